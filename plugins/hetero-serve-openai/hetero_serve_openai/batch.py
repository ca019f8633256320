"""``hetero-infer batch --input-file FILE``: a prompts file through the serving backend.

The backend is the one ``hetero-infer serve`` would use: ``server.backend``,
or, with ``--data-parallel-size N`` above 1, the replicas of the backend
``data_parallel_backend`` names (``ray`` from ``hetero-serve-ray``); the core's
``hetero-infer --input-file FILE --data-parallel-size N`` runs this command.
It is driven through :class:`BackendClient`; the output has the same lines,
in the same order, as a run on one engine. Lines that share their parameters
are sent together, one such group after another.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from tqdm import tqdm

from hetero_core.cli.generate import read_prompts
from hetero_core.cli.main import build_parser
from hetero_core.cli.options import engine_config, generation_params
from hetero_core.config import EngineConfig
from hetero_core.errors import ConfigError
from hetero_core.logs import configure_logging
from hetero_core.params import GenerationParams
from hetero_serve_openai.backend import backend_name, create_backend
from hetero_serve_openai.client import BackendClient
from hetero_serve_openai.generation import Choice


def batch_command(argv: list[str]) -> int:
    """The ``batch`` command: the generate command's flags (``hetero-infer --help``); ``--input-file`` is required."""
    args = build_parser().parse_args(argv)
    configure_logging(debug=args.debug, quiet=not args.debug)
    if not args.input_file or args.input or args.chat:
        raise ConfigError("batch takes --input-file FILE (not --input or --chat)", param="input_file")
    replicated_batch(engine_config(args), args.input_file, args.output_file, generation_params(args))
    return 0


def replicated_batch(
    config: EngineConfig, input_file: Path, output_file: Path | None, params: GenerationParams
) -> None:
    """Generate for every prompt of ``input_file`` over the replicas, with one progress bar;
    one JSON line per prompt."""
    items = read_prompts(input_file, params)
    groups: dict[GenerationParams, list[int]] = {}  # line indexes by their parameters
    for index, (_, item_params) in enumerate(items):
        groups.setdefault(item_params, []).append(index)
    client = BackendClient(create_backend(config), name=backend_name(config))
    num_tokens = 0
    started = time.monotonic()
    firsts: dict[int, Choice] = {}  # each line's first choice
    try:
        with tqdm(total=sum(p.n for _, p in items), unit="req", file=sys.stderr) as progress:

            def finished(choice: Choice) -> None:
                nonlocal num_tokens
                num_tokens += len(choice.token_ids)
                progress.update(1)
                progress.set_postfix(tokens_per_s=f"{num_tokens / (time.monotonic() - started):.1f}")

            for group_params, indexes in groups.items():
                prompts = [items[i][0].get("messages", items[i][0].get("prompt")) for i in indexes]
                choices = client.generate(prompts, group_params, on_finished=finished)
                firsts.update(zip(indexes, choices[:: group_params.n], strict=True))
    finally:
        client.close()
    lines = []
    for index, (item, _) in enumerate(items):
        first = firsts[index]
        record = {
            "input": item.get("prompt", item.get("messages")),
            "output": first.text,
            "finish_reason": first.finish_reason.value,
            "prompt_tokens": first.num_prompt_tokens,
            "completion_tokens": len(first.token_ids),
        }
        if first.failure is not None:
            record["error"] = first.failure.message
        lines.append(json.dumps(record))
    text = "\n".join(lines) + "\n"
    if output_file is None:
        sys.stdout.write(text)
    else:
        output_file.write_text(text)
