"""The engine loop on the mock executor: results, stopping, streaming, errors, observers."""

from __future__ import annotations

import re

import pytest

from hetero_core.config import EngineConfig
from hetero_core.engine import InferenceEngine
from hetero_core.errors import CacheMemoryError, SchedulerError, ValidationError
from hetero_core.hookspecs import hookimpl
from hetero_core.params import GenerationParams
from hetero_core.sequence import FinishReason

from .conftest import core_plugin_manager, mock_config

GREEDY = GenerationParams(temperature=0.0, max_tokens=12)


def test_generate_returns_records_in_prompt_order(make_engine) -> None:
    engine = make_engine()
    records = engine.generate(["hello", "a longer prompt here", "x"], GREEDY)
    assert [r.input_text for r in records] == ["hello", "a longer prompt here", "x"]
    for record in records:
        assert record.finish_reason is FinishReason.LENGTH
        assert len(record.generated_tokens) == 12
        assert record.input_tokens == list(record.input_text.encode())
        assert record.duration >= record.time_to_first_token >= 0
    assert engine.get_memory_stats().used_blocks == 0
    assert not engine.has_pending_work()


def test_same_prompt_same_output_whatever_the_batch(make_engine) -> None:
    alone = make_engine().generate(["the prompt"], GREEDY)[0]
    crowd = make_engine().generate(["other", "the prompt", "more text"], GREEDY)[1]
    assert crowd.generated_tokens == alone.generated_tokens


def test_eos_stops_unless_ignored(make_engine) -> None:
    engine = make_engine(executor={"name": "mock", "eos_probability": 0.3})
    stopped = engine.generate(["abc"], GenerationParams(temperature=0.0, max_tokens=64))[0]
    assert stopped.finish_reason is FinishReason.STOP
    assert stopped.generated_tokens[-1] == engine.tokenizer.eos_token_id
    assert len(stopped.generated_tokens) < 64
    ignored = engine.generate(["abc"], GenerationParams(temperature=0.0, max_tokens=64, ignore_eos=True))[0]
    assert ignored.finish_reason is FinishReason.LENGTH and len(ignored.generated_tokens) == 64


def test_min_tokens_delays_eos(make_engine) -> None:
    engine = make_engine(executor={"name": "mock", "eos_probability": 0.5})
    record = engine.generate(["abc"], GenerationParams(temperature=0.0, max_tokens=40, min_tokens=10))[0]
    assert len(record.generated_tokens) >= 10


def test_stop_token_ids(make_engine) -> None:
    engine = make_engine()
    free = engine.generate(["stop here"], GREEDY)[0]
    stop_at = free.generated_tokens[4]
    first = free.generated_tokens.index(stop_at)
    record = engine.generate(["stop here"], GenerationParams(temperature=0.0, max_tokens=12, stop_token_ids=[stop_at]))[
        0
    ]
    assert record.finish_reason is FinishReason.STOP
    assert record.generated_tokens == free.generated_tokens[: first + 1]


def test_stop_string_truncates_and_is_never_streamed(make_engine) -> None:
    engine = make_engine(executor={"name": "mock", "vocab_size": 128})  # ASCII only
    params = GenerationParams(temperature=0.0, max_tokens=30)
    free = engine.generate(["find a stop"], params)[0]
    stop = free.output_text[8:10]
    expected = free.output_text[: free.output_text.index(stop)]
    streamed = list(engine.stream("find a stop", GenerationParams(temperature=0.0, max_tokens=30, stop=[stop])))
    assert "".join(d.text for d in streamed) == expected
    assert streamed[-1].finish_reason is FinishReason.STOP


def test_stop_string_kept_when_asked_even_streamed(make_engine) -> None:
    engine = make_engine(executor={"name": "mock", "vocab_size": 128})
    free = engine.generate(["find a stop"], GenerationParams(temperature=0.0, max_tokens=30))[0].output_text
    stop = free[8:11]
    params = GenerationParams(temperature=0.0, max_tokens=30, stop=[stop], include_stop_str_in_output=True)
    streamed = list(engine.stream("find a stop", params))
    assert (
        "".join(d.text for d in streamed)
        == free[: free.index(stop) + 3]
        == engine.generate(["find a stop"], params)[0].output_text
    )
    assert streamed[-1].finish_reason is FinishReason.STOP


def test_special_tokens_enter_the_text_only_when_not_skipped(make_engine) -> None:
    engine = make_engine()
    bos = engine.tokenizer.bos_token_id
    forced = dict(temperature=0.0, max_tokens=2, logit_bias={bos: 100})
    assert engine.generate(["x"], GenerationParams(**forced))[0].output_text == ""
    assert engine.generate(["x"], GenerationParams(**forced, skip_special_tokens=False))[0].output_text == "<s><s>"


