"""Attention over a paged KV cache: the Numba kernels against the torch gather + SDPA path.

    python benchmarks/attention.py [--batch 32] [--contexts 128 256 512 1024 2048]
        [--chunks 64 256 512 1024] [--threads 2]
        [--gpu-batches 1 4 16 64] [--gpu-contexts 256 1024 4096 8192] [--gpu-dtypes bfloat16 float16 float32]
        [--gpu-shape tile=256,words_per_lane=2] [--gpu-only]

SmolLM2's attention shape (9 heads, 3 KV heads, head size 64), block size 16,
every sequence at the same context length, physical blocks shuffled.

On the CPU (float32 and bfloat16 caches): the Numba CPU kernel and the torch
path (index_select of the blocks, widened to float32, then
scaled_dot_product_attention with a length mask, as the torch backend runs
it), median wall time and the K/V bytes each kernel must read per second.
With a bfloat16 cache the queries are bfloat16 numbers, as a bfloat16
model's are, which the kernel's scores take as they are (AVX-512 BF16 dot
products, where the CPU has them); the kernel's time with queries that are
not (float32 scores) follows. Then one prefill chunk of each ``--chunks``
length with nothing cached before, bfloat16: the Numba CPU prefill kernel
(the same two ways, over the bfloat16 cache, causal) against torch's causal scaled_dot_product_attention
in bfloat16 over the chunk's own keys and values (the torch backend's
path for such a chunk), with the arithmetic rate of the causal half. On a CUDA GPU,
when present, first: per cache dtype, batch and context, the Numba CUDA decode
kernel's time and K/V read bandwidth against the device's measured copy
bandwidth, and torch's gather + SDPA in the same dtype. GPU times are kernel
times: 20 calls captured in a CUDA graph, replayed between CUDA events (no
Python launch cost). ``--gpu-shape`` sets the kernels' launch shape first
(``hetero_kernels.cuda.configure``), to compare shapes.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numba
import numpy as np
import torch
import torch.nn.functional as F

HEADS, KV_HEADS, HEAD_SIZE, BLOCK = 9, 3, 64, 16
SCALE = HEAD_SIZE**-0.5


def median_seconds(function, repeats: int) -> float:
    function()
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def problem(batch: int, context: int, device: str, dtype=torch.float32):
    blocks_per_seq = -(-context // BLOCK)
    num_blocks = batch * blocks_per_seq
    k_cache = torch.randn(num_blocks, BLOCK, KV_HEADS, HEAD_SIZE, device=device).to(dtype)
    v_cache = torch.randn_like(k_cache)
    tables = torch.randperm(num_blocks, device=device).view(batch, blocks_per_seq).int()
    lengths = torch.full((batch,), context, dtype=torch.int32, device=device)
    query = torch.randn(batch, HEADS, HEAD_SIZE, device=device)
    return bfloat16_numbers(query) if dtype == torch.bfloat16 else query, k_cache, v_cache, tables, lengths


def bfloat16_numbers(query: torch.Tensor) -> torch.Tensor:
    """Float32 queries rounded to bfloat16, as a bfloat16 model's queries reach attention."""
    return query.bfloat16().float()


def unrounded(query: np.ndarray) -> np.ndarray:
    """``query`` nudged off the bfloat16 numbers (by an ulp of float32), for the kernel's float32 scores."""
    return np.nextafter(query, np.float32(np.inf))


def kv_bytes(batch: int, context: int, element_size: int) -> int:
    return 2 * batch * context * KV_HEADS * HEAD_SIZE * element_size


def torch_path(query, k_cache, v_cache, tables, lengths, dtype=torch.float32):
    """Gather every sequence's blocks into contiguous K/V in ``dtype``, then masked SDPA (grouped-query)."""
    batch = query.shape[0]
    keys = (
        k_cache.index_select(0, tables.reshape(-1).long())
        .view(batch, -1, KV_HEADS, HEAD_SIZE)
        .transpose(1, 2)
        .to(dtype)
    )
    values = (
        v_cache.index_select(0, tables.reshape(-1).long())
        .view(batch, -1, KV_HEADS, HEAD_SIZE)
        .transpose(1, 2)
        .to(dtype)
    )
    mask = (torch.arange(keys.shape[2], device=query.device)[None, :] < lengths[:, None])[:, None, None, :]
    return (
        F.scaled_dot_product_attention(
            query.to(dtype).unsqueeze(2), keys, values, attn_mask=mask, scale=SCALE, enable_gqa=True
        )
        .squeeze(2)
        .float()
    )


