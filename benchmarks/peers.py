"""The peers the engine is measured against, on the same prompts: transformers' ``generate`` and llama-cpp-python.

Each runner returns the same record as the engine's (see ``throughput.py``):
elapsed seconds, output tokens, every request's time to first token, and the
decode tokens and seconds (the time after a request's first token).
"""

from __future__ import annotations

import time

import torch

from hetero_executor_torch import resolve_device
from workload import Request

HF_BATCH = 32  # transformers runs the batched workloads in padded batches of this many, in submission order
PAD = 2


def load_transformers(path, dtype: torch.dtype):
    """Dense weights in ``dtype`` (transformers 5 would otherwise keep a GGUF's blocks packed and compute in float32),
    on the engine's own ``auto`` device (the GPU where torch sees one)."""
    import transformers

    if path.is_file():
        dense = transformers.GgufConfig(dequantize=True)
        model = transformers.AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=dtype, quantization_config=dense
        )
    else:
        model = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
    return model.to(resolve_device("auto")).eval()


def timed_generate(model, requests: list[Request]) -> list[float]:
    """One left-padded greedy ``generate`` over ``requests`` until the longest output; the time of each step's
    logits."""
    import transformers

    class Clock(transformers.LogitsProcessor):
        def __init__(self) -> None:
            self.times: list[float] = []

        def __call__(self, input_ids, scores):
            self.times.append(time.monotonic())
            return scores

    width = max(len(r.prompt) for r in requests)
    steps = max(r.new_tokens for r in requests)
    ids = torch.tensor([[PAD] * (width - len(r.prompt)) + r.prompt for r in requests])
    mask = torch.tensor([[0] * (width - len(r.prompt)) + [1] * len(r.prompt) for r in requests])
    clock = Clock()
    model.generate(
        input_ids=ids.to(model.device),
        attention_mask=mask.to(model.device),
        max_new_tokens=steps,
        min_new_tokens=steps,
        do_sample=False,
        pad_token_id=PAD,
        logits_processor=transformers.LogitsProcessorList([clock]),
    )
    return clock.times


def run_transformers(path, dtype: torch.dtype, requests: list[Request], sequential: bool) -> dict:
    model = load_transformers(path, dtype)
    with torch.inference_mode():
        timed_generate(model, [Request(r.prompt, 2) for r in requests[:HF_BATCH]])  # warm-up at full width
        size = 1 if sequential else HF_BATCH
        ttfts, decode_tokens, decode_seconds = [], 0, 0.0
        started = time.monotonic()
        for first in range(0, len(requests), size):
            chunk = requests[first : first + size]
            submitted = started if not sequential else time.monotonic()
            times = timed_generate(model, chunk)
            ttfts += [times[0] - submitted] * len(chunk)
            decode_tokens += sum(r.new_tokens - 1 for r in chunk)  # the useful ones; padded rows run on to the longest
            decode_seconds += times[-1] - times[0]
        elapsed = time.monotonic() - started
    return {
        "elapsed": elapsed,
        "output_tokens": sum(r.new_tokens for r in requests),
        "ttfts": ttfts,
        "decode_tokens": decode_tokens,
        "decode_seconds": decode_seconds,
    }


def llama_cpp_available() -> bool:
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return False
    return True


def run_llama_cpp(path, requests: list[Request], threads: int) -> dict:
    """llama-cpp-python on the same GGUF, one request at a time (its Python API decodes one sequence)."""
    from llama_cpp import Llama

    llm = Llama(
        model_path=str(path), n_ctx=1024, n_batch=512, n_threads=threads, n_threads_batch=threads, verbose=False
    )

    def generate(request: Request) -> list[float]:
        llm.reset()
        times = []
        for _token in llm.generate(request.prompt, temp=0.0, top_k=1, repeat_penalty=1.0, reset=True):
            times.append(time.monotonic())
            if len(times) == request.new_tokens:
                break
        return times

    generate(Request(requests[-1].prompt, 2))  # warm-up
    ttfts, decode_seconds = [], 0.0
    started = time.monotonic()
    for request in requests:
        submitted = time.monotonic()
        times = generate(request)
        ttfts.append(times[0] - submitted)
        decode_seconds += times[-1] - times[0]
    elapsed = time.monotonic() - started
    return {
        "elapsed": elapsed,
        "output_tokens": sum(r.new_tokens for r in requests),
        "ttfts": ttfts,
        "decode_tokens": sum(r.new_tokens - 1 for r in requests),
        "decode_seconds": decode_seconds,
    }
