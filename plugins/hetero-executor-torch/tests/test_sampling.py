"""The sampler against plain references: truncation sets, penalties, logprobs, seeds, frequencies."""

from __future__ import annotations

import math

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hetero_core.batch import ScheduledSequence
from hetero_core.params import GenerationParams
from hetero_executor_torch.sampling import Sampler, argmax_rows, sample_each_alone_on_failure

VOCAB = 16


def seq(
    params: GenerationParams, history: list[int] | None = None, *, seq_id: int = 0, prompt: int = 1, seed=None
) -> ScheduledSequence:
    tokens = history if history is not None else [0]
    return ScheduledSequence(
        seq_id,
        tokens[-1:],
        len(tokens) - 1,
        [0],
        True,
        params,
        tokens,
        prompt,
        seed if seed is not None else params.seed,
    )


def allowed_tokens(logits: np.ndarray, params: GenerationParams) -> set[int]:
    """The reference: which tokens temperature + top-k + top-p + min-p leave."""
    scaled = logits / params.temperature
    order = sorted(range(len(scaled)), key=lambda i: -scaled[i])
    keep = order[: params.top_k or len(order)]
    probs = np.exp(scaled[keep] - scaled[keep].max())
    probs /= probs.sum()
    kept, mass = [], 0.0
    for token, p in zip(keep, probs, strict=True):
        if mass >= params.top_p - 1e-6 and kept:
            break
        if p < params.min_p * probs[0] - 1e-9 and kept:
            continue
        kept.append(token)
        mass += p
    return set(kept)


logit_rows = st.lists(st.floats(-8, 8, allow_nan=False).map(lambda x: round(x, 2)), min_size=VOCAB, max_size=VOCAB)


@settings(max_examples=200, deadline=None)
@given(
    logits=logit_rows,
    temperature=st.sampled_from([0.3, 1.0, 1.7]),
    top_k=st.one_of(st.none(), st.integers(1, VOCAB)),
    top_p=st.sampled_from([0.1, 0.5, 0.9, 1.0]),
    min_p=st.sampled_from([0.0, 0.05, 0.3]),
    seed=st.integers(0, 10_000),
)
def test_truncation_never_emits_a_token_outside_the_allowed_set(logits, temperature, top_k, top_p, min_p, seed) -> None:
    params = GenerationParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed)
    row = np.array(logits, dtype=np.float32)
    if len(set(np.round(row / temperature, 3))) < VOCAB:  # ties make "the top k" ambiguous
        return
    tokens, _ = Sampler(VOCAB)(torch.from_numpy(row[None]), [seq(params)])
    assert tokens[0] in allowed_tokens(row, params)


def test_greedy_is_argmax_and_skips_padded_vocabulary() -> None:
    logits = torch.randn(4, VOCAB + 5, generator=torch.Generator().manual_seed(0))
    logits[:, VOCAB:] = 100.0  # padding columns must never win
    tokens, logprobs = Sampler(VOCAB)(logits, [seq(GenerationParams(temperature=0.0), seq_id=i) for i in range(4)])
    assert tokens == logits[:, :VOCAB].argmax(-1).tolist() and logprobs == {}


def test_penalties_follow_their_definitions() -> None:
    logits = torch.tensor([[2.0, -2.0, 1.0, 0.5] + [0.0] * (VOCAB - 4)])
    params = GenerationParams(
        temperature=0.0, repetition_penalty=2.0, presence_penalty=0.5, frequency_penalty=0.25, logprobs=VOCAB
    )
    history = [0, 1, 2, 2]  # prompt [0, 1]; output [2, 2]
    tokens, logprobs = Sampler(VOCAB)(logits, [seq(params, history, prompt=2)])
    expected = logits[0].clone()
    expected[0], expected[1] = 2.0 / 2, -2.0 * 2  # repetition: prompt and output tokens
    expected[2] = 1.0 / 2 - 0.5 - 0.25 * 2  # and presence/frequency over the output only
    reference = torch.log_softmax(expected, -1)
    got = dict(logprobs[0].top)
    for token in range(VOCAB):
        assert math.isclose(got[token], float(reference[token]), abs_tol=1e-5)
    assert tokens[0] == int(expected.argmax())


