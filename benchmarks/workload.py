"""The benchmark workloads: seeded random token-id prompts, each with its number of new tokens.

- ``standard``: 32 prompts of lengths spread evenly over 16..256, 64 new tokens each, all submitted at once.
- ``sequential``: the same requests one at a time (batch-1 decode and time to first token).
- ``mixed``: 256 requests, prompt lengths 16..512 and output lengths 16..256 spread over the requests
  (seeded shuffle), all submitted at once.
"""

from __future__ import annotations

import random

import attrs

WORKLOADS = ("standard", "sequential", "mixed")


@attrs.frozen
class Request:
    prompt: list[int]
    new_tokens: int


def standard_prompts(
    num_requests: int = 32, min_len: int = 16, max_len: int = 256, vocab_size: int = 49152, seed: int = 0
) -> list[list[int]]:
    """``num_requests`` prompts whose lengths run evenly from ``min_len`` to ``max_len`` (control ids avoided)."""
    rng = random.Random(seed)
    step = (max_len - min_len) / max(1, num_requests - 1)
    lengths = [round(min_len + i * step) for i in range(num_requests)]
    return [[rng.randrange(17, vocab_size) for _ in range(length)] for length in lengths]


def spread(count: int, low: int, high: int) -> list[int]:
    step = (high - low) / max(1, count - 1)
    return [round(low + i * step) for i in range(count)]


def workload(name: str, num_requests: int | None = None, new_tokens: int = 64, seed: int = 0) -> list[Request]:
    """The named workload's requests in submission order."""
    if name in ("standard", "sequential"):
        return [Request(p, new_tokens) for p in standard_prompts(num_requests or 32, seed=seed)]
    if name == "mixed":
        count = num_requests or 256
        rng = random.Random(seed)
        prompt_lens, output_lens = spread(count, 16, 512), spread(count, 16, 256)
        rng.shuffle(prompt_lens)
        rng.shuffle(output_lens)
        return [
            Request([rng.randrange(17, 49152) for _ in range(p)], n)
            for p, n in zip(prompt_lens, output_lens, strict=True)
        ]
    raise ValueError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]
