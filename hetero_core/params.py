"""Per-request generation parameters."""

from __future__ import annotations

from typing import Any, Mapping

import attrs

from hetero_core.errors import ValidationError
from hetero_core.structured_output import StructuredOutput
from hetero_core.validators import number_in, optional

MAX_STOP_STRINGS = 16
MAX_STOP_TOKEN_IDS = 64
MAX_LOGPROBS = 20
MAX_N = 64
MAX_INT = 2**31 - 1  # the largest count or token id any field takes (executors index with int32)
GREEDY_BELOW_TEMPERATURE = 1e-5  # lower temperatures are greedy: dividing logits by them is not finite
MIN_REPETITION_PENALTY = 0.01  # logits are divided or multiplied by it; below this they lose all meaning
MAX_LOGIT_BIAS_ENTRIES = 300
MAX_LOGIT_BIAS = 100.0


def _to_tuple(value: Any) -> Any:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    return tuple(value) if isinstance(value, (list, tuple)) else value


def _check_stop(_instance: Any, attribute: Any, value: Any) -> None:
    if not isinstance(value, tuple) or not all(isinstance(s, str) and s for s in value):
        raise ValidationError(f"{attribute.name} must be a list of non-empty strings, got {value!r}", param="stop")
    for stop in value:
        try:
            stop.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValidationError(
                f"stop string {stop!r} is not valid Unicode text: {exc.reason}", param="stop"
            ) from exc
    if len(value) > MAX_STOP_STRINGS:
        raise ValidationError(
            f"{attribute.name} allows at most {MAX_STOP_STRINGS} strings, got {len(value)}", param="stop"
        )


def _check_token_ids(_instance: Any, attribute: Any, value: Any) -> None:
    if not isinstance(value, tuple) or not all(
        isinstance(t, int) and not isinstance(t, bool) and 0 <= t <= MAX_INT for t in value
    ):
        raise ValidationError(
            f"{attribute.name} must be a list of integers in [0, {MAX_INT}], got {value!r}", param=attribute.name
        )
    if len(value) > MAX_STOP_TOKEN_IDS:
        raise ValidationError(
            f"{attribute.name} allows at most {MAX_STOP_TOKEN_IDS} ids, got {len(value)}", param=attribute.name
        )


def _to_bias_pairs(value: Any) -> Any:
    if value is None:
        return ()
    if isinstance(value, Mapping):
        value = value.items()
    try:
        return tuple(sorted((token_id, bias) for token_id, bias in value))
    except (TypeError, ValueError):
        return value


def _check_logit_bias(_instance: Any, attribute: Any, value: Any) -> None:
    allowed = f"a mapping of token ids in [0, {MAX_INT}] to numbers in [-{MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}]"
    if not isinstance(value, tuple) or not all(
        isinstance(token_id, int)
        and not isinstance(token_id, bool)
        and 0 <= token_id <= MAX_INT
        and isinstance(bias, (int, float))
        and not isinstance(bias, bool)
        and -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS
        for token_id, bias in value
    ):
        raise ValidationError(f"{attribute.name} must be {allowed}, got {value!r:.200}", param=attribute.name)
    if len(value) > MAX_LOGIT_BIAS_ENTRIES:
        raise ValidationError(
            f"{attribute.name} allows at most {MAX_LOGIT_BIAS_ENTRIES} tokens, got {len(value)}", param=attribute.name
        )
    if len({token_id for token_id, _ in value}) < len(value):
        raise ValidationError(f"{attribute.name} names a token twice", param=attribute.name)


def _check_structured_output(_instance: Any, attribute: Any, value: Any) -> None:
    if value is not None and not isinstance(value, StructuredOutput):
        raise ValidationError(
            f"{attribute.name} must be a StructuredOutput (StructuredOutput.json_schema(...), .regex(...), ...),"
            f" got {type(value).__name__}",
            param=attribute.name,
        )


def _check_bool(_instance: Any, attribute: Any, value: Any) -> None:
    if not isinstance(value, bool):
        raise ValidationError(f"{attribute.name} must be true or false, got {value!r}", param=attribute.name)


