"""How close each shipped dtype / weight format stays to the float32 model: teacher-forced next-token KL and top-1
agreement.

    python benchmarks/quality.py [--new-tokens 200] [--configs bf16-auto,bf16-dense,...]
        [--paths batch-1,decode-batch,batched] [--no-transformers]

The float32 engine (dense weights; it matches transformers in float32, see
the parity tests) answers a fixed set of chat prompts greedily. Each
configuration then reads the same prompt + answer, and at every answer
position its next-token distribution is compared with float32's: mean
KL(fp32 || config) in nats, the share of positions where both pick the same
top token, and the worst position's KL.

The answers run to 200 tokens (about 1,200 positions) by default: a change
in the last bit of an intermediate flips the top token at a few near ties
either way, which over the 424 positions of 48-token answers moves a path's
agreement by as much as half a point, the size of the gaps being compared
(``docs/design/2026-11-26-quality-measurement.md``).

An engine configuration is measured on each of its paths: ``batch-1``
(prompt prefilled, then the answer decoded one token at a time: the packed
kernels where the weights are packed), ``decode-batch`` (every prompt
prefilled, then all the answers decoded together, one token per chat a step:
steps of a dozen rows, the tiled int4 kernel where it runs) and ``batched``
(the whole sequence in one pass: the dense matmuls of many-row steps) and
``verify-8`` (prompt prefilled, then the answer computed 8 tokens a step from
a decode position, as speculative decoding verifies a token and 7
proposals: the rows a bfloat16 speculative step rounds as it does).
transformers in bf16 reads the whole sequence in one forward pass.

Everything runs on CUDA where torch sees a GPU (the executors' ``auto``
device; transformers too). The default configurations follow the device:
``bf16-auto,bf16-dense,bf16-int8,fp32-int4`` on the CPU (packed weights are
CPU kernels), ``bf16-dense,fp16-dense`` on CUDA (float16 is CUDA's only);
the ``*-numba-cuda`` configurations run attention on the Numba CUDA kernels
(CUDA only).
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from hetero_core.batch import ExecutionBatch, ScheduledSequence
from hetero_core.config import EngineConfig
from hetero_core.engine import InferenceEngine
from hetero_core.model_source import resolve_model_path
from hetero_core.params import GenerationParams
from hetero_core.step_layout import layout
from hetero_executor_torch import TorchExecutor, resolve_device

CHATS = [
    "What is the capital of France?",
    "Explain in two sentences why the sky looks blue.",
    "Write a haiku about a lighthouse in winter.",
    "How do I reverse a list in Python?",
    "Give me three tips for sleeping better.",
    "What is the difference between a virus and a bacterium?",
    "Translate 'good morning, my friend' into Spanish.",
    "Summarize the plot of a story about a lost dog finding its way home.",
    "Why do cats purr?",
    "List the planets of the solar system in order.",
    "What does a compiler do?",
    "Suggest a name for a bakery that sells only bread made with rye.",
]
CONFIGS = {
    "bf16-auto": {"dtype": "bfloat16", "weights": "auto"},
    "bf16-dense": {"dtype": "bfloat16", "weights": "dense"},
    "bf16-int8": {"dtype": "bfloat16", "weights": "int8"},
    "fp32-int4": {"dtype": "float32", "weights": "int4"},
    "fp16-dense": {"dtype": "float16", "weights": "dense"},
    "fp32-numba-cuda": {"dtype": "float32", "weights": "dense", "attention": "numba-cuda"},
    "fp16-numba-cuda": {"dtype": "float16", "weights": "dense", "attention": "numba-cuda"},
    "bf16-numba-cuda": {"dtype": "bfloat16", "weights": "dense", "attention": "numba-cuda"},
}
# The packed formats are CPU kernels and float16 runs on CUDA only (where auto weights are dense).
DEFAULT_CONFIGS = {"cpu": ("bf16-auto", "bf16-dense", "bf16-int8", "fp32-int4"), "cuda": ("bf16-dense", "fp16-dense")}
PATHS = ("batch-1", "decode-batch", "batched", "verify-8")
VERIFY_ROWS = 8  # a speculative step's rows: the sequence's next token and 7 proposals
BLOCK = 16


def reference_answers(engine: InferenceEngine, new_tokens: int) -> list[tuple[list[int], list[int]]]:
    params = GenerationParams(temperature=0.0, max_tokens=new_tokens)
    records = engine.generate(
        [
            engine.tokenizer.apply_chat_template([{"role": "user", "content": c}], add_generation_prompt=True)
            for c in CHATS
        ],
        params,
    )
    return [(r.input_tokens, r.generated_tokens) for r in records]


def whole_pass(executor: TorchExecutor, ids: list[int]) -> torch.Tensor:
    """float32 logits at every position of ``ids`` from one prefill."""
    return executor.prefill_logits(ids, list(range(-(-len(ids) // BLOCK))))


def batch_one(executor: TorchExecutor, prompt: list[int], answer: list[int]) -> torch.Tensor:
    """Logits predicting each answer token: the prompt prefilled, then the answer decoded token by token."""
    rows = [whole_pass(executor, prompt)[-1:]]
    greedy = GenerationParams(temperature=0.0)
    for offset, token in enumerate(answer[:-1]):
        position = len(prompt) + offset
        sequence = ScheduledSequence(
            0,
            [token],
            position,
            list(range(position // BLOCK + 1)),
            True,
            greedy,
            prompt + answer[: offset + 1],
            len(prompt),
            None,
        )
        rows.append(executor.model.forward(*executor.model_inputs(layout(ExecutionBatch([sequence], BLOCK)))))
    return torch.cat(rows)


def verified(executor: TorchExecutor, prompt: list[int], answer: list[int]) -> torch.Tensor:
    """Logits predicting each answer token: the prompt prefilled, then the answer computed 8 tokens a step, as
    speculative decoding's verification steps compute a sequence's next token and its proposals."""
    rows = [whole_pass(executor, prompt)[-1:]]
    greedy = GenerationParams(temperature=0.0)
    for start in range(0, len(answer) - 1, VERIFY_ROWS):
        chunk = answer[start : min(start + VERIFY_ROWS, len(answer) - 1)]
        position = len(prompt) + start
        sequence = ScheduledSequence(
            0,
            chunk,
            position,
            list(range((position + len(chunk) - 1) // BLOCK + 1)),
            True,
            greedy,
            prompt + answer[: start + 1],
            len(prompt),
            None,
            num_proposed=len(chunk) - 1,
        )
        rows.append(executor.model.forward(*executor.model_inputs(layout(ExecutionBatch([sequence], BLOCK)))))
    return torch.cat(rows)


def decoded_together(executor: TorchExecutor, samples: list[tuple[list[int], list[int]]]) -> list[torch.Tensor]:
    """Logits predicting each chat's answer tokens: every prompt prefilled in its own blocks, then one
    step a position decoding the next answer token of every chat that has one."""
    blocks_each = blocks_per_chat(samples)
    tables = [list(range(i * blocks_each, (i + 1) * blocks_each)) for i in range(len(samples))]
    rows = [
        [executor.prefill_logits(p, table[: -(-len(p) // BLOCK)])[-1:]]
        for (p, _), table in zip(samples, tables, strict=True)
    ]
    greedy = GenerationParams(temperature=0.0)
    for offset in range(max(len(a) for _, a in samples) - 1):
        live = [i for i, (_, a) in enumerate(samples) if offset < len(a) - 1]
        step = []
        for i in live:
            prompt, answer = samples[i]
            position = len(prompt) + offset
            step.append(
                ScheduledSequence(
                    i,
                    [answer[offset]],
                    position,
                    tables[i][: position // BLOCK + 1],
                    True,
                    greedy,
                    prompt + answer[: offset + 1],
                    len(prompt),
                    None,
                )
            )
        ordered = layout(ExecutionBatch(step, BLOCK))  # shortest context first
        logits = executor.model.forward(*executor.model_inputs(ordered))
        for row, sequence in enumerate(ordered.sequences):
            rows[sequence.seq_id].append(logits[row : row + 1])
    return [torch.cat(r) for r in rows]


def path_logits(path: str, executor: TorchExecutor, samples: list[tuple[list[int], list[int]]]) -> list[torch.Tensor]:
    """Each chat's logits predicting its answer tokens, computed along ``path``."""
    if path == "decode-batch":
        return decoded_together(executor, samples)
    if path == "batched":
        return [whole_pass(executor, p + a)[len(p) - 1 : -1] for p, a in samples]
    one = batch_one if path == "batch-1" else verified
    return [one(executor, p, a) for p, a in samples]


