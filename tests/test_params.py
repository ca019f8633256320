"""GenerationParams: every bound accepted at its edge and rejected just past it, with a named error."""

from __future__ import annotations

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hetero_core.errors import ValidationError
from hetero_core.params import GenerationParams

# field -> (values accepted, values rejected, text of the allowed range)
BOUNDS = {
    "max_tokens": ([1, 10**6, 2**31 - 1], [-1, 1.5, True, 2**31], "[0, 2147483647]"),
    "temperature": ([0.0, 2.0, 0, 1, 1e-38], [-1e-9, 2.000001, float("nan"), float("inf"), "1"], "[0.0, 2.0]"),
    "top_p": ([1e-9, 1.0], [0.0, 1.000001, -0.5, float("nan")], "(0.0, 1.0]"),
    "top_k": ([None, 1, 50, 2**31 - 1], [0, -1, 2.0, 9223372036854775808], "[1, 2147483647]"),
    "min_p": ([0.0, 1.0], [-1e-9, 1.01], "[0.0, 1.0]"),
    "repetition_penalty": ([0.01, 2.0], [0.0, 1e-300, 0.0099, 2.01, float("-inf")], "[0.01, 2.0]"),
    "presence_penalty": ([-2.0, 2.0], [-2.01, 2.01], "[-2.0, 2.0]"),
    "frequency_penalty": ([-2.0, 2.0], [-2.01, 2.01], "[-2.0, 2.0]"),
    "seed": ([None, 0, 2**63 - 1], [-1, 2**63, 1.0], "[0, 9223372036854775807]"),
    "n": ([1, 64], [0, 65], "[1, 64]"),
    "logprobs": ([None, 0, 20], [-1, 21], "[0, 20]"),
    "min_tokens": ([0, 100], [-1, 101], "[0"),
    "priority": ([-(10**9), 0, 10**9], [0.5, None, 2**63], "integer"),
    "ignore_eos": ([True, False], [1, "yes", None], "true or false"),
    "prompt_logprobs": ([None, 0, 20], [-1, 21, 1.5], "[0, 20]"),
    "include_stop_str_in_output": ([True, False], [1, None], "true or false"),
    "skip_special_tokens": ([True, False], [0, "no"], "true or false"),
}


@pytest.mark.parametrize("field", sorted(BOUNDS))
def test_bounds(field: str) -> None:
    accepted, rejected, allowed = BOUNDS[field]
    for value in accepted:
        assert getattr(GenerationParams(**{field: value}), field) == value
    for value in rejected:
        with pytest.raises(ValidationError) as raised:
            GenerationParams(**{field: value})
        assert raised.value.param == field
        assert field in raised.value.message and allowed in raised.value.message and repr(value) in raised.value.message


def test_defaults_are_the_seed_ones() -> None:
    params = GenerationParams()
    assert (params.max_tokens, params.temperature, params.top_p) == (100, 1.0, 0.9)


def test_max_tokens_zero_only_scores_the_prompt() -> None:
    assert GenerationParams(max_tokens=0, prompt_logprobs=0).max_tokens == 0
    with pytest.raises(ValidationError, match="max_tokens must be at least 1, got 0.*prompt_logprobs") as raised:
        GenerationParams(max_tokens=0)
    assert raised.value.param == "max_tokens"


def test_stop_strings() -> None:
    assert GenerationParams(stop="END").stop == ("END",)
    assert GenerationParams(stop=["a", "b"]).stop == ("a", "b")
    for bad in ([""], [3], ["x"] * 17, ["ok", "lone \ud800 surrogate"]):
        with pytest.raises(ValidationError, match="stop"):
            GenerationParams(stop=bad)
    with pytest.raises(ValidationError, match="stop_token_ids"):
        GenerationParams(stop_token_ids=[-1])


def test_from_mapping_names_unknown_keys() -> None:
    with pytest.raises(ValidationError, match="unknown generation parameter.*temprature") as raised:
        GenerationParams.from_mapping({"temprature": 0.5})
    assert raised.value.param == "temprature"


@given(
    max_tokens=st.integers(1, 4096),
    temperature=st.floats(0, 2),
    top_p=st.floats(0, 1, exclude_min=True),
    top_k=st.one_of(st.none(), st.integers(1, 1000)),
    n=st.integers(1, 64),
)
def test_every_value_in_range_is_accepted(max_tokens, temperature, top_p, top_k, n) -> None:
    params = GenerationParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k, n=n)
    assert params.is_greedy == (temperature < 1e-5)


def test_tiny_temperatures_are_greedy() -> None:
    assert GenerationParams(temperature=1e-38).is_greedy and GenerationParams(temperature=0).is_greedy
    assert not GenerationParams(temperature=1e-5).is_greedy


def test_stop_token_ids_are_bounded() -> None:
    with pytest.raises(ValidationError, match="stop_token_ids"):
        GenerationParams(stop_token_ids=[2**31])
    with pytest.raises(ValidationError, match="at most 64"):
        GenerationParams(stop_token_ids=list(range(65)))


@pytest.mark.parametrize("values", [None, [("temperature", 1)], {1: 2}, "temperature=0"])
def test_from_mapping_rejects_what_is_not_a_mapping_of_names(values) -> None:
    with pytest.raises(ValidationError, match="mapping"):
        GenerationParams.from_mapping(values)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=6,
)


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(values=st.dictionaries(st.sampled_from(sorted(attrs.fields_dict(GenerationParams))), json_values, max_size=4))
def test_any_json_is_either_valid_params_or_a_validation_error(values) -> None:
    """What a client can send never surfaces as a TypeError or an AttributeError."""
    try:
        params = GenerationParams.from_mapping(values)
    except ValidationError as exc:
        assert exc.param in attrs.fields_dict(GenerationParams) or exc.param in ("stop", "min_tokens")
    else:
        assert params.max_tokens >= 1 or params.prompt_logprobs is not None
