"""The Python API used as a library: wrong arguments, raising callbacks, threads, closing, quiet logs."""

from __future__ import annotations

import gc
import subprocess
import sys
import threading
import time

import pytest

import hetero_core
from hetero_core.engine import InferenceEngine
from hetero_core.errors import EngineError, SchedulerError, ValidationError
from hetero_core.params import GenerationParams
from hetero_core.sequence import FinishReason

GREEDY = GenerationParams(temperature=0.0, max_tokens=8)


def test_the_engine_is_exported_from_the_package() -> None:
    assert hetero_core.InferenceEngine is InferenceEngine and "InferenceEngine" in hetero_core.__all__


@pytest.mark.parametrize(
    ("call", "param"),
    [
        (lambda e: e.submit_request(None), "prompt"),
        (lambda e: e.submit_request(42), "prompt"),
        (lambda e: e.submit_request(b"bytes"), "prompt"),
        (lambda e: e.submit_request({"text": "x"}), "prompt"),
        (lambda e: e.submit_request(["a", "b"]), "prompt"),
        (lambda e: e.submit_request("x", {"temperature": 0}), "params"),
        (lambda e: e.submit_request("x", request_id=5), "request_id"),
        (lambda e: e.submit_request("x", on_output="print"), "on_output"),
        (lambda e: e.submit_request("x", GenerationParams(top_k=260)), "top_k"),
        (lambda e: e.submit_request("x", GenerationParams(stop_token_ids=[259])), "stop_token_ids"),
        (lambda e: e.submit_chat("hello"), "messages"),
        (lambda e: e.submit_chat([]), "messages"),
        (lambda e: e.submit_chat(["hello"]), "messages"),
        (lambda e: e.generate("one prompt"), "prompt"),
        (lambda e: GenerationParams(ignore_eos=1), "ignore_eos"),
    ],
)
def test_wrong_arguments_are_validation_errors(make_engine, call, param: str) -> None:
    engine = make_engine()
    with pytest.raises(ValidationError) as raised:
        call(engine)
    assert raised.value.param == param
    assert not engine.has_pending_work()


def test_a_raising_callback_ends_only_its_request(make_engine) -> None:
    engine = make_engine()

    def explode(delta) -> None:
        raise RuntimeError("callback bug")

    alone = engine.generate(["steady"], GREEDY)[0]
    bad = engine.submit_request("boom", GREEDY, request_id="same-id", on_output=explode)
    good = engine.submit_request("steady", GREEDY)
    records = {r.request_id: r for r in engine.run()}
    assert records[bad].finish_reason is FinishReason.ERROR
    assert records[bad].error == "the on_output callback raised RuntimeError: callback bug"
    assert records[good].generated_tokens == alone.generated_tokens
    assert engine.get_memory_stats().used_blocks == 0 and not engine.has_pending_work()
    engine.submit_request("reuse", GREEDY, request_id="same-id")  # the id is free again
    assert engine.run()[0].finish_reason is FinishReason.LENGTH


@pytest.mark.parametrize(
    ("interrupt", "error"), [(SystemExit(3), "SystemExit: 3"), (KeyboardInterrupt(), "KeyboardInterrupt")]
)
def test_a_callback_raising_an_interrupt_ends_its_request_and_raises_once(make_engine, interrupt, error: str) -> None:
    engine = make_engine()

    def interrupt_the_caller(delta) -> None:
        raise interrupt

    alone = engine.generate(["steady"], GREEDY)[0]
    bad = engine.submit_request("boom", GREEDY, on_output=interrupt_the_caller)
    good = engine.submit_request("steady", GREEDY)
    with pytest.raises(type(interrupt)):
        engine.run()
    records = {r.request_id: r for r in engine.run()}
    assert records[bad].finish_reason is FinishReason.ERROR
    assert records[bad].error == f"the on_output callback raised {error}"
    assert records[good].generated_tokens == alone.generated_tokens
    assert engine.get_memory_stats().used_blocks == 0 and not engine.has_pending_work()


def test_a_callback_raising_on_the_last_delta_keeps_the_result(make_engine) -> None:
    engine = make_engine()

    def explode_at_the_end(delta) -> None:
        if delta.is_finished:
            raise RuntimeError("late bug")

    engine.submit_request("steady", GREEDY, on_output=explode_at_the_end)
    record = engine.run()[0]
    assert record.finish_reason is FinishReason.LENGTH and record.error is None and len(record.generated_tokens) == 8


def test_step_from_two_threads_is_refused(make_engine) -> None:
    engine = make_engine(executor={"name": "mock", "step_latency": 0.2})
    engine.submit_request("slow", GREEDY)
    stepping = threading.Thread(target=engine.step)
    stepping.start()
    time.sleep(0.05)
    with pytest.raises(EngineError, match="step\\(\\) is already running in another thread"):
        engine.step()
    stepping.join()
    assert len(engine.run()) == 1 and engine.get_memory_stats().used_blocks == 0


def test_a_closed_engine_refuses_work(make_engine) -> None:
    engine = make_engine()
    engine.close()
    engine.close()
    with pytest.raises(SchedulerError, match="closed"):
        engine.submit_request("late", GREEDY)
    with pytest.raises(SchedulerError, match="closed"):
        engine.step()


def test_generate_leaves_nothing_queued_when_a_prompt_is_rejected(make_engine) -> None:
    engine = make_engine()
    with pytest.raises(ValidationError, match="prompt must not be empty"):
        engine.generate(["fine", "also fine", ""], GREEDY)
    assert not engine.has_pending_work()
    assert engine.generate(["fine"], GREEDY)[0].finish_reason is FinishReason.LENGTH


LIBRARY_USE = """
from hetero_core import EngineConfig, GenerationParams, InferenceEngine
config = EngineConfig.from_mapping({
    "tokenizer": "simple", "executor": "mock", "scheduler": "reference", "cache_allocator": "reference",
    "block_size": 4, "max_num_blocks": 64, "plugins": {"load": ["hetero_core.testing.reference"]},
})
engine = InferenceEngine(config)
engine.generate(["quiet please"] * 3, GenerationParams(temperature=0.0, max_tokens=4))
"""


def test_used_as_a_library_the_engine_prints_nothing() -> None:
    result = subprocess.run([sys.executable, "-c", LIBRARY_USE], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert (result.stdout, result.stderr) == ("", "")


@pytest.mark.parametrize("enabled", [True, False])
@pytest.mark.parametrize("fails", [False, True])
def test_the_garbage_collector_is_paused_while_the_engine_starts(make_engine, monkeypatch, enabled, fails) -> None:
    seen: list[bool] = []
    start = InferenceEngine._start

    def recording_start(self, registry) -> None:
        seen.append(gc.isenabled())
        if fails:
            raise RuntimeError("start failed")
        start(self, registry)

    monkeypatch.setattr(InferenceEngine, "_start", recording_start)
    (gc.enable if enabled else gc.disable)()
    try:
        if fails:
            with pytest.raises(RuntimeError, match="start failed"):
                make_engine()
        else:
            make_engine()
        assert seen == [False]
        assert gc.isenabled() is enabled
    finally:
        gc.enable()
