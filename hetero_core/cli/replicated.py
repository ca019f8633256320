"""``hetero-infer --input-file FILE --data-parallel-size N``: a prompts file spread over engine replicas.

The replicas are the serving backend ``data_parallel_backend`` names (``ray``
from ``hetero-serve-ray``), driven through :class:`BackendClient`; the
output has the same lines, in the same order, as a run on one engine.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from tqdm import tqdm

from hetero_core.cli.generate import _read_prompts
from hetero_core.config import EngineConfig
from hetero_core.params import GenerationParams
from hetero_core.server.backend import create_backend
from hetero_core.server.client import BackendClient
from hetero_core.server.generation import Choice


def replicated_batch(config: EngineConfig, input_file: Path, output_file: Path | None, params: GenerationParams) -> None:
    """Generate for every prompt of ``input_file`` over the replicas, with one progress bar; one JSON line per prompt."""
    items = _read_prompts(input_file)
    client = BackendClient(create_backend(config))
    num_tokens = 0
    started = time.monotonic()
    try:
        with tqdm(total=len(items) * params.n, unit="req", file=sys.stderr) as progress:

            def finished(choice: Choice) -> None:
                nonlocal num_tokens
                num_tokens += len(choice.token_ids)
                progress.update(1)
                progress.set_postfix(tokens_per_s=f"{num_tokens / (time.monotonic() - started):.1f}")

            choices = client.generate([item.get("messages", item.get("prompt")) for item in items], params, on_finished=finished)
    finally:
        client.close()
    lines = []
    for number, item in enumerate(items):
        first = choices[number * params.n]
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
