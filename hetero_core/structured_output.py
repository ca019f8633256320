"""Structured output: what a request may constrain its text to, and the contract of a grammar engine.

A request names a constraint (:class:`StructuredOutput`: a JSON schema, any JSON
object, a regular expression, a list of choices, a grammar in a named dialect,
or tool calls). A *structured-output backend* (a plugin, see
``register_structured_output_backends``) compiles each distinct constraint
once and makes one :class:`GrammarMatcher` per sample. Before each step the
core asks for the allowed next tokens of every constrained sample that samples
in it, as the rows of one bitmask: all together through the backend's
:meth:`BatchMaskFiller.fill_bitmasks` where it has one (llguidance's fills
them in parallel), else one matcher after another. The executor only applies
that mask. After sampling, the core feeds the chosen token back with
:meth:`GrammarMatcher.accept_token`.

A bitmask row holds ``ceil(vocab_size / 32)`` int32 words; bit ``t % 32`` of
word ``t // 32`` set means token ``t`` is allowed. Use :func:`new_bitmask`
and :func:`allowed_token_ids` rather than packing bits by hand.
"""

from __future__ import annotations

import enum
import json
from typing import Any, Mapping, Protocol, runtime_checkable

import attrs
import numpy as np

from hetero_core.errors import ValidationError
from hetero_core.tool_prompt import TOOL_CALL_CLOSE, TOOL_CALL_OPEN

BITS_PER_WORD = 32
MAX_CHOICES = 1024
NO_ARGUMENTS = {"type": "object", "properties": {}, "additionalProperties": False}


class ConstraintKind(enum.Enum):
    JSON_SCHEMA = "json_schema"
    JSON_OBJECT = "json_object"
    REGEX = "regex"
    CHOICE = "choice"
    GRAMMAR = "grammar"
    TOOL_CALLS = "tool_calls"


def _non_empty_text(what: str) -> Any:
    def check(_instance: Any, _attribute: Any, value: Any) -> None:
        if not isinstance(value, str) or not value:
            raise ValidationError(f"{what} must be a non-empty string, got {value!r}", param="structured_output")

    return check


@attrs.frozen
class Grammar:
    """A grammar's text and the dialect it is written in.

    A dialect is a name a backend declares in ``grammar_dialects``: ``"lark"``
    (Lark's syntax, start rule ``start``) and ``"gbnf"`` (llama.cpp's GBNF,
    start rule ``root``) are the usual ones. Each dialect's extensions are
    the backend's own (llguidance's Lark reads ``%json`` rules, for one).
    """

    dialect: str = attrs.field(validator=_non_empty_text("a grammar's dialect"))
    text: str = attrs.field(validator=_non_empty_text("a grammar"))


@attrs.frozen
class ToolFunction:
    """A function a tool call may name: its name and its arguments' JSON schema (JSON text of an object schema)."""

    name: str = attrs.field(validator=_non_empty_text("a function's name"))
    parameters: str = attrs.field(validator=attrs.validators.instance_of(str))

    @property
    def schema(self) -> dict[str, Any]:
        return json.loads(self.parameters)


@attrs.frozen
class ToolCalls:
    """Output made of tool calls, in the call format of :mod:`hetero_core.tool_prompt`.

    One call is the text ``open_tag``, a newline, the JSON object
    ``{"name": NAME, "arguments": ARGUMENTS}`` (written as :func:`json.dumps`
    writes it: ``", "`` and ``": "``), a newline, ``close_tag``; ``NAME``
    is one of ``functions`` and ``ARGUMENTS`` is valid against its schema.

    - ``several``: one or more calls, each after the last on a new line;
      else exactly one.
    - ``free_text``: the output is any text, in which each call, once the
      text holds ``open_tag``, must be a valid call (the model chooses
      whether to call); else the output is the calls alone.
    """

    functions: tuple[ToolFunction, ...] = attrs.field()
    several: bool = False
    free_text: bool = False
    open_tag: str = attrs.field(default=TOOL_CALL_OPEN, validator=_non_empty_text("a tool call's opening tag"))
    close_tag: str = attrs.field(default=TOOL_CALL_CLOSE, validator=_non_empty_text("a tool call's closing tag"))

    @functions.validator
    def _check_functions(self, _attribute: Any, functions: Any) -> None:
        if not isinstance(functions, tuple) or not functions or not all(isinstance(f, ToolFunction) for f in functions):
            raise ValidationError("tool calls need a non-empty tuple of ToolFunction", param="structured_output")
        names = [function.name for function in functions]
        if len(set(names)) != len(names):
            raise ValidationError(f"tool calls name a function twice: {names}", param="structured_output")


