"""Verifying a speculator's proposals in the shared sampling stage: exactly plain sampling's distribution.

The exact test enumerates every outcome of every draw on a three-token
vocabulary: the sampler's one random step (``Sampler._draw``) is replaced by
a scripted one that records the probabilities each row was drawn from, and a
depth-first search replays generation with every script that has non-zero
probability. The probability of an output is the sum over the scripts that
produce it of the product of the chosen tokens' probabilities; for plain and
speculative decoding these must be equal, sequence by sequence.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Callable

import numpy as np
import pytest
import torch

from hetero_core.batch import ScheduledSequence
from hetero_core.params import GenerationParams
from hetero_core.structured_output import new_bitmask
from hetero_executor_torch.sampling import Sampler, sample_and_verify

VOCAB = 3
EOS = 2
PROMPT = [0, 1]
TABLE = torch.randn((VOCAB, VOCAB, VOCAB), generator=torch.Generator().manual_seed(7)) * 1.5


def logits_after(tokens: list[int]) -> torch.Tensor:
    """The toy model: logits that depend on the last two tokens."""
    return TABLE[tokens[-2], tokens[-1]]


class ScriptedSampler(Sampler):
    """Draws the tokens a script names (then the first possible one), recording each row's probabilities."""

    def __init__(self, script: list[int]) -> None:
        super().__init__(VOCAB, eos_token_ids=(EOS,))
        self.script = script
        self.draws: list[list[float]] = []

    def _draw(self, probs: torch.Tensor, seqs: list[ScheduledSequence]) -> torch.Tensor:
        tokens = []
        for row in probs.double().tolist():
            index = len(self.draws)
            self.draws.append(row)
            tokens.append(self.script[index] if index < len(self.script) else next(t for t, p in enumerate(row) if p))
        return torch.tensor(tokens)


def scheduled(tokens: list[int], params: GenerationParams, proposed: list[int], seed: int | None = None):
    return ScheduledSequence(
        seq_id=0,
        token_ids=[tokens[-1], *proposed],
        start_position=len(tokens) - 1,
        block_table=[0],
        do_sample=True,
        params=params,
        all_token_ids=list(tokens),
        num_prompt_tokens=len(PROMPT),
        seed=seed,
        num_proposed=len(proposed),
    )


Proposer = Callable[[list[int], int], list[int]]


def generate(sampler: Sampler, params: GenerationParams, length: int, propose: Proposer | None) -> tuple[int, ...]:
    """``length`` tokens after PROMPT, a step at a time, with or without proposals."""
    tokens = list(PROMPT)
    while len(tokens) - len(PROMPT) < length:
        room = length - (len(tokens) - len(PROMPT)) - 1
        proposed = propose(tokens, room) if propose and room else []
        rows = torch.stack([logits_after(tokens + proposed[:j]) for j in range(len(proposed) + 1)])
        output = sample_and_verify(sampler, rows, [scheduled(tokens, params, proposed, params.seed)])
        assert not output.errors
        kept = output.num_accepted.get(0, 0)
        assert kept <= len(proposed)
        tokens += [*proposed[:kept], output.sampled_token_ids[0]]
    return tuple(tokens[len(PROMPT) :])


def distribution(params: GenerationParams, length: int, propose: Proposer | None) -> dict[tuple[int, ...], float]:
    """Every output of ``length`` tokens with its exact probability, by enumerating the draws."""
    found: dict[tuple[int, ...], float] = defaultdict(float)

    def explore(script: list[int]) -> None:
        sampler = ScriptedSampler(script)
        output = generate(sampler, params, length, propose)
        if len(sampler.draws) > len(script):  # a draw the script does not name: branch on it
            for token, probability in enumerate(sampler.draws[len(script)]):
                if probability > 0:
                    explore([*script, token])
            return
        found[output] += math.prod(draw[token] for draw, token in zip(sampler.draws, script, strict=True))

    explore([])
    return dict(found)


