"""Where a decode step's time goes: the engine profiled with torch.profiler, on its own device.

    python benchmarks/step_profile.py [--model PATH] [--tokenizer NAME] [--batch 1] [--new-tokens 64] [--executor torch]
        [--dtype auto] [--attention auto] [--decode-graphs auto] [--rows 20]

Runs ``--batch`` requests of a short prompt for ``--new-tokens`` greedy tokens
(after a warm-up pass that captures the decode graphs), once as it is and once
under torch.profiler (host ops, and device kernels where there is a GPU), and prints:

- the time per decode step, plain and under the profiler, and how much of it each part of the step took on
  the host (labelled regions: the engine's step, the executor's ``execute``,
  the decode graph's replay with its input copies, the head, sampling);
- on a GPU, the device's busy time per step (the kernels' summed time, graph
  replays included) beside the wall time: where wall time is much longer, the
  step waits on the host, not on the GPU;
- the ops with the most host time and, on a GPU, the kernels with the most device time.
"""

from __future__ import annotations

import argparse

from torch.profiler import ProfilerActivity, profile, record_function

from hetero_core import EngineConfig, GenerationParams, hookimpl
from hetero_core.engine import InferenceEngine
from hetero_core.plugins import create_plugin_manager

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."
REGIONS = ("engine step", "execute", "decode graph", "head", "sampling")


def labelled(label: str, function):
    def run(*args, **kwargs):
        with record_function(label):
            return function(*args, **kwargs)

    return run


class DecodeSteps:
    """Counts the engine's decode-only steps and their durations."""

    def __init__(self) -> None:
        self.count, self.seconds = 0, 0.0

    @hookimpl
    def on_step_finished(self, engine, stats) -> None:
        if stats.num_decode_tokens and not stats.num_prefill_tokens:
            self.count += 1
            self.seconds += stats.duration


def device_time_us(event) -> float:
    return getattr(event, "self_device_time_total", None) or getattr(event, "self_cuda_time_total", 0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="model path (default: the embedded SmolLM2)")
    parser.add_argument("--tokenizer", help="tokenizer plugin (default: the model's own)")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--executor", default="torch", help="torch or numba-cuda")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--attention", default="auto", help="the torch executor's attention backend")
    parser.add_argument("--decode-graphs", default="auto", choices=["auto", "true", "false"])
    parser.add_argument("--rows", type=int, default=20, help="rows of each op table")
    args = parser.parse_args()

    executor = {
        "name": args.executor,
        "dtype": args.dtype,
        "decode_graphs": {"auto": "auto", "true": True, "false": False}[args.decode_graphs],
    }
    if args.executor == "torch":
        executor["attention"] = args.attention
    decodes = DecodeSteps()
    pm = create_plugin_manager()
    pm.register(decodes, name="decode-steps")
    tokenizer = {"tokenizer": args.tokenizer} if args.tokenizer else {}
    config = EngineConfig(
        model=args.model,
        executor=executor,
        max_num_seqs=args.batch,
        max_batch_size=args.batch,
        max_model_len=1024,
        **tokenizer,
    )
    engine = InferenceEngine(config, plugin_manager=pm)
    ex = engine.executor
    ex.execute = labelled("execute", ex.execute)
    ex.sampler = labelled("sampling", ex.sampler)
    ex.model.logits = labelled("head", ex.model.logits)
    if ex.graphs is not None:
        ex.graphs.run = labelled("decode graph", ex.graphs.run)
    params = GenerationParams(temperature=0.0, max_tokens=args.new_tokens, ignore_eos=True)
    engine.generate([PROMPT] * args.batch, params)  # warm-up: captures the graphs this run replays

    def run() -> tuple[int, float]:
        """Decode steps and their seconds, for ``--batch`` requests submitted at once."""
        engine.allocator.reset_prefix_cache()
        decodes.count, decodes.seconds = 0, 0.0
        for _ in range(args.batch):
            engine.submit_request(PROMPT, params)
        while engine.has_pending_work():
            with record_function("engine step"):
                engine.step()
        return decodes.count, decodes.seconds

    plain_steps, plain_seconds = run()
    cuda = ex.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        decode_steps, decode_seconds = run()
    events = prof.key_averages()
    steps = max(1, decode_steps)
    graphs = ex.graphs.num_graphs if ex.graphs is not None else "off"
    print(f"{ex.device}, {ex.dtype}, attention {ex.attention.name}, decode graphs {graphs}, batch {args.batch}")
    print(
        f"decode steps {plain_steps}: {plain_seconds / max(1, plain_steps) * 1e3:.3f} ms a step"
        f" ({args.batch * plain_steps / max(plain_seconds, 1e-9):.0f} tok/s);"
        f" under the profiler {decode_seconds / steps * 1e3:.3f} ms a step"
    )
    regions: dict = {}  # on a GPU each label also names a device-side range (no host time): keep the host's
    for event in events:
        if event.key in REGIONS and event.cpu_time_total >= getattr(regions.get(event.key), "cpu_time_total", -1):
            regions[event.key] = event
    for region in REGIONS:
        if region in regions:
            event = regions[region]
            print(
                f"  host in {region:13s} {event.cpu_time_total / 1e3 / event.count:8.3f} ms a call, {event.count} calls"
            )
    if cuda:
        busy = sum(device_time_us(e) for e in events) / 1e3
        print(
            f"  device busy {busy / (decode_steps + args.batch):.3f} ms a step"
            " (kernels' summed time over every step, prefill included)"
        )
        print(
            events.table(
                sort_by="self_device_time_total"
                if hasattr(events[0], "self_device_time_total")
                else "self_cuda_time_total",
                row_limit=args.rows,
            )
        )
    print(events.table(sort_by="self_cpu_time_total", row_limit=args.rows))


if __name__ == "__main__":
    main()
