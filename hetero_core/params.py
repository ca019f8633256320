"""Per-request generation parameters."""

from __future__ import annotations

from typing import Any, Mapping

import attrs

from hetero_core.errors import ValidationError
from hetero_core.validators import number_in, optional

MAX_STOP_STRINGS = 16
MAX_LOGPROBS = 20
MAX_N = 64


def _to_tuple(value: Any) -> Any:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    return tuple(value) if isinstance(value, (list, tuple)) else value


def _check_stop(_instance: Any, attribute: Any, value: Any) -> None:
    if not isinstance(value, tuple) or not all(isinstance(s, str) and s for s in value):
        raise ValidationError(f"{attribute.name} must be a list of non-empty strings, got {value!r}", param="stop")
    if len(value) > MAX_STOP_STRINGS:
        raise ValidationError(
            f"{attribute.name} allows at most {MAX_STOP_STRINGS} strings, got {len(value)}", param="stop"
        )


def _check_token_ids(_instance: Any, attribute: Any, value: Any) -> None:
    if not isinstance(value, tuple) or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value):
        raise ValidationError(
            f"{attribute.name} must be a list of non-negative integers, got {value!r}", param=attribute.name
        )


@attrs.frozen
class GenerationParams:
    """How to generate the continuation of one prompt.

    Every field is validated on construction; an invalid value raises
    :class:`~hetero_core.errors.ValidationError` naming the field, the value
    and the allowed range. ``temperature == 0`` means greedy decoding, and
    then the other sampling knobs (top_p, top_k, min_p) have no effect.
    """

    max_tokens: int = attrs.field(default=100, validator=number_in(1, None, integer=True))
    temperature: float = attrs.field(default=1.0, validator=number_in(0.0, 2.0))
    top_p: float = attrs.field(default=0.9, validator=number_in(0.0, 1.0, low_open=True))
    top_k: int | None = attrs.field(default=None, validator=optional(number_in(1, None, integer=True)))
    min_p: float = attrs.field(default=0.0, validator=number_in(0.0, 1.0))
    repetition_penalty: float = attrs.field(default=1.0, validator=number_in(0.0, 2.0, low_open=True))
    presence_penalty: float = attrs.field(default=0.0, validator=number_in(-2.0, 2.0))
    frequency_penalty: float = attrs.field(default=0.0, validator=number_in(-2.0, 2.0))
    seed: int | None = attrs.field(default=None, validator=optional(number_in(0, 2**63 - 1, integer=True)))
    stop: tuple[str, ...] = attrs.field(default=(), converter=_to_tuple, validator=_check_stop)
    stop_token_ids: tuple[int, ...] = attrs.field(default=(), converter=_to_tuple, validator=_check_token_ids)
    ignore_eos: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    min_tokens: int = attrs.field(default=0, validator=number_in(0, None, integer=True))
    n: int = attrs.field(default=1, validator=number_in(1, MAX_N, integer=True))
    logprobs: int | None = attrs.field(default=None, validator=optional(number_in(0, MAX_LOGPROBS, integer=True)))
    priority: int = attrs.field(default=0, validator=number_in(None, None, integer=True))

    def __attrs_post_init__(self) -> None:
        if self.min_tokens > self.max_tokens:
            raise ValidationError(
                f"min_tokens must be in [0, max_tokens={self.max_tokens}], got {self.min_tokens}",
                param="min_tokens",
            )

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> GenerationParams:
        """Build from a dict, rejecting unknown keys by name."""
        unknown = sorted(set(values) - set(attrs.fields_dict(cls)))
        if unknown:
            raise ValidationError(f"unknown generation parameter(s): {', '.join(unknown)}", param=unknown[0])
        return cls(**values)
