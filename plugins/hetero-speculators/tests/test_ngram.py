"""The ``ngram`` speculator: its contract, what it proposes, and how its bound adapts."""

from __future__ import annotations

import pytest

from hetero_core.errors import ConfigError
from hetero_core.plugins import ComponentRegistry, create_plugin_manager
from hetero_core.speculation import ProposalRequest
from hetero_core.testing import SpeculatorContract
from hetero_speculators.ngram import FIRST_PAUSE, NgramSpeculator


class TestNgramContract(SpeculatorContract):
    vocab_size = 259

    @pytest.fixture
    def make_speculator(self):
        return lambda: NgramSpeculator(k=5)


def propose(speculator: NgramSpeculator, tokens: list[int], max_proposals: int = 8, seq_id: int = 0) -> list[int]:
    return speculator.propose([ProposalRequest(seq_id, tokens, 1, max_proposals)])[0]


def test_the_longest_suffix_match_wins_and_its_latest_occurrence() -> None:
    speculator = NgramSpeculator(k=4, min_ngram=1, max_ngram=3)
    #        0  1  2  3  4  5  6  7  8  9 10 11
    tokens = [1, 2, 3, 9, 9, 2, 3, 7, 7, 1, 2, 3]
    # "1 2 3" occurred at 0..2 (followed by 9 9 2 3); "2 3" last occurred at 5..6 (followed by 7 7 1 2)
    assert propose(speculator, tokens) == [9, 9, 2, 3]


def test_no_match_no_proposal_and_the_bound_is_the_requests() -> None:
    speculator = NgramSpeculator(k=8, min_ngram=2)
    assert propose(speculator, [1, 2, 3, 4, 5]) == []
    assert propose(speculator, [1, 2, 3, 1, 2], max_proposals=2, seq_id=1) == [3, 1]


def test_the_index_grows_with_the_sequence() -> None:
    speculator = NgramSpeculator(k=3, min_ngram=2, max_ngram=2)
    tokens = [4, 5, 6, 7]
    assert propose(speculator, tokens) == []
    tokens += [8, 4, 5]
    assert propose(speculator, tokens) == [6, 7, 8]


def test_the_bound_adapts_and_failures_pause_proposals() -> None:
    speculator = NgramSpeculator(k=7, min_ngram=1, max_ngram=1, patience=2)
    tokens = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1]
    assert propose(speculator, tokens) == [2, 3, 4, 5, 6, 7, 8]
    speculator.observe(0, 7, 4)  # four kept: the bound drops to 5
    tokens += [2, 3, 4, 5, 6]  # the four kept, and the model's token: the copied one (it ends the proposal)
    assert propose(speculator, tokens) == [7, 8, 9, 1, 2]  # the copy goes on
    speculator.observe(0, 5, 5)  # all kept: it grows by 2
    tokens += [7, 8, 9, 1, 2, 3]
    assert propose(speculator, tokens) == [4, 5, 6, 7, 8, 9, 1]
    speculator.observe(0, 7, 0)  # none kept (the model wrote 40): the bound drops to its floor
    tokens += [40]
    assert propose(speculator, tokens) == [5, 6, 7]  # an edit: 40 in place of 4, the copy goes on after it
    speculator.observe(0, 3, 0)  # `patience` failures in a row: a pause
    assert [propose(speculator, tokens) for _ in range(FIRST_PAUSE)] == [[]] * FIRST_PAUSE
    assert propose(speculator, [*tokens, 1]) == [2, 3, 40]


def test_after_an_edit_the_copy_goes_on_and_the_next_token_tells_which_edit() -> None:
    speculator = NgramSpeculator(k=4, min_ngram=2, max_ngram=2)
    # a record copied over several lines: a line break (9) before each field the prompt separates with 8
    tokens = [8, 1, 2, 8, 3, 4, 8, 5, 6, 8, 7, 7, 0, 1, 2]
    assert propose(speculator, tokens) == [8, 3, 4, 8]
    speculator.observe(0, 4, 3)  # three kept, then the model wrote 9 before 8: taken as 9 in place of 8 first
    tokens += [8, 3, 4, 9]
    assert propose(speculator, tokens) == [5, 6, 8, 7]
    speculator.observe(0, 4, 0)  # wrong: the model wrote the 8 that 9 was taken to replace
    tokens += [8]
    assert propose(speculator, tokens) == [5, 6, 8]  # 9 went before it: the copy goes on after it
    speculator.observe(0, 3, 2)  # the model wrote 9 again, before the next 8
    tokens += [5, 6, 9]
    assert propose(speculator, tokens) == [8, 7, 7]  # this sequence's edits insert: at the token 9 went before
    # a token left out: the copy goes on past it
    speculator = NgramSpeculator(k=3, min_ngram=2, max_ngram=2)
    tokens = [1, 2, 3, 4, 5, 6, 0, 1, 2]
    assert propose(speculator, tokens, seq_id=1) == [3, 4, 5]
    speculator.observe(1, 3, 1)
    assert propose(speculator, [*tokens, 3, 5], seq_id=1) == [6, 0, 1]


def test_an_edit_the_model_kept_to_is_applied_to_later_copies_until_it_is_turned_down() -> None:
    speculator = NgramSpeculator(k=6, min_ngram=2, max_ngram=2)
    # a list whose items (1 to 5) each follow the tokens 8 7; the model writes each on a line of its own: 8 9 7
    tokens = [20, 7, 1, 8, 7, 2, 8, 7, 3, 8, 7, 4, 8, 7, 5, 21, 20, 7]
    assert propose(speculator, tokens) == [1, 8, 7, 2, 8, 7]
    speculator.observe(0, 6, 2)  # 1 8 kept, then the model wrote 9
    tokens += [1, 8, 9]
    assert propose(speculator, tokens) == [2, 8, 7]  # taken as 9 in place of 7 first
    speculator.observe(0, 3, 0)
    tokens += [7]  # it went before 7: remembered between 8 and 7
    assert propose(speculator, tokens) == [2, 8, 9]  # the bound is 3
    speculator.observe(0, 3, 3)
    tokens += [2, 8, 9, 7]
    assert propose(speculator, tokens) == [3, 8, 9, 7, 4]
    speculator.observe(0, 5, 2)  # this time the model wrote 7 after 8: the edit is forgotten
    tokens += [3, 8, 7]
    assert propose(speculator, tokens) == [4, 8, 7]


def test_options_are_checked_by_name() -> None:
    registry = ComponentRegistry(create_plugin_manager(load=["hetero_speculators.plugin"]))
    registration = registry.get("speculator", "ngram")
    assert registration.validate_options({"k": 3}) == {"k": 3, "min_ngram": 2, "max_ngram": 4, "patience": 3}
    with pytest.raises(ConfigError, match="max_ngram=1 must be at least min_ngram=2"):
        registration.validate_options({"max_ngram": 1})
    with pytest.raises(ConfigError, match="speculator 'ngram' has no option 'n'"):
        registration.validate_options({"n": 3})
