"""Random workloads through the real scheduler, the paged allocator and the mock executor.

A hypothesis state machine submits, aborts and steps, and after every step
checks the budgets, block accounting (every used block is in the table of
a running sequence, so finishing, aborting or preempting sibling samples
leaks none) and the policy's admission order (for ``lpm``: that no
request is passed over by more than ``max_overtakes`` later arrivals); with
or without the ``ngram`` speculator, whose guesses are mostly wrong here
(the mock's tokens are hashes), so their slots are taken and trimmed; at
the end it drains the engine and checks that every request ended exactly
once, with all of its samples and a truthful finish reason, and that no
block leaked.
"""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from hetero_core.engine import InferenceEngine
from hetero_core.params import GenerationParams
from hetero_core.scheduler import SchedulerOutput
from hetero_core.sequence import FinishReason
from hetero_core.sequence_view import SequenceView

from .conftest import plugin_config

LPM_MAX_OVERTAKES = 2


class EngineWorkload(RuleBasedStateMachine):
    @initialize(
        policy=st.sampled_from(["fcfs", "priority", {"name": "lpm", "max_overtakes": LPM_MAX_OVERTAKES}]),
        num_blocks=st.integers(6, 24),
        block_size=st.sampled_from([1, 2, 4]),
        max_batch_size=st.integers(1, 6),
        max_total_tokens=st.integers(1, 24),
        max_num_seqs=st.integers(3, 8),
        threshold=st.sampled_from([0.5, 0.9, 1.0]),
        prefix_caching=st.booleans(),
        eos=st.sampled_from([0.0, 0.1]),
        speculator=st.sampled_from([None, {"name": "ngram", "k": 3, "min_ngram": 1, "patience": 1000}]),
    )
    def build(
        self,
        policy,
        num_blocks,
        block_size,
        max_batch_size,
        max_total_tokens,
        max_num_seqs,
        threshold,
        prefix_caching,
        eos,
        speculator,
    ) -> None:
        self.engine = InferenceEngine(
            plugin_config(
                scheduler=policy,
                max_num_blocks=num_blocks,
                block_size=block_size,
                max_batch_size=max_batch_size,
                max_total_tokens=max_total_tokens,
                max_num_seqs=max_num_seqs,
                memory_threshold=threshold,
                max_model_len=num_blocks * block_size,
                cache_allocator={"name": "paged", "enable_prefix_caching": prefix_caching},
                executor={"name": "mock", "eos_probability": eos},
                speculator=speculator,
            )
        )
        key = getattr(self.engine.policy, "key", None)  # fcfs and priority: a total order
        self.policy_key = None if key is None else (lambda seq: key(SequenceView(seq)))
        self.overtaken_by: dict[str, set[str]] = {}  # waiting request -> later arrivals admitted before it
        self.plans: list[SchedulerOutput] = []
        schedule = self.engine.scheduler.schedule

        def recording_schedule(proposals=None) -> SchedulerOutput:
            before = {s.seq_id for s in self.engine.scheduler.waiting if s.num_preemptions == 0}
            plan = schedule(proposals)
            self.check_plan(plan, before)
            return plan

        self.engine.scheduler.schedule = recording_schedule
        self.submitted: dict[str, GenerationParams] = {}
        self.completed: dict[str, object] = {}
        self.aborted: set[str] = set()
        self.capacity = num_blocks * block_size

    def check_plan(self, plan: SchedulerOutput, never_admitted_before: set[int]) -> None:
        config = self.engine.config
        scheduler = self.engine.scheduler
        assert len(plan.work) <= config.max_batch_size
        assert sum(w.num_new_tokens for w in plan.work) <= config.max_total_tokens
        assert all(w.num_new_tokens >= 1 + len(w.proposed) for w in plan.work)
        assert len({w.seq.seq_id for w in plan.work}) == len(plan.work)
        assert len(scheduler.running) <= config.max_num_seqs
        # Admission follows the policy: a sequence admitted for the first time goes
        # before every never-admitted sequence that is still waiting.
        newly = [s for s in scheduler.running if s.seq_id in never_admitted_before]
        still_waiting = [s for s in scheduler.waiting if s.seq_id in never_admitted_before]
        if self.policy_key is not None:
            for admitted in newly:
                assert all(self.policy_key(admitted) < self.policy_key(w) for w in still_waiting)
            return
        # lpm: any order, but a bounded number of later arrivals go first
        for waiting in still_waiting:
            passed = self.overtaken_by.setdefault(waiting.request.request_id, set())
            passed.update(
                s.request.request_id for s in newly if s.request.arrival_index > waiting.request.arrival_index
            )
            assert len(passed) <= LPM_MAX_OVERTAKES, f"{waiting.request.request_id} passed over by {sorted(passed)}"

    @rule(
        length=st.integers(1, 12),
        max_tokens=st.integers(0, 10),
        priority=st.integers(0, 2),
        n=st.integers(1, 4),
        shared_prefix=st.booleans(),
        scored=st.booleans(),
        data=st.data(),
    )
    def submit(self, length, max_tokens, priority, n, shared_prefix, scored, data) -> None:
        length = min(length, self.capacity - max_tokens)
        if length < 1 or n > self.engine.config.max_num_seqs:
            return
        prompt = (
            [7] * length
            if shared_prefix
            else data.draw(st.lists(st.integers(0, 255), min_size=length, max_size=length))
        )
        prompt_logprobs = 1 if scored or max_tokens == 0 else None  # max_tokens 0 only scores the prompt
        params = GenerationParams(
            temperature=1.0,
            seed=len(self.submitted),
            max_tokens=max_tokens,
            priority=priority,
            n=n,
            prompt_logprobs=prompt_logprobs,
        )
        request_id = self.engine.submit_request(prompt, params, request_id=f"r{len(self.submitted)}")
        self.submitted[request_id] = params

    @precondition(lambda self: self.submitted)
    @rule(data=st.data())
    def abort(self, data) -> None:
        request_id = data.draw(st.sampled_from(sorted(self.submitted)))
        if self.engine.abort_request(request_id):
            self.aborted.add(request_id)

    @rule(steps=st.integers(1, 4))
    def step(self, steps) -> None:
        for _ in range(steps):
            self.record(self.engine.step())

    def record(self, records) -> None:
        for record in records:
            assert record.request_id not in self.completed, "a request finished twice"
            self.completed[record.request_id] = record

    @invariant()
    def blocks_add_up(self) -> None:
        if not hasattr(self, "engine"):
            return
        stats = self.engine.get_memory_stats()
        assert stats.used_blocks + stats.free_blocks + stats.cached_blocks == stats.total_blocks
        running = self.engine.scheduler.running
        assert stats.num_sequences == len(running)
        assert stats.used_blocks == len({b for s in running for b in self.engine.allocator.block_table(s.seq_id)})
        for seq in running:  # a request's held samples wait outside the scheduler until its first sample places them
            assert not seq.request.held_samples or seq.index == 0

    def teardown(self) -> None:
        if not hasattr(self, "engine"):
            return
        for _ in range(10_000):
            if not self.engine.has_pending_work():
                break
            self.record(self.engine.step())
        assert not self.engine.has_pending_work(), "the engine did not drain: a request is stuck"
        assert set(self.completed) == set(self.submitted)
        for request_id, record in self.completed.items():
            params = self.submitted[request_id]
            assert [o.index for o in record.outputs] == list(range(params.n))
            if params.prompt_logprobs is not None and request_id not in self.aborted:  # every position, once
                assert [e.token_id for e in record.prompt_logprobs[1:]] == record.input_tokens[1:]
            for output in record.outputs:
                if output.finish_reason is FinishReason.ABORT:
                    assert request_id in self.aborted
                elif output.finish_reason is FinishReason.LENGTH:
                    assert len(output.token_ids) == params.max_tokens
                else:
                    assert output.finish_reason is FinishReason.STOP
                    assert output.token_ids[-1] == self.engine.tokenizer.eos_token_id
                    assert len(output.token_ids) <= params.max_tokens
        assert self.engine.get_memory_stats().used_blocks == 0
        self.engine.close()


EngineWorkload.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestEngineWorkload = EngineWorkload.TestCase


def run_workload(num_blocks: int) -> tuple[dict[str, list[list[int]]], int]:
    engine = InferenceEngine(
        plugin_config(max_num_blocks=num_blocks, block_size=2, max_model_len=60, max_total_tokens=16)
    )
    prompts = [[(i * 7 + j) % 250 for j in range(3 + (i * 5) % 17)] for i in range(24)]
    ids = {}
    for i, prompt in enumerate(prompts):
        params = GenerationParams(temperature=0.8, seed=i, max_tokens=8 + i % 9, n=1 + i % 2, priority=i % 3)
        ids[engine.submit_request(prompt, params)] = i
    records = engine.run()
    assert engine.get_memory_stats().used_blocks == 0
    outputs = {str(ids[r.request_id]): [o.token_ids for o in r.outputs] for r in records}
    return outputs, engine.metrics.num_preemptions


def test_outputs_do_not_depend_on_memory_pressure() -> None:
    ample, ample_preemptions = run_workload(num_blocks=2048)
    tiny, tiny_preemptions = run_workload(num_blocks=30)
    assert ample_preemptions == 0
    assert tiny_preemptions > 10
    assert tiny == ample
