"""What a chat request says about tools: ``tools``, ``tool_choice``, ``parallel_tool_calls``.

``tool_choice`` decides how the tools are used (the default is ``auto``
with tools, ``none`` without):

- ``none``: the tools are not shown to the model and its text is returned as is;
- ``auto``: the model is shown the tools and may call them; ``<tool_call>``
  blocks in its text become ``tool_calls`` (see :mod:`hetero_serve_openai.tool_parser`).
  When a function is ``strict``, the text is free but each call the model
  opens is constrained like a forced one;
- ``required``: the output is constrained to one or more calls (exactly one
  when ``parallel_tool_calls`` is false) of the listed functions, each with
  arguments valid against its ``parameters`` schema;
- ``{"type": "function", "function": {"name": ...}}``: exactly one call of
  that function, with valid arguments.

Forced calls are generated in the default ``<tool_call>`` convention of
:mod:`hetero_core.tool_prompt`, constrained by the core's tool-call constraint
(:meth:`StructuredOutput.tool_calls <hetero_core.structured_output.StructuredOutput.tool_calls>`),
which the structured-output backend compiles into its own grammar: any
model's output parses into valid calls holding the declared parameters; a
function with ``strict: true`` has every object of its schema closed to the
keys it lists (:mod:`hetero_serve_openai.strict`).
OpenAI's deprecated ``functions`` and ``function_call`` are refused with a
400 that points to ``tools`` and ``tool_choice``.
"""

from __future__ import annotations

from typing import Any, Literal

import attrs
from pydantic import BaseModel, Field, field_validator

from hetero_core.structured_output import NO_ARGUMENTS, StructuredOutput
from hetero_serve_openai.errors import APIError
from hetero_serve_openai.fields import STRICT, JSONObject, Text
from hetero_serve_openai.strict import strict_schema

NAME_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"  # OpenAI's rule for function names


class FunctionDefinition(BaseModel):
    model_config = STRICT

    name: str = Field(pattern=NAME_PATTERN)
    description: Text | None = None
    parameters: JSONObject | None = None
    strict: bool | None = (
        None  # calls are schema-valid and hold the declared parameters either way; strict closes nested objects too
    )

    @field_validator("parameters")
    @classmethod
    def _object_schema(cls, parameters: dict[str, Any] | None) -> dict[str, Any] | None:
        if parameters is not None and parameters.get("type", "object") != "object":
            raise ValueError("parameters must be the JSON schema of an object")
        return parameters


class Tool(BaseModel):
    model_config = STRICT

    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(BaseModel):
    model_config = STRICT

    name: str


class NamedToolChoice(BaseModel):
    model_config = STRICT

    type: Literal["function"]
    function: NamedFunction


@attrs.frozen
class ToolPlan:
    """How one request uses its tools: what the prompt shows, what constrains the output, whether the text is parsed."""

    tools: tuple[dict[str, Any], ...]  # shown to the model (empty with tool_choice none)
    names: frozenset[str]
    constraint: StructuredOutput | None  # forced calls, or auto's calls when a function is strict
    parses_calls: bool
    is_forced: bool = False  # the output is calls only


NO_TOOLS = ToolPlan((), frozenset(), None, False)


class ToolFields(BaseModel):
    """The chat request fields about tools; mixed into the chat body."""

    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True
    functions: Any = None
    function_call: Any = None

    def tool_plan(self, has_structured_output: bool) -> ToolPlan:
        """The plan, or a 400 naming the field that makes the request contradictory."""
        for legacy in ("functions", "function_call"):
            if getattr(self, legacy) is not None:
                raise APIError(
                    400, f"{legacy} is deprecated and not supported: send tools and tool_choice", param=legacy
                )
        if self.tools is None:
            if self.tool_choice not in (None, "none"):
                raise APIError(400, "tool_choice needs tools", param="tool_choice")
            return NO_TOOLS
        if not self.tools:
            raise APIError(400, "tools must not be empty (leave the field out instead)", param="tools")
        functions = {tool.function.name: tool.function for tool in self.tools}
        if len(functions) != len(self.tools):
            duplicate = next(n for n in functions if sum(t.function.name == n for t in self.tools) > 1)
            raise APIError(400, f"tools name the function {duplicate!r} twice", param="tools")
        choice = self.tool_choice or "auto"
        if choice == "none":
            return NO_TOOLS
        if has_structured_output:
            raise APIError(
                400,
                "tools and a response format both constrain the output: give one (or tool_choice none)",
                param="tools",
            )
        shown = tuple(tool.model_dump(exclude_none=True) for tool in self.tools)
        if choice == "auto":
            if not any(function.strict for function in functions.values()):
                return ToolPlan(shown, frozenset(functions), None, True)
            constraint = tool_calls_constraint(
                list(functions.values()), several=self.parallel_tool_calls, free_text=True
            )
            return ToolPlan(shown, frozenset(functions), constraint, True)
        if choice == "required":
            constraint = tool_calls_constraint(list(functions.values()), several=self.parallel_tool_calls)
        else:
            if choice.function.name not in functions:
                raise APIError(
                    400,
                    f"tool_choice names {choice.function.name!r}, which is not among the tools",
                    param="tool_choice",
                )
            constraint = tool_calls_constraint([functions[choice.function.name]], several=False)
        return ToolPlan(shown, frozenset(functions), constraint, True, is_forced=True)


def tool_calls_constraint(
    functions: list[FunctionDefinition], *, several: bool, free_text: bool = False
) -> StructuredOutput:
    """Calls of ``functions`` (one, or ``several``; alone, or in ``free_text``),
    each with its :func:`arguments_schema`."""
    schemas = {function.name: arguments_schema(function) for function in functions}
    return StructuredOutput.tool_calls(schemas, several=several, free_text=free_text)


def arguments_schema(function: FunctionDefinition) -> dict[str, Any]:
    """The schema a call's arguments must satisfy.

    The top-level object holds only the declared parameters unless its schema
    says ``additionalProperties`` (small models pad them otherwise); a
    ``strict`` function has every object of its schema closed
    (:func:`~hetero_serve_openai.strict.strict_schema`).
    """
    schema = dict(function.parameters if function.parameters is not None else NO_ARGUMENTS)
    if function.strict:
        return strict_schema(schema)
    if "properties" in schema:
        schema.setdefault("additionalProperties", False)
    return schema
