"""Command-line flags and how they override the config file."""

from __future__ import annotations

import argparse
from typing import Any

from hetero_core.config import EngineConfig
from hetero_core.params import GenerationParams

# flags that override the config key of the same name
ENGINE_FLAGS = (
    "block_size",
    "max_num_blocks",
    "max_batch_size",
    "max_num_seqs",
    "max_model_len",
    "max_total_tokens",
    "memory_threshold",
    "model",
    "seed",
    "data_parallel_size",
    "ray_address",
)
COMPONENT_FLAGS = ("tokenizer", "scheduler", "executor")  # a name; the file's options stay when the name is the same


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags default to None, so only the ones given override the config file."""
    group = parser.add_argument_group("engine (override the config file)")
    group.add_argument("--config", help="JSON config file (the seed's config.json layout works)")
    group.add_argument("--model", help="a .gguf file or a Hugging Face folder (default: the embedded SmolLM2)")
    group.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"], help="executor compute dtype")
    group.add_argument("--tokenizer", help="tokenizer component name")
    group.add_argument("--scheduler", help="scheduler policy name (fcfs, priority, ...)")
    group.add_argument("--executor", help="executor component name (torch, numba-cuda, mock, ...)")
    group.add_argument("--seed", type=int, help="seed for unseeded sampling")
    for flag, kind in (
        ("--block-size", int),
        ("--max-num-blocks", int),
        ("--max-batch-size", int),
        ("--max-num-seqs", int),
        ("--max-model-len", int),
        ("--max-total-tokens", int),
        ("--memory-threshold", float),
    ):
        group.add_argument(flag, type=kind)
    group.add_argument("--data-parallel-size", type=int, help="engine replicas for serve and --input-file (default 1; above 1 needs hetero-serve-ray)")
    group.add_argument("--ray-address", help="the Ray cluster the replicas join (host:port or 'auto'; default: start one here)")


def add_sampling_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("generation")
    group.add_argument("--max-tokens", type=int, default=100)
    group.add_argument("--temperature", type=float, default=0.7)
    group.add_argument("--top-p", type=float, default=0.9)
    group.add_argument("--top-k", type=int)
    group.add_argument("--stop", action="append", default=[], help="a stop string (repeatable)")


def engine_config(args: argparse.Namespace) -> EngineConfig:
    """The config file (or defaults) with every given flag applied on top."""
    config = EngineConfig.from_file(args.config) if args.config else EngineConfig()
    changes: dict[str, Any] = {key: getattr(args, key) for key in ENGINE_FLAGS if getattr(args, key) is not None}
    for key in COMPONENT_FLAGS:
        current = getattr(config, key)
        name = getattr(args, key) or current.name
        options = dict(current.options) if name == current.name else {}
        if key == "executor" and args.dtype is not None:
            options["dtype"] = args.dtype
        if (name, options) != (current.name, dict(current.options)):
            changes[key] = {"name": name, **options}
    return config.evolve(**changes) if changes else config


def generation_params(args: argparse.Namespace) -> GenerationParams:
    return GenerationParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.seed,
        stop=args.stop,
    )
