"""``hetero-infer export-tokenizer DIR``: the model's tokenizer as Hugging Face files.

Tools that load a tokenizer with ``transformers`` (lm-evaluation-harness's
``local-completions`` with ``tokenizer=DIR``) then count and split tokens as
the server does, whatever the model file: a Hugging Face folder or a GGUF
file with its embedded vocabulary. The tokenizer component writes the files
through its ``save_pretrained(directory)`` method; one without it cannot be
exported.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from hetero_core.cli.options import add_engine_arguments, engine_config
from hetero_core.errors import ConfigError
from hetero_core.plugins import ComponentRegistry, create_plugin_manager


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hetero-infer export-tokenizer",
        description=(
            "Write the model's tokenizer.json and tokenizer_config.json (special tokens, chat template) into DIR."
        ),
    )
    parser.add_argument(
        "directory", type=Path, metavar="DIR", help="where the files go (created if missing; files there are replaced)"
    )
    parser.add_argument("--debug", action="store_true", help="tracebacks")
    add_engine_arguments(parser)
    return parser


def export_tokenizer(args: argparse.Namespace) -> int:
    """Build the tokenizer the config names, as the engine would, and save it; prints each path written."""
    config = engine_config(args)
    registry = ComponentRegistry(create_plugin_manager(disable=config.plugins.disable, load=config.plugins.load))
    tokenizer = registry.create("tokenizer", config.tokenizer.name, config.tokenizer.options, config)
    save = getattr(tokenizer, "save_pretrained", None)
    if save is None:
        raise ConfigError(
            f"tokenizer {config.tokenizer.name!r} cannot be exported: it has no save_pretrained(directory)",
            param="tokenizer",
        )
    for path in save(args.directory):
        print(path)
    return 0
