"""Generating from the command line: one prompt, an interactive chat, or a file of prompts.

Each returns the exit status: 0 when every generation finished, 1 when one
failed (its error is on stderr, and in a batch's output line).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, TextIO

import attrs
from tqdm import tqdm

from hetero_core.engine import InferenceEngine
from hetero_core.errors import CacheMemoryError, ValidationError
from hetero_core.params import GenerationParams

PROMPT_KEYS = ("prompt", "messages")
# what a prompt file's line may set, by the API's names; not what its output line has no place for (logprobs,
# more samples)
LINE_PARAMS = tuple(
    name
    for name in attrs.fields_dict(GenerationParams)
    if name not in ("structured_output", "n", "logprobs", "prompt_logprobs")
)


def one_shot(
    engine: InferenceEngine, prompt: str, params: GenerationParams, *, as_chat: bool = True, out: TextIO | None = None
) -> int:
    """Stream the answer to ``out`` as it is produced; a summary line goes to stderr.

    With ``as_chat`` the prompt is one user message in the model's chat template.
    """
    out = out or sys.stdout
    started = time.monotonic()
    deltas: list = []
    if as_chat:
        engine.submit_chat([{"role": "user", "content": prompt}], params, on_output=deltas.append)
    else:
        engine.submit_request(prompt, params, on_output=deltas.append)
    text, num_tokens, error = _write_while_running(engine, deltas, out)
    elapsed = time.monotonic() - started
    out.write("\n")
    out.flush()
    if error is not None:
        return _report_failure(error)
    print(f"[{num_tokens} tokens in {elapsed:.2f} s, {num_tokens / elapsed:.1f} tokens/s]", file=sys.stderr)
    return 0


def _report_failure(error: str) -> int:
    print(f"hetero-infer: error: generation failed: {error}", file=sys.stderr)
    return 1


def _write_while_running(engine: InferenceEngine, deltas: list, out: TextIO) -> tuple[str, int, str | None]:
    """Step until the engine is idle, writing each step's new text; return the text, its token count and any error."""
    pieces: list[str] = []
    num_tokens = 0
    error = None
    while engine.has_pending_work():
        engine.step()
        for delta in deltas:
            out.write(delta.text)
            out.flush()
            pieces.append(delta.text)
            num_tokens += len(delta.token_ids)
            error = error or delta.error
        deltas.clear()
    return "".join(pieces), num_tokens, error


def chat(
    engine: InferenceEngine, params: GenerationParams, source: TextIO | None = None, out: TextIO | None = None
) -> int:
    """An interactive chat with the model's template; the history grows with each turn. Ctrl-D ends it.

    A turn that fails is reported and left out of the history; the chat goes on.
    """
    source, out = source or sys.stdin, out or sys.stdout
    history: list[dict[str, str]] = []
    status = 0
    while True:
        out.write("> ")
        out.flush()
        line = source.readline()
        if not line:
            out.write("\n")
            return status
        if not line.strip():
            continue
        history.append({"role": "user", "content": line.rstrip("\n")})
        deltas: list = []
        engine.submit_chat(history, params, on_output=deltas.append)
        answer, _, error = _write_while_running(engine, deltas, out)
        out.write("\n")
        if error is not None:
            status = _report_failure(error)
            history.pop()
            continue
        history.append({"role": "assistant", "content": answer})


def read_prompts(path: Path, params: GenerationParams) -> list[tuple[dict[str, Any], GenerationParams]]:
    """Each line's prompt (``{"prompt": ...}`` or ``{"messages": ...}``) and parameters, ``params`` where the line
    sets none.

    A line is a JSON object with "prompt" or "messages" and any of :data:`LINE_PARAMS`,
    or else the line's text. An unknown key or a bad value is a ``ValidationError``
    naming the line.
    """
    items = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        if not line.lstrip().startswith("{"):
            items.append(({"prompt": line}, params))
            continue
        where = f"{path}:{number}"
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValidationError(f"{where}: invalid JSON: {exc.msg}") from exc
        if not isinstance(item, dict) or ("prompt" in item) == ("messages" in item):
            raise ValidationError(f"{where}: expected an object with 'prompt' or 'messages' (one of them)")
        given = {key: value for key, value in item.items() if key not in PROMPT_KEYS}
        items.append(({key: item[key] for key in PROMPT_KEYS if key in item}, _line_params(given, params, where)))
    return items