def _check_value(instance: StructuredOutput, _attribute: Any, value: Any) -> None:
    kind = instance.kind
    if kind is ConstraintKind.GRAMMAR:
        if not isinstance(value, Grammar):
            raise ValidationError(f"a grammar constraint holds a Grammar, got {value!r}", param="structured_output")
    elif kind is ConstraintKind.TOOL_CALLS:
        if not isinstance(value, ToolCalls):
            raise ValidationError(f"a tool_calls constraint holds ToolCalls, got {value!r}", param="structured_output")
    elif kind is ConstraintKind.JSON_OBJECT:
        if value is not None:
            raise ValidationError("a json_object constraint takes no value", param="structured_output")
    elif kind is ConstraintKind.JSON_SCHEMA:
        if not isinstance(value, str):
            raise ValidationError("a json_schema constraint holds the schema as JSON text", param="structured_output")
    elif kind is ConstraintKind.CHOICE:
        if (
            not isinstance(value, tuple)
            or not value
            or len(value) > MAX_CHOICES
            or not all(isinstance(choice, str) and choice for choice in value)
        ):
            raise ValidationError(
                f"choice must be a list of 1 to {MAX_CHOICES} non-empty strings, got {value!r}",
                param="structured_output",
            )
    elif not isinstance(value, str) or not value:
        raise ValidationError(
            f"a {kind.value} constraint must be a non-empty string, got {value!r}", param="structured_output"
        )


@attrs.frozen
class StructuredOutput:
    """One request's constraint on its output text. Build it with the named constructors.

    Constraints are values: two equal constraints share one compiled grammar.
    A schema's text keeps its properties in the order given (they are
    generated in that order), so schemas that differ only in that order are
    different constraints.
    Whether a schema, regex or grammar is valid is the backend's to say, when
    it compiles it (a :class:`~hetero_core.errors.ValidationError`).
    A grammar's ``value`` is a :class:`Grammar`; tool calls' a :class:`ToolCalls`.
    """

    kind: ConstraintKind = attrs.field(validator=attrs.validators.instance_of(ConstraintKind))
    value: str | tuple[str, ...] | Grammar | ToolCalls | None = attrs.field(default=None, validator=_check_value)

    @classmethod
    def json_schema(cls, schema: dict[str, Any] | str) -> StructuredOutput:
        """Text that is one JSON value valid against ``schema`` (a dict, or its JSON text)."""
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except ValueError as exc:
                raise ValidationError(f"the JSON schema is not valid JSON: {exc}", param="structured_output") from exc
        if not isinstance(schema, (dict, bool)):
            raise ValidationError(
                f"a JSON schema must be an object, got {type(schema).__name__}", param="structured_output"
            )
        return cls(ConstraintKind.JSON_SCHEMA, json.dumps(schema, separators=(",", ":")))

    @classmethod
    def json_object(cls) -> StructuredOutput:
        """Text that is one JSON object, of any shape."""
        return cls(ConstraintKind.JSON_OBJECT)

    @classmethod
    def regex(cls, pattern: str) -> StructuredOutput:
        """Text that matches ``pattern`` as a whole."""
        return cls(ConstraintKind.REGEX, pattern)

    @classmethod
    def choice(cls, choices: list[str] | tuple[str, ...]) -> StructuredOutput:
        """Text that is exactly one of ``choices``."""
        return cls(ConstraintKind.CHOICE, tuple(choices) if isinstance(choices, (list, tuple)) else choices)

    @classmethod
    def grammar(cls, text: str, dialect: str = "lark") -> StructuredOutput:
        """Text of the start rule of a grammar written in ``dialect`` (see :class:`Grammar`)."""
        return cls(ConstraintKind.GRAMMAR, Grammar(dialect, text))

    @classmethod
    def tool_calls(
        cls,
        functions: Mapping[str, dict[str, Any] | None],
        *,
        several: bool = False,
        free_text: bool = False,
        open_tag: str = TOOL_CALL_OPEN,
        close_tag: str = TOOL_CALL_CLOSE,
    ) -> StructuredOutput:
        """Tool calls of ``functions`` (name -> arguments schema; None: no arguments), see :class:`ToolCalls`."""
        tools = []
        for name, schema in functions.items():
            schema = NO_ARGUMENTS if schema is None else schema
            if not isinstance(schema, dict) or schema.get("type", "object") != "object":
                raise ValidationError(
                    f"function {name!r}: arguments must have an object schema, got {schema!r}",
                    param="structured_output",
                )
            tools.append(ToolFunction(name, json.dumps(schema, separators=(",", ":"))))
        return cls(ConstraintKind.TOOL_CALLS, ToolCalls(tuple(tools), several, free_text, open_tag, close_tag))

    @property
    def schema(self) -> Any:
        """The JSON schema, parsed (only for ``json_schema``)."""
        assert self.kind is ConstraintKind.JSON_SCHEMA and isinstance(self.value, str)
        return json.loads(self.value)


