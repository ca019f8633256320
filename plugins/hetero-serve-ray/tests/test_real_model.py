"""Two replicas of the embedded SmolLM2 (one thread each) answer exactly as one engine does,
through the openai client."""

from __future__ import annotations

from typing import Iterator

import openai
import pytest
import ray
from serve_ray_harness import ReplicatedServer, num_completed, wait_until

from hetero_core.config import EngineConfig
from hetero_core.engine import InferenceEngine
from hetero_core.params import GenerationParams

pytestmark = pytest.mark.model  # the embedded model, in two replicas

MAX_TOKENS = 24
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,"]
CHATS = ["What is 2 + 2?", "Name a colour of the rainbow."]


def model_config(**overrides) -> EngineConfig:
    values = dict(
        executor={"name": "torch", "dtype": "float32", "num_threads": 1}, max_model_len=512, max_num_blocks=128
    )
    values.update(overrides)
    return EngineConfig.from_mapping(values)


@pytest.fixture(scope="module")
def single_engine_answers() -> dict[str, str]:
    """Greedy answers of one engine in this process, one request at a time."""
    engine = InferenceEngine(model_config())
    params = GenerationParams(max_tokens=MAX_TOKENS, temperature=0.0)
    answers = {prompt: engine.generate([prompt], params)[0].output_text for prompt in PROMPTS}
    for question in CHATS:
        engine.submit_chat([{"role": "user", "content": question}], params, request_id=question)
        answers[question] = next(r.output_text for r in engine.run() if r.request_id == question)
    engine.close()
    return answers


@pytest.fixture(scope="module")
def server(ray_cluster: str) -> Iterator[ReplicatedServer]:
    options = {"num_cpus_per_replica": 1, "num_threads_per_replica": 1}
    config = model_config(data_parallel_size=2, server={"model_name": "smollm2", "backend_options": options})
    with ReplicatedServer(config, ready_timeout=480) as running:  # two model loads on a busy machine
        yield running


def test_two_replicas_answer_like_one_engine(server: ReplicatedServer, single_engine_answers: dict[str, str]) -> None:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused")
    for prompt in PROMPTS:
        answer = client.completions.create(model="smollm2", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0)
        assert answer.choices[0].text == single_engine_answers[prompt]
        streamed = client.completions.create(
            model="smollm2", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0, stream=True
        )
        assert "".join(chunk.choices[0].text for chunk in streamed if chunk.choices) == single_engine_answers[prompt]
    for question in CHATS:
        messages = [{"role": "user", "content": question}]
        answer = client.chat.completions.create(
            model="smollm2", messages=messages, max_tokens=MAX_TOKENS, temperature=0
        )
        assert answer.choices[0].message.content == single_engine_answers[question]
        streamed = client.chat.completions.create(
            model="smollm2", messages=messages, max_tokens=MAX_TOKENS, temperature=0, stream=True
        )
        assert (
            "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == single_engine_answers[question]
        )
    # a replica counts a request finished after its last delta has gone out, so the count may lag the client
    expected = 2 * (len(PROMPTS) + len(CHATS))
    wait_until(
        lambda: sum(served_by(server)) == expected,
        f"replicas' metrics to count {expected} finished requests",
        timeout=10.0,
    )
    assert all(served_by(server))  # both replicas answered


def served_by(server: ReplicatedServer) -> list[int]:
    return [num_completed(ray.get(r.actor.metrics.remote())) for r in server.backend.replicas]