@attrs.frozen
class GenerationParams:
    """How to generate the continuation of one prompt.

    Every field is validated on construction; an invalid value raises
    :class:`~hetero_core.errors.ValidationError` naming the field, the value
    and the allowed range. Every number is bounded, so no value can overflow
    an executor's arithmetic; the engine further bounds ``top_k`` and
    ``stop_token_ids`` by the model's vocabulary and ``max_tokens`` by its
    context. A ``temperature`` below ``GREEDY_BELOW_TEMPERATURE`` (1e-5),
    0 included, means greedy decoding, and then the other sampling knobs
    (top_p, top_k, min_p) have no effect.

    ``structured_output`` constrains the text to a JSON schema, any JSON
    object, a regex, a choice list or a grammar (see
    :class:`~hetero_core.structured_output.StructuredOutput`); the engine
    compiles it when the request is submitted, so one that cannot be
    compiled is a ``ValidationError``. A sample ends with ``stop`` as soon as
    its text is complete. ``logit_bias`` adds a bias in [-100, 100] to
    chosen tokens' logits before sampling (given as a mapping of token id to
    bias; stored as sorted pairs); -100 bans a token.

    ``prompt_logprobs`` asks for the logprob of every prompt token given
    the tokens before it (the model's raw distribution: no penalties, bias
    or temperature), plus the ``prompt_logprobs`` most likely alternatives
    at each position; the first prompt token has none. Such a request
    computes every prompt position (it takes nothing from the prefix
    cache), and only with it may ``max_tokens`` be 0: the prompt is scored
    and the request finishes with ``length`` without generating a token.
    ``include_stop_str_in_output`` keeps a matched stop string at the end of
    the text; ``skip_special_tokens`` (default true) leaves control tokens
    out of the text.
    """

    max_tokens: int = attrs.field(default=100, validator=number_in(0, MAX_INT, integer=True))
    temperature: float = attrs.field(default=1.0, validator=number_in(0.0, 2.0))
    top_p: float = attrs.field(default=0.9, validator=number_in(0.0, 1.0, low_open=True))
    top_k: int | None = attrs.field(default=None, validator=optional(number_in(1, MAX_INT, integer=True)))
    min_p: float = attrs.field(default=0.0, validator=number_in(0.0, 1.0))
    repetition_penalty: float = attrs.field(default=1.0, validator=number_in(MIN_REPETITION_PENALTY, 2.0))
    presence_penalty: float = attrs.field(default=0.0, validator=number_in(-2.0, 2.0))
    frequency_penalty: float = attrs.field(default=0.0, validator=number_in(-2.0, 2.0))
    seed: int | None = attrs.field(default=None, validator=optional(number_in(0, 2**63 - 1, integer=True)))
    stop: tuple[str, ...] = attrs.field(default=(), converter=_to_tuple, validator=_check_stop)
    stop_token_ids: tuple[int, ...] = attrs.field(default=(), converter=_to_tuple, validator=_check_token_ids)
    ignore_eos: bool = attrs.field(default=False, validator=_check_bool)
    min_tokens: int = attrs.field(default=0, validator=number_in(0, MAX_INT, integer=True))
    n: int = attrs.field(default=1, validator=number_in(1, MAX_N, integer=True))
    logprobs: int | None = attrs.field(default=None, validator=optional(number_in(0, MAX_LOGPROBS, integer=True)))
    priority: int = attrs.field(default=0, validator=number_in(-(2**63), 2**63 - 1, integer=True))
    structured_output: StructuredOutput | None = attrs.field(default=None, validator=_check_structured_output)
    logit_bias: tuple[tuple[int, float], ...] = attrs.field(
        default=(), converter=_to_bias_pairs, validator=_check_logit_bias
    )
    prompt_logprobs: int | None = attrs.field(
        default=None, validator=optional(number_in(0, MAX_LOGPROBS, integer=True))
    )
    include_stop_str_in_output: bool = attrs.field(default=False, validator=_check_bool)
    skip_special_tokens: bool = attrs.field(default=True, validator=_check_bool)

    def __attrs_post_init__(self) -> None:
        if self.max_tokens == 0 and self.prompt_logprobs is None:
            raise ValidationError(
                "max_tokens must be at least 1, got 0 (0 is allowed only with prompt_logprobs, to score the prompt)",
                param="max_tokens",
            )
        if self.min_tokens > self.max_tokens:
            raise ValidationError(
                f"min_tokens must be in [0, max_tokens={self.max_tokens}], got {self.min_tokens}",
                param="min_tokens",
            )

    @property
    def is_greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW_TEMPERATURE

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> GenerationParams:
        """Build from a dict, rejecting unknown keys by name."""
        if not isinstance(values, Mapping) or not all(isinstance(k, str) for k in values):
            raise ValidationError(f"generation parameters must be a mapping of names to values, got {values!r}")
        unknown = sorted(set(values) - set(attrs.fields_dict(cls)))
        if unknown:
            raise ValidationError(f"unknown generation parameter(s): {', '.join(unknown)}", param=unknown[0])
        return cls(**values)
