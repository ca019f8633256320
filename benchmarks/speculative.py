"""Speculative decoding on chat prompts: the engine with and without its ``ngram`` speculator, and llama-cpp-python
with and without prompt lookup, each run in its own process.

    python benchmarks/speculative.py [--modes batch-1,32-at-once] [--peers hetero,hetero-ngram,...]
        [--peers-at-once hetero,hetero-ngram]
        [--k 8] [--ngram-option min_ngram=1 ...] [--max-tokens 200] [--prompts 3] [--repeats 1]
        [--show] [--json PATH]

Workloads (chat prompts of the embedded SmolLM2-135M-Instruct, rendered with
its chat template; greedy; generation ends at EOS or ``--max-tokens``):
``code`` (rewrite a given 40-line Python file with a function renamed or a
docstring added), ``quote`` (repeat a given passage word for word), ``json``
(answer with fields of a given JSON record) -- the answer repeats the prompt,
where prompt lookup pays -- and ``chat`` (open questions, where it should
not). ``--prompts`` of each kind (3 at most).

Peers: ``hetero`` (plain decoding, the executor's defaults), ``hetero-ngram``
(the ``ngram`` speculator, ``--k`` and ``--ngram-option``), ``hetero-fp32``
and ``hetero-ngram-fp32`` (the same in float32, whose outputs must be
identical token for token), ``llama-cpp``, ``llama-cpp-lookup-2`` and
``llama-cpp-lookup-10`` (llama-cpp-python on the same GGUF and the same token
ids, ``LlamaPromptLookupDecoding`` proposing 2 or 10 tokens).

Modes: ``batch-1`` (one request at a time: decode tok/s = tokens after the
first / time from the first token to the last, time to first token, and
generated tokens / request time) and ``32-at-once`` (32 requests submitted
together, cycling through every prompt of every kind; engine peers only:
generated tok/s). Each (mode, peer) runs in a fresh process; peers alternate
and ``--repeats`` runs the whole round again, so each ratio compares runs of
one round on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import child_process  # noqa: E402

MODES = ("batch-1", "32-at-once")
ENGINE_PEERS = {  # peer -> (executor options, speculates)
    "hetero": ({}, False),
    "hetero-ngram": ({}, True),
    "hetero-fp32": ({"dtype": "float32"}, False),
    "hetero-ngram-fp32": ({"dtype": "float32"}, True),
}
LOOKUP_PEERS = {"llama-cpp": 0, "llama-cpp-lookup-2": 2, "llama-cpp-lookup-10": 10}  # peer -> tokens proposed
PEERS = (*ENGINE_PEERS, *LOOKUP_PEERS)
DEFAULT_PEERS = {
    "batch-1": ",".join(PEERS),
    "32-at-once": "hetero,hetero-ngram",
}
AT_ONCE = 32

# ------------------------------------------------------------------------------------------ the prompts

CONFIG_FILE = '''def load_config(path):
    """Read a key=value file into a dict."""
    config = {}
    with open(path) as handle:
        for line in handle:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            key, value = line.split("=", 1)
            config[key.strip()] = value.strip()
    return config


def get_int(config, key, default=0):
    value = config.get(key)
    if value is None:
        return default
    return int(value)


def get_bool(config, key, default=False):
    value = config.get(key)
    if value is None:
        return default
    return value.lower() in ("1", "true", "yes")


def main():
    config = load_config("app.cfg")
    port = get_int(config, "port", 8080)
    debug = get_bool(config, "debug")
    print("port", port)
    print("debug", debug)


if __name__ == "__main__":
    main()
'''
INVENTORY_FILE = """class Inventory:
    def __init__(self):
        self.items = {}

    def add(self, name, count):
        if count <= 0:
            raise ValueError("count must be positive")
        self.items[name] = self.items.get(name, 0) + count

    def remove(self, name, count):
        have = self.items.get(name, 0)
        if count > have:
            raise ValueError("not enough " + name)
        self.items[name] = have - count
        if self.items[name] == 0:
            del self.items[name]

    def total(self):
        return sum(self.items.values())

    def report(self):
        lines = []
        for name in sorted(self.items):
            lines.append(name + ": " + str(self.items[name]))
        return "\\n".join(lines)


def demo():
    stock = Inventory()
    stock.add("apple", 5)
    stock.add("pear", 3)
    stock.remove("apple", 2)
    print(stock.report())
    print("total", stock.total())


demo()
"""
SHAPES_FILE = """import math


def area_of_circle(radius):
    return math.pi * radius * radius


def area_of_square(side):
    return side * side