def test_stream_deltas_concatenate_to_the_output(make_engine) -> None:
    engine = make_engine()
    deltas = list(engine.stream("stream me", GREEDY))
    record = make_engine().generate(["stream me"], GREEDY)[0]
    assert "".join(d.text for d in deltas) == record.output_text
    assert [t for d in deltas for t in d.token_ids] == record.generated_tokens
    assert [d.finish_reason for d in deltas][-1] is FinishReason.LENGTH
    assert all(d.finish_reason is None for d in deltas[:-1])


def test_pre_tokenized_prompt(make_engine) -> None:
    engine = make_engine()
    by_text = engine.generate(["hi!"], GREEDY)[0]
    by_ids = engine.generate([list(b"hi!")], GREEDY)[0]
    assert by_ids.generated_tokens == by_text.generated_tokens


def test_chat_uses_the_template(make_engine) -> None:
    engine = make_engine()
    deltas: list = []
    engine.submit_chat([{"role": "user", "content": "hey"}], GREEDY, on_output=deltas.append)
    record = engine.run()[0]
    assert record.input_text == "user: hey\nassistant: "
    assert "".join(d.text for d in deltas) == record.output_text


@pytest.mark.parametrize("state", ["waiting", "running"])
def test_abort_frees_every_block(make_engine, state: str) -> None:
    engine = make_engine()
    deltas: list = []
    request_id = engine.submit_request("abort me " * 5, GenerationParams(max_tokens=40), on_output=deltas.append)
    if state == "running":
        for _ in range(3):
            engine.step()
        assert engine.get_memory_stats().used_blocks > 0
    assert engine.abort_request(request_id)
    records = engine.step()
    assert [r.finish_reason for r in records] == [FinishReason.ABORT]
    assert deltas[-1].finish_reason is FinishReason.ABORT
    assert engine.get_memory_stats().used_blocks == 0
    assert not engine.abort_request(request_id)
    assert not engine.has_pending_work()


@pytest.mark.parametrize("steps_before", [0, 1])
def test_aborting_while_samples_are_held_still_ends_every_sample(make_engine, steps_before: int) -> None:
    engine = make_engine()
    deltas: list = []
    request_id = engine.submit_request(
        "a prompt long enough to take a few chunks", GenerationParams(n=3, max_tokens=5), on_output=deltas.append
    )
    for _ in range(steps_before):
        engine.step()
    engine.abort_request(request_id)
    record = engine.run()[0]
    assert sorted(d.index for d in deltas if d.finish_reason is FinishReason.ABORT) == [0, 1, 2]
    assert [o.index for o in record.outputs] == [0, 1, 2]
    assert engine.get_memory_stats().used_blocks == 0


def test_submit_rejects_what_could_never_run(make_engine) -> None:
    engine = make_engine(max_model_len=64, max_num_blocks=8, block_size=4, max_waiting_requests=2)
    with pytest.raises(ValidationError, match="exceed the maximum context length of 64"):
        engine.submit_request("x" * 60, GenerationParams(max_tokens=10))
    with pytest.raises(CacheMemoryError, match="needs 10 KV blocks but the pool has only 8"):
        engine.submit_request("x" * 20, GenerationParams(max_tokens=20))
    with pytest.raises(ValidationError, match="must not be empty"):
        engine.submit_request("", GREEDY)
    with pytest.raises(ValidationError, match=r"\[0, 259\)"):
        engine.submit_request([1, 2, 999], GREEDY)
    engine.submit_request("a", GREEDY)
    engine.submit_request("b", GREEDY)
    with pytest.raises(SchedulerError, match="waiting queue is full"):
        engine.submit_request("c", GREEDY)


def test_duplicate_request_id_rejected(make_engine) -> None:
    engine = make_engine()
    engine.submit_request("a", GREEDY, request_id="same")
    with pytest.raises(ValidationError, match="already in use"):
        engine.submit_request("b", GREEDY, request_id="same")


def test_parallel_samples_share_the_prompt(make_engine) -> None:
    engine = make_engine()
    params = GenerationParams(temperature=1.0, max_tokens=10, n=3, seed=7)
    record = engine.generate(["share this prompt please"], params)[0]
    assert sorted(o.index for o in record.outputs) == [0, 1, 2]
    assert len({tuple(o.token_ids) for o in record.outputs}) == 3  # distinct seeds per sample
    assert engine.get_memory_stats().used_blocks == 0
    again = make_engine().generate(["share this prompt please"], params)[0]
    assert [o.token_ids for o in again.outputs] == [o.token_ids for o in record.outputs]


