"""Decode attention over a paged KV cache: Numba kernels against the torch gather + SDPA path.

    python benchmarks/attention.py [--batch 32] [--contexts 256 1024 2048]

SmolLM2's attention shape (9 heads, 3 KV heads, head size 64), block size 16.
On the CPU: the Numba CPU kernel and the torch path, float32. On a CUDA GPU
(when present): the Numba CUDA kernel's achieved K/V read bandwidth, as a
fraction of the device's measured copy bandwidth.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
import torch.nn.functional as F

HEADS, KV_HEADS, HEAD_SIZE, BLOCK = 9, 3, 64, 16


def timed(function, repeats: int) -> float:
    function()
    started = time.perf_counter()
    for _ in range(repeats):
        function()
    return (time.perf_counter() - started) / repeats


def problem(batch: int, context: int, device: str, dtype=torch.float32):
    blocks_per_seq = -(-context // BLOCK)
    num_blocks = batch * blocks_per_seq
    k_cache = torch.randn(num_blocks, BLOCK, KV_HEADS, HEAD_SIZE, dtype=dtype, device=device)
    v_cache = torch.randn_like(k_cache)
    tables = torch.randperm(num_blocks, device=device).view(batch, blocks_per_seq).int()
    lengths = torch.full((batch,), context, dtype=torch.int32, device=device)
    query = torch.randn(batch, HEADS, HEAD_SIZE, dtype=dtype, device=device)
    return query, k_cache, v_cache, tables, lengths


def torch_path(query, k_cache, v_cache, tables, lengths):
    batch = query.shape[0]
    keys = k_cache.index_select(0, tables.reshape(-1).long()).view(batch, -1, KV_HEADS, HEAD_SIZE).transpose(1, 2)
    values = v_cache.index_select(0, tables.reshape(-1).long()).view(batch, -1, KV_HEADS, HEAD_SIZE).transpose(1, 2)
    mask = (torch.arange(keys.shape[2], device=query.device)[None, :] < lengths[:, None])[:, None, None, :]
    return F.scaled_dot_product_attention(query.unsqueeze(2), keys, values, attn_mask=mask, enable_gqa=True).squeeze(2)


def cpu_benchmark(batch: int, contexts: list[int]) -> None:
    from hetero_kernels import cpu

    print(f"CPU, batch {batch}, float32, {torch.get_num_threads()} threads")
    for context in contexts:
        query, k_cache, v_cache, tables, lengths = problem(batch, context, "cpu")
        out = np.zeros(query.shape, dtype=np.float32)
        arrays = (query.numpy(), k_cache.numpy(), v_cache.numpy(), tables.numpy(), lengths.numpy())
        numba_time = timed(lambda: cpu.paged_decode_attention(out, *arrays, HEAD_SIZE**-0.5), 5)
        torch_time = timed(lambda: torch_path(query, k_cache, v_cache, tables, lengths), 5)
        print(f"  context {context:5d}: numba {numba_time * 1e3:7.2f} ms   torch gather+SDPA {torch_time * 1e3:7.2f} ms")


def cuda_benchmark(batch: int, contexts: list[int]) -> None:
    from hetero_kernels import cuda as kernels

    source = torch.empty(512 * 2**20, dtype=torch.uint8, device="cuda")
    target = torch.empty_like(source)
    torch.cuda.synchronize()
    copy_time = timed(lambda: (target.copy_(source), torch.cuda.synchronize()), 20)
    copy_bandwidth = 2 * source.numel() / copy_time  # read + write
    print(f"CUDA {torch.cuda.get_device_name()}: copy bandwidth {copy_bandwidth / 1e9:.0f} GB/s")
    for dtype in (torch.float16, torch.float32):
        for context in contexts:
            query, k_cache, v_cache, tables, lengths = problem(batch, context, "cuda", dtype)
            out = torch.empty(query.shape, dtype=torch.float32, device="cuda")
            q = query.float()

            def run():
                kernels.paged_decode_attention(out, q, k_cache, v_cache, tables, lengths, HEAD_SIZE**-0.5)
                torch.cuda.synchronize()

            elapsed = timed(run, 20)
            expected = torch_path(q, k_cache.float(), v_cache.float(), tables, lengths)
            error = (out - expected).abs().max().item()
            kv_bytes = 2 * batch * context * KV_HEADS * HEAD_SIZE * k_cache.element_size()
            bandwidth = kv_bytes / elapsed
            print(
                f"  {str(dtype):14s} context {context:6d}: {elapsed * 1e6:8.1f} us, K/V {bandwidth / 1e9:7.1f} GB/s"
                f" = {bandwidth / copy_bandwidth:5.1%} of copy; max error vs torch {error:.1e}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--contexts", type=int, nargs="+", default=[256, 1024, 2048])
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if torch.cuda.is_available():
        cuda_benchmark(args.batch, args.contexts + [8192, 32768])
    cpu_benchmark(args.batch, args.contexts)


if __name__ == "__main__":
    main()
