"""``hetero-infer``: generate, chat, run a batch, list plugins, benchmark, export the tokenizer; plugins add
commands (serve)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable

from hetero_core.cli.bench import run_benchmark
from hetero_core.cli.commands import plugin_command, run_command
from hetero_core.cli.export_tokenizer import build_parser as export_parser
from hetero_core.cli.export_tokenizer import export_tokenizer
from hetero_core.cli.generate import batch, chat, one_shot
from hetero_core.cli.options import add_engine_arguments, add_sampling_arguments, engine_config, generation_params
from hetero_core.errors import CacheMemoryError, ConfigError, EngineError, ValidationError
from hetero_core.logs import configure_logging
from hetero_core.plugins import create_plugin_manager, describe_plugins

EXAMPLES = """\
examples:
  hetero-infer --input "What is the capital of France?"
  hetero-infer --chat
  hetero-infer --input-file prompts.jsonl --output-file results.jsonl
  hetero-infer --input-file prompts.jsonl --data-parallel-size 2      (replicas on Ray: hetero-serve-ray)
  hetero-infer serve --port 8000                                      (the OpenAI server: hetero-serve-openai)
  hetero-infer serve --data-parallel-size 2 [-o server.backend_options.address=HOST:PORT]
  hetero-infer plugins
  hetero-infer bench serve --rate 4       (also: bench throughput, bench attention; --help for each)
  hetero-infer export-tokenizer DIR       (tokenizer.json and tokenizer_config.json, for transformers and lm-eval)
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hetero-infer",
        description="LLM inference with pluggable backends.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "command",
        nargs="?",
        choices=["generate", "plugins"],
        default="generate",
        help="or a plugin's command: serve, ...",
    )
    parser.add_argument("--input", help="a prompt to answer (streamed to stdout)")
    parser.add_argument("--chat", action="store_true", help="interactive chat using the model's chat template")
    parser.add_argument("--raw", action="store_true", help="send --input as plain text, not as a chat message")
    parser.add_argument(
        "--input-file",
        type=Path,
        help="prompts: text lines, or JSONL with 'prompt' or 'messages' and any parameters of their own"
        " (max_tokens, ...)",
    )
    parser.add_argument("--output-file", type=Path, help="where --input-file results go (JSONL; default stdout)")
    parser.add_argument(
        "--serve", action="store_true", help="same as the 'serve' command ('hetero-infer serve --help' for its flags)"
    )
    parser.add_argument("--debug", action="store_true", help="debug logs and tracebacks")
    add_engine_arguments(parser)
    add_sampling_arguments(parser)
    return parser


def run(args: argparse.Namespace, argv: list[str]) -> int:
    config = engine_config(args)
    if args.command == "plugins":
        pm = create_plugin_manager(disable=config.plugins.disable, load=config.plugins.load)
        print(json.dumps(describe_plugins(pm), indent=2))
        return 0
    params = generation_params(args)
    if not (args.input or args.chat or args.input_file):
        raise ConfigError(
            "nothing to do: give --input TEXT, --chat, --input-file FILE, or a command (serve, plugins, bench)"
        )
    if config.data_parallel_size > 1:
        if not args.input_file:
            raise ConfigError("--data-parallel-size applies to serve and --input-file, not to --input or --chat")
        return run_command("batch", argv)  # replicas are serving backends; batch reads the same flags
    from hetero_core.engine import InferenceEngine

    engine = InferenceEngine(config)
    try:
        if args.input_file:
            return batch(engine, args.input_file, args.output_file, params)
        if args.chat:
            return chat(engine, params)
        return one_shot(engine, args.input, params, as_chat=not args.raw)
    finally:
        engine.close()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["bench"]:  # the benchmark programs parse their own options
        configure_logging(quiet=True)
        return guarded(lambda: run_benchmark(argv[1:]), debug="--debug" in argv)
    if argv[:1] == ["export-tokenizer"]:  # a positional DIR and the engine flags
        export_args = export_parser().parse_args(argv[1:])
        configure_logging(debug=export_args.debug, quiet=not export_args.debug)
        return guarded(lambda: export_tokenizer(export_args), debug=export_args.debug)
    command = plugin_command(argv)
    if command is not None:  # it configures logging itself
        return guarded(lambda: run_command(*command), debug="--debug" in argv)
    args = build_parser().parse_args(argv)
    configure_logging(debug=args.debug, quiet=not args.debug)
    return guarded(lambda: run(args, argv), debug=args.debug)


def guarded(action: Callable[[], int], *, debug: bool) -> int:
    """Run ``action``; unless ``debug``, a failure is one line on stderr and a non-zero status, never a traceback.

    Exit status 2 is a problem with the input (config, flags, files, a request the engine refuses), 1 a
    generation that failed or an internal fault, 130 Ctrl-C.
    """
    try:
        return action()
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        if debug:
            raise
        print(f"hetero-infer: error: {describe(exc)}", file=sys.stderr)
        return 2 if isinstance(exc, (ConfigError, ValidationError, CacheMemoryError, OSError)) else 1


def describe(exc: Exception) -> str:
    if isinstance(exc, EngineError):
        return exc.message
    if isinstance(exc, OSError) and exc.filename is not None:
        return f"{exc.filename}: {exc.strerror}"
    return f"{type(exc).__name__}: {exc} (run with --debug for the traceback)"


if __name__ == "__main__":
    sys.exit(main())
