"""Prompt logprobs: how likely each prompt token was, given the tokens before it.

The head runs only over the rows that score a prompt token (the positions
whose next token is still in the prompt) of the sequences that ask
(``params.prompt_logprobs``), and over at most ``ROWS_PER_SLICE`` rows at a
time, so a long prompt never holds a full ``[prompt, vocab]`` logits
tensor. Logprobs come from the model's raw distribution (no penalties,
bias, mask or temperature), computed as ``logit - logsumexp`` without the
full log-softmax, and are clamped at ``MIN_LOGPROB`` like the sampler's; the
rank is 1 + how many tokens are strictly more likely.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from hetero_core.batch import ScheduledSequence, TokenLogprobs
from hetero_executor_torch.sampling import MIN_LOGPROB

ROWS_PER_SLICE = 256  # at SmolLM2's vocabulary, 50 MB of float32 logits per slice

LogitsAt = Callable[[torch.Tensor], torch.Tensor]  # float32 logits of the hidden rows at these indices


def score_prompts(
    logits_at: LogitsAt, ordered: Sequence[ScheduledSequence], vocab_size: int, device: torch.device
) -> tuple[dict[int, list[TokenLogprobs]], dict[int, str]]:
    """Per sequence that asks, the prompt logprobs of its positions scored this step; errors for non-finite logits.

    ``ordered`` is the forward pass's layout: each sequence's tokens are
    consecutive rows, in this order.
    """
    scored: dict[int, list[TokenLogprobs]] = {}
    errors: dict[int, str] = {}
    first_row = 0
    for seq in ordered:
        positions = seq.prompt_logprob_positions
        if positions:
            # the row of position p - 1 scores the token at position p: the sequence's rows from its first
            targets = seq.all_token_ids[positions.start : positions.stop]
            entries = []
            for offset in range(0, len(targets), ROWS_PER_SLICE):
                rows = torch.arange(
                    first_row + offset, first_row + min(offset + ROWS_PER_SLICE, len(targets)), device=device
                )
                logits = logits_at(rows)[:, :vocab_size]
                normalizer = torch.logsumexp(logits, dim=-1, keepdim=True)  # not finite when a logit is NaN or +inf
                if not bool(normalizer.isfinite().all()):
                    errors[seq.seq_id] = "the model produced non-finite logits for this sequence's prompt"
                    break
                entries += _entries(
                    logits, normalizer, targets[offset : offset + len(rows)], seq.params.prompt_logprobs
                )
            else:
                scored[seq.seq_id] = entries
        first_row += len(seq.token_ids)
    return scored, errors


def _entries(logits: torch.Tensor, normalizer: torch.Tensor, targets: list[int], num_top: int) -> list[TokenLogprobs]:
    """Logprobs as ``logit - logsumexp``, never materialising the whole log-softmax; ranks and top-k from the logits."""
    target = torch.tensor(targets, device=logits.device)[:, None]
    chosen = logits.gather(1, target)
    ranks = ((logits > chosen).sum(dim=-1) + 1).tolist()
    chosen = (chosen - normalizer)[:, 0].clamp(min=MIN_LOGPROB).tolist()
    if num_top:
        top_values, top_ids = logits.topk(min(num_top, logits.shape[1]), dim=-1)
        top_values = (top_values - normalizer).clamp(min=MIN_LOGPROB)
        tops = [
            list(zip(ids, values, strict=True))
            for ids, values in zip(top_ids.tolist(), top_values.tolist(), strict=True)
        ]
    else:
        tops = [[] for _ in targets]
    return [TokenLogprobs(t, lp, top, rank=r) for t, lp, top, r in zip(targets, chosen, tops, ranks, strict=True)]