def cpu_benchmark(batch: int, contexts: list[int], repeats: int) -> None:
    from hetero_kernels import cpu

    def raw(cache: torch.Tensor) -> np.ndarray:  # what the kernel reads: bfloat16 as its bits
        return (cache.view(torch.uint16) if cache.dtype == torch.bfloat16 else cache).numpy()

    for dtype in (torch.float32, torch.bfloat16):
        print(
            f"CPU, batch {batch}, {dtype} cache, {torch.get_num_threads()} torch threads,"
            f" {numba.get_num_threads()} numba threads"
        )
        for context in contexts:
            query, k_cache, v_cache, tables, lengths = problem(batch, context, "cpu", dtype)
            out = np.zeros(query.shape, dtype=np.float32)
            arrays = (query.numpy(), raw(k_cache), raw(v_cache), tables.numpy(), lengths.numpy())
            numba_time = median_seconds(lambda: cpu.paged_decode_attention(out, *arrays, SCALE), repeats)
            torch_time = median_seconds(lambda: torch_path(query, k_cache, v_cache, tables, lengths), repeats)
            error = np.abs(out - torch_path(query, k_cache, v_cache, tables, lengths).numpy()).max()
            size = kv_bytes(batch, context, k_cache.element_size())
            float32_scores = ""
            if dtype == torch.bfloat16:
                other = (unrounded(arrays[0]), *arrays[1:])
                float32_seconds = median_seconds(lambda: cpu.paged_decode_attention(out, *other, SCALE), repeats)
                float32_scores = f"   float32 queries {float32_seconds * 1e3:7.2f} ms"
            print(
                f"  context {context:5d}: numba {numba_time * 1e3:7.2f} ms"
                f" ({size / numba_time / 1e9:5.1f} GB/s){float32_scores}"
                f"   torch gather+SDPA {torch_time * 1e3:7.2f} ms ({size / torch_time / 1e9:5.1f} GB/s)"
                f"   speed-up {torch_time / numba_time:4.1f}x   max difference {error:.1e}"
            )


def cpu_prefill_benchmark(chunks: list[int], repeats: int) -> None:
    from hetero_kernels import cpu

    print(
        f"CPU prefill, one causal chunk, bfloat16 cache, {torch.get_num_threads()} torch threads,"
        f" {numba.get_num_threads()} numba threads"
    )
    for length in chunks:
        query, k_cache, v_cache, tables, _ = problem(1, length, "cpu", torch.bfloat16)
        query = bfloat16_numbers(torch.randn(length, HEADS, HEAD_SIZE))
        out = np.zeros(query.shape, dtype=np.float32)
        starts, lengths = np.array([0, length], dtype=np.int32), np.array([length], dtype=np.int32)
        arrays = (
            query.numpy(),
            k_cache.view(torch.uint16).numpy(),
            v_cache.view(torch.uint16).numpy(),
            tables.numpy(),
            starts,
            lengths,
        )
        other = (unrounded(arrays[0]), *arrays[1:])
        float32_time = median_seconds(lambda: cpu.paged_prefill_attention(np.zeros_like(out), *other, SCALE), repeats)
        numba_time = median_seconds(lambda: cpu.paged_prefill_attention(out, *arrays, SCALE), repeats)

        def contiguous(
            cache: torch.Tensor,
        ) -> torch.Tensor:  # the chunk's own keys or values, [1, kv_heads, length, head_size]
            return cache.index_select(0, tables[0].long()).view(-1, KV_HEADS, HEAD_SIZE)[:length].transpose(0, 1)[None]

        q, keys, values = query.bfloat16().transpose(0, 1)[None], contiguous(k_cache), contiguous(v_cache)
        sdpa = lambda: F.scaled_dot_product_attention(q, keys, values, is_causal=True, scale=SCALE, enable_gqa=True)  # noqa: E731
        torch_time = median_seconds(sdpa, repeats)
        error = np.abs(out - sdpa()[0].transpose(0, 1).float().numpy()).max()
        flops = 4 * HEADS * HEAD_SIZE * length * (length + 1) / 2
        print(
            f"  chunk {length:5d}: numba {numba_time * 1e3:7.2f} ms ({flops / numba_time / 1e9:5.1f} GFLOP/s)"
            f"   float32 queries {float32_time * 1e3:7.2f} ms"
            f"   torch SDPA bf16 {torch_time * 1e3:7.2f} ms ({flops / torch_time / 1e9:5.1f} GFLOP/s)"
            f"   speed-up {torch_time / numba_time:4.1f}x   max difference {error:.1e}"
        )


