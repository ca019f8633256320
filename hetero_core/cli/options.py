"""Command-line flags and how they override the config file."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from hetero_core.config import EngineConfig
from hetero_core.errors import ConfigError
from hetero_core.params import GenerationParams
from hetero_core.structured_output import StructuredOutput

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
)
COMPONENT_FLAGS = (
    "tokenizer",
    "scheduler",
    "cache_allocator",
    "executor",
    "structured_output",
    "speculator",
)  # a name; the file's options stay when the name is the same
SECTIONS = (
    "server",
)  # config sections whose keys -o sets: SECTION.KEY=VALUE, or SECTION.KEY.INNER=VALUE within an object


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags default to None, so only the ones given override the config file."""
    group = parser.add_argument_group("engine (override the config file)")
    group.add_argument("--config", help="JSON config file (the seed's config.json layout works)")
    group.add_argument("--model", help="a .gguf file or a Hugging Face folder (default: the embedded SmolLM2)")
    group.add_argument("--dtype", help=argparse.SUPPRESS)  # moved to the executor's options: refused with a pointer
    group.add_argument("--tokenizer", help="tokenizer component name")
    group.add_argument("--scheduler", help="scheduler policy name (fcfs, priority, ...)")
    group.add_argument("--cache-allocator", help="cache allocator component name (paged, ...)")
    group.add_argument("--executor", help="executor component name (torch, numba-cuda, mock, ...)")
    group.add_argument("--structured-output", help="structured-output backend name (llguidance, ...)")
    group.add_argument("--speculator", help="speculative decoding: a speculator name (ngram, draft, ...); default none")
    group.add_argument(
        "-o",
        "--option",
        action="append",
        default=[],
        metavar="COMPONENT.KEY=VALUE",
        help="a component option, e.g. executor.dtype=float32 or cache_allocator.enable_prefix_caching=false,"
        " or a server key,"
        " e.g. server.backend=command_bridge or server.backend_options.address=HOST:PORT"
        " (VALUE is read as JSON, else as a string; repeatable; 'hetero-infer plugins' lists the options)",
    )
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
    group.add_argument(
        "--data-parallel-size",
        type=int,
        help="engine replicas for serve and --input-file (default 1; above 1 needs hetero-serve-ray)",
    )
    group.add_argument(
        "--ray-address", help=argparse.SUPPRESS
    )  # moved to the ray backend's options: refused with a pointer


def add_sampling_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("generation")
    group.add_argument("--max-tokens", type=int, default=100)
    group.add_argument("--temperature", type=float, default=0.7)
    group.add_argument("--top-p", type=float, default=0.9)
    group.add_argument("--top-k", type=int)
    group.add_argument("--stop", action="append", default=[], help="a stop string (repeatable)")
    group.add_argument(
        "--include-stop-str-in-output", action="store_true", help="keep the stop string that ended the text"
    )
    group.add_argument(
        "--skip-special-tokens",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="leave control tokens out of the text",
    )
    constraint = group.add_mutually_exclusive_group()
    constraint.add_argument(
        "--json-schema", metavar="FILE", help="answer with JSON valid against the JSON schema in FILE"
    )
    constraint.add_argument("--regex", help="answer with text that matches this regular expression")


def engine_config(args: argparse.Namespace) -> EngineConfig:
    """The config file (or defaults) with every given flag applied on top."""
    if args.dtype is not None:
        raise ConfigError(f"--dtype is the executor's option now: use -o executor.dtype={args.dtype}", param="dtype")
    if args.ray_address is not None:
        raise ConfigError(
            f"--ray-address is the ray backend's option now: use -o server.backend_options.address={args.ray_address}",
            param="ray_address",
        )
    config = EngineConfig.from_file(args.config) if args.config else EngineConfig()
    changes: dict[str, Any] = {key: getattr(args, key) for key in ENGINE_FLAGS if getattr(args, key) is not None}
    assigned = component_options(args.option)
    for key in COMPONENT_FLAGS:
        current = getattr(config, key)
        if current is None and getattr(args, key) is None:  # an optional component none was chosen for
            if key in assigned:
                raise ConfigError(
                    f"--option {key}.{next(iter(assigned[key]))} sets an option of no {key}:"
                    f" choose one with --{key.replace('_', '-')} NAME",
                    param=key,
                )
            continue
        name = getattr(args, key) or current.name
        options = dict(current.options) if current is not None and name == current.name else {}
        options.update(assigned.get(key, {}))
        if current is None or (name, options) != (current.name, dict(current.options)):
            changes[key] = {"name": name, **options}
    changes.update(
        {section: assigned[section] for section in SECTIONS if section in assigned}
    )  # merged onto the file's section
    return config.evolve(**changes) if changes else config


def component_options(assignments: list[str]) -> dict[str, dict[str, Any]]:
    """``COMPONENT.KEY=VALUE`` and ``SECTION.KEY=VALUE`` flags, grouped by component or section; VALUE is JSON when
    it parses, else the text."""
    grouped: dict[str, dict[str, Any]] = {}
    for assignment in assignments:
        target, equals, text = assignment.partition("=")
        component, dot, key = target.partition(".")
        if not equals or not dot or not key or component not in COMPONENT_FLAGS + SECTIONS:
            raise ConfigError(
                f"--option takes COMPONENT.KEY=VALUE with COMPONENT one of {', '.join(COMPONENT_FLAGS + SECTIONS)},"
                f" got {assignment!r}",
                param="option",
            )
        try:
            value = json.loads(text)
        except ValueError:
            value = text
        if component in SECTIONS:  # a dotted key sets a key of an object within the section
            *outer, key = key.split(".")
            target_object = grouped.setdefault(component, {})
            for name in outer:
                target_object = target_object.setdefault(name, {})
                if not isinstance(target_object, dict):
                    raise ConfigError(
                        f"--option {assignment!r} sets a key within {component}.{name}, which is not an object",
                        param="option",
                    )
            target_object[key] = value
        else:
            grouped.setdefault(component, {})[key] = value
    return grouped


def generation_params(args: argparse.Namespace) -> GenerationParams:
    return GenerationParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.seed,
        stop=args.stop,
        include_stop_str_in_output=args.include_stop_str_in_output,
        skip_special_tokens=args.skip_special_tokens,
        structured_output=structured_output(args),
    )


def structured_output(args: argparse.Namespace) -> StructuredOutput | None:
    """The constraint ``--json-schema`` or ``--regex`` asks for, if any."""
    if args.regex is not None:
        return StructuredOutput.regex(args.regex)
    if args.json_schema is None:
        return None
    try:
        text = Path(args.json_schema).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the JSON schema file {args.json_schema}: {exc}", param="json_schema") from exc
    return StructuredOutput.json_schema(text)
