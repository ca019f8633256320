"""On the torch executor, a sequence that cannot be sampled fails alone; the batch's others are untouched."""

from __future__ import annotations

import pytest

from hetero_core.errors import ValidationError
from hetero_core.params import GenerationParams
from hetero_core.sequence import FinishReason

from .conftest import tiny_engine

PROMPTS = ["The first prompt", "a second, longer prompt that spans several blocks", "x"]
GREEDY = GenerationParams(temperature=0.0, max_tokens=8, ignore_eos=True)
FRAGILE_SEED = 666


def test_a_sequence_the_sampler_cannot_handle_fails_alone(tiny_model) -> None:
    engine = tiny_engine(tiny_model)
    alone = [engine.generate([p], GREEDY)[0].generated_tokens for p in PROMPTS]
    sampler = engine.executor.sampler

    def fragile(logits, seqs):  # what a too-large top_k did to the whole batch before parameters were bounded
        if any(s.params.seed == FRAGILE_SEED for s in seqs):
            raise OverflowError("Overflow when unpacking long long")
        return sampler(logits, seqs)

    engine.executor.sampler = fragile
    bad = engine.submit_request("fragile", GenerationParams(temperature=0.5, max_tokens=8, seed=FRAGILE_SEED))
    ids = [engine.submit_request(p, GREEDY) for p in PROMPTS]
    records = {r.request_id: r for r in engine.run()}
    assert records[bad].finish_reason is FinishReason.ERROR
    assert records[bad].error == "sampling failed for this sequence's parameters"  # no internal text
    assert [records[i].generated_tokens for i in ids] == alone
    assert engine.get_memory_stats().used_blocks == 0


def test_non_finite_logits_fail_only_their_sequence(tiny_model) -> None:
    engine = tiny_engine(tiny_model)
    alone = engine.generate([PROMPTS[0]], GREEDY)[0].generated_tokens
    model = engine.executor.model
    logits = model.logits

    def poisoned(hidden):
        out = logits(hidden)
        if out.shape[0] > 1:  # the first step prefills both prompts: poison the later one's row
            out[-1, 0] = float("nan")
        return out

    model.logits = poisoned
    good = engine.submit_request(PROMPTS[0], GREEDY)
    bad = engine.submit_request(PROMPTS[2], GREEDY)
    records = {r.request_id: r for r in engine.run()}
    assert records[bad].error == "the model produced non-finite logits for this sequence"
    assert records[good].generated_tokens == alone


def test_parameters_beyond_the_vocabulary_are_refused_before_they_run(tiny_model) -> None:
    engine = tiny_engine(tiny_model)
    with pytest.raises(ValidationError, match="top_k"):
        GenerationParams(top_k=9223372036854775808)
    with pytest.raises(ValidationError, match="top_k must be at most the vocabulary size 259"):
        engine.submit_request("x", GenerationParams(top_k=260))
    assert not engine.has_pending_work()
