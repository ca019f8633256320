"""Cheap checks of what components hand the engine, so a plugin's mistake is named where it happens.

A component is trusted for what it computes, not for the shape of what it
returns: an executor that omits a token, returns one outside the
vocabulary or a NaN logprob, or an allocator whose block table does not
cover the step's tokens, is caught here and blamed on its plugin by name.
Each check costs O(sequences in the step), never O(tokens in the context);
prompt logprobs cost O(prompt positions scored in the step).
"""

from __future__ import annotations

import math
from typing import Any

from hetero_core.batch import ExecutionBatch, ExecutionOutput, ScheduledSequence, TokenLogprobs
from hetero_core.errors import ExecutionError


def check_execution_output(output: Any, batch: ExecutionBatch, vocab_size: int, plugin: str) -> dict[int, str]:
    """Per sequence whose output is unusable, why; raises ``ExecutionError`` for a malformed whole.

    Reasons the executor gave in ``output.errors`` are returned as they are.
    """
    if not isinstance(output, ExecutionOutput):
        raise ExecutionError(f"executor plugin {plugin!r} returned {type(output).__name__}, not an ExecutionOutput")
    tokens, logprobs, errors, prompt_logprobs = (
        output.sampled_token_ids,
        output.logprobs,
        output.errors,
        output.prompt_logprobs,
    )
    for name, value in (
        ("sampled_token_ids", tokens),
        ("logprobs", logprobs),
        ("errors", errors),
        ("prompt_logprobs", prompt_logprobs),
        ("num_accepted", output.num_accepted),
        ("accepted_logprobs", output.accepted_logprobs),
    ):
        if not isinstance(value, dict):
            raise ExecutionError(f"executor plugin {plugin!r} returned {name} as {type(value).__name__}, not a dict")
    problems: dict[int, str] = {}
    for seq in batch.sequences:
        reason = errors.get(seq.seq_id)
        if reason is not None:
            problems[seq.seq_id] = reason if isinstance(reason, str) and reason else "the executor failed on it"
            continue
        problem = _prompt_logprobs_problem(seq, prompt_logprobs.get(seq.seq_id), vocab_size)
        if seq.do_sample and not problem:
            problem = (
                _token_problem(tokens.get(seq.seq_id), vocab_size)
                or _logprobs_problem(seq, logprobs, tokens, vocab_size)
                or (_verification_problem(seq, output, vocab_size) if seq.num_proposed else None)
            )
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


def _logprobs_problem(
    seq: ScheduledSequence, logprobs: dict[int, Any], tokens: dict[int, Any], vocab_size: int
) -> str | None:
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
    return _top_problem(got.top, wanted, vocab_size)


def _verification_problem(seq: ScheduledSequence, output: ExecutionOutput, vocab_size: int) -> str | None:
    """A count of kept proposals within the proposals, and where logprobs are wanted, one entry per kept one."""
    accepted = output.num_accepted.get(seq.seq_id)
    if isinstance(accepted, bool) or not isinstance(accepted, int) or not 0 <= accepted <= seq.num_proposed:
        return f"returned {accepted!r} accepted proposals, not an int in [0, {seq.num_proposed}]"
    if seq.params.logprobs is None:
        return None
    got = output.accepted_logprobs.get(seq.seq_id, [])
    kept = seq.proposed_token_ids[:accepted]
    if not isinstance(got, list) or [getattr(e, "token_id", None) for e in got] != kept:
        return f"returned accepted logprobs {got!r:.100}, not one TokenLogprobs for each of the kept proposals {kept}"
    for entry in got:
        if not _is_logprob(entry.logprob):
            return f"returned logprob {entry.logprob!r} for a kept proposal, not a finite number <= 0"
        problem = _top_problem(entry.top, seq.params.logprobs, vocab_size)
        if problem:
            return f"{problem} for a kept proposal"
    return None


def _top_problem(top: Any, wanted: int, vocab_size: int) -> str | None:
    if not isinstance(top, list) or len(top) != min(wanted, vocab_size):
        return f"returned {len(top) if isinstance(top, list) else top!r} top logprobs, not {wanted}"
    for entry in top:
        if not (
            isinstance(entry, tuple)
            and len(entry) == 2
            and _token_problem(entry[0], vocab_size) is None
            and _is_logprob(entry[1])
        ):
            return f"returned top logprob entry {entry!r}, not a (token, finite logprob <= 0) pair"
    return None


def _prompt_logprobs_problem(seq: ScheduledSequence, got: Any, vocab_size: int) -> str | None:
    """One entry per scored position, for the prompt token there, finite, ranked, with its top alternatives."""
    positions = seq.prompt_logprob_positions
    if not positions:
        return None if not got else "returned prompt logprobs it was not asked for"
    if not isinstance(got, list) or len(got) != len(positions):
        count = len(got) if isinstance(got, list) else type(got).__name__
        return (
            f"returned {count} prompt logprobs, not one for each of the {len(positions)} prompt positions of the step"
        )
    for position, entry in zip(positions, got, strict=True):
        expected = seq.all_token_ids[position]
        if not isinstance(entry, TokenLogprobs) or entry.token_id != expected:
            return (
                f"returned a prompt logprob entry {entry!r:.100} at position {position},"
                f" not the TokenLogprobs of token {expected}"
            )
        if not _is_logprob(entry.logprob):
            return f"returned prompt logprob {entry.logprob!r} at position {position}, not a finite number <= 0"
        if isinstance(entry.rank, bool) or not isinstance(entry.rank, int) or not 1 <= entry.rank <= vocab_size:
            return f"returned rank {entry.rank!r} at prompt position {position}, not an int in [1, {vocab_size}]"
        problem = _top_problem(entry.top, seq.params.prompt_logprobs, vocab_size)
        if problem:
            return f"{problem} at prompt position {position}"
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
            return (
                f"cache allocator plugin {plugin!r} gave sequence {seq.seq_id} block {block!r},"
                f" outside [0, {num_blocks})"
            )
    return None
