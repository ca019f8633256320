"""The engine loop: schedule -> build batch -> execute -> append/detokenize -> stream/finish.

Components are resolved once, when the engine is built; the loop calls
their methods directly. ``submit_request``, ``submit_chat`` and
``abort_request`` are thread-safe: they validate in the caller's thread and
hand the work to the stepping thread through an inbox, so a server can
submit from its event loop while another thread calls :meth:`step`.
:meth:`step` and everything built on it must be called from one thread.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
import uuid
from typing import Any, Callable, Iterator, Mapping, Sequence as SequenceOf

import pluggy
import structlog

from hetero_core.batch import ExecutionBatch, ExecutionOutput, ScheduledSequence
from hetero_core.config import EngineConfig
from hetero_core.errors import CacheMemoryError, ConfigError, ExecutionError, SchedulerError, ValidationError
from hetero_core.memory import MemoryStats
from hetero_core.metrics import EngineMetrics, StepStats
from hetero_core.output_processor import OutputProcessor, completed_request
from hetero_core.outputs import CompletedRequest, StreamDelta
from hetero_core.params import GenerationParams
from hetero_core.plugins import ComponentRegistry, create_plugin_manager
from hetero_core.protocols import CacheAllocator, Executor, SchedulerPolicy, Tokenizer
from hetero_core.scheduler import Scheduler, SchedulerOutput
from hetero_core.sequence import FinishReason, Request, RequestState, Sequence

log = structlog.get_logger()

OnOutput = Callable[[StreamDelta], None]


class InferenceEngine:
    """Serves one model: accepts requests and advances all of them a step at a time."""

    def __init__(self, config: EngineConfig | None = None, *, plugin_manager: pluggy.PluginManager | None = None) -> None:
        config = config or EngineConfig()
        self.plugin_manager = plugin_manager or create_plugin_manager(
            disable=config.plugins.disable, load=config.plugins.load
        )
        registry = ComponentRegistry(self.plugin_manager)
        self.config = config
        self.tokenizer: Tokenizer = registry.create("tokenizer", config.tokenizer.name, config.tokenizer.options, config)
        self.executor: Executor = registry.create("executor", config.executor.name, config.executor.options, config)
        self.model_info = self.executor.model_info
        self.max_model_len = min(config.max_model_len, self.model_info.max_model_len)
        self.num_blocks = self._pool_size()
        self.executor.initialize_cache(self.num_blocks, config.block_size)
        self.allocator: CacheAllocator = registry.create(
            "cache_allocator", config.cache_allocator.name, config.cache_allocator.options, self.num_blocks, config.block_size
        )
        self.policy: SchedulerPolicy = registry.create("scheduler", config.scheduler.name, config.scheduler.options)
        self.scheduler = Scheduler(config, self.policy, self.allocator)
        self.outputs = OutputProcessor(self.tokenizer, self.max_model_len)
        self.metrics = EngineMetrics()
        self._requests: dict[str, Request] = {}
        self._inbox: list[Request] = []
        self._aborts: list[str] = []
        self._lock = threading.Lock()
        self._arrivals = itertools.count()
        hook = self.plugin_manager.hook
        self._step_observers = hook.on_step_finished if hook.on_step_finished.get_hookimpls() else None
        self._finish_observers = hook.on_request_finished if hook.on_request_finished.get_hookimpls() else None
        self.executor.warm_up(min(config.max_total_tokens, self.max_model_len), config.max_batch_size)
        hook.on_engine_started(engine=self)
        log.info("engine started", model=self.model_info.name, num_blocks=self.num_blocks, executor=config.executor.name)

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

        Raises ``ValidationError`` for an empty or too long prompt or bad ids,
        ``CacheMemoryError`` when the request could never fit the KV pool, and
        ``SchedulerError`` when the waiting queue is full. ``on_output``, if
        given, receives a :class:`StreamDelta` from the stepping thread for
        every step that produced output, the last one with a finish reason.
        """
        params = params or GenerationParams()
        if isinstance(prompt, str):
            prompt_text, token_ids = prompt, self.tokenizer.encode(prompt)
        else:
            token_ids = self._check_token_ids(prompt)
            prompt_text = self.tokenizer.decode(token_ids, skip_special_tokens=False)
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
        prompt_text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        token_ids = self.tokenizer.encode(prompt_text, add_special_tokens=False)
        return self._enqueue(prompt_text, token_ids, params or GenerationParams(), request_id, on_output)

    def _check_token_ids(self, token_ids: SequenceOf[int]) -> list[int]:
        vocab_size = self.model_info.vocab_size
        for token_id in token_ids:
            if isinstance(token_id, bool) or not isinstance(token_id, int) or not 0 <= token_id < vocab_size:
                raise ValidationError(f"prompt token ids must be integers in [0, {vocab_size}), got {token_id!r}", param="prompt")
        return list(token_ids)

    def _enqueue(
        self, prompt_text: str, token_ids: list[int], params: GenerationParams, request_id: str | None, on_output: OnOutput | None
    ) -> str:
        num_prompt = len(token_ids)
        if num_prompt == 0:
            raise ValidationError("prompt must not be empty", param="prompt")
        if num_prompt + params.max_tokens > self.max_model_len:
            raise ValidationError(
                f"prompt has {num_prompt} tokens and max_tokens is {params.max_tokens}: together they exceed"
                f" the maximum context length of {self.max_model_len} tokens",
                param="max_tokens" if num_prompt < self.max_model_len else "prompt",
            )
        blocks_needed = math.ceil((num_prompt + params.max_tokens) / self.config.block_size)
        if blocks_needed > self.num_blocks:
            raise CacheMemoryError(
                f"request needs {blocks_needed} KV blocks but the pool has only {self.num_blocks}", param="max_tokens"
            )
        if not self.config.enable_chunked_prefill and num_prompt > self.config.max_total_tokens:
            raise ValidationError(
                f"prompt has {num_prompt} tokens, more than max_total_tokens={self.config.max_total_tokens}"
                " and chunked prefill is disabled",
                param="prompt",
            )
        if params.n > self.config.max_num_seqs:
            raise ValidationError(f"n must be at most max_num_seqs={self.config.max_num_seqs}, got {params.n}", param="n")
        with self._lock:
            request_id = request_id or uuid.uuid4().hex
            if request_id in self._requests:
                raise ValidationError(f"request id {request_id!r} is already in use", param="request_id")
            if len(self.scheduler.waiting) + len(self._inbox) >= self.config.max_waiting_requests:
                raise SchedulerError(f"the waiting queue is full ({self.config.max_waiting_requests} requests)")
            request = Request(
                request_id=request_id,
                prompt_text=prompt_text,
                prompt_token_ids=token_ids,
                params=params,
                arrival_index=next(self._arrivals),
                arrival_time=time.monotonic(),
                on_output=on_output,
            )
            self._requests[request_id] = request
            self._inbox.append(request)
        return request_id

    def abort_request(self, request_id: str) -> bool:
        """Cancel a request; its blocks are freed at the next step. False if it is unknown or finished."""
        with self._lock:
            request = self._requests.get(request_id)
            if request is None or request.is_finished:
                return False
            self._aborts.append(request_id)
            return True

    # ------------------------------------------------------------------ stepping

    def has_pending_work(self) -> bool:
        with self._lock:
            return bool(self._inbox or self._aborts or self.scheduler.has_unfinished())

    def step(self) -> list[CompletedRequest]:
        """Run one scheduling step and return the requests that finished in it."""
        started = time.monotonic()
        finished: list[Request] = []
        self._take_inbox(finished)
        plan = self.scheduler.schedule()
        if plan.work:
            try:
                output = self._execute(plan)
            except ExecutionError as error:
                self._fail_batch(plan, error, finished)
            else:
                self._process(plan, output, finished)
        completed = [self._finish_request(r) for r in finished]
        self._update_metrics(plan, started)
        return completed

    def _take_inbox(self, finished: list[Request]) -> None:
        with self._lock:
            new, self._inbox = self._inbox, []
            aborts, self._aborts = self._aborts, []
        for request in new:
            seq = Sequence(
                seq_id=self.scheduler.new_seq_id(),
                request=request,
                index=0,
                token_ids=list(request.prompt_token_ids),
                num_prompt_tokens=len(request.prompt_token_ids),
                pending_forks=request.params.n - 1,
            )
            request.sequences.append(seq)
            self.scheduler.add(seq)
            self.metrics.requests_submitted += 1
            self.metrics.prompt_tokens += seq.num_prompt_tokens
        for request_id in aborts:
            request = self._requests.get(request_id)
            if request is not None and not request.is_finished:
                self._end_request(request, FinishReason.ABORT, finished)

    def _execute(self, plan: SchedulerOutput) -> ExecutionOutput:
        """Run the step's batch, retrying a failing executor; ``ExecutionError`` once retries run out."""
        batch = ExecutionBatch(
            sequences=[
                ScheduledSequence(
                    seq_id=w.seq.seq_id,
                    token_ids=w.seq.token_ids[w.seq.num_computed_tokens : w.seq.num_computed_tokens + w.num_new_tokens],
                    start_position=w.seq.num_computed_tokens,
                    block_table=self.allocator.block_table(w.seq.seq_id),
                    do_sample=w.do_sample,
                    params=w.seq.request.params,
                    all_token_ids=w.seq.token_ids,
                    num_prompt_tokens=w.seq.num_prompt_tokens,
                    seed=w.seq.sampling_seed,
                )
                for w in plan.work
            ],
            block_size=self.config.block_size,
            block_copies=plan.block_copies,
        )
        attempts = self.config.max_retry_attempts + 1
        error = ""
        for attempt in range(1, attempts + 1):
            try:
                return self.executor.execute(batch)
            except Exception as exc:  # any executor fault: retry, then fail only this batch's requests
                error = f"{type(exc).__name__}: {exc}"
                log.warning("executor failed", attempt=attempt, error=error)
                if attempt < attempts:
                    self.metrics.num_execution_retries += 1
        raise ExecutionError(f"execution failed after {attempts} attempts: {error}")

    def _fail_batch(self, plan: SchedulerOutput, error: ExecutionError, finished: list[Request]) -> None:
        for request in {id(w.seq.request): w.seq.request for w in plan.work}.values():
            if not request.is_finished:
                request.error = error.message
                self._end_request(request, FinishReason.ERROR, finished)

    def _process(self, plan: SchedulerOutput, output: ExecutionOutput, finished: list[Request]) -> None:
        for work in plan.work:
            seq = work.seq
            if seq.is_finished:  # its request ended earlier in this loop
                continue
            seq.num_computed_tokens += work.num_new_tokens
            if work.do_sample:
                logprobs = output.logprobs.get(seq.seq_id)
                self.outputs.append_token(seq, output.sampled_token_ids[seq.seq_id], logprobs)
                self.metrics.generation_tokens += 1
                if seq.finish_reason is not None:
                    self._finish_sequence(seq)
                self._emit(seq, 1, int(logprobs is not None))
                if seq.request.is_finished:
                    finished.append(seq.request)
            elif seq.pending_forks and seq.num_computed_tokens == seq.num_tokens - 1:
                self.scheduler.fork(seq)

    def _emit(self, seq: Sequence, num_new_tokens: int, num_new_logprobs: int) -> None:
        if seq.request.on_output is not None:
            seq.request.on_output(self.outputs.delta(seq, num_new_tokens, num_new_logprobs))

    def _finish_sequence(self, seq: Sequence) -> None:
        seq.state = RequestState.FAILED if seq.finish_reason is FinishReason.ERROR else RequestState.COMPLETED
        seq.pending_forks = 0
        self.scheduler.remove(seq)

    def _end_request(self, request: Request, reason: FinishReason, finished: list[Request]) -> None:
        """Finish every unfinished sample of ``request`` with ``reason`` (abort or error).

        Samples not yet forked off the prompt are created finished, so each of
        the ``n`` samples still gets its final delta and its output.
        """
        for parent in list(request.sequences):
            for _ in range(parent.pending_forks):
                request.sequences.append(
                    Sequence(
                        seq_id=self.scheduler.new_seq_id(),
                        request=request,
                        index=len(request.sequences),
                        token_ids=list(parent.prompt_token_ids),
                        num_prompt_tokens=parent.num_prompt_tokens,
                    )
                )
            parent.pending_forks = 0
        for seq in request.sequences:
            if not seq.is_finished:
                seq.finish_reason = reason
                self._finish_sequence(seq)
                self._emit(seq, 0, 0)
        finished.append(request)

    def _finish_request(self, request: Request) -> CompletedRequest:
        request.finish_time = time.monotonic()
        request.state = RequestState.FAILED if request.error else RequestState.COMPLETED
        with self._lock:
            self._requests.pop(request.request_id, None)
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
        if self._finish_observers is not None:
            self._finish_observers(engine=self, completed=completed)
        return completed

    def _update_metrics(self, plan: SchedulerOutput, started: float) -> None:
        stats = self.allocator.stats()
        metrics = self.metrics
        metrics.num_steps += 1
        metrics.num_preemptions += len(plan.preempted)
        metrics.prefix_cache_queries = stats.prefix_cache_queries
        metrics.prefix_cache_hits = stats.prefix_cache_hits
        metrics.num_running = len(self.scheduler.running)
        metrics.num_waiting = len(self.scheduler.waiting)
        metrics.kv_cache_usage = stats.usage
        if self._step_observers is not None:
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
        """Submit ``prompts``, run until they finish, and return their records in prompt order."""
        ids = [self.submit_request(p, params) for p in prompts]
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
        self.executor.close()
