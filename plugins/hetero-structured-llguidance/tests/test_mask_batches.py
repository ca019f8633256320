"""A step's masks filled together (``fill_bitmasks``): the same rows as one matcher at a time,
and a failing matcher fails alone."""

from __future__ import annotations

import random

import numpy as np
import pytest

from hetero_core.structured_output import StructuredOutput, allowed_token_ids, new_bitmask
from hetero_structured_llguidance import LLGuidanceBackend

from .test_json_schemas import SCHEMAS

CONSTRAINTS = [
    *(StructuredOutput.json_schema(schema) for schema in SCHEMAS.values()),
    StructuredOutput.regex(r"[a-z]{1,8}(-[0-9]{2})?"),
    StructuredOutput.choice(["alpha", "beta", "gamma delta"]),
    StructuredOutput.json_object(),
]


def one_by_one(matchers, vocab_size: int) -> np.ndarray:
    bitmask = new_bitmask(len(matchers), vocab_size)
    for row, matcher in enumerate(matchers):
        matcher.fill_bitmask(bitmask, row)
    return bitmask


@pytest.mark.parametrize("mask_threads", [1, 2, 4])
def test_masks_filled_together_equal_masks_filled_one_by_one(tokenizer, mask_threads) -> None:
    """Samples of every test schema, each at its own point of a random walk, along 12 steps (inside strings too)."""
    backend = LLGuidanceBackend(tokenizer, mask_threads=mask_threads)
    matchers = [backend.new_matcher(backend.compile(constraint)) for constraint in CONSTRAINTS * 2]
    rng = random.Random(mask_threads)
    eos = tokenizer.eos_token_id
    for step in range(12):
        together = new_bitmask(len(matchers), tokenizer.vocab_size)
        together[:] = 0
        assert backend.fill_bitmasks(matchers, together) == [None] * len(matchers)
        assert np.array_equal(together, one_by_one(matchers, tokenizer.vocab_size)), step
        for row, matcher in enumerate(matchers):
            allowed = [t for t in allowed_token_ids(together[row], tokenizer.vocab_size).tolist() if t != eos]
            if allowed and not matcher.is_finished:
                assert matcher.accept_token(rng.choice(allowed))


def test_a_failed_matcher_fails_alone_in_its_batch(backend, tokenizer) -> None:
    constraint = StructuredOutput.choice(["yes", "no"])
    matchers = [backend.new_matcher(backend.compile(constraint)) for _ in range(3)]
    matchers[1]._matcher.consume_token(0)  # taken behind the backend's back: the matcher is now in error
    bitmask = new_bitmask(3, tokenizer.vocab_size)
    problems = backend.fill_bitmasks(matchers, bitmask)
    assert problems[0] is None and problems[2] is None
    assert problems[1].startswith("the grammar matcher failed:")
    expected = one_by_one([matchers[0]], tokenizer.vocab_size)[0]
    assert np.array_equal(bitmask[0], expected) and np.array_equal(bitmask[2], expected)


def test_a_bitmask_of_the_wrong_shape_is_refused(backend, tokenizer) -> None:
    matchers = [backend.new_matcher(backend.compile(StructuredOutput.json_object())) for _ in range(2)]
    with pytest.raises(ValueError, match="2 rows of"):
        backend.fill_bitmasks(matchers, new_bitmask(3, tokenizer.vocab_size))
    with pytest.raises(ValueError, match="contiguous int32"):
        backend.fill_bitmasks(matchers, new_bitmask(2, tokenizer.vocab_size + 64)[:, :-2])
