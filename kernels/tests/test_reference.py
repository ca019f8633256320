"""The reference against plain dense softmax attention over contiguous keys and values.

Both compute in float64 from the same inputs, so they agree to 1e-10.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from paged_problems import Problem, problems

from hetero_kernels import reference


def dense_attention(query, keys, values, scale, first_position):
    """Causal softmax attention for query rows at positions first_position, first_position + 1, ...
    over keys/values [L, kv_heads, head_size]; grouped-query attention by repeating KV heads."""
    group = query.shape[1] // keys.shape[1]
    keys = np.repeat(keys.astype(np.float64), group, axis=1)
    values = np.repeat(values.astype(np.float64), group, axis=1)
    scores = np.einsum("thd,lhd->htl", query.astype(np.float64), keys) * scale
    visible = np.arange(len(keys))[None, :] <= (first_position + np.arange(len(query)))[:, None]
    scores = np.where(visible[None], scores, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    return np.einsum("htl,lhd->thd", weights, values)


def contiguous(cache, table, length):
    """A sequence's first ``length`` positions, [length, kv_heads, head_size], copied block by block."""
    return np.concatenate([cache[block] for block in table])[:length]


@settings(max_examples=40, deadline=None)
@given(problems())
def test_reference_prefill_equals_dense_attention(problem: Problem) -> None:
    prefill = problem.prefill
    out = np.zeros(prefill.query.shape, dtype=np.float64)
    reference.paged_prefill_attention(out, *problem.prefill_args)
    for b, length in enumerate(problem.context_lens):
        rows = slice(prefill.query_start_loc[b], prefill.query_start_loc[b + 1])
        keys = contiguous(problem.k_cache, problem.block_tables[b], length)
        values = contiguous(problem.v_cache, problem.block_tables[b], length)
        first_position = length - (rows.stop - rows.start)
        np.testing.assert_allclose(
            out[rows], dense_attention(prefill.query[rows], keys, values, problem.scale, first_position), atol=1e-10
        )


@settings(max_examples=40, deadline=None)
@given(problems())
def test_reference_decode_equals_dense_attention(problem: Problem) -> None:
    out = np.zeros(problem.query.shape, dtype=np.float64)
    reference.paged_decode_attention(out, *problem.decode_args)
    for b, length in enumerate(problem.context_lens):
        keys = contiguous(problem.k_cache, problem.block_tables[b], length)
        values = contiguous(problem.v_cache, problem.block_tables[b], length)
        expected = dense_attention(problem.query[b : b + 1], keys, values, problem.scale, length - 1)
        np.testing.assert_allclose(out[b : b + 1], expected, atol=1e-10)
