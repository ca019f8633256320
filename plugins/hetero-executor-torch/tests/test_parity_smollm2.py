"""Greedy tokens and logits match Hugging Face transformers on the embedded SmolLM2 GGUF (float32)."""

from __future__ import annotations

import pytest
import torch

from hetero_core.config import EngineConfig
from hetero_core.engine import InferenceEngine
from hetero_core.model_source import resolve_model_path
from hetero_core.params import GenerationParams

pytestmark = pytest.mark.model  # the embedded model, in the engine and in transformers

transformers = pytest.importorskip("transformers")

MODEL = resolve_model_path(None)
NEW_TOKENS = 32
NEAR_TIE = 0.05
CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Write a short poem about the sea."}],
    [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "List three prime numbers."},
    ],
]


@pytest.fixture(scope="module")
def reference():
    return transformers.AutoModelForCausalLM.from_pretrained(
        str(MODEL.parent), gguf_file=MODEL.name, dtype=torch.float32
    )


@pytest.fixture(scope="module")
def engine():
    return InferenceEngine(EngineConfig(executor={"name": "torch", "dtype": "float32"}, max_model_len=512))


@pytest.fixture(scope="module")
def generations(engine):
    params = GenerationParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    ids = [engine.submit_chat(chat, params) for chat in CHATS]
    records = {r.request_id: r for r in engine.run()}
    return [records[i] for i in ids]


@pytest.mark.parametrize("number", range(len(CHATS)))
def test_greedy_tokens_match_unless_a_near_tie(reference, generations, number: int) -> None:
    record = generations[number]
    sequence = torch.tensor([record.input_tokens + record.generated_tokens])
    with torch.inference_mode():
        logits = reference(sequence).logits[0, len(record.input_tokens) - 1 : -1]
    for step, token in enumerate(record.generated_tokens):
        top2 = logits[step].topk(2)
        expected = int(top2.indices[0])
        if token != expected:
            gap = float(top2.values[0] - top2.values[1])
            assert gap < NEAR_TIE, f"step {step}: got {token}, transformers picks {expected} by a margin of {gap:.3f}"
            assert float(logits[step, expected] - logits[step, token]) < NEAR_TIE
            break  # past a near-tie the two continuations legitimately differ
    assert len(record.generated_tokens) == NEW_TOKENS


def test_logits_match_transformers(reference, engine, generations) -> None:
    record = generations[0]
    ids = record.input_tokens + record.generated_tokens
    with torch.inference_mode():
        expected = reference(torch.tensor([ids])).logits[0]
    executor = engine.executor

    blocks = -(-len(ids) // engine.config.block_size)
    ours = executor.prefill_logits(
        ids, list(range(engine.num_blocks - blocks, engine.num_blocks))
    )  # the tail of the pool, unused here
    torch.testing.assert_close(ours.cpu(), expected, atol=2e-3, rtol=1e-3)


def test_batched_equals_single_on_the_real_model(engine, generations) -> None:
    """Alone, and with its system prompt now in the prefix cache, the answer is the same."""
    single = engine.generate(
        [generations[1].input_tokens], GenerationParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    )
    assert single[0].num_cached_tokens > 0
    assert single[0].generated_tokens == generations[1].generated_tokens


def test_decode_graphs_give_the_same_tokens_on_the_real_model(generations) -> None:
    """Decode steps replayed from graphs (CUDA graphs, or their CPU stand-in): padded batch and block-table buckets."""
    engine = InferenceEngine(
        EngineConfig(
            executor={"name": "torch", "dtype": "float32", "decode_graphs": True}, max_model_len=512, max_batch_size=3
        )
    )
    params = GenerationParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    records = engine.generate([r.input_tokens for r in generations], params)
    assert [r.generated_tokens for r in records] == [r.generated_tokens for r in generations]
    assert engine.executor.graphs.num_graphs > 1


def test_prompt_logprobs_match_transformers(reference, engine, generations) -> None:
    """Each prompt token's logprob, rank and top 5 as transformers' log-softmax gives them (float32), though
    the prompt's blocks are in the prefix cache: a scored prompt is computed again, every position."""
    ids = generations[2].input_tokens
    scored = engine.generate([ids], GenerationParams(max_tokens=0, prompt_logprobs=5))[0]
    assert scored.num_cached_tokens == 0 and scored.generated_tokens == [] and scored.prompt_logprobs[0] is None
    entries = scored.prompt_logprobs[1:]
    assert [e.token_id for e in entries] == ids[1:]
    with torch.inference_mode():
        expected = torch.log_softmax(reference(torch.tensor([ids])).logits[0, :-1].float(), dim=-1)
    want = expected.gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
    torch.testing.assert_close(torch.tensor([e.logprob for e in entries]), want, atol=2e-3, rtol=1e-3)
    top_values = expected.topk(5, dim=-1).values
    torch.testing.assert_close(
        torch.tensor([[lp for _, lp in e.top] for e in entries]), top_values, atol=2e-3, rtol=1e-3
    )
    for position, (entry, target) in enumerate(zip(entries, want, strict=True)):
        above, near = (
            int((expected[position] > target + 2e-3).sum()),
            int(((expected[position] - target).abs() <= 2e-3).sum()),
        )
        assert above + 1 <= entry.rank <= above + near, f"position {position + 1}: rank {entry.rank}"


BF16_NEAR_TIE = 0.5


def test_the_default_engine_decoding_chats_together_stays_with_float32(reference) -> None:
    """The default engine (bf16 where the CPU runs it fast, the GGUF's 4-bit weights packed: on the
    tiled kernel for steps of a few sequences where the CPU has AVX-512 BF16) decodes four chats at
    once; each token is float32's choice, or close to it, up to the first near tie."""
    engine = InferenceEngine(EngineConfig(max_model_len=512))
    params = GenerationParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    chats = CHATS + [[{"role": "user", "content": "Why do cats purr?"}]]
    ids = [engine.submit_chat(chat, params) for chat in chats]
    records = {r.request_id: r for r in engine.run()}
    for record in (records[i] for i in ids):
        assert len(record.generated_tokens) == NEW_TOKENS
        with torch.inference_mode():
            logits = reference(torch.tensor([record.input_tokens + record.generated_tokens])).logits[
                0, len(record.input_tokens) - 1 : -1
            ]
        for step, token in enumerate(record.generated_tokens):
            expected = int(logits[step].argmax())
            if token != expected:
                assert float(logits[step, expected] - logits[step, token]) < BF16_NEAR_TIE, (
                    f"step {step}: got {token}, float32 picks {expected}"
                )
                break
