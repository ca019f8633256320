"""Scoring prompts over HTTP: lm-evaluation-harness's loglikelihood requests, vLLM's prompt_logprobs, output shaping."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

FACT = "The capital of France is"


@pytest.fixture(scope="module")
def client(model_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{model_server.url}/v1", api_key="unused", max_retries=0)


def loglikelihood(client, tokenizer, context: str, continuation: str) -> tuple[float, bool]:
    """What lm-evaluation-harness's local-completions model asks (echo, logprobs 1,
    max_tokens 1) and how it reads it."""
    response = client.completions.create(
        model="smollm2", prompt=context + continuation, echo=True, logprobs=1, max_tokens=1, temperature=0
    )
    logprobs = response.choices[0].logprobs
    num_context = len(tokenizer.encode(context))
    scored = logprobs.token_logprobs[num_context:-1]
    tops = logprobs.top_logprobs[num_context:-1]
    return sum(scored), all(lp == max(top.values()) for lp, top in zip(scored, tops, strict=True))


def test_echo_with_logprobs_and_no_new_token_scores_the_prompt(client, model_server) -> None:
    response = client.completions.create(model="smollm2", prompt=FACT, echo=True, logprobs=1, max_tokens=0)
    choice = response.choices[0]
    assert choice.text == FACT and choice.finish_reason == "length" and response.usage.completion_tokens == 0
    logprobs = choice.logprobs
    num_prompt = len(model_server.engine.tokenizer.encode(FACT))
    assert (
        len(logprobs.tokens)
        == len(logprobs.token_logprobs)
        == len(logprobs.top_logprobs)
        == len(logprobs.text_offset)
        == num_prompt
    )
    assert "".join(logprobs.tokens) == FACT
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    assert all(lp <= 0 for lp in logprobs.token_logprobs[1:]) and all(
        len(top) == 1 for top in logprobs.top_logprobs[1:]
    )
    assert logprobs.text_offset == [sum(len(t) for t in logprobs.tokens[:i]) for i in range(num_prompt)]
    generating = client.completions.create(
        model="smollm2", prompt=FACT, echo=True, logprobs=1, max_tokens=1, temperature=0
    ).choices[0]
    assert generating.logprobs.token_logprobs[1:num_prompt] == pytest.approx(logprobs.token_logprobs[1:], abs=1e-4)
    assert len(generating.logprobs.tokens) == num_prompt + 1 and generating.logprobs.text_offset[-1] == len(FACT)
    assert generating.text == FACT + generating.logprobs.tokens[-1]


def test_loglikelihood_prefers_the_true_continuation(client, model_server) -> None:
    tokenizer = model_server.engine.tokenizer
    paris, paris_greedy = loglikelihood(client, tokenizer, FACT, " Paris")
    berlin, berlin_greedy = loglikelihood(client, tokenizer, FACT, " Berlin")
    assert paris > berlin + 2 and paris_greedy and not berlin_greedy


def test_vllm_prompt_logprobs_on_both_endpoints(client, model_server) -> None:
    tokenizer = model_server.engine.tokenizer
    response = client.completions.create(
        model="smollm2", prompt=FACT, max_tokens=1, temperature=0, extra_body={"prompt_logprobs": 2}
    )
    scored = response.choices[0].model_extra["prompt_logprobs"]
    ids = tokenizer.encode(FACT)
    assert scored[0] is None and len(scored) == len(ids)
    for token_id, ranked in zip(ids[1:], scored[1:], strict=True):
        mine = ranked[str(token_id)]
        assert mine["decoded_token"] == tokenizer.decode([token_id], skip_special_tokens=False) and mine["rank"] >= 1
        assert {1, 2} <= {v["rank"] for v in ranked.values()} and len(ranked) in (2, 3)
        assert all(v["logprob"] <= 0 for v in ranked.values())
    chat = client.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "Hi"}], max_tokens=1, extra_body={"prompt_logprobs": 0}
    )
    whole = chat.model_extra["prompt_logprobs"]
    assert whole[0] is None and len(whole) == chat.usage.prompt_tokens and all(len(r) == 1 for r in whole[1:])


def test_stop_string_kept_with_include_stop_str_in_output(client) -> None:
    free = (
        client.completions.create(model="smollm2", prompt="1, 2, 3, 4,", max_tokens=12, temperature=0).choices[0].text
    )
    stop = free[3:5]
    kept = client.completions.create(
        model="smollm2",
        prompt="1, 2, 3, 4,",
        max_tokens=12,
        temperature=0,
        stop=[stop],
        extra_body={"include_stop_str_in_output": True},
    )
    assert kept.choices[0].text == free[: free.index(stop) + len(stop)] and kept.choices[0].finish_reason == "stop"


def test_special_tokens_shown_only_when_asked(client) -> None:
    forced = {"1": 100}  # <|im_start|>, a control token
    hidden = client.completions.create(model="smollm2", prompt="Hi", max_tokens=2, temperature=0, logit_bias=forced)
    shown = client.completions.create(
        model="smollm2",
        prompt="Hi",
        max_tokens=2,
        temperature=0,
        logit_bias=forced,
        extra_body={"skip_special_tokens": False},
    )
    assert hidden.choices[0].text == "" and shown.choices[0].text == "<|im_start|><|im_start|>"


def test_streamed_echo_with_logprobs_scores_the_prompt_in_the_first_chunk(mock_server) -> None:
    body = {
        "prompt": "abcdef",
        "max_tokens": 3,
        "echo": True,
        "logprobs": 2,
        "prompt_logprobs": 1,
        "stream": True,
        "n": 2,
    }
    with httpx.stream("POST", f"{mock_server.url}/v1/completions", json=body, timeout=30) as response:
        chunks = [json.loads(line[6:])["choices"][0] for line in response.iter_lines() if line.startswith("data: {")]
    whole = httpx.post(f"{mock_server.url}/v1/completions", json={**body, "stream": False}, timeout=30).json()[
        "choices"
    ]
    for index in (0, 1):
        mine = [c for c in chunks if c["index"] == index]
        first = mine[0]
        assert first["text"].startswith("abcdef") and first["logprobs"]["tokens"][:6] == list("abcdef")
        assert first["logprobs"]["token_logprobs"][0] is None and len(first["logprobs"]["token_logprobs"]) == 7
        assert first["prompt_logprobs"] == whole[index]["prompt_logprobs"] and all(
            "prompt_logprobs" not in c for c in mine[1:]
        )
        streamed = [lp for c in mine for lp in c["logprobs"]["token_logprobs"]]
        assert streamed[:6] == whole[index]["logprobs"]["token_logprobs"][:6] and len(streamed) == 9
