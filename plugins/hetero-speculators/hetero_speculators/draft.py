"""``draft``: a second, smaller model proposes; the target model verifies.

The draft model runs on an executor of its own (any registered executor:
the ``torch`` one with the same model quantized, a smaller model of the same
vocabulary, ...), with a KV cache of its own. For each sequence the
speculator remembers which tokens' keys and values that cache holds. At each
step it keeps the longest common prefix of those and the sequence (less the
sequence's last token, computed again for its logits), computes the rest of
the sequence (the whole prompt the first time; after a step, the kept
proposals and the target's token) and samples greedily, then decodes
``k - 1`` more tokens one at a time, greedily. Every sequence of the step is
in the same draft batch at each of those ``k`` draft steps. Rejected
proposals need no notice: they fall outside the common prefix at the next
step, and their slots are written over.

The draft's pool (``num_blocks`` blocks of ``block_size`` slots) is kept by
a private free list, not by a cache allocator: rewinding a sequence below
tokens it computed (its own rejected proposals) is outside
``CacheAllocator.trim``'s contract, and a draft needs neither sharing nor a
prefix cache. A sequence whose blocks run out, whose draft step fails, or
that outgrows the draft model's context proposes nothing at that step; a
sequence that ran out of blocks or context starts over at its next step.
"""

from __future__ import annotations

from typing import Any
from typing import Sequence as SequenceOf

import attrs

from hetero_core.batch import ExecutionBatch, ScheduledSequence
from hetero_core.components import ComponentRegistry
from hetero_core.config import EngineConfig
from hetero_core.errors import ConfigError
from hetero_core.logs import get_logger
from hetero_core.params import GenerationParams
from hetero_core.protocols import ModelInfo
from hetero_core.speculation import ProposalRequest
from hetero_core.validators import named_options, non_empty_string, number_in, optional

log = get_logger(__name__)

GREEDY = GenerationParams(temperature=0.0, max_tokens=1)


def common_prefix_length(a: list[int], b: list[int], limit: int) -> int:
    """How many leading tokens ``a`` and ``b`` share, at most ``limit`` (a binary search over slice
    comparisons, which run in C: a draft's tokens differ from the sequence's only near its end)."""
    low, high = 0, max(0, min(len(a), len(b), limit))
    if a[:high] == b[:high]:
        return high
    while high - low > 1:  # a[:low] == b[:low] and a[:high] != b[:high]
        middle = (low + high) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle
    return low


@attrs.frozen
class DraftOptions:
    """The options of ``draft`` (config: ``"speculator": {"name": "draft", "k": 4}``)."""

    model: str | None = attrs.field(default=None, validator=optional(non_empty_string(error=ConfigError)))
    executor: str = attrs.field(default="torch", validator=non_empty_string(error=ConfigError))
    executor_options: dict[str, Any] = attrs.field(factory=dict, converter=named_options("executor_options"))
    k: int = attrs.field(default=4, validator=number_in(1, 16, integer=True, error=ConfigError))
    num_blocks: int = attrs.field(default=256, validator=number_in(1, 2**24, integer=True, error=ConfigError))
    block_size: int = attrs.field(default=16, validator=number_in(1, 1024, integer=True, error=ConfigError))


@attrs.define
class _Draft:
    """One sequence in the draft's cache."""

    tokens: list[int] = attrs.field(factory=list)  # the tokens whose keys and values the draft's cache holds
    block_table: list[int] = attrs.field(factory=list)


@attrs.define
class _Drafting:
    """A sequence being drafted in this call."""

    index: int  # of its request
    request: ProposalRequest
    draft: _Draft
    num_proposals: int
    new_tokens: list[int]  # to compute at the next draft step
    proposal: list[int] = attrs.field(factory=list)


