"""Cheap checks of what components hand the engine, so a plugin's mistake is named where it happens.

A component is trusted for what it computes, not for the shape of what it
returns: an executor that omits a token, returns one outside the
vocabulary or a NaN logprob, or an allocator whose block table does not
cover the step's tokens, is caught here and blamed on its plugin by name.
Each check costs O(sequences in the step), never O(tokens in the context).
"""

from __future__ import annotations

import math
from typing import Any

from hetero_core.batch import ExecutionBatch, ExecutionOutput, ScheduledSequence, TokenLogprobs
from hetero_core.errors import ExecutionError


def check_execution_output(output: Any, batch: ExecutionBatch, vocab_size: int, plugin: str) -> dict[int, str]:
    """Per sampled sequence whose output is unusable, why; raises ``ExecutionError`` for a malformed whole.

    Reasons the executor gave in ``output.errors`` are returned as they are.
    """
    if not isinstance(output, ExecutionOutput):
        raise ExecutionError(f"executor plugin {plugin!r} returned {type(output).__name__}, not an ExecutionOutput")
    tokens, logprobs, errors = output.sampled_token_ids, output.logprobs, output.errors
    for name, value in (("sampled_token_ids", tokens), ("logprobs", logprobs), ("errors", errors)):
        if not isinstance(value, dict):
            raise ExecutionError(f"executor plugin {plugin!r} returned {name} as {type(value).__name__}, not a dict")
    problems: dict[int, str] = {}
    for seq in batch.sequences:
        if not seq.do_sample:
            continue
        reason = errors.get(seq.seq_id)
        if reason is not None:
            problems[seq.seq_id] = reason if isinstance(reason, str) and reason else "the executor failed on it"
            continue
        problem = _token_problem(tokens.get(seq.seq_id), vocab_size) or _logprobs_problem(seq, logprobs, tokens, vocab_size)
        if problem:
            problems[seq.seq_id] = f"executor plugin {plugin!r} {problem} for sequence {seq.seq_id}"
    return problems


def _token_problem(token: Any, vocab_size: int) -> str | None:
    if token is None:
        return "returned no token and no error"
    if isinstance(token, bool) or not isinstance(token, int):
        return f"returned a {type(token).__name__} token {token!r}, not an int"
    if not 0 <= token < vocab_size:
        return f"returned token {token}, outside the vocabulary [0, {vocab_size})"
    return None


def _logprobs_problem(seq: ScheduledSequence, logprobs: dict[int, Any], tokens: dict[int, Any], vocab_size: int) -> str | None:
    wanted = seq.params.logprobs
    got = logprobs.get(seq.seq_id)
    if wanted is None:
        return None
    if not isinstance(got, TokenLogprobs):
        return f"returned {type(got).__name__} logprobs, not TokenLogprobs"
    if got.token_id != tokens[seq.seq_id]:
        return f"returned logprobs of token {got.token_id}, not of the sampled token {tokens[seq.seq_id]}"
    if not _is_logprob(got.logprob):
        return f"returned logprob {got.logprob!r}, not a finite number <= 0"
    if not isinstance(got.top, list) or len(got.top) != min(wanted, vocab_size):
        return f"returned {len(got.top) if isinstance(got.top, list) else got.top!r} top logprobs, not {wanted}"
    for entry in got.top:
        if not (isinstance(entry, tuple) and len(entry) == 2 and _token_problem(entry[0], vocab_size) is None and _is_logprob(entry[1])):
            return f"returned top logprob entry {entry!r}, not a (token, finite logprob <= 0) pair"
    return None


def _is_logprob(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value <= 1e-4


def block_table_problem(seq: ScheduledSequence, block_size: int, num_blocks: int, plugin: str) -> str | None:
    """Why the allocator's table cannot hold the step's tokens of ``seq``, or None."""
    table = seq.block_table
    end = seq.start_position + len(seq.token_ids)
    if len(table) * block_size < end:
        return f"cache allocator plugin {plugin!r} gave sequence {seq.seq_id} {len(table)} blocks for {end} tokens"
    for index in range(seq.start_position // block_size, (end - 1) // block_size + 1):
        block = table[index]
        if isinstance(block, bool) or not isinstance(block, int) or not 0 <= block < num_blocks:
            return f"cache allocator plugin {plugin!r} gave sequence {seq.seq_id} block {block!r}, outside [0, {num_blocks})"
    return None