def area_of_triangle(base, height):
    return 0.5 * base * height


def describe(shape, area):
    return shape + " with area " + str(round(area, 2))


def main():
    shapes = [
        ("circle", area_of_circle(2.0)),
        ("square", area_of_square(3.0)),
        ("triangle", area_of_triangle(4.0, 5.0)),
    ]
    for shape, area in shapes:
        print(describe(shape, area))
    largest = max(shapes, key=lambda pair: pair[1])
    print("largest:", largest[0])


if __name__ == "__main__":
    main()
"""
PASSAGES = [
    "The lighthouse stood at the edge of the cliff for more than a hundred years. Every night the keeper climbed"
    " the narrow stairs, lit the great lamp and watched the ships pass safely along the rocky coast. In winter the"
    " storms were so strong that the windows shook, but the light never went out. When the keeper grew old, his"
    " daughter took his place, and she kept the lamp burning just as he had taught her.",
    "Water covers about seventy percent of the surface of the Earth. Most of it is salt water in the oceans, and"
    " only a small part is fresh water that people can drink. Much of the fresh water is frozen in glaciers and ice"
    " caps. Rivers, lakes and underground water supply the towns and farms, so keeping them clean is important for"
    " everyone.",
    "The old bridge crossed the river in the middle of the village. Children walked over it every morning on their"
    " way to school, and farmers drove their carts over it to the market on Saturdays. One spring the river rose"
    " higher than anyone could remember, and the water reached the stones of the bridge. The villagers worked all"
    " night to save it, and in the morning the bridge was still standing.",
]
RECORDS = [
    (
        '{"id": 4821, "name": "Maria Lopez", "email": "maria.lopez@example.com", "phone": "555-0142", "address":'
        ' {"street": "12 Oak Street", "city": "Springfield", "zip": "62704"}, "orders": 17, "member_since":'
        ' "2019-03-08", "newsletter": true}',
        "name, email, city and orders",
    ),
    (
        '{"sku": "TB-2290", "title": "Stainless Steel Water Bottle", "brand": "Trailblazer", "price": 24.99,'
        ' "currency": "USD", "stock": 312, "color": "forest green", "capacity_ml": 750, "tags": ["outdoor",'
        ' "hiking", "reusable"]}',
        "sku, title, price and stock",
    ),
    (
        '{"flight": "KL1604", "airline": "KLM", "from": "Amsterdam", "to": "Rome", "departure": "2024-05-14T09:35",'
        ' "arrival": "2024-05-14T11:50", "gate": "D7", "seat": "14C", "passenger": "Jonas Berg", "status":'
        ' "on time"}',
        "flight, from, to, gate and passenger",
    ),
]
MESSAGES = {
    "code": [
        f"```python\n{CONFIG_FILE}```\n\nAdd a docstring to the function main and output the complete file.",
        f"Here is a Python file:\n\n```python\n{INVENTORY_FILE}```\n\n"
        "Rewrite this file with the function demo renamed to run_demo. Output the complete file.",
        f"Here is a Python file:\n\n```python\n{SHAPES_FILE}```\n\n"
        "Rewrite this file with the function describe renamed to label. Output the complete file.",
    ],
    "quote": [f"Repeat the following passage exactly, word for word:\n\n{passage}" for passage in PASSAGES],
    "json": [
        f"Extract the fields {fields} from this JSON record and answer with a JSON object only.\n\n{record}"
        for record, fields in RECORDS
    ],
    "chat": [
        "Write a short story about a robot who learns to paint.",
        "Explain how a refrigerator keeps food cold.",
        "What are the advantages and disadvantages of living in a big city?",
    ],
}
KINDS = tuple(MESSAGES)


def prompts(per_kind: int) -> dict[str, list[list[int]]]:
    """Each kind's first ``per_kind`` messages as token ids of the embedded model's chat template."""
    from hetero_core.model_source import resolve_model_path
    from hetero_tokenizer_hf.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(resolve_model_path(None))
    render = lambda text: tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": text}]))  # noqa: E731
    return {kind: [render(text) for text in texts[:per_kind]] for kind, texts in MESSAGES.items()}


def at_once_prompts(by_kind: dict[str, list[list[int]]]) -> list[list[int]]:
    every = [prompt for kind in KINDS for prompt in by_kind[kind]]
    return [every[i % len(every)] for i in range(AT_ONCE)]


# ------------------------------------------------------------------------------------------ the engine


def ngram_options(args: argparse.Namespace) -> dict:
    options = {"k": args.k}
    for item in args.ngram_option:
        key, _, value = item.partition("=")
        options[key] = int(value)
    return options


def start_engine(peer: str, args: argparse.Namespace):
    from hetero_core import EngineConfig, hookimpl
    from hetero_core.engine import InferenceEngine
    from hetero_core.plugins import create_plugin_manager

    class DecodeSteps:
        count = 0

        @hookimpl
        def on_step_finished(self, engine, stats) -> None:
            self.count += not stats.num_prefill_tokens and stats.num_decode_tokens > 0

    executor, speculates = ENGINE_PEERS[peer]
    steps = DecodeSteps()
    pm = create_plugin_manager()
    pm.register(steps, name="decode-steps")
    config = EngineConfig(
        executor={"name": "torch", "num_threads": args.threads, **executor},
        speculator={"name": "ngram", **ngram_options(args)} if speculates else None,
        max_num_seqs=AT_ONCE,
        max_batch_size=AT_ONCE,
        max_model_len=1024,
    )
    return InferenceEngine(config, plugin_manager=pm), steps


def speculation_counts(engine) -> dict:
    m = engine.metrics
    return {
        "verifications": m.speculative_verifications,
        "proposed": m.speculative_proposed_tokens,
        "accepted": m.speculative_accepted_tokens,
    }


def difference(after: dict, before: dict) -> dict:
    return {key: after[key] - before[key] for key in after}


def run_engine(peer: str, mode: str, by_kind: dict, args: argparse.Namespace) -> dict:
    from hetero_core import GenerationParams

    engine, steps = start_engine(peer, args)
    params = GenerationParams(temperature=0.0, max_tokens=args.max_tokens)
    warm = GenerationParams(temperature=0.0, max_tokens=32)
    engine.generate([by_kind[kind][0] for kind in KINDS], warm)  # compiles every step shape speculation makes
    if mode == "32-at-once":
        engine.generate(at_once_prompts(by_kind), GenerationParams(temperature=0.0, max_tokens=2))
    engine.allocator.reset_prefix_cache()
    result = {"config": f"{engine.executor.dtype}, weights {engine.executor.weight_format}", "kinds": {}}
    if mode == "batch-1":
        for kind in KINDS:
            records, counts = [], {"verifications": 0, "proposed": 0, "accepted": 0, "decode_steps": 0}
            for prompt in by_kind[kind]:
                before, steps_before = speculation_counts(engine), steps.count
                record = engine.generate([prompt], params)[0]
                counts = {
                    **{k: v + counts[k] for k, v in difference(speculation_counts(engine), before).items()},
                    "decode_steps": counts["decode_steps"] + steps.count - steps_before,
                }
                records.append(
                    {
                        "tokens": record.generated_tokens,
                        "text": record.output_text,
                        "ttft": record.time_to_first_token,
                        "seconds": record.duration,
                    }
                )
            result["kinds"][kind] = {"requests": records, **counts}
    else:
        before, steps_before = speculation_counts(engine), steps.count
        started = time.monotonic()
        records = engine.generate(at_once_prompts(by_kind), params)
        elapsed = time.monotonic() - started
        result["kinds"]["mixed"] = {
            "elapsed": elapsed,
            "generated": sum(len(r.generated_tokens) for r in records),
            "tokens": [r.generated_tokens for r in records],
            "decode_steps": steps.count - steps_before,
            **difference(speculation_counts(engine), before),
        }
    engine.close()
    return result


# ------------------------------------------------------------------------------------------ llama-cpp-python


def run_llama_cpp(peer: str, by_kind: dict, args: argparse.Namespace) -> dict:
    from llama_cpp import Llama
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    from hetero_core.model_source import resolve_model_path
    from hetero_tokenizer_hf.tokenizer import load_tokenizer

    path = resolve_model_path(None)
    proposed = LOOKUP_PEERS[peer]
    # With a draft model, llama-cpp-python 0.3 reads every position's logits but keeps rows for only n_batch
    # positions unless logits_all is passed: a sequence past them would fail.
    llm = Llama(
        model_path=str(path),
        draft_model=LlamaPromptLookupDecoding(num_pred_tokens=proposed) if proposed else None,
        logits_all=bool(proposed),
        n_ctx=2048,
        n_batch=512,
        n_threads=args.threads,
        n_threads_batch=args.threads,
        verbose=False,
    )
    eos = {llm.token_eos(), load_tokenizer(path).eos_token_id}

    def generate(prompt: list[int], max_tokens: int) -> tuple[list[int], list[float]]:
        llm.reset()
        tokens, times = [], []
        for token in llm.generate(prompt, temp=0.0, top_k=1, repeat_penalty=1.0, reset=True):
            tokens.append(token)
            times.append(time.monotonic())
            if token in eos or len(tokens) == max_tokens:
                break
        return tokens, times

    for kind in KINDS:  # warm-up
        generate(by_kind[kind][0], 32)
    result = {"config": f"llama-cpp-python, prompt lookup {proposed or 'off'}", "kinds": {}}
    for kind in KINDS:
        records = []
        for prompt in by_kind[kind]:
            submitted = time.monotonic()
            tokens, times = generate(prompt, args.max_tokens)
            records.append(
                {
                    "tokens": tokens,
                    "text": llm.detokenize(tokens).decode("utf-8", "replace"),
                    "ttft": times[0] - submitted,
                    "seconds": times[-1] - submitted,
                }
            )
        result["kinds"][kind] = {"requests": records}
    return result


# ------------------------------------------------------------------------------------------ one run per process


def run_child(peer: str, mode: str, args: argparse.Namespace) -> dict:
    import torch

    torch.set_num_threads(args.threads)
    by_kind = prompts(args.prompts)
    if peer in LOOKUP_PEERS:
        return run_llama_cpp(peer, by_kind, args)
    return run_engine(peer, mode, by_kind, args)


def spawn(peer: str, mode: str, argv: list[str]) -> dict | None:
    return child_process.spawn(__file__, f"{peer}:{mode}", f"{peer} ({mode})", argv)


def figures(kind: dict) -> dict:
    """A batch-1 kind's figures over its requests; a 32-at-once run's totals."""
    out = {}
    if "requests" in kind:
        requests = kind["requests"]
        generated = sum(len(r["tokens"]) for r in requests)
        decode_seconds = sum(r["seconds"] - r["ttft"] for r in requests)
        out |= {
            "generated": generated,
            "decode_tok_s": sum(len(r["tokens"]) - 1 for r in requests) / max(1e-9, decode_seconds),
            "ttft_ms": sum(r["ttft"] for r in requests) / len(requests) * 1e3,
            "total_tok_s": generated / sum(r["seconds"] for r in requests),
        }
        if kind.get("decode_steps"):  # one sequence: every decoding step is one of its steps
            out["tokens_per_step"] = sum(len(r["tokens"]) - 1 for r in requests) / kind["decode_steps"]
    else:
        out |= {"generated": kind["generated"], "total_tok_s": kind["generated"] / kind["elapsed"]}
    if kind.get("proposed"):
        out |= {
            "acceptance": kind["accepted"] / kind["proposed"],
            "mean_accepted_length": kind["accepted"] / kind["verifications"],
            "tokens_per_verifying_step": 1 + kind["accepted"] / kind["verifications"],
        }
    if kind.get("decode_steps"):
        out["decode_steps"] = kind["decode_steps"]
    return out


def speed(figure: dict) -> float:
    return figure.get("decode_tok_s", figure["total_tok_s"])


def describe(peer: str, name: str, figure: dict, plain: dict | None, lookups: dict[str, dict]) -> str:
    if "decode_tok_s" in figure:
        line = (
            f"    {name:6s} {peer:20s} decode {figure['decode_tok_s']:6.1f} tok/s, TTFT {figure['ttft_ms']:5.0f} ms,"
            f" total {figure['total_tok_s']:6.1f} tok/s, {figure['generated']:4d} tokens"
        )
    else:
        line = f"    {name:6s} {peer:20s} {figure['total_tok_s']:6.1f} tok/s, {figure['generated']:4d} tokens"
    if plain is not None and peer != "hetero":
        line += f"; {speed(figure) / speed(plain):.2f}x hetero"
    if peer.startswith("hetero-ngram"):
        line += "".join(f", {speed(figure) / speed(other):.2f}x {lookup}" for lookup, other in lookups.items())
    if "acceptance" in figure:
        line += (
            f"; accepted {figure['acceptance']:.0%} of proposals, {figure['mean_accepted_length']:.2f} per verifying"
            " step"
        )
    if "tokens_per_step" in figure:
        line += f", {figure['tokens_per_step']:.2f} tokens per step"
    elif "decode_steps" in figure:
        line += f", {figure['decode_steps']} decode steps"
    return line


def identity(results: dict[str, dict], plain: str, spec: str) -> dict[str, str] | None:
    """Per kind, whether ``spec``'s outputs equal ``plain``'s token for token."""
    if plain not in results or spec not in results:
        return None
    verdict = {}
    for name, kind in results[plain]["kinds"].items():
        mine = kind["requests"] if "requests" in kind else [{"tokens": t} for t in kind["tokens"]]
        theirs = results[spec]["kinds"][name]
        theirs = theirs["requests"] if "requests" in theirs else [{"tokens": t} for t in theirs["tokens"]]
        same = sum(a["tokens"] == b["tokens"] for a, b in zip(mine, theirs, strict=True))
        verdict[name] = "yes" if same == len(mine) else f"no ({same} of {len(mine)} identical)"
    return verdict


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return line.partition(":")[2].strip()
    return platform.machine()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, from {', '.join(MODES)}")
    parser.add_argument("--peers", help=f"batch-1 peers, comma-separated (default: {DEFAULT_PEERS['batch-1']})")
    parser.add_argument(
        "--peers-at-once", help=f"32-at-once peers, engine only (default: {DEFAULT_PEERS['32-at-once']})"
    )
    parser.add_argument("--k", type=int, default=8, help="the ngram speculator's k")
    parser.add_argument(
        "--ngram-option", action="append", default=[], metavar="KEY=N", help="another ngram option, e.g. min_ngram=1"
    )
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("--prompts", type=int, default=3, choices=[1, 2, 3], help="prompts of each kind")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--show", action="store_true", help="print each peer's answer to each kind's first prompt")
    parser.add_argument("--json", type=Path, help="write every run's figures here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        peer, mode = args.child.split(":")
        child_process.report(run_child(peer, mode, args))
        return
    modes = args.modes.split(",")
    chosen = {
        "batch-1": (args.peers or DEFAULT_PEERS["batch-1"]).split(","),
        "32-at-once": (args.peers_at_once or DEFAULT_PEERS["32-at-once"]).split(","),
    }
    unknown = [m for m in modes if m not in MODES] + [p for p in chosen["batch-1"] if p not in PEERS]
    unknown += [p for p in chosen["32-at-once"] if p not in ENGINE_PEERS]
    unknown += [o for o in args.ngram_option if "=" not in o or not o.partition("=")[2].isdigit()]
    if unknown:
        parser.error(f"unknown mode or peer, or an ngram option not KEY=N: {', '.join(unknown)}")
    argv = [a for a in sys.argv[1:] if a != "--show"]
    commit = subprocess.run(
        ["git", "log", "--oneline", "-1"], capture_output=True, text=True, cwd=Path(__file__).parent
    )
    print(
        f"{args.threads} threads; max_tokens {args.max_tokens}; {args.prompts} prompts of each kind;"
        f" ngram {ngram_options(args)}; at {commit.stdout.strip()}"
    )
    rounds = []
    for repeat in range(args.repeats):
        for mode in modes:
            print(f"round {repeat + 1}, {mode}", flush=True)
            results = {}
            for peer in chosen[mode]:
                result = spawn(peer, mode, argv)
                if result is not None:
                    results[peer] = result
                    if args.show and repeat == 0:
                        for name, kind in result["kinds"].items():
                            if "requests" in kind:
                                print(f"  --- {peer} on {name}:\n{kind['requests'][0]['text']}\n  ---")
            summary = {peer: {n: figures(k) for n, k in r["kinds"].items()} for peer, r in results.items()}
            names = list(next(iter(summary.values()), {}))
            for name in names:
                lookups = {p: summary[p][name] for p in LOOKUP_PEERS if p != "llama-cpp" and p in summary}
                for peer in summary:
                    plain = summary.get("hetero", {}).get(name)
                    print(describe(peer, name, summary[peer][name], plain, lookups), flush=True)
            identical = {
                "float32": identity(results, "hetero-fp32", "hetero-ngram-fp32"),
                "default dtype": identity(results, "hetero", "hetero-ngram"),
            }
            for dtype, verdict in identical.items():
                if verdict is not None:
                    print(f"    ngram's outputs identical to plain decoding's, {dtype}: {verdict}")
            rounds.append(
                {
                    "round": repeat + 1,
                    "mode": mode,
                    "load_average_1min": os.getloadavg()[0],
                    "configs": {peer: r["config"] for peer, r in results.items()},
                    "figures": summary,
                    "identical_outputs": {k: v for k, v in identical.items() if v is not None},
                }
            )
    if args.json:
        record = {
            "host": f"{cpu_name()}, {os.cpu_count()} cores, {args.threads} threads",
            "commit": commit.stdout.strip(),
            "command": "python benchmarks/speculative.py " + " ".join(a for a in sys.argv[1:]),
            "max_tokens": args.max_tokens,
            "prompts_per_kind": args.prompts,
            "ngram": ngram_options(args),
            "rounds": rounds,
        }
        args.json.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
