"""The standard offline workload: seeded random token-id prompts of evenly spread lengths."""

from __future__ import annotations

import random


def standard_prompts(num_requests: int = 32, min_len: int = 16, max_len: int = 256, vocab_size: int = 49152, seed: int = 0) -> list[list[int]]:
    """``num_requests`` prompts whose lengths run evenly from ``min_len`` to ``max_len`` (control ids avoided)."""
    rng = random.Random(seed)
    step = (max_len - min_len) / max(1, num_requests - 1)
    lengths = [round(min_len + i * step) for i in range(num_requests)]
    return [[rng.randrange(17, vocab_size) for _ in range(length)] for length in lengths]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]
