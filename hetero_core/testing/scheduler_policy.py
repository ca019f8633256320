"""Contract tests for scheduler policies.

Subclass :class:`SchedulerPolicyContract` in a test module and override the
``policy`` fixture to return your policy; pytest then runs every check below
against it. The fixture is function-scoped, a fresh policy per check, since
a policy may keep state between calls (a wider-scoped one would be a
``classmethod`` under ``@pytest.fixture``, as pytest requires)::

    class TestMyPolicy(SchedulerPolicyContract):
        @pytest.fixture
        def policy(self):
            return MyPolicy()
"""

from __future__ import annotations

import random

import pytest

from hetero_core.params import GenerationParams
from hetero_core.protocols import SchedulerPolicy
from hetero_core.sequence import Request, Sequence
from hetero_core.sequence_view import SequenceView


def make_view(
    arrival_index: int,
    *,
    priority: int = 0,
    num_prompt_tokens: int = 8,
    index: int = 0,
    num_computed_tokens: int = 0,
    num_output_tokens: int = 0,
    num_prefix_match_tokens: int = 0,
) -> SequenceView:
    """What a policy sees of sample ``index`` of a request that arrived ``arrival_index`` seconds after time 0."""
    request = Request(
        request_id=f"r{arrival_index}",
        prompt_text="",
        prompt_token_ids=[1] * num_prompt_tokens,
        params=GenerationParams(priority=priority),
        arrival_index=arrival_index,
        arrival_time=float(arrival_index),
    )
    seq = Sequence(
        seq_id=arrival_index * 64 + index,
        request=request,
        index=index,
        token_ids=[1] * (num_prompt_tokens + num_output_tokens),
        num_prompt_tokens=num_prompt_tokens,
        num_computed_tokens=num_computed_tokens,
    )
    request.sequences.append(seq)
    return SequenceView(seq, num_prefix_match_tokens)


def random_views(rng: random.Random, count: int, *, priorities: tuple[int, ...] = (0, 1, 2)) -> list[SequenceView]:
    """``count`` waiting sequences of distinct arrivals, random priorities, prompt lengths and prefix matches."""
    views = []
    for arrival_index in rng.sample(range(10 * count), count):
        num_prompt_tokens = rng.randint(1, 512)
        views.append(
            make_view(
                arrival_index,
                priority=rng.choice(priorities),
                num_prompt_tokens=num_prompt_tokens,
                num_prefix_match_tokens=rng.randrange(0, num_prompt_tokens, 16),
            )
        )
    return views


class SchedulerPolicyContract:
    """What every scheduler policy must do (see :class:`hetero_core.protocols.SchedulerPolicy`)."""

    @pytest.fixture
    def policy(self) -> SchedulerPolicy:
        raise NotImplementedError("override the 'policy' fixture to return the policy under test")

    @pytest.mark.parametrize("seed", range(5))
    def test_order_is_a_permutation_and_leaves_the_input_alone(self, policy: SchedulerPolicy, seed: int) -> None:
        waiting = random_views(random.Random(seed), 20)
        before = list(waiting)
        ordered = policy.order(waiting)
        assert waiting == before
        assert sorted(id(s) for s in ordered) == sorted(id(s) for s in waiting)

    @pytest.mark.parametrize("seed", range(5))
    def test_order_is_deterministic(self, policy: SchedulerPolicy, seed: int) -> None:
        waiting = random_views(random.Random(seed), 20)
        assert policy.order(waiting) == policy.order(list(waiting))

    def test_order_of_nothing_is_nothing(self, policy: SchedulerPolicy) -> None:
        assert list(policy.order([])) == []

    @pytest.mark.parametrize("seed", range(5))
    def test_victim_is_a_running_sequence(self, policy: SchedulerPolicy, seed: int) -> None:
        running = random_views(random.Random(seed), 10)
        assert any(policy.choose_victim(running) is s for s in running)
        assert policy.choose_victim(running[:1]) is running[0]

    def test_victim_is_never_the_sequence_admitted_first(self, policy: SchedulerPolicy) -> None:
        running = random_views(random.Random(7), 10)
        first = policy.order(running)[0]
        assert policy.choose_victim(running) is not first

    @pytest.mark.parametrize("seed", range(3))
    def test_no_starvation_among_equal_priorities(self, policy: SchedulerPolicy, seed: int) -> None:
        """Serve one sequence per round while a new one of the same priority arrives each round:
        the oldest waiting sequence must be served within a bounded number of rounds."""
        rng = random.Random(seed)
        # the oldest has the least favourable shape for a size- or prefix-based policy; later arrivals the best
        oldest = make_view(0, num_prompt_tokens=512)
        waiting = [oldest, *(make_view(i, num_prompt_tokens=rng.randint(1, 512)) for i in range(1, 8))]
        for round_number in range(8, 500):
            served = policy.order(waiting)[0]
            if served is oldest:
                return
            waiting.remove(served)
            num_prompt_tokens = rng.randint(1, 16)
            waiting.append(
                make_view(
                    round_number, num_prompt_tokens=num_prompt_tokens, num_prefix_match_tokens=num_prompt_tokens - 1
                )
            )
        pytest.fail("the oldest sequence waited 500 rounds behind later arrivals of the same priority")
