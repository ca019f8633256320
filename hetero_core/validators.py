"""attrs validators whose failures name the field, the value and the allowed range."""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping

from hetero_core.errors import ConfigError, EngineError, ValidationError

Validator = Callable[[Any, Any, Any], None]


def number_in(
    low: float | None,
    high: float | None,
    *,
    low_open: bool = False,
    high_open: bool = False,
    error: type[EngineError] = ValidationError,
    integer: bool = False,
) -> Validator:
    """Accept a finite number in the interval [low, high] (ends open as asked; None = unbounded)."""
    left = "(" if low_open else "["
    right = ")" if high_open else "]"
    interval = f"{left}{'-inf' if low is None else low}, {'inf' if high is None else high}{right}"
    allowed = f"an integer in {interval}" if integer else f"a number in {interval}"

    def check(_instance: Any, attribute: Any, value: Any) -> None:
        kind_ok = isinstance(value, int) if integer else isinstance(value, (int, float))
        if isinstance(value, bool) or not kind_ok or (not integer and not math.isfinite(value)):
            raise error(f"{attribute.name} must be {allowed}, got {value!r}", param=attribute.name)
        too_low = low is not None and (value <= low if low_open else value < low)
        too_high = high is not None and (value >= high if high_open else value > high)
        if too_low or too_high:
            raise error(f"{attribute.name} must be {allowed}, got {value!r}", param=attribute.name)

    return check


def boolean(*, error: type[EngineError] = ValidationError) -> Validator:
    """Accept True or False only (not 1, not "yes")."""

    def check(_instance: Any, attribute: Any, value: Any) -> None:
        if not isinstance(value, bool):
            raise error(f"{attribute.name} must be true or false, got {value!r}", param=attribute.name)

    return check


def non_empty_string(*, error: type[EngineError] = ValidationError) -> Validator:
    """Accept a string with at least one character."""

    def check(_instance: Any, attribute: Any, value: Any) -> None:
        if not isinstance(value, str) or not value:
            raise error(f"{attribute.name} must be a non-empty string, got {value!r}", param=attribute.name)

    return check


def optional(validator: Validator) -> Validator:
    """Accept None, or whatever ``validator`` accepts."""

    def check(instance: Any, attribute: Any, value: Any) -> None:
        if value is not None:
            validator(instance, attribute, value)

    return check


def one_of(choices: tuple[str, ...], *, error: type[EngineError] = ValidationError) -> Validator:
    """Accept one of a fixed set of strings."""

    def check(_instance: Any, attribute: Any, value: Any) -> None:
        if value not in choices:
            raise error(
                f"{attribute.name} must be one of {', '.join(map(repr, choices))}, got {value!r}",
                param=attribute.name,
            )

    return check


def named_options(param: str) -> Callable[[Any], dict[str, Any]]:
    """An attrs converter for keyword options: an object whose keys are strings (``ConfigError`` naming ``param``)."""

    def convert(value: Any) -> dict[str, Any]:
        if not isinstance(value, Mapping) or not all(isinstance(key, str) for key in value):
            raise ConfigError(f"{param} must be an object of named options, got {value!r}", param=param)
        return dict(value)

    return convert
