"""Chaos: concurrent submitters, aborts, raising observers and a faulty executor sequence, all at once.

Every well-formed request must complete with the tokens it gets alone
(greedy, the mock executor), the poisoned ones fail alone, and the pool is
empty at the end.
"""

from __future__ import annotations

import random
import threading

import pytest

from hetero_core.hookspecs import hookimpl
from hetero_core.params import GenerationParams
from hetero_core.sequence import FinishReason

from .test_engine_faults import POISON, FaultyExecutorPlugin, RaisingObserver, engine_with, report_error

NUM_SUBMITTERS = 4
REQUESTS_EACH = 12


class BrokenHookPlugin(RaisingObserver):
    """Raises from both observer hooks, and from on_engine_started too."""

    @hookimpl
    def on_engine_started(self, engine) -> None:
        raise RuntimeError("start observer broke")


def raise_for_the_batch(output, seq_id: int) -> None:
    raise RuntimeError("poisoned batch")


FAULTS = {
    "reported": (report_error, "cannot handle this sequence"),
    "raised": (raise_for_the_batch, "executor plugin 'faulty' failed to run"),
}


def chaos_engine(fault: str, **overrides):
    return engine_with(
        (FaultyExecutorPlugin(FAULTS[fault][0]), "faulty"),
        (BrokenHookPlugin(), "broken-hooks"),
        executor="faulty",
        max_num_blocks=16,  # small enough that requests are preempted and recomputed
        max_batch_size=6,
        memory_threshold=1.0,
        **overrides,
    )


def workload(seed: int) -> list[tuple[str, object, GenerationParams]]:
    """(kind, prompt, params): kind is 'good', 'poison' or 'abort'."""
    rng = random.Random(seed)
    items = []
    for _ in range(NUM_SUBMITTERS * REQUESTS_EACH):
        kind = rng.choices(["good", "poison", "abort"], weights=[6, 1, 1])[0]
        prompt = "".join(rng.choice("abcdefgh ") for _ in range(rng.randint(1, 20)))
        params = GenerationParams(
            temperature=0.0, max_tokens=rng.randint(1, 16), n=rng.choice([1, 1, 2]), logprobs=rng.choice([None, 2])
        )
        items.append((kind, [POISON, *prompt.encode()] if kind == "poison" else prompt, params))
    return items


@pytest.mark.parametrize(("seed", "fault"), [(0, "reported"), (1, "reported"), (2, "raised"), (3, "raised")])
def test_well_formed_requests_are_untouched_by_chaos(seed: int, fault: str) -> None:
    """A faulty sequence is either reported by the executor or makes it raise for its whole batch."""
    items = workload(seed)
    reference = chaos_engine(fault)
    expected = {
        index: [o.token_ids for o in reference.generate([prompt], params)[0].outputs]
        for index, (kind, prompt, params) in enumerate(items)
        if kind == "good"
    }
    engine = chaos_engine(fault)
    ids: dict[int, str] = {}
    lock = threading.Lock()
    done = threading.Event()
    records = {}

    def submitter(first: int) -> None:
        for index in range(first, len(items), NUM_SUBMITTERS):
            kind, prompt, params = items[index]
            request_id = engine.submit_request(prompt, params)
            with lock:
                ids[index] = request_id
            if kind == "abort":
                engine.abort_request(request_id)

    threads = [threading.Thread(target=submitter, args=(first,)) for first in range(NUM_SUBMITTERS)]
    stepper = threading.Thread(target=lambda: step_until(engine, done, records))
    stepper.start()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    done.set()
    stepper.join(timeout=120)
    assert not stepper.is_alive()

    for index, (kind, _prompt, _params) in enumerate(items):
        record = records[ids[index]]
        if kind == "good":
            assert [o.token_ids for o in record.outputs] == expected[index]
            assert record.error is None
        elif kind == "poison":
            assert record.finish_reason is FinishReason.ERROR and FAULTS[fault][1] in record.error
        else:
            assert record.finish_reason in (FinishReason.ABORT, FinishReason.LENGTH, FinishReason.STOP)
    stats = engine.get_memory_stats()
    assert stats.used_blocks == 0 and stats.num_sequences == 0 and not engine.has_pending_work()
    assert engine.metrics.num_preemptions > 0  # the pool was tight enough to exercise recompute


def step_until(engine, done: threading.Event, records: dict) -> None:
    while not done.is_set() or engine.has_pending_work():
        for record in engine.step():
            records[record.request_id] = record
