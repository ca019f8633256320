"""The official openai client against a running server with the real embedded model."""

from __future__ import annotations

import openai
import pytest

pytestmark = [pytest.mark.model, pytest.mark.integration]  # the embedded model, through the installed plugins

CHAT = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def client(model_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{model_server.url}/v1", api_key="unused", max_retries=0)


def test_models_lists_the_served_model(client) -> None:
    assert [m.id for m in client.models.list().data] == ["smollm2"]


def test_chat_answers_for_real(client) -> None:
    response = client.chat.completions.create(model="smollm2", messages=CHAT, max_tokens=20, temperature=0)
    choice = response.choices[0]
    assert "Paris" in choice.message.content
    assert choice.finish_reason == "stop"
    assert response.usage.prompt_tokens == 37
    assert response.usage.completion_tokens >= 2
    assert response.usage.total_tokens == response.usage.prompt_tokens + response.usage.completion_tokens


def test_streaming_chat_equals_the_whole_answer(client) -> None:
    whole = client.chat.completions.create(model="smollm2", messages=CHAT, max_tokens=20, temperature=0)
    stream = client.chat.completions.create(
        model="smollm2",
        messages=CHAT,
        max_tokens=20,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_completion_length_and_echo(client) -> None:
    response = client.completions.create(model="smollm2", prompt="The sky is", max_tokens=5, temperature=0, echo=True)
    choice = response.choices[0]
    assert choice.text.startswith("The sky is") and len(choice.text) > len("The sky is")
    assert choice.finish_reason == "length"
    assert response.usage.completion_tokens == 5


def test_several_prompts_and_samples(client) -> None:
    response = client.completions.create(
        model="smollm2", prompt=["One", "Two"], max_tokens=4, n=2, temperature=0.8, seed=3
    )
    assert sorted(c.index for c in response.choices) == [0, 1, 2, 3]
    assert response.usage.completion_tokens == 16


def test_stop_strings_end_the_text(client) -> None:
    free = client.completions.create(model="smollm2", prompt="1, 2, 3, 4,", max_tokens=12, temperature=0)
    stop = free.choices[0].text[3:5]
    stopped = client.completions.create(
        model="smollm2", prompt="1, 2, 3, 4,", max_tokens=12, temperature=0, stop=[stop]
    )
    assert stopped.choices[0].text == free.choices[0].text[: free.choices[0].text.index(stop)]
    assert stopped.choices[0].finish_reason == "stop"


def test_logprobs(client) -> None:
    response = client.completions.create(model="smollm2", prompt="Hello", max_tokens=3, temperature=0, logprobs=2)
    logprobs = response.choices[0].logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.top_logprobs) == 3
    assert all(lp <= 0 for lp in logprobs.token_logprobs)
    assert all(len(top) <= 2 for top in logprobs.top_logprobs)
    chat = client.chat.completions.create(
        model="smollm2", messages=CHAT, max_tokens=3, temperature=0, logprobs=True, top_logprobs=2
    )
    entries = chat.choices[0].logprobs.content
    assert len(entries) == 3 and all(len(e.top_logprobs) == 2 for e in entries)
    assert entries[0].top_logprobs[0].logprob == pytest.approx(entries[0].logprob)  # greedy picks the top


def test_errors_surface_as_client_exceptions(client) -> None:
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.completions.create(model="smollm2", prompt="x", temperature=3)
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.completions.create(model="gpt-4", prompt="x")
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        client.completions.create(model="smollm2", prompt="word " * 1100, max_tokens=10)


def test_a_response_message_goes_back_as_the_sdk_dumps_it(client) -> None:
    first = client.chat.completions.create(model="smollm2", messages=CHAT, max_tokens=20, temperature=0)
    answer = first.choices[0].message.model_dump()
    assert answer["refusal"] is None and "audio" in answer and "function_call" in answer  # what the SDK adds
    named = [
        {"role": "system", "content": "You are a geography teacher.", "name": "teacher"},
        {**CHAT[0], "name": "alice"},
    ]
    follow_up = {"role": "user", "content": "And what is the capital of Italy?", "name": "alice"}
    second = client.chat.completions.create(
        model="smollm2", messages=[*named, answer, follow_up], max_tokens=20, temperature=0
    )
    assert second.choices[0].finish_reason == "stop" and second.choices[0].message.content