@runtime_checkable
class GrammarMatcher(Protocol):
    """Where one sample stands in its grammar. Not thread-safe; one per sample.

    The matcher has accepted exactly the tokens the sample generated so far.
    The ``n`` samples of a request are sibling sequences, each with its own
    matcher made by :meth:`StructuredOutputBackend.new_matcher`: nothing is
    ever copied from one to another.
    """

    def fill_bitmask(self, bitmask: np.ndarray, row: int) -> None:
        """Write the allowed next tokens into ``bitmask[row]`` (see :func:`new_bitmask`).

        No control token (the tokenizer's ``special_token_ids``) is allowed
        but end-of-sequence, and that only where the text may end. Once the
        grammar is complete (:attr:`is_finished`) end-of-sequence is the only
        token allowed: no trailing whitespace, no further text.
        """
        ...

    def accept_token(self, token_id: int) -> bool:
        """Advance by one generated token; False (and no change) when the grammar forbids it."""
        ...

    def rollback(self, num_tokens: int) -> None:
        """Forget the last ``num_tokens`` accepted tokens, an accepted end-of-sequence included (preemption by
        recompute, speculative rejections)."""
        ...

    @property
    def is_finished(self) -> bool:
        """True when the text is complete: only end-of-sequence may follow (or it was accepted)."""
        ...


@runtime_checkable
class StructuredOutputBackend(Protocol):
    """A grammar engine, bound to one tokenizer's vocabulary.

    It reads the vocabulary through :meth:`Tokenizer.token_bytes
    <hetero_core.protocols.Tokenizer.token_bytes>` and keeps every token of
    :attr:`~hetero_core.protocols.Tokenizer.special_token_ids` out of
    constrained text (EOS only ends it). It compiles every
    :class:`ConstraintKind`: a ``TOOL_CALLS`` constraint into its own grammar
    for the call format :class:`ToolCalls` describes. :meth:`compile` is
    called at a request's admission, so a constraint that cannot be compiled
    is a ``ValidationError`` for that request alone. Compiled grammars are
    cached by the backend: compiling an equal constraint again returns the
    same object.
    """

    #: The grammar dialects a ``GRAMMAR`` constraint may be written in for
    #: this backend (``("lark", "gbnf")``, say); the core refuses any other
    #: by name before :meth:`compile`.
    grammar_dialects: tuple[str, ...]

    def compile(self, constraint: StructuredOutput) -> Any:
        """A compiled grammar for ``constraint``; raises ``ValidationError`` naming what is wrong with it.

        A constraint that no text satisfies, or whose first step already fails
        (its first mask is empty, or a token that mask allows cannot be
        accepted), is refused here rather than failing every sample at its
        first token; so is one that passes a bound of the backend, naming it,
        and a grammar in a dialect not in :attr:`grammar_dialects`.
        """
        ...

    def new_matcher(self, compiled: Any) -> GrammarMatcher:
        """A matcher at the start of ``compiled`` (a value :meth:`compile` returned)."""
        ...


@runtime_checkable
class BatchMaskFiller(Protocol):
    """Optional for a :class:`StructuredOutputBackend`: one step's masks, all at once.

    A backend that can compute several matchers' masks together (in parallel,
    without holding the GIL) implements it; the core then makes one call per
    step instead of one :meth:`GrammarMatcher.fill_bitmask` per sample.
    """

    def fill_bitmasks(self, matchers: list[GrammarMatcher], bitmask: np.ndarray) -> list[str | None]:
        """Write each ``matchers[i]``'s allowed next tokens into ``bitmask[i]``.

        ``matchers`` are distinct, made by this backend; ``bitmask`` is a
        C-contiguous int32 array of ``len(matchers)`` rows (see
        :func:`new_bitmask`). Each row must equal what
        ``matchers[i].fill_bitmask(bitmask, i)`` writes. Returns, per matcher,
        None, or why it failed where ``fill_bitmask`` would raise (its row is
        then undefined): a failing matcher fails alone. Raising fails no one:
        the core then asks each matcher alone.
        """
        ...


def num_bitmask_words(vocab_size: int) -> int:
    return (vocab_size + BITS_PER_WORD - 1) // BITS_PER_WORD


def new_bitmask(num_rows: int, vocab_size: int) -> np.ndarray:
    """An int32 bitmask with every token allowed in every row."""
    return np.full((num_rows, num_bitmask_words(vocab_size)), -1, dtype=np.int32)


def is_allowed(bitmask_row: np.ndarray, token_id: int) -> bool:
    """Whether a bitmask row allows ``token_id`` (False for an id beyond the row)."""
    word = token_id // BITS_PER_WORD
    return 0 <= word < len(bitmask_row) and bool((int(bitmask_row[word]) >> (token_id % BITS_PER_WORD)) & 1)


def allowed_token_ids(bitmask_row: np.ndarray, vocab_size: int) -> np.ndarray:
    """The token ids a bitmask row allows, ascending."""
    bits = np.unpackbits(bitmask_row.astype("<i4").view(np.uint8), bitorder="little")
    return np.flatnonzero(bits[:vocab_size])