def gpu_seconds(function, calls: int = 20, replays: int = 5) -> tuple[float, str]:
    """Seconds per call of ``function`` on the GPU, and how they were timed: ``calls`` calls captured
    in one CUDA graph and replayed between CUDA events (kernel time, no Python launch cost); where a
    capture fails, back-to-back eager calls between events (launch cost included)."""
    function()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            function()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                function()
        graph.replay()
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / (calls * replays), "graph"
    except RuntimeError:
        torch.cuda.synchronize()
        start.record()
        for _ in range(calls * replays):
            function()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / (calls * replays), "eager"


def copy_bandwidth() -> float:
    """The device's copy bandwidth, bytes read + written per second (a 1 GiB device-to-device copy)."""
    source = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    target = torch.empty_like(source)
    seconds, _ = gpu_seconds(lambda: target.copy_(source), calls=5, replays=2)
    return 2 * source.numel() / seconds


def cuda_benchmark(batches: list[int], contexts: list[int], dtypes: list[str]) -> None:
    """The Numba CUDA decode kernel and torch's gather + SDPA (both in the cache's dtype) per batch and
    context: time per call, K/V bytes read per second, and that as a share of the copy bandwidth."""
    from hetero_kernels import cuda as kernels

    bandwidth = copy_bandwidth()
    print(f"CUDA {torch.cuda.get_device_name()}: copy bandwidth {bandwidth / 1e9:.0f} GB/s (read + write)")
    for name in dtypes:
        dtype = getattr(torch, name)
        for batch in batches:
            for context in contexts:
                query, k_cache, v_cache, tables, lengths = problem(batch, context, "cuda", dtype)
                out = torch.empty(query.shape, dtype=torch.float32, device="cuda")
                kernel_time, how = gpu_seconds(
                    lambda: kernels.paged_decode_attention(out, query, k_cache, v_cache, tables, lengths, SCALE)
                )
                q = query.to(dtype)
                torch_time, _ = gpu_seconds(lambda: torch_path(q, k_cache, v_cache, tables, lengths, dtype))
                error = (out - torch_path(query, k_cache, v_cache, tables, lengths)).abs().max().item()
                size = kv_bytes(batch, context, k_cache.element_size())
                print(
                    f"  {name:8s} batch {batch:3d} context {context:5d}: kernel {kernel_time * 1e6:8.1f} us"
                    f" ({size / kernel_time / 1e9:6.0f} GB/s, {size / kernel_time / bandwidth:4.0%} of copy)"
                    f"   torch gather+SDPA {torch_time * 1e6:8.1f} us ({size / torch_time / 1e9:6.0f} GB/s)"
                    f"   speed-up {torch_time / kernel_time:4.1f}x   max difference {error:.1e}   timed as {how}"
                )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=32, help="CPU decode batch")
    parser.add_argument(
        "--contexts", type=int, nargs="+", default=[128, 256, 512, 1024, 2048], help="CPU decode contexts"
    )
    parser.add_argument("--chunks", type=int, nargs="+", default=[64, 256, 512, 1024], help="prefill chunk lengths")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads for torch and numba")
    parser.add_argument("--repeats", type=int, default=9, help="timed CPU runs per measurement (the median is shown)")
    parser.add_argument("--gpu-batches", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--gpu-contexts", type=int, nargs="+", default=[256, 1024, 4096, 8192])
    parser.add_argument(
        "--gpu-dtypes", nargs="+", default=["bfloat16", "float16", "float32"], help="cache dtypes on the GPU"
    )
    parser.add_argument(
        "--gpu-shape",
        default="",
        help="the CUDA kernels' launch shape, as hetero_kernels.cuda.configure's keywords: tile=256,words_per_lane=2",
    )
    parser.add_argument("--gpu-only", action="store_true", help="skip the CPU measurements")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    numba.set_num_threads(min(args.threads, numba.config.NUMBA_NUM_THREADS))
    if torch.cuda.is_available():
        if args.gpu_shape:
            from hetero_kernels import cuda as kernels

            kernels.configure(
                **{key: int(value) for key, value in (item.split("=") for item in args.gpu_shape.split(","))}
            )
        cuda_benchmark(args.gpu_batches, args.gpu_contexts, args.gpu_dtypes)
    if not args.gpu_only:
        cpu_benchmark(args.batch, args.contexts, args.repeats)
        cpu_prefill_benchmark(args.chunks, args.repeats)


if __name__ == "__main__":
    main()
