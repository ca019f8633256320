"""The engine loop: schedule -> build batch -> execute -> append/detokenize -> stream/finish.

Components are resolved once, when the engine is built; the loop calls
their methods directly. ``submit_request``, ``submit_chat`` and
``abort_request`` are thread-safe: they validate in the caller's thread and
hand the work to the stepping thread through an inbox, so a server can
submit from its event loop while another thread calls :meth:`step`.
:meth:`step` and everything built on it run one at a time: a second thread
that calls :meth:`step` while one is running gets an ``EngineError``.

No request harms another: a request whose sequence the executor cannot
handle, whose ``on_output`` callback raises, or whose component output is
malformed fails alone, with an error naming the cause; observer hooks that
raise are logged with their plugin's name and change nothing. A callback
that raises ``SystemExit`` or ``KeyboardInterrupt`` ends its request the
same way; the step finishes, so no state is left half-updated, and then
re-raises it once; the requests that finished in that step are returned by
the next one.
"""

from __future__ import annotations

import contextlib
import gc
import threading
import time
from typing import Any, Callable, Iterator, Mapping
from typing import Sequence as SequenceOf

import pluggy

from hetero_core.admission import Admission
from hetero_core.batch import ExecutionOutput
from hetero_core.batch_builder import BatchBuilder
from hetero_core.config import EngineConfig
from hetero_core.errors import ConfigError, EngineError, SchedulerError, ValidationError
from hetero_core.execution import BatchRunner
from hetero_core.grammars import Grammars
from hetero_core.inbox import Inbox
from hetero_core.logs import get_logger
from hetero_core.memory import MemoryStats
from hetero_core.metrics import EngineMetrics, StepStats
from hetero_core.model_source import one_parse_per_file
from hetero_core.observers import Observers
from hetero_core.output_processor import OutputProcessor, completed_request
from hetero_core.outputs import CompletedRequest, StreamDelta
from hetero_core.params import GenerationParams
from hetero_core.plugins import ComponentRegistry, create_plugin_manager
from hetero_core.protocols import CacheAllocator, Executor, SchedulerPolicy, Tokenizer
from hetero_core.scheduler import ScheduledWork, Scheduler, SchedulerOutput
from hetero_core.sequence import FinishReason, Request, Sequence
from hetero_core.speculation import ProposalRequest, Speculation

log = get_logger(__name__)

ENGINE_POINTS = ("tokenizer", "executor", "cache_allocator", "scheduler")  # resolved when the engine is built

