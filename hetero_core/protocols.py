"""The four extension points, as the engine calls them.

A plugin implements one of these protocols and registers a factory for it
under a name (see :mod:`hetero_core.hookspecs`). The engine resolves every
component once, when it is built, then calls these methods directly in its
loop. Implementations need not inherit from anything: matching the methods
is enough (``typing.Protocol``). ``hetero_core.testing`` holds contract
tests that check an implementation against these docstrings.
"""

from __future__ import annotations

from typing import Any, Mapping, Protocol, runtime_checkable
from typing import Sequence as SequenceOf

import attrs

from hetero_core.batch import ExecutionBatch, ExecutionOutput
from hetero_core.memory import MemoryStats
from hetero_core.sequence_view import SequenceView

# --------------------------------------------------------------------------- tokenizer


@runtime_checkable
class IncrementalDetokenizer(Protocol):
    """Turns a growing stream of token ids into text, a piece at a time.

    Made by :meth:`Tokenizer.new_detokenizer` for one sequence. The pieces
    returned by :meth:`add` followed by :meth:`finish` concatenate to
    ``tokenizer.decode(all_added_ids)``. A piece never ends inside a UTF-8
    character: bytes of an incomplete character are held back until the
    token that completes it arrives. Each call costs O(new tokens), not a
    decode of the whole output.
    """

    def add(self, token_ids: SequenceOf[int]) -> str:
        """Append ``token_ids`` to the stream and return the newly completed text (maybe empty)."""
        ...

    def finish(self) -> str:
        """End the stream and return whatever is held back (an incomplete character decodes as U+FFFD)."""
        ...