def blocks_per_chat(samples: list[tuple[list[int], list[int]]]) -> int:
    """Cache blocks that hold the longest prompt + answer."""
    return -(-max(len(p) + len(a) for p, a in samples) // BLOCK)


def compare(logits: torch.Tensor, reference: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per position: KL(reference || logits) and whether the top tokens agree."""
    ref = F.log_softmax(reference.float(), dim=-1)
    kl = (ref.exp() * (ref - F.log_softmax(logits.float(), dim=-1))).sum(-1)
    return kl, logits.argmax(-1) == reference.argmax(-1)


def report(name: str, parts: list[tuple[torch.Tensor, torch.Tensor]], seconds: float) -> None:
    kl = torch.cat([p[0] for p in parts])
    agree = torch.cat([p[1] for p in parts]).float()
    print(
        f"  {name:28s} KL mean {kl.mean():.5f}  max {kl.max():.4f}  top-1 agreement {agree.mean():.2%}"
        f" over {len(kl)} positions ({seconds:.0f} s)",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="model path (default: the embedded SmolLM2)")
    parser.add_argument("--new-tokens", type=int, default=200)
    device = resolve_device("auto")  # where the executors below run
    parser.add_argument(
        "--configs", default=",".join(DEFAULT_CONFIGS[device.type]), help=f"comma-separated, from {', '.join(CONFIGS)}"
    )
    parser.add_argument("--paths", default=",".join(PATHS), help=f"comma-separated, from {', '.join(PATHS)}")
    parser.add_argument("--no-transformers", action="store_true")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    configs, paths = list(filter(None, args.configs.split(","))), list(filter(None, args.paths.split(",")))
    unknown = [c for c in configs if c not in CONFIGS] + [p for p in paths if p not in PATHS]
    if unknown:
        parser.error(f"unknown config or path: {', '.join(unknown)}")
    torch.set_num_threads(args.threads)
    model = resolve_model_path(args.model)
    config = EngineConfig(
        model=str(model),
        executor={"name": "torch", "dtype": "float32", "weights": "dense", "attention": "torch"},
        max_model_len=1024,
        block_size=BLOCK,
    )
    engine = InferenceEngine(config)
    samples = reference_answers(engine, args.new_tokens)
    with torch.inference_mode():
        references = [whole_pass(engine.executor, p + a)[len(p) - 1 : -1] for p, a in samples]
    engine.close()
    print(
        f"{len(samples)} chats, {sum(len(a) for _, a in samples)} answer tokens from the float32 engine;"
        " against float32:"
    )
    for name in configs:
        executor = TorchExecutor(config, **CONFIGS[name])
        executor.initialize_cache(len(samples) * blocks_per_chat(samples), BLOCK)
        with torch.inference_mode():
            for path in paths:
                started = time.monotonic()
                report(
                    f"hetero {name} {path}",
                    [
                        compare(logits, r)
                        for logits, r in zip(path_logits(path, executor, samples), references, strict=True)
                    ],
                    time.monotonic() - started,
                )
        executor.close()
    if not args.no_transformers:
        import transformers

        for dtype in (torch.bfloat16, torch.float32):
            if model.is_dir():  # a Hugging Face folder
                hf = transformers.AutoModelForCausalLM.from_pretrained(str(model), dtype=dtype)
            else:
                dense = transformers.GgufConfig(dequantize=True)
                hf = transformers.AutoModelForCausalLM.from_pretrained(
                    str(model.parent), gguf_file=model.name, dtype=dtype, quantization_config=dense
                )
            hf = hf.to(device).eval()
            started = time.monotonic()
            with torch.inference_mode():
                parts = [
                    compare(hf(torch.tensor([p + a], device=device)).logits[0, len(p) - 1 : -1], r)
                    for (p, a), r in zip(samples, references, strict=True)
                ]
            report(f"transformers {str(dtype).removeprefix('torch.')}", parts, time.monotonic() - started)


if __name__ == "__main__":
    main()