PROPOSERS: dict[str, Proposer] = {
    "next-ids": lambda tokens, room: [(tokens[-1] + 1 + j) % VOCAB for j in range(min(2, room))],
    "zeros": lambda tokens, room: [0] * min(2, room),
    "one-eos": lambda tokens, room: [EOS][:room],
}
PARAMS = {
    "temperature": GenerationParams(temperature=0.9, max_tokens=8),
    "top-k": GenerationParams(temperature=1.2, top_k=2, max_tokens=8),
    "top-p": GenerationParams(temperature=1.0, top_p=0.7, max_tokens=8),
    "penalties": GenerationParams(
        temperature=1.0, repetition_penalty=1.5, presence_penalty=0.5, frequency_penalty=0.3, max_tokens=8
    ),
    "min-tokens": GenerationParams(temperature=1.0, min_tokens=2, max_tokens=8),
    "bias": GenerationParams(temperature=0.8, logit_bias={1: 1.5}, max_tokens=8),
}


@pytest.mark.parametrize(
    ("params_name", "proposer"),
    [("temperature", name) for name in PROPOSERS] + [(name, "next-ids") for name in PARAMS if name != "temperature"],
)
def test_speculative_sampling_has_plain_samplings_distribution(params_name: str, proposer: str) -> None:
    params = PARAMS[params_name]
    plain = distribution(params, 3, None)
    speculative = distribution(params, 3, PROPOSERS[proposer])
    assert math.isclose(sum(plain.values()), 1.0, abs_tol=1e-6)
    assert plain.keys() == speculative.keys()
    for output, probability in plain.items():  # float32 softmax rows round alike up to an ulp or two
        assert speculative[output] == pytest.approx(probability, rel=1e-6, abs=1e-9), output


def test_a_seeded_request_gets_the_same_tokens_with_and_without_proposals() -> None:
    proposers = list(PROPOSERS.values())
    for seed in range(40):
        params = GenerationParams(temperature=1.0, seed=seed, max_tokens=8)
        plain = generate(Sampler(VOCAB, eos_token_ids=(EOS,)), params, 6, None)
        for propose in proposers:
            assert generate(Sampler(VOCAB, eos_token_ids=(EOS,)), params, 6, propose) == plain


def test_each_position_takes_its_own_mask_row_and_logprobs_follow_the_kept_tokens() -> None:
    masks = new_bitmask(3, VOCAB)
    masks[0, 0], masks[1, 0], masks[2, 0] = 0b010, 0b011, 0b110  # {1}, then {0, 1}, then {1, 2}
    rows = torch.stack([logits_after([0, 1]), logits_after([0, 1, 1]), logits_after([0, 1, 1, 0])])
    rows[1, 0], rows[1, 2] = 9.0, 20.0  # 0 wins at the second position only through its mask row
    rows[2, 2], rows[2, 0] = 9.0, 20.0  # and 2 at the third
    params = GenerationParams(temperature=0.0, logprobs=2, max_tokens=8)
    seq = scheduled([0, 1], params, [1, 0])
    seq.allowed_tokens = masks
    output = sample_and_verify(Sampler(VOCAB), rows, [seq])
    assert output.num_accepted == {0: 2} and output.sampled_token_ids == {0: 2}
    assert [e.token_id for e in output.accepted_logprobs[0]] == [1, 0] and output.logprobs[0].token_id == 2
    for entry, row, mask in zip([*output.accepted_logprobs[0], output.logprobs[0]], rows, masks, strict=True):
        allowed = torch.tensor([bool(int(mask[0]) >> t & 1) for t in range(VOCAB)])
        expected = torch.log_softmax(row.masked_fill(~allowed, float("-inf")), dim=-1)[entry.token_id].item()
        assert entry.logprob == pytest.approx(expected, abs=1e-5)  # of the position's masked distribution


def test_a_row_that_cannot_be_sampled_fails_only_its_sequence() -> None:
    params = GenerationParams(temperature=0.0, max_tokens=8)
    broken = scheduled([0, 1], params, [1, 1])
    healthy = scheduled([1, 0], params, [2])
    healthy.seq_id = 5
    rows = torch.stack(
        [
            logits_after([0, 1]),
            torch.full((VOCAB,), float("nan")),
            logits_after([0, 1, 1, 1]),
            logits_after([1, 0]),
            logits_after([1, 0, 2]),
        ]
    )
    output = sample_and_verify(Sampler(VOCAB), rows, [broken, healthy])
    greedy_first = int(np.argmax(logits_after([0, 1]).numpy()))
    if greedy_first == 1:  # the first proposal is kept, and the row after it is broken
        assert 0 in output.errors and 0 not in output.sampled_token_ids
    else:  # rejected at once: the broken row is never used
        assert output.sampled_token_ids[0] == greedy_first and output.num_accepted[0] == 0
    assert 5 in output.sampled_token_ids and 5 not in output.errors
