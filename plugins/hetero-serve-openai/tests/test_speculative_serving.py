"""A server whose engine speculates (prompt lookup) answers through every endpoint as one that does not."""

from __future__ import annotations

from typing import Iterator

import httpx
import openai
import pytest

from hetero_core.config import EngineConfig
from hetero_core.testing.plugin_isolation import installed_plugins

from .conftest import RunningServer

pytestmark = [pytest.mark.model, pytest.mark.integration]  # the embedded model and the speculators plugin

PASSAGE = "The lamp was lit at dusk, and the keeper watched the ships pass the rocks until dawn."
CHAT = [{"role": "user", "content": f"Repeat this sentence exactly: {PASSAGE}"}]


@pytest.fixture(scope="module")
def speculative_server() -> Iterator[RunningServer]:
    config = EngineConfig(
        executor={"name": "torch", "dtype": "float32"},
        max_model_len=1024,
        speculator={"name": "ngram", "min_ngram": 1},
        server={"model_name": "smollm2"},
    )
    with installed_plugins():
        server = RunningServer(config).start()
    try:
        yield server
    finally:
        server.__exit__()


def clients(model_server, speculative_server) -> list[openai.OpenAI]:
    return [
        openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
        for server in (model_server, speculative_server)
    ]


def test_chat_completion_and_responses_are_the_same_with_speculation(model_server, speculative_server) -> None:
    plain, speculative = clients(model_server, speculative_server)
    answers = [
        c.chat.completions.create(model="smollm2", messages=CHAT, max_tokens=32, temperature=0)
        for c in (plain, speculative)
    ]
    assert answers[0].choices[0].message.content == answers[1].choices[0].message.content
    assert answers[0].usage == answers[1].usage
    prompt = f"Copy: {PASSAGE}\nCopy: {PASSAGE}\nCopy:"
    texts = [
        c.completions.create(model="smollm2", prompt=prompt, max_tokens=24, temperature=0) for c in (plain, speculative)
    ]
    assert texts[0].choices[0].text == texts[1].choices[0].text
    responses = [
        c.responses.create(model="smollm2", input=CHAT[0]["content"], max_output_tokens=24, temperature=0)
        for c in (plain, speculative)
    ]
    assert responses[0].output_text == responses[1].output_text


def test_a_speculative_stream_matches_the_whole_answer_and_metrics_count_it(speculative_server) -> None:
    client = openai.OpenAI(base_url=f"{speculative_server.url}/v1", api_key="unused", max_retries=0)
    whole = client.chat.completions.create(model="smollm2", messages=CHAT, max_tokens=32, temperature=0)
    stream = client.chat.completions.create(model="smollm2", messages=CHAT, max_tokens=32, temperature=0, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == whole.choices[0].message.content
    metrics = httpx.get(f"{speculative_server.url}/metrics").text
    values = {
        line.split()[0].split("{")[0]: float(line.split()[-1])
        for line in metrics.splitlines()
        if line.startswith(("vllm:spec", "hetero:spec"))
    }
    assert values["vllm:spec_decode_num_accepted_tokens_total"] > 0
    assert values["vllm:spec_decode_num_draft_tokens_total"] >= values["vllm:spec_decode_num_accepted_tokens_total"]
    assert values["hetero:spec_decode_mean_accepted_length"] > 0