def _line_params(given: dict[str, Any], params: GenerationParams, where: str) -> GenerationParams:
    """``params`` with a line's own values over them, read as the API reads them."""
    unknown = [key for key in given if key not in LINE_PARAMS]
    if unknown:
        raise ValidationError(
            f"{where}: unknown key {unknown[0]!r}; a line takes 'prompt' or 'messages' and {', '.join(LINE_PARAMS)}",
            param=unknown[0],
        )
    top_k = given.get("top_k")
    if top_k in (-1, 0) and not isinstance(top_k, bool):  # no limit, as in the API
        given["top_k"] = None
    if isinstance(given.get("logit_bias"), dict):  # JSON keys are text: token ids in ASCII digits, as in the API
        given["logit_bias"] = {int(k) if k.isascii() and k.isdigit() else k: v for k, v in given["logit_bias"].items()}
    try:
        return attrs.evolve(params, **given)
    except ValidationError as exc:
        raise ValidationError(f"{where}: {exc.message}", param=exc.param) from exc


def batch(engine: InferenceEngine, input_file: Path, output_file: Path | None, params: GenerationParams) -> int:
    """Run every prompt (with its line's parameters over ``params``) through continuous batching, one JSON line per
    result in input order.

    A failed prompt's line has its ``error``; the status is 1 when any failed.
    """
    items = read_prompts(input_file, params)
    ids = []
    rejected: dict[str, str] = {}  # a prompt the engine refuses is reported in its line; the others run
    for number, (item, item_params) in enumerate(items, start=1):
        try:
            if "messages" in item:
                ids.append(engine.submit_chat(item["messages"], item_params))
            else:
                ids.append(engine.submit_request(item["prompt"], item_params))
        except (ValidationError, CacheMemoryError) as exc:
            ids.append(f"rejected-{number}")
            rejected[ids[-1]] = exc.message
    records = {}
    num_tokens = 0
    started = time.monotonic()
    with tqdm(total=len(ids) - len(rejected), unit="req", file=sys.stderr) as progress:
        while engine.has_pending_work():
            for record in engine.step():
                records[record.request_id] = record
                num_tokens += sum(len(o.token_ids) for o in record.outputs)
                progress.update(1)
                progress.set_postfix(tokens_per_s=f"{num_tokens / (time.monotonic() - started):.1f}")
    lines = [
        json.dumps({"input": item.get("prompt", item.get("messages")), "error": rejected[i]})
        if i in rejected
        else json.dumps(
            {
                "input": item.get("prompt", item.get("messages")),
                "output": records[i].output_text,
                "finish_reason": records[i].finish_reason.value,
                "prompt_tokens": len(records[i].input_tokens),
                "completion_tokens": len(records[i].generated_tokens),
                **({"error": records[i].error} if records[i].error else {}),
            }
        )
        for (item, _), i in zip(items, ids, strict=True)
    ]
    text = "\n".join(lines) + "\n"
    if output_file is None:
        sys.stdout.write(text)
    else:
        output_file.write_text(text)
    errors = {i: rejected.get(i) or records[i].error for i in ids}
    failed = [(number, errors[i]) for number, i in enumerate(ids, start=1) if errors[i]]
    if failed:
        number, error = failed[0]
        return _report_failure(f"{len(failed)} of {len(ids)} prompts failed; the first, prompt {number}: {error}")
    return 0