@runtime_checkable
class Tokenizer(Protocol):
    """Text to token ids and back, plus the model's chat format.

    Token ids are ints in ``[0, vocab_size)``. ``eos_token_id`` ends
    generation unless a request sets ``ignore_eos``; ``bos_token_id`` is the
    prefix :meth:`encode` adds with ``add_special_tokens``. Each of the three,
    ``pad_token_id`` included, may be None when the vocabulary has no such
    token. :meth:`token_bytes` and :attr:`special_token_ids` are the
    vocabulary as a grammar engine reads it.
    """

    @property
    def vocab_size(self) -> int: ...

    @property
    def bos_token_id(self) -> int | None: ...

    @property
    def eos_token_id(self) -> int | None: ...

    @property
    def pad_token_id(self) -> int | None: ...

    @property
    def special_token_ids(self) -> frozenset[int]:
        """The control tokens: ids that stand for no text (decode leaves them out with ``skip_special_tokens``).

        BOS, EOS and PAD are among them, as are a chat format's markers
        (``<|im_start|>`` and the like). No constrained text may contain one.
        """
        ...

    def token_bytes(self) -> SequenceOf[bytes]:
        """Each token id's bytes, indexed by id (``vocab_size`` entries): what the token adds to generated text.

        Over the ids :meth:`encode` gives for a text (without special tokens),
        the bytes join into the text's UTF-8 bytes (with a leading space where
        the tokenizer prepends one, as SentencePiece does). A token may be part
        of a character (byte-level vocabularies split UTF-8 sequences). Control
        tokens (:attr:`special_token_ids`) are listed as their text; an id with
        no token has ``b""``. Computed once, so a grammar engine may call it
        when it is built.
        """
        ...

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``; with ``add_special_tokens`` the model's usual prefix (a BOS) is added."""
        ...

    def decode(self, token_ids: SequenceOf[int], *, skip_special_tokens: bool = True) -> str:
        """The text of ``token_ids``; control tokens are left out when ``skip_special_tokens``."""
        ...

    def new_detokenizer(
        self, prompt_token_ids: SequenceOf[int], *, skip_special_tokens: bool = True
    ) -> IncrementalDetokenizer:
        """A fresh streaming detokenizer for output that follows ``prompt_token_ids``.

        The prompt is context only (some tokenizers decode a token differently
        after a given prefix); its text is never returned.
        """
        ...

    def apply_chat_template(
        self,
        messages: SequenceOf[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: SequenceOf[Mapping[str, Any]] | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        """Render OpenAI-style messages (``{"role": ..., "content": ...}``) as the model's prompt text.

        The result is encoded with ``add_special_tokens=False``: the template
        itself carries any special tokens. Raises ``ValidationError`` for
        messages the template cannot render (:func:`hetero_core.messages.check_messages`
        says what a well-formed message is).

        - ``add_generation_prompt``: end with the opening of an assistant turn.
        - ``continue_final_message``: end right after the last message's
          content, with no end-of-turn, so generation continues it (callers
          never combine it with ``add_generation_prompt``).
        - ``tools``: OpenAI function tools (``{"type": "function", "function":
          {...}}``). Tools, assistant ``tool_calls`` and ``tool`` messages must
          all reach the text: through the template's own tool support, or else
          through :func:`hetero_core.tool_prompt.inline_tools`, the default.
        - ``template_kwargs``: extra variables for the template (a tokenizer
          without a template variable for them renders as if they were absent).
        """
        ...


# --------------------------------------------------------------------------- scheduler policy


@runtime_checkable
class SchedulerPolicy(Protocol):
    """Decides who goes first; never how much goes.

    The core's scheduler enforces every budget (sequences, tokens, memory);
    the policy only orders. Both methods receive read-only
    :class:`~hetero_core.sequence_view.SequenceView` objects (request id,
    sample index, priority, arrival, token counts, prefix-cache match) and
    return some of them. A policy must be deterministic for equal inputs
    and must not starve: a sequence that waits must eventually come first.
    """

    #: When True, the scheduler fills each waiting sequence's
    #: ``num_prefix_match_tokens`` before :meth:`order` (a prefix-cache lookup
    #: per waiting sequence and step); when False or absent, it stays 0 and
    #: costs nothing.
    wants_prefix_match: bool

    def order(self, seqs: SequenceOf[SequenceView]) -> list[SequenceView]:
        """Return ``seqs`` in the order they should be served (a permutation; the first goes first).

        Called each step for the waiting queue (admission order) and for the
        running sequences (which keep their place when the step's budgets run
        out). Preempted sequences are waiting too; a policy normally puts them
        where their original arrival places them, which is near the front.
        """
        ...

    def choose_victim(self, running: SequenceOf[SequenceView]) -> SequenceView:
        """Pick the running sequence to preempt when the cache cannot grow (``running`` is never empty)."""
        ...


# --------------------------------------------------------------------------- cache allocator


@runtime_checkable
class CacheAllocator(Protocol):
    """Block bookkeeping for the paged KV cache: ids only, never tensors.

    The pool has ``num_blocks`` physical blocks of ``block_size`` token slots.
    Each live sequence has a block table: physical block ids in logical
    order, block ``i`` holding positions ``[i * block_size, (i + 1) * block_size)``.
    A block may be in several tables (a prefix-cache hit, or sibling samples
    of one request): such a block is full and computed, so nothing writes it.

    Calls come in check/act pairs: the scheduler asks :meth:`can_append`
    before :meth:`append_slots`, which then must succeed.
    """

    @property
    def block_size(self) -> int: ...

    @property
    def num_blocks(self) -> int: ...

    def allocate(self, seq_id: int, token_ids: SequenceOf[int], sibling_of: int | None = None) -> int:
        """Start a block table for a new sequence whose known tokens are ``token_ids``.

        With prefix caching, the table starts with the cached blocks of the
        longest run of full blocks at the start of ``token_ids`` whose tokens
        match exactly; the return value is how many tokens that covers (a
        multiple of ``block_size``, always less than ``len(token_ids)`` so the
        last token is computed again and yields logits). Without a hit it is 0.

        ``sibling_of`` names a live sequence with the same prompt whose blocks
        before the one holding the last token are computed: the table starts
        with those, shared even without prefix caching, and the return value
        is ``(len(token_ids) - 1) // block_size * block_size``.
        No other block is taken: :meth:`append_slots` grows the table.
        """
        ...

    def num_cached_prefix_tokens(self, token_ids: SequenceOf[int]) -> int:
        """How many tokens :meth:`allocate` would find cached for ``token_ids`` if called now.

        The same figure as :meth:`allocate`'s return value (a multiple of
        ``block_size``, less than ``len(token_ids)``; 0 without prefix
        caching), but it takes nothing, counts nothing in :meth:`stats` and
        changes no state. Cheap: scheduler policies that prefer long prefix
        matches call it for every waiting sequence at every step.
        """
        ...

    def can_append(self, seq_id: int, num_computed_tokens: int, num_new_tokens: int) -> bool:
        """Whether :meth:`append_slots` with these arguments would find the blocks it needs."""
        ...

    def append_slots(
        self, seq_id: int, token_ids: SequenceOf[int], num_computed_tokens: int, num_new_tokens: int
    ) -> None:
        """Make room to compute ``num_new_tokens`` more tokens of the sequence.

        The sequence's first ``num_computed_tokens`` tokens are in the cache;
        afterwards its table covers ``num_computed_tokens + num_new_tokens``
        positions. ``token_ids`` holds at least that many tokens (it may be
        the whole sequence). Raises ``CacheMemoryError`` when blocks run out
        (callers check :meth:`can_append` first).
        """
        ...

    def trim(self, seq_id: int, num_tokens: int) -> None:
        """Shrink the sequence's table to the blocks that hold its first ``num_tokens`` positions.

        The blocks past them are released (speculative decoding gives back
        the slots of rejected proposals this way). ``num_tokens`` is at least
        the sequence's computed tokens, so no computed or shared block goes;
        a ``num_tokens`` the table already fits in changes nothing.
        """
        ...

    def free(self, seq_id: int) -> None:
        """Release the sequence's blocks. Full blocks stay in the prefix cache until their slots are needed."""
        ...

    def block_table(self, seq_id: int) -> list[int]:
        """The sequence's block table. Read-only for the caller; it changes with the next allocator call."""
        ...

    def stats(self) -> MemoryStats:
        """Current pool occupancy and prefix-cache counters."""
        ...


# --------------------------------------------------------------------------- executor


@attrs.frozen
class ModelInfo:
    """What the engine needs to know about the model an executor serves."""

    name: str
    vocab_size: int
    max_model_len: int  # the longest sequence (prompt + output) the model supports
    # the ids that end generation (end of sequence, end of turn), as the model's files name them;
    # empty: the tokenizer's ``eos_token_id``
    eos_token_ids: tuple[int, ...] = attrs.field(default=(), converter=tuple)


@runtime_checkable
class Executor(Protocol):
    """Runs the model: owns the weights, the KV cache tensors and sampling.

    Life cycle: the engine reads :attr:`model_info`, may ask
    :meth:`kv_cache_block_bytes` to size the pool from a memory budget, then
    calls :meth:`initialize_cache` once, :meth:`warm_up` once, then
    :meth:`execute` once per step, and :meth:`close` at shutdown.

    Speculative decoding needs an executor that declares
    ``verifies_proposals = True`` (see
    :class:`~hetero_core.batch.ScheduledSequence`); it may also declare
    ``max_proposals``, the most proposals one sequence's step should carry,
    and ``max_verify_tokens``, the most tokens a decoding step should carry in
    all, its sequences' own tokens and their proposals (beyond them a step
    costs out of proportion, e.g. kernels that take a bounded number of rows:
    the engine gives each decoding sequence an equal share, and none when the
    sequences alone fill it). Without ``verifies_proposals`` it never sees a
    proposal.
    """

    @property
    def model_info(self) -> ModelInfo: ...

    def kv_cache_block_bytes(self, block_size: int) -> int:
        """Bytes one KV block of ``block_size`` tokens takes across all layers (keys and values)."""
        ...

    def initialize_cache(self, num_blocks: int, block_size: int) -> None:
        """Allocate the KV cache: ``num_blocks`` blocks of ``block_size`` token slots each."""
        ...

    def warm_up(self, max_num_tokens: int, max_num_seqs: int) -> None:
        """Run whatever first-call work (compilation, graph capture) a step of up to these sizes needs."""
        ...

    def execute(self, batch: ExecutionBatch) -> ExecutionOutput:
        """Run one forward pass over the batch and sample.

        Every new key/value of the batch is written to its slot before any
        attention reads the cache. Returns a token for every sequence with
        ``do_sample``, sampled with its params on the executor's device (and
        logprobs where ``params.logprobs`` is set), or, for a sequence it
        cannot handle, an entry in ``ExecutionOutput.errors``: that sequence
        fails alone. A sequence with ``params.prompt_logprobs`` set also gets
        the logprobs of its prompt tokens at
        ``ScheduledSequence.prompt_logprob_positions``, sampled or not (see
        :class:`~hetero_core.batch.ExecutionOutput`). Raises ``ExecutionError`` (or any exception) when the
        whole batch fails; the engine may retry the same batch, then run its
        sequences one at a time, so a failed call must leave no partial state
        that changes a retry's result.

        The engine checks the output cheaply at the boundary: every sampled
        sequence has exactly one int token in ``[0, vocab_size)`` or an
        error, logprobs are finite and at most 0, and prompt logprobs come
        one per scored position for the prompt token there. A sequence whose
        output breaks these rules fails with an ``ExecutionError`` naming
        the executor's plugin.
        """
        ...

    def close(self) -> None:
        """Release the model and the cache."""
        ...