def test_logprobs_are_sorted_and_sized() -> None:
    logits = torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(1))
    tokens, logprobs = Sampler(VOCAB)(
        logits,
        [
            seq(GenerationParams(temperature=0.0, logprobs=3), seq_id=7),
            seq(GenerationParams(temperature=0.0), seq_id=8),
        ],
    )
    assert set(logprobs) == {7}
    top = logprobs[7].top
    assert len(top) == 3 and [v for _, v in top] == sorted((v for _, v in top), reverse=True)
    assert logprobs[7].token_id == tokens[0] == top[0][0]
    assert math.isclose(logprobs[7].logprob, float(torch.log_softmax(logits[0], -1).max()), abs_tol=1e-6)


def test_seeded_rows_do_not_depend_on_the_batch() -> None:
    generator = torch.Generator().manual_seed(2)
    target = torch.randn(VOCAB, generator=generator)
    params = GenerationParams(temperature=1.0, top_p=1.0, seed=99)
    alone, _ = Sampler(VOCAB, default_seed=1)(target[None], [seq(params)])
    others = torch.randn(3, VOCAB, generator=generator)
    batch = torch.cat([others[:2], target[None], others[2:]])
    rows = [
        seq(GenerationParams(temperature=1.0), seq_id=1),
        seq(GenerationParams(temperature=0.0), seq_id=2),
        seq(params, seq_id=3),
        seq(GenerationParams(temperature=0.7), seq_id=4),
    ]
    together, _ = Sampler(VOCAB, default_seed=5)(batch, rows)
    assert together[2] == alone[0]


def test_different_seeds_explore_the_distribution() -> None:
    logits = torch.zeros(1, VOCAB)
    draws = {
        Sampler(VOCAB)(logits, [seq(GenerationParams(temperature=1.0, top_p=1.0, seed=s))])[0][0] for s in range(200)
    }
    assert len(draws) > VOCAB // 2


def test_frequencies_follow_softmax_with_temperature() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0] + [-30.0] * (VOCAB - 4)])
    temperature = 0.8
    sampler = Sampler(VOCAB, default_seed=3)
    params = GenerationParams(temperature=temperature, top_p=1.0)
    draws = 4000
    rows = [seq(params, seq_id=i) for i in range(draws)]
    tokens, _ = sampler(logits.expand(draws, VOCAB), rows)
    observed = np.bincount(tokens, minlength=VOCAB)[:4] / draws
    expected = torch.softmax(logits[0] / temperature, -1)[:4].numpy()
    assert np.abs(observed - expected).max() < 0.03


def test_min_tokens_blocks_eos_and_stop_tokens() -> None:
    logits = torch.zeros(1, VOCAB)
    logits[0, 5] = 10.0  # eos
    logits[0, 6] = 9.0  # a stop token
    params = GenerationParams(temperature=0.0, min_tokens=3, stop_token_ids=[6])
    tokens, _ = Sampler(VOCAB, eos_token_ids=(5,))(logits, [seq(params, [0, 1], prompt=1)])
    assert tokens[0] not in (5, 6)
    done, _ = Sampler(VOCAB, eos_token_ids=(5,))(logits, [seq(params, [0, 1, 2, 3], prompt=1)])
    assert done[0] == 5


def test_a_row_that_cannot_be_sampled_fails_alone() -> None:
    """Non-finite logits, or parameters that break the sampler, are that sequence's error; the rest are sampled."""
    sampler = Sampler(VOCAB)
    logits = torch.randn(4, VOCAB)
    logits[1, 3] = float("nan")
    broken = GenerationParams(temperature=1.0)
    object.__setattr__(broken, "top_k", 2**63)  # what validation now refuses: it overflowed the whole batch
    seqs = [seq(GenerationParams(temperature=0.0), seq_id=i) for i in range(3)] + [seq(broken, seq_id=3)]
    out = sample_each_alone_on_failure(sampler, logits, seqs)
    assert set(out.errors) == {1, 3} and "non-finite" in out.errors[1]
    assert out.sampled_token_ids == {0: int(logits[0].argmax()), 2: int(logits[2].argmax())}