class FlakyExecutorPlugin:
    """Wraps the mock executor: fails every batch that holds the poisoned token, or the first few batches."""

    POISON = 255

    def __init__(self, failures_before_success: int = 0) -> None:
        self.failures_left = failures_before_success

    @hookimpl
    def register_executors(self, register) -> None:
        from hetero_core.builtin.mock_executor import MockExecutor

        plugin = self

        class Flaky(MockExecutor):
            def execute(self, batch):
                if plugin.failures_left > 0:
                    plugin.failures_left -= 1
                    raise RuntimeError("transient fault")
                if any(FlakyExecutorPlugin.POISON in s.token_ids for s in batch.sequences):
                    raise RuntimeError("poisoned batch")
                return super().execute(batch)

        register("flaky", lambda config, **options: Flaky(**options))


def flaky_engine(plugin: FlakyExecutorPlugin, **overrides) -> InferenceEngine:
    return InferenceEngine(
        mock_config(executor="flaky", **overrides), plugin_manager=core_plugin_manager((plugin, "flaky"))
    )


def test_transient_executor_faults_are_retried() -> None:
    engine = flaky_engine(FlakyExecutorPlugin(failures_before_success=2), max_retry_attempts=2)
    record = engine.generate(["retry"], GREEDY)[0]
    assert record.finish_reason is FinishReason.LENGTH
    assert engine.metrics.num_execution_retries == 2


def test_a_failing_batch_fails_only_its_requests(caplog) -> None:
    engine = flaky_engine(FlakyExecutorPlugin(), max_batch_size=1)
    good = engine.submit_request("fine", GREEDY)
    bad = engine.submit_request([FlakyExecutorPlugin.POISON, 1], GREEDY)
    records = {r.request_id: r for r in engine.run()}
    assert records[good].finish_reason is FinishReason.LENGTH
    assert records[bad].finish_reason is FinishReason.ERROR
    error_id = re.search(r"executor plugin 'flaky' failed .* \(error id (\w+);", records[bad].error).group(1)
    assert "poisoned" not in records[bad].error  # the exception's text goes to the log only
    assert any(error_id in r.getMessage() and "poisoned batch" in r.getMessage() for r in caplog.records)
    assert engine.get_memory_stats().used_blocks == 0
    assert engine.metrics.requests_finished[FinishReason.ERROR] == 1


def test_a_sequence_that_fails_its_batch_fails_alone() -> None:
    """An executor that raises for the whole batch: after the retries each sequence runs alone, once."""
    alone = flaky_engine(FlakyExecutorPlugin()).generate(["fine", "also fine"], GREEDY)
    engine = flaky_engine(FlakyExecutorPlugin(), max_retry_attempts=1)
    good = [engine.submit_request(prompt, GREEDY) for prompt in ("fine", "also fine")]
    bad = engine.submit_request([FlakyExecutorPlugin.POISON, 1], GenerationParams(temperature=0.0, max_tokens=12, n=2))
    records = {r.request_id: r for r in engine.run()}
    assert [records[i].generated_tokens for i in good] == [r.generated_tokens for r in alone]
    assert (
        records[bad].finish_reason is FinishReason.ERROR and "failed to run this request, alone" in records[bad].error
    )
    assert engine.metrics.num_execution_retries == 1
    assert engine.get_memory_stats().used_blocks == 0


def test_observer_hooks_see_the_engine_work() -> None:
    seen: dict[str, list] = {"started": [], "steps": [], "finished": []}

    class Observer:
        @hookimpl
        def on_engine_started(self, engine):
            seen["started"].append(engine)

        @hookimpl
        def on_step_finished(self, engine, stats):
            seen["steps"].append(stats)

        @hookimpl
        def on_request_finished(self, engine, completed):
            seen["finished"].append(completed.request_id)

    engine = InferenceEngine(mock_config(), plugin_manager=core_plugin_manager((Observer(), "observer")))
    request_id = engine.submit_request("watch", GREEDY)
    engine.run()
    assert seen["started"] == [engine]
    assert seen["finished"] == [request_id]
    assert sum(s.num_decode_tokens for s in seen["steps"]) == 11
    assert sum(s.num_prefill_tokens for s in seen["steps"]) == 5


def test_config_from_engine_defaults_are_the_seed_ones() -> None:
    config = EngineConfig()
    assert (config.block_size, config.max_num_blocks, config.max_batch_size, config.max_num_seqs) == (16, 1024, 32, 256)
    assert (config.max_model_len, config.max_total_tokens, config.memory_threshold, config.max_retry_attempts) == (
        2048,
        4096,
        0.9,
        2,
    )
