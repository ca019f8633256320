"""Grammar-engine costs on the embedded model's vocabulary: compile (cold and cached) and per-token mask work.

    python benchmarks/structured_output.py [--backend llguidance] [--walks 20]

For each JSON schema of the structured-output tests, and for the grammar of a
forced tool call (``tool_choice: required`` over two functions), it prints the cold compile
time (a fresh backend), the cached one (the same constraint again), and the
median and 99th-percentile time to fill one sample's allowed-token bitmask
and to accept the sampled token, measured along random walks that end in
complete, valid JSON. One decode step of a batch-32 run on this CPU takes
tens of milliseconds: the mask work per constrained sample compares with that.
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import statistics
import sys
import time
from pathlib import Path

import attrs

from hetero_core.model_source import resolve_model_path
from hetero_core.plugins import ComponentRegistry, create_plugin_manager
from hetero_core.structured_output import StructuredOutput, new_bitmask
from hetero_core.testing.structured_output import Walker
from hetero_serve_openai.tools import FunctionDefinition, tool_calls_constraint
from hetero_tokenizer_hf import load_tokenizer


def load_schemas() -> dict:
    path = Path(__file__).resolve().parents[1] / "plugins/hetero-structured-llguidance/tests/test_json_schemas.py"
    spec = importlib.util.spec_from_file_location("schemas", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.SCHEMAS


def constraints() -> dict[str, StructuredOutput]:
    built = {name: StructuredOutput.json_schema(schema) for name, schema in load_schemas().items()}
    weather = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city"],
    }
    hours = {"type": "object", "properties": {"hours_ahead": {"type": "integer", "minimum": 0, "maximum": 12}}}
    functions = [
        FunctionDefinition(name="get_weather", parameters=weather),
        FunctionDefinition(name="get_time", parameters=hours),
    ]
    built["tool call, 2 functions"] = tool_calls_constraint(functions, several=False)
    return built


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="llguidance")
    parser.add_argument("--walks", type=int, default=20)
    args = parser.parse_args()
    tokenizer = load_tokenizer(resolve_model_path(None))
    registry = ComponentRegistry(create_plugin_manager())
    make_backend = lambda: registry.create("structured_output", args.backend, {}, tokenizer)  # noqa: E731
    start = time.perf_counter()
    make_backend()
    print(
        f"backend {args.backend!r}: vocabulary of {tokenizer.vocab_size} tokens"
        f" read in {(time.perf_counter() - start) * 1e3:.0f} ms"
    )
    walker = Walker(tokenizer)
    bitmask = new_bitmask(1, tokenizer.vocab_size)
    print(
        f"{'schema':<26} {'cold ms':>8} {'cached us':>10} {'mask us p50/p99':>17} {'accept us p50':>14} {'tokens':>7}"
    )
    for name, constraint in constraints().items():
        backend = make_backend()
        start = time.perf_counter()
        compiled = backend.compile(constraint)
        cold = time.perf_counter() - start
        start = time.perf_counter()
        backend.compile(attrs.evolve(constraint))  # an equal constraint, another object
        cached = time.perf_counter() - start
        mask_times, accept_times, num_tokens = [], [], 0
        rng = random.Random(name)
        for _ in range(args.walks):
            matcher = backend.new_matcher(compiled)
            for token in walker.walk(backend.new_matcher(compiled), rng) + [tokenizer.eos_token_id]:
                start = time.perf_counter()
                matcher.fill_bitmask(bitmask, 0)
                mask_times.append(time.perf_counter() - start)
                start = time.perf_counter()
                assert matcher.accept_token(token)
                accept_times.append(time.perf_counter() - start)
                num_tokens += 1
        print(
            f"{name:<26} {cold * 1e3:>8.2f} {cached * 1e6:>10.1f} "
            f"{statistics.median(mask_times) * 1e6:>8.1f}/{percentile(mask_times, 0.99) * 1e6:<8.1f} "
            f"{statistics.median(accept_times) * 1e6:>14.1f} {num_tokens:>7}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