class DraftSpeculator:
    """The ``draft`` speculator (see the module docstring).

    :param model: the draft model: a GGUF file or a Hugging Face folder; None: the embedded default model.
    :param executor: the executor component that runs the draft model.
    :param executor_options: that executor's options (``{"weights": "int4"}``, ...).
    :param k: the most tokens it proposes for a sequence in one step.
    :param num_blocks: blocks in the draft's KV pool.
    :param block_size: token slots per block of the draft's pool.
    """

    def __init__(
        self,
        config: EngineConfig,
        model_info: ModelInfo,
        components: ComponentRegistry,
        *,
        model: str | None = None,
        executor: str = "torch",
        executor_options: dict[str, Any] | None = None,
        k: int = 4,
        num_blocks: int = 256,
        block_size: int = 16,
    ) -> None:
        draft_config = config.evolve(model=model, speculator=None)
        self.executor = components.create("executor", executor, executor_options or {}, draft_config)
        try:
            info = self.executor.model_info
            if info.vocab_size != model_info.vocab_size:
                raise ConfigError(
                    f"speculator 'draft': the draft model {info.name!r} has {info.vocab_size} tokens,"
                    f" the model it drafts for ({model_info.name!r}) {model_info.vocab_size};"
                    " a draft must share the vocabulary",
                    param="speculator.model",
                )
            self.executor.initialize_cache(num_blocks, block_size)
            self.executor.warm_up(min(config.max_total_tokens, info.max_model_len), config.max_batch_size)
        except BaseException:
            self.executor.close()
            raise
        self.max_model_len = info.max_model_len
        self.k = k
        self.block_size = block_size
        self.num_blocks = num_blocks
        self._free_blocks = list(range(num_blocks - 1, -1, -1))  # taken from the end: block 0 first
        self._drafts: dict[int, _Draft] = {}

    @property
    def num_used_blocks(self) -> int:
        """Blocks of the draft's pool that sequences hold."""
        return self.num_blocks - len(self._free_blocks)

    def propose(self, requests: SequenceOf[ProposalRequest]) -> list[list[int]]:
        proposals: list[list[int]] = [[] for _ in requests]
        drafting = [d for i, r in enumerate(requests) if (d := self._start(i, r)) is not None]
        while drafting:
            batch = ExecutionBatch(
                [
                    ScheduledSequence(
                        seq_id=d.request.seq_id,
                        token_ids=d.new_tokens,
                        start_position=len(d.draft.tokens),
                        block_table=d.draft.block_table,
                        do_sample=True,
                        params=GREEDY,
                        all_token_ids=d.request.token_ids + d.proposal,
                        num_prompt_tokens=d.request.num_prompt_tokens,
                        seed=None,
                    )
                    for d in drafting
                ],
                self.block_size,
            )
            try:
                output = self.executor.execute(batch)
            except Exception as exc:  # the draft's fault: this step goes without proposals
                log.error("draft model step failed", error=f"{type(exc).__name__}: {exc}", num_sequences=len(drafting))
                return [[] for _ in requests]
            still = []
            for d in drafting:
                seq_id = d.request.seq_id
                token = output.sampled_token_ids.get(seq_id)
                if token is None:
                    log.warning("draft model failed a sequence", seq_id=seq_id, error=output.errors.get(seq_id))
                    continue
                d.draft.tokens += d.new_tokens
                d.proposal.append(token)
                d.new_tokens = [token]
                if len(d.proposal) < d.num_proposals:
                    still.append(d)
                else:
                    proposals[d.index] = d.proposal
            drafting = still
        return proposals

    def observe(self, seq_id: int, num_proposed: int, num_accepted: int) -> None:
        """Nothing to do: the next step's common prefix leaves out the rejected proposals."""

    def free(self, seq_id: int) -> None:
        self._drop(seq_id)

    def close(self) -> None:
        for seq_id in list(self._drafts):
            self._drop(seq_id)
        self.executor.close()

    def _start(self, index: int, request: ProposalRequest) -> _Drafting | None:
        """Rewind the sequence's draft to its common prefix with the request and make room for this call's
        draft steps; None (and the draft dropped) when blocks or the draft model's context run out."""
        draft = self._drafts.setdefault(request.seq_id, _Draft())
        tokens = request.token_ids
        num_kept = common_prefix_length(draft.tokens, tokens, len(tokens) - 1)
        del draft.tokens[num_kept:]
        num_proposals = min(self.k, request.max_proposals)
        end = len(tokens) + num_proposals - 1  # the last proposal is sampled, never computed
        if end > self.max_model_len or not self._fit(draft, end):
            self._drop(request.seq_id)
            return None
        return _Drafting(index, request, draft, num_proposals, tokens[num_kept:])

    def _fit(self, draft: _Draft, num_tokens: int) -> bool:
        """Make the draft's table exactly cover ``num_tokens`` positions; False (nothing taken) when the pool
        is short."""
        table, needed = draft.block_table, -(-num_tokens // self.block_size)
        while len(table) > needed:
            self._free_blocks.append(table.pop())
        if needed - len(table) > len(self._free_blocks):
            return False
        while len(table) < needed:
            table.append(self._free_blocks.pop())
        return True

    def _drop(self, seq_id: int) -> None:
        draft = self._drafts.pop(seq_id, None)
        if draft is not None:
            self._free_blocks.extend(reversed(draft.block_table))