def test_tiny_temperature_is_greedy_and_tiny_penalties_stay_finite() -> None:
    sampler = Sampler(VOCAB)
    logits = torch.randn(1, VOCAB)
    tokens, _ = sampler(logits, [seq(GenerationParams(temperature=1e-38))])
    assert tokens == [int(logits[0].argmax())]
    params = GenerationParams(temperature=1.0, repetition_penalty=0.01, logprobs=VOCAB, min_tokens=2)
    out = sample_each_alone_on_failure(
        Sampler(VOCAB, eos_token_ids=(0,)), logits, [seq(params, [0, 1, 2, 0], prompt=4)]
    )  # EOS blocked: -inf
    entry = out.logprobs[0]
    assert all(math.isfinite(lp) and lp <= 0 for lp in [entry.logprob, *(lp for _, lp in entry.top)])


@settings(max_examples=150, deadline=None)
@given(
    logits=logit_rows,
    temperature=st.sampled_from([0.0, 1e-38, 1e-6, 0.5, 2.0]),
    top_k=st.one_of(st.none(), st.integers(1, VOCAB)),
    top_p=st.sampled_from([1e-9, 0.5, 1.0]),
    min_p=st.sampled_from([0.0, 0.5, 1.0]),
    repetition_penalty=st.sampled_from([0.01, 0.5, 1.0, 2.0]),
    penalty=st.sampled_from([-2.0, 0.0, 2.0]),
    min_tokens=st.integers(0, 3),
    history=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=6),
)
def test_every_valid_parameter_set_samples_a_token_with_finite_logprobs(
    logits, temperature, top_k, top_p, min_p, repetition_penalty, penalty, min_tokens, history
) -> None:
    params = GenerationParams(
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        min_p=min_p,
        repetition_penalty=repetition_penalty,
        presence_penalty=penalty,
        frequency_penalty=penalty,
        min_tokens=min_tokens,
        max_tokens=4,
        logprobs=VOCAB,
    )
    out = sample_each_alone_on_failure(
        Sampler(VOCAB, eos_token_ids=(0,)), torch.tensor([logits]), [seq(params, history)]
    )
    assert out.errors == {} and 0 <= out.sampled_token_ids[0] < VOCAB
    entry = out.logprobs[0]
    assert all(math.isfinite(lp) and lp <= 0.0 for lp in [entry.logprob, *(lp for _, lp in entry.top)])


@settings(max_examples=50, deadline=None)
@given(rows=st.integers(0, 40), width=st.integers(1, 3000), levels=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_argmax_rows_picks_the_first_largest_as_argmax_does(rows: int, width: int, levels: int, seed: int) -> None:
    """Few distinct values, so most rows hold their maximum several times."""
    values = torch.randint(0, levels, (rows, width), generator=torch.Generator().manual_seed(seed)).float()
    assert torch.equal(argmax_rows(values), values.argmax(dim=-1))


@settings(max_examples=30, deadline=None)
@given(
    vocab=st.integers(1, 100),
    constrained=st.lists(st.booleans(), min_size=1, max_size=6),
    bf16=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_masks_apply_to_their_rows_only(vocab, constrained, bf16, seed) -> None:
    """Against a bit-by-bit reference: all rows or some constrained, the model's dtype,
    a vocabulary past the mask's width."""
    rng = np.random.default_rng(seed)
    num_words = max(1, (vocab - 40 + 31) // 32)  # the tokenizer's ids; the model's beyond the mask are never allowed
    bitmask = rng.integers(-(2**31), 2**31, size=(len(constrained), num_words), dtype=np.int64).astype(np.int32)
    logits = torch.randn(len(constrained), vocab, generator=torch.Generator().manual_seed(seed))
    logits = logits.bfloat16() if bf16 else logits
    rows = []
    for i, is_constrained in enumerate(constrained):
        row = seq(GenerationParams(temperature=0.0, logprobs=1), seq_id=i)
        row.allowed_tokens = bitmask[i] if is_constrained else None
        rows.append(row)
    tokens, logprobs = Sampler(vocab)(logits, rows)
    for i, is_constrained in enumerate(constrained):
        allowed = [
            t
            for t in range(vocab)
            if not is_constrained or (t < 32 * num_words and (int(bitmask[i, t // 32]) >> (t % 32)) & 1)
        ]
        if not allowed:
            continue  # nothing allowed: the boundary, not the sampler, fails such a row
        assert tokens[i] in allowed and logprobs[i].token_id == tokens[i]
        assert float(logits[i, tokens[i]]) == max(float(logits[i, t]) for t in allowed)  # ties: any of the best