OnOutput = Callable[[StreamDelta], None]
MAX_PROPOSALS = 64  # per sequence and step, where the executor names no bound


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for the block (on again after, if it was on).

    Building an engine imports its plugins' libraries (torch alone is about a
    million objects) and loads a model: each allocation-triggered pass over
    every live object costs a tenth of a second or more, several times over,
    and finds next to nothing, since what start-up creates it keeps. Cycles
    left behind are collected by the first pass after the block.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class InferenceEngine:
    """Serves one model: accepts requests and advances all of them a step at a time."""

    def __init__(
        self, config: EngineConfig | None = None, *, plugin_manager: pluggy.PluginManager | None = None
    ) -> None:
        config = config or EngineConfig()
        if not isinstance(config, EngineConfig):
            raise ConfigError(f"config must be an EngineConfig, got {type(config).__name__}")
        with collector_paused():
            self._build(config, plugin_manager)

    def _build(self, config: EngineConfig, plugin_manager: pluggy.PluginManager | None) -> None:
        self.plugin_manager = plugin_manager or create_plugin_manager(
            disable=config.plugins.disable, load=config.plugins.load
        )
        registry = ComponentRegistry(self.plugin_manager)
        self.config = config
        self.plugin_names = {point: registry.get(point, getattr(config, point).name).plugin for point in ENGINE_POINTS}
        self._registry = registry
        with one_parse_per_file():  # the tokenizer and the executor often read the same model file
            self.tokenizer: Tokenizer = registry.create(
                "tokenizer", config.tokenizer.name, config.tokenizer.options, config
            )
            self.executor: Executor = registry.create("executor", config.executor.name, config.executor.options, config)
        self.speculation: Speculation | None = None
        try:
            self._start(registry)
        except BaseException:
            self.executor.close()
            raise

    def _start(self, registry: ComponentRegistry) -> None:
        config = self.config
        self.model_info = self.executor.model_info
        self._check_vocabularies()
        self.max_model_len = min(config.max_model_len, self.model_info.max_model_len)
        self.num_blocks = self._pool_size()
        self.executor.initialize_cache(self.num_blocks, config.block_size)
        self.admission = Admission(config, self.model_info.vocab_size, self.max_model_len, self.num_blocks)
        self.allocator: CacheAllocator = registry.create(
            "cache_allocator",
            config.cache_allocator.name,
            config.cache_allocator.options,
            self.num_blocks,
            config.block_size,
        )
        self.policy: SchedulerPolicy = registry.create("scheduler", config.scheduler.name, config.scheduler.options)
        self.scheduler = Scheduler(config, self.policy, self.allocator, policy_plugin=self.plugin_names["scheduler"])
        self.outputs = OutputProcessor(self.tokenizer, self.max_model_len, self._eos_token_ids())
        self.metrics = EngineMetrics()
        self.runner = BatchRunner(
            self.executor,
            self.plugin_names["executor"],
            self.model_info.vocab_size,
            config.max_retry_attempts,
            self.metrics,
        )
        self.inbox = Inbox(config.max_waiting_requests)
        self.grammars = Grammars(config, registry, self.tokenizer)
        self.batches = BatchBuilder(
            config.block_size, self.num_blocks, self.plugin_names["cache_allocator"], self.grammars
        )
        self._broken_callbacks: list[Request] = []
        self._interrupt: BaseException | None = (
            None  # a callback's SystemExit or KeyboardInterrupt, re-raised after its step
        )
        self._undelivered: list[CompletedRequest] = []  # finished in a step that re-raised it
        self._step_lock = threading.Lock()
        self._close_lock = threading.Lock()
        self._closed = False
        self._leak_reported = False
        hook = self.plugin_manager.hook
        self._step_observers = Observers(hook.on_step_finished)
        self._finish_observers = Observers(hook.on_request_finished)
        self.executor.warm_up(min(config.max_total_tokens, self.max_model_len), config.max_batch_size)
        self.speculation = self._speculation(registry)
        Observers(hook.on_engine_started)(engine=self)
        log.info(
            "engine started", model=self.model_info.name, num_blocks=self.num_blocks, executor=config.executor.name
        )

    def _speculation(self, registry: ComponentRegistry) -> Speculation | None:
        """The configured speculator, if any; ``ConfigError`` when the executor or allocator cannot serve it."""
        spec = self.config.speculator
        if spec is None:
            return None
        if not getattr(self.executor, "verifies_proposals", False):
            raise ConfigError(
                f"speculator {spec.name!r} needs an executor that verifies proposals;"
                f" executor plugin {self.plugin_names['executor']!r} does not (verifies_proposals)",
                param="speculator",
            )
        if not callable(getattr(self.allocator, "trim", None)):
            raise ConfigError(
                f"speculator {spec.name!r} needs a cache allocator with trim;"
                f" cache allocator plugin {self.plugin_names['cache_allocator']!r} has none",
                param="speculator",
            )
        self._max_proposals = getattr(self.executor, "max_proposals", MAX_PROPOSALS)
        self._max_verify_tokens = getattr(self.executor, "max_verify_tokens", None)
        speculator = registry.create("speculator", spec.name, spec.options, self.config, self.model_info, registry)
        return Speculation(speculator, registry.get("speculator", spec.name).plugin, self.model_info.vocab_size)

    def _check_vocabularies(self) -> None:
        """Warn when the tokenizer and the model count their tokens differently.

        A model may have more ids than its tokenizer (padded embeddings); a
        tokenizer with more ids than the model, or a mismatch, is usually
        the wrong pair. Either way nothing breaks silently: prompt ids are
        checked against the model's vocabulary at submission, sampled ids at
        each step.
        """
        model_vocab, tokenizer_vocab = self.model_info.vocab_size, self.tokenizer.vocab_size
        if tokenizer_vocab != model_vocab:
            log.warning(
                "tokenizer and model vocabularies differ",
                tokenizer=self.config.tokenizer.name,
                tokenizer_vocab_size=tokenizer_vocab,
                executor=self.config.executor.name,
                model_vocab_size=model_vocab,
            )

    def _eos_token_ids(self) -> frozenset[int]:
        """The ids that end generation: the model's (``ConfigError`` if outside its vocabulary), else the
        tokenizer's EOS."""
        ids = self.model_info.eos_token_ids
        if not ids:
            return frozenset(() if self.tokenizer.eos_token_id is None else (self.tokenizer.eos_token_id,))
        bad = [
            t for t in ids if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < self.model_info.vocab_size
        ]
        if bad:
            raise ConfigError(
                f"executor plugin {self.plugin_names['executor']!r} names end-of-sequence id {bad[0]!r},"
                f" outside its vocabulary [0, {self.model_info.vocab_size})"
            )
        return frozenset(ids)

    def _pool_size(self) -> int:
        if self.config.kv_cache_memory_mb is None:
            return self.config.max_num_blocks
        block_bytes = self.executor.kv_cache_block_bytes(self.config.block_size)
        num_blocks = int(self.config.kv_cache_memory_mb * 2**20 // block_bytes)
        if num_blocks < 1:
            raise ConfigError(
                f"kv_cache_memory_mb={self.config.kv_cache_memory_mb} holds no block of {block_bytes} bytes",
                param="kv_cache_memory_mb",
            )
        return num_blocks

    # ------------------------------------------------------------------ submitting

    def submit_request(
        self,
        prompt: str | SequenceOf[int],
        params: GenerationParams | None = None,
        *,
        request_id: str | None = None,
        on_output: OnOutput | None = None,
    ) -> str:
        """Queue a prompt (text, or token ids) for generation and return its request id.

        Raises ``ValidationError`` for an empty or too long prompt, bad ids or
        arguments of the wrong type, ``CacheMemoryError`` when the request
        could never fit the KV pool, and ``SchedulerError`` when the waiting
        queue is full or the engine is closed. ``on_output``, if given,
        receives a :class:`StreamDelta` from the stepping thread for every
        step that produced output, the last one with a finish reason; if it
        raises, its request ends with an error (the others go on).
        """
        params = self._check_call(params, request_id, on_output)
        if isinstance(prompt, str):
            prompt_text, token_ids = prompt, self.tokenizer.encode(prompt)
        elif isinstance(prompt, (list, tuple)):
            token_ids = self.admission.check_token_ids(prompt)
            prompt_text = self.tokenizer.decode(token_ids, skip_special_tokens=False)
        else:
            raise ValidationError(
                f"prompt must be a string or a list of token ids, got {type(prompt).__name__}", param="prompt"
            )
        return self._enqueue(prompt_text, token_ids, params, request_id, on_output)

    def submit_chat(
        self,
        messages: SequenceOf[Mapping[str, Any]],
        params: GenerationParams | None = None,
        *,
        request_id: str | None = None,
        on_output: OnOutput | None = None,
    ) -> str:
        """Like :meth:`submit_request`, for OpenAI-style messages rendered with the model's chat template."""
        params = self._check_call(params, request_id, on_output)
        if not isinstance(messages, (list, tuple)) or not messages or not all(isinstance(m, Mapping) for m in messages):
            raise ValidationError(
                f"messages must be a non-empty list of objects, got {messages!r:.200}", param="messages"
            )
        prompt_text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        token_ids = self.tokenizer.encode(prompt_text, add_special_tokens=False)
        return self._enqueue(prompt_text, token_ids, params, request_id, on_output)

    def _check_call(self, params: Any, request_id: Any, on_output: Any) -> GenerationParams:
        if self._closed:
            raise SchedulerError("the engine is closed: it accepts no more requests")
        return self.admission.check_arguments(params, request_id, on_output)

    def _enqueue(
        self,
        prompt_text: str,
        token_ids: list[int],
        params: GenerationParams,
        request_id: str | None,
        on_output: OnOutput | None,
    ) -> str:
        self.admission.check_fits(token_ids, params)
        grammar = None if params.structured_output is None else self.grammars.compile(params.structured_output)
        return self.inbox.put(
            prompt_text, token_ids, params, request_id, on_output, grammar, len(self.scheduler.waiting)
        )

    def abort_request(self, request_id: str) -> bool:
        """Cancel a request; its blocks are freed at the next step. False if it is unknown or finished."""
        return self.inbox.abort(request_id)

    # ------------------------------------------------------------------ stepping

    def has_pending_work(self) -> bool:
        return self.inbox.has_pending() or self.scheduler.has_unfinished() or bool(self._undelivered)

    def step(self) -> list[CompletedRequest]:
        """Run one scheduling step and return the requests that finished in it."""
        if not self._step_lock.acquire(blocking=False):
            raise EngineError(
                "step() is already running in another thread: drive an engine from one thread"
                " (other threads may submit and abort)"
            )
        try:
            if self._closed:
                raise SchedulerError("the engine is closed")
            completed, self._undelivered = [*self._undelivered, *self._step()], []
            interrupt, self._interrupt = self._interrupt, None
            if interrupt is not None:
                self._undelivered = completed
                raise interrupt
            return completed
        finally:
            self._step_lock.release()

    def _step(self) -> list[CompletedRequest]:
        started = time.monotonic()
        finished: list[Request] = []
        self._take_inbox(finished)
        plan = self.scheduler.schedule(self._proposals())
        if plan.work:
            batch, problems = self.batches.build(plan)
            output, failures = self.runner.run(batch)
            self._process(plan, output, problems | failures, finished)
        self._end_broken_callbacks(finished)
        completed = [self._finish_request(r) for r in finished]
        self._update_metrics(plan, started)
        return completed

    def _proposals(self) -> dict[int, list[int]]:
        """The speculator's proposals for the decoding sequences, each bounded by its request's room to grow, the
        executor's ``max_proposals`` and an equal share of its ``max_verify_tokens``."""
        if self.speculation is None or not self.speculation.is_on:
            return {}
        decoding = [seq for seq in self.scheduler.running if self.scheduler.is_decoding(seq)]
        bound = self._max_proposals
        if self._max_verify_tokens is not None and decoding:
            bound = min(bound, self._max_verify_tokens // len(decoding) - 1)
        requests = []
        for seq in decoding:
            # the step's own token takes one place of the request's room
            room = min(seq.request.params.max_tokens - seq.num_output_tokens, self.max_model_len - seq.num_tokens) - 1
            room = min(room, bound)
            if room > 0:
                requests.append(ProposalRequest(seq.seq_id, list(seq.token_ids), seq.num_prompt_tokens, room))
        return self.speculation.propose(requests)

    def _take_inbox(self, finished: list[Request]) -> None:
        new, aborted = self.inbox.take()
        for request in new:
            seq = request.start(self.scheduler.new_seq_id)
            self.scheduler.add(seq)
            self.metrics.requests_submitted += 1
            self.metrics.prompt_tokens += seq.num_prompt_tokens
        for request in aborted:
            if not request.is_finished:
                self._end_request(request, FinishReason.ABORT, finished)

    def _fail_request(self, request: Request, message: str, finished: list[Request]) -> None:
        if not request.is_finished:
            request.error = message
            self._end_request(request, FinishReason.ERROR, finished)

    def _process(
        self, plan: SchedulerOutput, output: ExecutionOutput, problems: dict[int, str], finished: list[Request]
    ) -> None:
        for work in plan.work:
            seq = work.seq
            if seq.is_finished:  # its request ended earlier in this loop
                continue
            problem = problems.get(seq.seq_id)
            if problem is not None:
                self._fail_request(seq.request, problem, finished)
                continue
            if seq.request.params.prompt_logprobs is not None:
                self.outputs.add_prompt_logprobs(
                    seq.request, seq.num_computed_tokens, output.prompt_logprobs.get(seq.seq_id, [])
                )
            seq.advance(work.num_new_tokens - len(work.proposed))
            if work.do_sample:
                self._take_samples(seq, work, output, finished)
            elif seq.request.held_samples:
                self.scheduler.place_siblings(seq)

    def _take_samples(
        self, seq: Sequence, work: ScheduledWork, output: ExecutionOutput, finished: list[Request]
    ) -> None:
        """``seq`` is computed to its last token: append the kept proposals and the token sampled after them,
        one at a time (each checked for stops), and stream them."""
        num_new_tokens = num_new_logprobs = 0
        if seq.request.params.max_tokens == 0:  # the prompt is scored: done, with no token
            seq.finish(FinishReason.LENGTH)
        else:
            accepted = work.proposed[: output.num_accepted.get(seq.seq_id, 0)]
            if work.proposed:
                self.metrics.record_verification(len(work.proposed), len(accepted))
                self.speculation.observe(seq.seq_id, len(work.proposed), len(accepted))
            wants_logprobs = seq.request.params.logprobs is not None
            logprobs = [*output.accepted_logprobs.get(seq.seq_id, []), output.logprobs.get(seq.seq_id)]
            for i, token_id in enumerate([*accepted, output.sampled_token_ids[seq.seq_id]]):
                if seq.matcher is not None and not seq.matcher.accept_token(token_id):
                    self._fail_request(
                        seq.request,
                        f"executor plugin {self.plugin_names['executor']!r} sampled token {token_id},"
                        " which the request's structured output does not allow",
                        finished,
                    )
                    return
                self.outputs.append_token(
                    seq,
                    token_id,
                    logprobs[i] if wants_logprobs else None,
                    is_complete=seq.matcher is not None and seq.matcher.is_finished,
                )
                self.metrics.generation_tokens += 1
                num_new_tokens += 1
                num_new_logprobs += wants_logprobs
                if seq.is_finished:
                    break
                if i < len(accepted):  # a kept proposal is in the cache already
                    seq.advance(1)
            if work.proposed and not seq.is_finished:
                self.allocator.trim(seq.seq_id, seq.num_computed_tokens)  # the rejected proposals' slots
        if seq.is_finished:
            self.scheduler.remove(seq)
        self._emit(seq, num_new_tokens, num_new_logprobs)
        if seq.request.is_finished:
            finished.append(seq.request)

    def _emit(self, seq: Sequence, num_new_tokens: int, num_new_logprobs: int) -> None:
        request = seq.request
        if request.on_output is None:
            return
        delta = self.outputs.delta(seq, num_new_tokens, num_new_logprobs)
        try:
            request.on_output(delta)
        except BaseException as exc:  # the caller's callback: its request ends, the others go on
            log.error(
                "on_output callback failed",
                request_id=request.request_id,
                error=f"{type(exc).__name__}: {exc}",
                exc_info=exc,
            )
            if not isinstance(exc, Exception):  # SystemExit, KeyboardInterrupt: raised once this step is done
                self._interrupt = self._interrupt or exc
            request.on_output = None
            if not request.is_finished:
                request.error = f"the on_output callback raised {type(exc).__name__}" + (f": {exc}" if str(exc) else "")
                self._broken_callbacks.append(request)

    def _end_broken_callbacks(self, finished: list[Request]) -> None:
        """End the requests whose callback raised this step (those not finished anyway)."""
        broken, self._broken_callbacks = self._broken_callbacks, []
        for request in broken:
            if not request.is_finished:
                self._end_request(request, FinishReason.ERROR, finished)

    def _end_request(self, request: Request, reason: FinishReason, finished: list[Request]) -> None:
        """Finish every unfinished sample of ``request`` with ``reason`` (abort or error); each gets its final delta."""
        for seq in request.end(reason):
            self.scheduler.remove(seq)
            self._emit(seq, 0, 0)
        finished.append(request)

    def _finish_request(self, request: Request) -> CompletedRequest:
        request.finish_time = time.monotonic()
        if self.speculation is not None:
            for seq in request.sequences:
                self.speculation.free(seq.seq_id)
        self.inbox.forget(request.request_id)
        completed = completed_request(request)
        self.metrics.requests_finished[completed.finish_reason] += 1
        log.info(
            "request finished",
            request_id=request.request_id,
            finish_reason=completed.finish_reason.value,
            prompt_tokens=len(completed.input_tokens),
            generated_tokens=sum(len(o.token_ids) for o in completed.outputs),
            cached_tokens=completed.num_cached_tokens,
            duration_s=round(completed.duration, 4),
            error=completed.error,
        )
        if self._finish_observers:
            self._finish_observers(engine=self, completed=completed)
        return completed

    def _update_metrics(self, plan: SchedulerOutput, started: float) -> None:
        stats = self.allocator.stats()
        metrics = self.metrics
        metrics.record_step(len(plan.preempted), len(self.scheduler.running), len(self.scheduler.waiting), stats)
        if not self.scheduler.running:
            self._check_no_blocks_held(stats)
        if self._step_observers:
            self._step_observers(
                engine=self,
                stats=StepStats(
                    step=metrics.num_steps,
                    num_sequences=len(plan.work),
                    num_prefill_tokens=plan.num_prefill_tokens,
                    num_decode_tokens=plan.num_decode_tokens,
                    num_preemptions=len(plan.preempted),
                    num_running=metrics.num_running,
                    num_waiting=metrics.num_waiting,
                    kv_cache_usage=stats.usage,
                    duration=time.monotonic() - started,
                ),
            )

    def _check_no_blocks_held(self, stats: MemoryStats) -> None:
        """With nothing running every block must be back: report an allocator that leaks (once)."""
        if (stats.used_blocks or stats.num_sequences) and not self._leak_reported:
            self._leak_reported = True
            log.error(
                "cache allocator leaks blocks: none runs, yet blocks are in use",
                plugin=self.plugin_names["cache_allocator"],
                used_blocks=stats.used_blocks,
                num_sequences=stats.num_sequences,
            )

    # ------------------------------------------------------------------ conveniences

    def run(self) -> list[CompletedRequest]:
        """Step until every submitted request has finished; return them in finishing order."""
        completed: list[CompletedRequest] = []
        while self.has_pending_work():
            completed.extend(self.step())
        return completed

    def generate(
        self, prompts: SequenceOf[str | SequenceOf[int]], params: GenerationParams | None = None
    ) -> list[CompletedRequest]:
        """Submit ``prompts``, run until they finish, and return their records in prompt order.

        When one prompt is rejected, none of them runs (the error is raised).
        """
        if isinstance(prompts, (str, bytes)) or not isinstance(prompts, (list, tuple)):
            raise ValidationError(f"prompts must be a list, got {type(prompts).__name__}", param="prompt")
        ids: list[str] = []
        try:
            for prompt in prompts:
                ids.append(self.submit_request(prompt, params))
        except BaseException:
            self.inbox.withdraw(ids)
            raise
        done: dict[str, CompletedRequest] = {}
        while not all(i in done for i in ids):
            for record in self.step():
                done[record.request_id] = record
        return [done[i] for i in ids]

    def stream(self, prompt: str | SequenceOf[int], params: GenerationParams | None = None) -> Iterator[StreamDelta]:
        """Generate for one prompt, yielding its deltas as steps produce them (other requests advance too)."""
        deltas: list[StreamDelta] = []
        request_id = self.submit_request(prompt, params, on_output=deltas.append)
        num_samples = (params or GenerationParams()).n
        num_finished = 0
        try:
            while num_finished < num_samples:
                self.step()
                for delta in deltas:
                    num_finished += delta.is_finished
                    yield delta
                deltas.clear()
        finally:
            if num_finished < num_samples:
                self.abort_request(request_id)
                self.step()

    def get_memory_stats(self) -> MemoryStats:
        return self.allocator.stats()

    def close(self) -> None:
        """Release the executor; later submits and steps fail with ``SchedulerError``. Closing twice is harmless."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        if self.speculation is not None:
            self.speculation.close()
        self.executor.close()
