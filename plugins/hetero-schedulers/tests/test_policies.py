"""The fcfs, priority and lpm policies, through the contract kit and on their own rules."""

from __future__ import annotations

import random

import pytest

from hetero_core.errors import ConfigError
from hetero_core.plugins import ComponentRegistry, create_plugin_manager
from hetero_core.testing import SchedulerPolicyContract
from hetero_core.testing.scheduler_policy import make_view, random_views
from hetero_schedulers import FcfsPolicy, LongestPrefixMatchPolicy, PriorityPolicy, plugin


class TestFcfsContract(SchedulerPolicyContract):
    @pytest.fixture
    def policy(self):
        return FcfsPolicy()


class TestPriorityContract(SchedulerPolicyContract):
    @pytest.fixture
    def policy(self):
        return PriorityPolicy()


@pytest.mark.parametrize("seed", range(10))
def test_fcfs_orders_by_arrival_and_preempts_the_latest(seed: int) -> None:
    waiting = random_views(random.Random(seed), 15)
    ordered = FcfsPolicy().order(waiting)
    assert [s.arrival_index for s in ordered] == sorted(s.arrival_index for s in waiting)
    assert FcfsPolicy().choose_victim(waiting) is ordered[-1]


@pytest.mark.parametrize("seed", range(10))
def test_priority_orders_by_priority_then_arrival(seed: int) -> None:
    waiting = random_views(random.Random(seed), 15)
    ordered = PriorityPolicy().order(waiting)
    keys = [(s.priority, s.arrival_index) for s in ordered]
    assert keys == sorted(keys)
    victim = PriorityPolicy().choose_victim(waiting)
    assert (victim.priority, victim.arrival_index) == keys[-1]


def test_samples_of_one_request_keep_their_order() -> None:
    first, second = make_view(3, index=1), make_view(3, index=0)
    assert FcfsPolicy().order([first, second]) == [second, first]


class TestLongestPrefixMatchContract(SchedulerPolicyContract):
    @pytest.fixture
    def policy(self):
        return LongestPrefixMatchPolicy()


def test_lpm_serves_the_longest_prefix_match_first_then_arrival() -> None:
    views = [
        make_view(0, num_prefix_match_tokens=0),
        make_view(1, num_prefix_match_tokens=32),
        make_view(2, num_prefix_match_tokens=64),
        make_view(3, num_prefix_match_tokens=32),
    ]
    assert [v.arrival_index for v in LongestPrefixMatchPolicy().order(views)] == [2, 1, 3, 0]
    running = [make_view(i, num_computed_tokens=8) for i in (2, 0, 3, 1)]  # running: no match looked up
    assert LongestPrefixMatchPolicy().choose_victim(running) is running[2]  # the latest arrival


@pytest.mark.parametrize("max_overtakes", [0, 1, 5, 64])
def test_lpm_lets_at_most_max_overtakes_later_arrivals_pass_a_request(max_overtakes: int) -> None:
    """Each round serves the first in order and a better-matching request arrives."""
    policy = LongestPrefixMatchPolicy(max_overtakes=max_overtakes)
    unlucky = make_view(0, num_prefix_match_tokens=0)
    waiting = [unlucky, make_view(1, num_prefix_match_tokens=16)]
    overtakes = 0
    for arrival in range(2, 200):
        served = policy.order(waiting)[0]
        if served is unlucky:
            break
        overtakes += 1
        waiting.remove(served)
        waiting.append(make_view(arrival, num_prefix_match_tokens=16 * arrival))
    assert overtakes == max_overtakes


def test_lpm_serves_overdue_requests_in_arrival_order_before_any_match() -> None:
    policy = LongestPrefixMatchPolicy(max_overtakes=2)
    views = [make_view(i, num_prefix_match_tokens=16 * i) for i in range(6)]  # 0..2 are overdue (5 - i > 2)
    assert [v.arrival_index for v in policy.order(views)] == [0, 1, 2, 5, 4, 3]


def test_lpm_without_overtakes_is_fcfs() -> None:
    views = random_views(random.Random(3), 30)
    assert LongestPrefixMatchPolicy(max_overtakes=0).order(views) == FcfsPolicy().order(views)


def test_only_lpm_asks_for_prefix_matches() -> None:
    assert LongestPrefixMatchPolicy.wants_prefix_match
    assert not FcfsPolicy.wants_prefix_match and not PriorityPolicy.wants_prefix_match


@pytest.mark.parametrize("bad", [-1, 1.5, True, "8"])
def test_a_bad_max_overtakes_is_a_config_error(bad) -> None:
    with pytest.raises(ConfigError, match="max_overtakes"):
        LongestPrefixMatchPolicy(max_overtakes=bad)
    pm = create_plugin_manager(entry_points=False, builtin=False)
    pm.register(plugin, name="schedulers")
    with pytest.raises(ConfigError, match="max_overtakes"):
        ComponentRegistry(pm).create("scheduler", "lpm", {"max_overtakes": bad})
