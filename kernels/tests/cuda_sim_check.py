"""Run under NUMBA_ENABLE_CUDASIM=1 (in a subprocess): the CUDA kernels against the reference."""

from __future__ import annotations

import os
import sys

import numpy as np

assert os.environ.get("NUMBA_ENABLE_CUDASIM") == "1", "run me with NUMBA_ENABLE_CUDASIM=1"

from numba import cuda  # noqa: E402

from hetero_kernels import cuda as kernels  # noqa: E402
from hetero_kernels import reference  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from shapes import random_case  # noqa: E402


def main() -> None:
    from numba import config

    assert config.ENABLE_CUDASIM and "simulator" in type(cuda.gpus).__module__, "the CUDA simulator is not active"
    # The simulator runs every GPU thread as a Python thread: shrink the tile (a power of two
    # at least the head size) and the split so tiny shapes still cross tiles and splits.
    kernels.TILE = 8
    kernels.TOKENS_PER_SPLIT = 8
    rng = np.random.default_rng(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
    for _ in range(2):
        case = random_case(rng, max_batch=2, max_heads=4, max_head_size=8, max_len=14)
        expected = np.zeros_like(case.query)
        reference.paged_decode_attention(expected, case.query, case.k_cache, case.v_cache, case.block_tables, case.context_lens, case.scale)
        got = np.zeros_like(case.query)
        kernels.paged_decode_attention(got, case.query, case.k_cache, case.v_cache, case.block_tables, case.context_lens, case.scale)
        np.testing.assert_allclose(got, expected, atol=1e-5, rtol=1e-4)

        chunk = case.prefill_chunks(rng)
        expected = np.zeros_like(chunk.query)
        reference.paged_prefill_attention(expected, chunk.query, case.k_cache, case.v_cache, case.block_tables, chunk.query_start_loc, case.context_lens, case.scale)
        got = np.zeros_like(chunk.query)
        kernels.paged_prefill_attention(got, chunk.query, case.k_cache, case.v_cache, case.block_tables, chunk.query_start_loc, case.context_lens, case.scale)
        np.testing.assert_allclose(got, expected, atol=1e-5, rtol=1e-4)

        key, value, slots = case.new_kv(rng)
        k_expected, v_expected = case.k_cache.copy(), case.v_cache.copy()
        reference.write_kv(key, value, k_expected, v_expected, slots)
        kernels.write_kv(key, value, case.k_cache, case.v_cache, slots)
        np.testing.assert_array_equal(case.k_cache, k_expected)
        np.testing.assert_array_equal(case.v_cache, v_expected)
    print("cuda simulator kernels match the reference")


if __name__ == "__main__":
    main()
