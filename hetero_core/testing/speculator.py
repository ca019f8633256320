"""Contract tests for speculators (:class:`hetero_core.speculation.Speculator`).

Subclass :class:`SpeculatorContract` and override the ``make_speculator``
fixture to return a factory of fresh speculators, and ``vocab_size`` with the
vocabulary its proposals come from. The checks call it as the engine does:
``propose`` for a few decoding sequences, ``observe`` with how many were
kept, ``free`` when a sequence ends::

    class TestMySpeculator(SpeculatorContract):
        vocab_size = 259

        @pytest.fixture
        def make_speculator(self):
            return lambda: MySpeculator(k=4)
"""

from __future__ import annotations

import random
from typing import Callable

import pytest

from hetero_core.speculation import ProposalRequest, Speculator

MakeSpeculator = Callable[[], Speculator]


def repeating_tokens(rng: random.Random, vocab_size: int, length: int) -> list[int]:
    """A random text made of a few phrases repeated, so that lookups find matches."""
    phrases = [[rng.randrange(vocab_size) for _ in range(rng.randint(2, 6))] for _ in range(4)]
    tokens: list[int] = []
    while len(tokens) < length:
        tokens += rng.choice(phrases)
    return tokens[:length]


def drive(speculator: Speculator, sequences: dict[int, list[int]], max_proposals: int, steps: int, seed: int) -> list:
    """Run ``steps`` engine-like steps over ``sequences`` (grown in place); every proposal made, in order."""
    rng = random.Random(seed)
    made = []
    for _ in range(steps):
        requests = [ProposalRequest(seq_id, tokens, 4, max_proposals) for seq_id, tokens in sequences.items()]
        proposals = speculator.propose(requests)
        made.append(proposals)
        for request, proposal in zip(requests, proposals, strict=True):
            kept = rng.randint(0, len(proposal))
            sequences[request.seq_id] += [*proposal[:kept], rng.randrange(4)]
            if proposal:
                speculator.observe(request.seq_id, len(proposal), kept)
    return made


class SpeculatorContract:
    """What every speculator must do."""

    vocab_size: int = 0  # override: the vocabulary the speculator's proposals come from

    @pytest.fixture
    def make_speculator(self) -> MakeSpeculator:
        raise NotImplementedError("override the make_speculator fixture")

    def test_proposals_are_vocabulary_ids_within_the_bound(self, make_speculator: MakeSpeculator) -> None:
        speculator = make_speculator()
        rng = random.Random(0)
        for max_proposals in (1, 3, 8):
            sequences = {i: repeating_tokens(rng, self.vocab_size, rng.randint(2, 40)) for i in range(4)}
            for proposals in drive(speculator, sequences, max_proposals, steps=6, seed=max_proposals):
                assert isinstance(proposals, list) and len(proposals) == len(sequences)
                for proposal in proposals:
                    assert isinstance(proposal, list) and len(proposal) <= max_proposals
                    assert all(isinstance(t, int) and 0 <= t < self.vocab_size for t in proposal)
            for seq_id in sequences:
                speculator.free(seq_id)
        speculator.close()

    def test_proposals_depend_only_on_the_calls(self, make_speculator: MakeSpeculator) -> None:
        rng = random.Random(1)
        start = {i: repeating_tokens(rng, self.vocab_size, 30 + i) for i in range(3)}
        runs = []
        for _ in range(2):
            speculator = make_speculator()
            runs.append(drive(speculator, {i: list(t) for i, t in start.items()}, 5, steps=8, seed=7))
            speculator.close()
        assert runs[0] == runs[1]

    def test_a_repeated_text_is_proposed_eventually(self, make_speculator: MakeSpeculator) -> None:
        """Speculation is for text that repeats: a sequence repeating one phrase gets proposals."""
        speculator = make_speculator()
        phrase = [5, 9, 2, 7, 3, 8]
        tokens = phrase * 6
        got = []
        for _ in range(4):
            [proposal] = speculator.propose([ProposalRequest(0, tokens, 6, 4)])
            got.append(proposal)
            kept = 0
            while kept < len(proposal) and proposal[kept] == phrase[(len(tokens) + kept) % len(phrase)]:
                kept += 1
            tokens = tokens + proposal[:kept] + [phrase[(len(tokens) + kept) % len(phrase)]]
            if proposal:
                speculator.observe(0, len(proposal), kept)
        assert any(got), "no proposal for a text that repeats one phrase"
        speculator.close()

    def test_unknown_and_freed_sequences_are_harmless(self, make_speculator: MakeSpeculator) -> None:
        speculator = make_speculator()
        speculator.free(12345)
        speculator.observe(12345, 3, 1)
        tokens = [1, 2, 3, 1, 2, 3, 1, 2]
        first = speculator.propose([ProposalRequest(7, tokens, 2, 4)])
        speculator.free(7)
        assert speculator.propose([ProposalRequest(7, list(tokens), 2, 4)]) == first  # a new sequence, same start
        speculator.free(7)
        assert speculator.propose([]) == []
        speculator.close()
