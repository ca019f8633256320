"""The fcfs and priority policies, through the contract kit and on their own rules."""

from __future__ import annotations

import random

import pytest

from hetero_core.testing import SchedulerPolicyContract
from hetero_core.testing.scheduler_policy import make_sequence, random_sequences
from hetero_schedulers import FcfsPolicy, PriorityPolicy


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
    waiting = random_sequences(random.Random(seed), 15)
    ordered = FcfsPolicy().order_waiting(waiting)
    assert [s.request.arrival_index for s in ordered] == sorted(s.request.arrival_index for s in waiting)
    assert FcfsPolicy().choose_victim(waiting) is ordered[-1]


@pytest.mark.parametrize("seed", range(10))
def test_priority_orders_by_priority_then_arrival(seed: int) -> None:
    waiting = random_sequences(random.Random(seed), 15)
    ordered = PriorityPolicy().order_waiting(waiting)
    keys = [(s.request.priority, s.request.arrival_index) for s in ordered]
    assert keys == sorted(keys)
    victim = PriorityPolicy().choose_victim(waiting)
    assert (victim.request.priority, victim.request.arrival_index) == keys[-1]


def test_samples_of_one_request_keep_their_order() -> None:
    first, second = make_sequence(3, index=1), make_sequence(3, index=0)
    assert FcfsPolicy().order_waiting([first, second]) == [second, first]
