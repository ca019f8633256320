"""What a request body says about its output's shape: OpenAI's ``response_format``,
vLLM's structured outputs, ``logit_bias``.

A request names at most one constraint, through exactly one of:

- ``response_format``: ``{"type": "text"}`` (none), ``{"type": "json_object"}``,
  or ``{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}``
  (with ``strict: true`` objects hold only the keys they list: see
  :mod:`hetero_serve_openai.strict`);
- ``structured_outputs`` (vLLM): one of ``json`` (a schema), ``json_object``,
  ``regex``, ``choice``, ``grammar``;
- vLLM's older fields ``guided_json``, ``guided_regex``, ``guided_choice``,
  ``guided_grammar``.

A grammar is GBNF when a line defines a rule with ``::=``, else Lark; the
structured-output backend refuses a dialect it does not read.

Two sources at once are a 400 naming the second, never a silent choice.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Literal

from pydantic import BaseModel, ConfigDict, Field

from hetero_core.structured_output import StructuredOutput
from hetero_serve_openai.errors import APIError
from hetero_serve_openai.fields import STRICT
from hetero_serve_openai.strict import strict_schema

STRICT_BY_NAME = ConfigDict(**STRICT, populate_by_name=True)
GBNF_RULE = re.compile(r"^\s*[A-Za-z][\w-]*\s*::=", re.MULTILINE)


class JsonSchemaFormat(BaseModel):
    model_config = STRICT_BY_NAME

    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None  # the schema is enforced either way; strict also closes its objects


class ResponseFormat(BaseModel):
    model_config = STRICT_BY_NAME

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    def constraint(self) -> StructuredOutput | None:
        if self.type == "text":
            return None
        if self.type == "json_object":
            return StructuredOutput.json_object()
        if self.json_schema is None or self.json_schema.schema_ is None:
            raise APIError(400, "response_format of type json_schema needs json_schema.schema", param="response_format")
        schema = self.json_schema.schema_
        return StructuredOutput.json_schema(strict_schema(schema) if self.json_schema.strict else schema)


class StructuredOutputs(BaseModel):
    model_config = STRICT_BY_NAME

    json_: dict[str, Any] | str | None = Field(default=None, alias="json")
    json_object: bool | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None

    def constraint(self) -> StructuredOutput:
        given = [
            name
            for name in ("json", "json_object", "regex", "choice", "grammar")
            if self._value(name) not in (None, False)
        ]
        if len(given) != 1:
            raise APIError(
                400,
                "structured_outputs takes exactly one of json, json_object, regex, choice, grammar; "
                f"got {given or 'none'}",
                param="structured_outputs",
            )
        return constraint_of(given[0], self._value(given[0]))

    def _value(self, name: str) -> Any:
        return self.json_ if name == "json" else getattr(self, name)


def constraint_of(kind: str, value: Any) -> StructuredOutput:
    if kind == "json":
        return StructuredOutput.json_schema(value)
    if kind == "json_object":
        return StructuredOutput.json_object()
    if kind == "regex":
        return StructuredOutput.regex(value)
    if kind == "choice":
        return StructuredOutput.choice(value)
    return StructuredOutput.grammar(value, dialect="gbnf" if GBNF_RULE.search(value) else "lark")


class ConstraintFields(BaseModel):
    """The request fields that constrain the output; mixed into both endpoints' bodies."""

    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    logit_bias: dict[str, float] | None = None

    def structured_output(self) -> StructuredOutput | None:
        """The one constraint the body names, if any (a 400 naming the field when it names two)."""
        sources = self._constraint_sources()
        if len(sources) > 1:
            raise APIError(
                400, f"{sources[1][0]} and {sources[0][0]} both constrain the output: give one", param=sources[1][0]
            )
        return sources[0][1]() if sources else None

    @property
    def constraint_field(self) -> str | None:
        """The field the body's constraint comes from (what a 400 about the constraint names)."""
        sources = self._constraint_sources()
        return sources[0][0] if sources else None

    def _constraint_sources(self) -> list[tuple[str, Callable[[], StructuredOutput]]]:
        sources: list[tuple[str, Callable[[], StructuredOutput]]] = []
        if self.response_format is not None and self.response_format.type != "text":
            sources.append(("response_format", self.response_format.constraint))
        if self.structured_outputs is not None:
            sources.append(("structured_outputs", self.structured_outputs.constraint))
        for kind in ("json", "regex", "choice", "grammar"):
            value = getattr(self, f"guided_{kind}")
            if value is not None:
                sources.append((f"guided_{kind}", lambda kind=kind, value=value: constraint_of(kind, value)))
        return sources

    def token_bias(self) -> dict[int, float]:
        """``logit_bias`` with its keys (token ids as JSON strings of ASCII digits, as OpenAI sends them) as ints."""
        bias = {}
        for key, value in (self.logit_bias or {}).items():
            if not (key.isascii() and key.isdigit()):  # int() would also read "１２" as 12
                raise APIError(400, f"logit_bias keys must be token ids, got {key!r}", param="logit_bias")
            bias[int(key)] = value
        return bias
