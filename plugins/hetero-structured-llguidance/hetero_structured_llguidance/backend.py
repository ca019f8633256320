"""The ``llguidance`` structured-output backend: compiled grammars cached per constraint, one matcher per sample.

A step's masks are filled together by an ``llguidance.LLExecutor``: on its
own threads, without the GIL, one matcher per thread at a time.
"""

from __future__ import annotations

import json
import os
import threading
from collections import OrderedDict

import llguidance
import numpy as np

from hetero_core.errors import ExecutionError, ValidationError
from hetero_core.logs import get_logger
from hetero_core.protocols import Tokenizer
from hetero_core.structured_output import ConstraintKind, StructuredOutput, allowed_token_ids, num_bitmask_words
from hetero_structured_llguidance.limits import MAX_MASK_THREADS, GrammarLimits, passed_bound, refusal
from hetero_structured_llguidance.tool_calls import tool_calls_grammar
from hetero_structured_llguidance.vocabulary import llguidance_tokenizer

ANY_JSON_OBJECT = {"type": "object"}
FIRST_TOKENS_TRIED = 8  # at compile time, allowed first tokens each taken on a copy

log = get_logger(__name__)


class LLGuidanceMatcher:
    """Implements :class:`hetero_core.structured_output.GrammarMatcher` over an ``llguidance.LLMatcher``."""

    def __init__(self, matcher: llguidance.LLMatcher, num_words: int, eos_token_id: int) -> None:
        self._matcher = matcher
        self._num_words = num_words
        self._eos_token_id = eos_token_id
        self._eos_after_stop = False  # EOS taken by a stopped matcher, which llguidance does not record

    def fill_bitmask(self, bitmask: np.ndarray, row: int) -> None:
        target = bitmask[row]
        if target.dtype != np.int32 or target.shape != (self._num_words,) or not target.flags["C_CONTIGUOUS"]:
            raise ValueError(
                f"a bitmask row must be {self._num_words} contiguous int32 words, got {target.shape} {target.dtype}"
            )
        self._matcher.unsafe_compute_mask_ptr(target.ctypes.data, target.nbytes)
        problem = self.problem()
        if problem is not None:
            raise ExecutionError(problem, param="structured_output")

    def problem(self) -> str | None:
        """Why the matcher failed (it then allows only end-of-sequence), or None."""
        return f"the grammar matcher failed: {self._matcher.get_error()}" if self._matcher.is_error() else None

    def accept_token(self, token_id: int) -> bool:
        if token_id == self._eos_token_id:
            # a complete grammar has stopped: it then takes EOS, though validate_tokens says otherwise
            if self._matcher.is_stopped():
                self._eos_after_stop, taken = True, not self._eos_after_stop
                return taken
            return self._matcher.is_accepting() and self._matcher.consume_token(token_id)
        if self._matcher.validate_tokens([token_id]) != 1:
            return False
        if not self._matcher.consume_token(token_id):  # allowed, but taking it passed a bound of the grammar engine
            log.error("grammar matcher failed on an allowed token", token_id=token_id, error=self._matcher.get_error())
            return False
        return True

    def rollback(self, num_tokens: int) -> None:
        if num_tokens and self._eos_after_stop:
            self._eos_after_stop = False
            num_tokens -= 1
        if num_tokens and not self._matcher.rollback(num_tokens):
            raise ExecutionError(
                f"the grammar matcher cannot roll back {num_tokens} tokens: {self._matcher.get_error()}"
            )

    @property
    def is_finished(self) -> bool:
        return self._matcher.is_stopped()


class LLGuidanceBackend:
    """Implements :class:`hetero_core.structured_output.StructuredOutputBackend` on llguidance.

    Options (``"structured_output": {"name": "llguidance", ...}``):

    - ``whitespace_flexible``: let JSON output hold any whitespace between tokens
      (llguidance's default). Off by default: JSON is written as ``json.dumps``
      writes it (``", "`` and ``": "``), which keeps small models from wandering
      into runs of blank lines.
    - ``max_cached_grammars``: how many compiled constraints to keep (least
      recently used ones are dropped); a refused constraint is kept too, so
      asking again is refused at once.
    - ``mask_threads``: threads that fill a step's masks together (default:
      one per CPU, at most 32); the stepping thread waits for them, so they
      take no cores from the model.
    - the bounds of :class:`~hetero_structured_llguidance.limits.GrammarLimits`.

    A constraint is refused at compile time (a ``ValidationError``) when no
    text satisfies it or its first step already fails: after the text it
    forces first, its first mask is empty or fails, or a token that mask
    allows (up to ``FIRST_TOKENS_TRIED`` of them, spread over the allowed
    ids) cannot be taken and followed by the next mask. A sample's mask and
    what it may take then agree from the first token on.
    """

    #: Lark as llguidance extends it (``%json`` rules, regex intersections), and llama.cpp's GBNF.
    grammar_dialects = ("lark", "gbnf")

    def __init__(
        self,
        tokenizer: Tokenizer,
        *,
        whitespace_flexible: bool = False,
        max_cached_grammars: int = 256,
        mask_threads: int | None = None,
        limits: GrammarLimits | None = None,
    ) -> None:
        self._tokenizer = llguidance_tokenizer(tokenizer)
        self._vocab_size = tokenizer.vocab_size
        self._num_words = num_bitmask_words(tokenizer.vocab_size)
        self._eos_token_id = tokenizer.eos_token_id
        self._json_options = (
            {} if whitespace_flexible else {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
        )
        self._max_cached = max_cached_grammars
        self.limits = limits or GrammarLimits()
        self._parser_limits = self.limits.parser_limits()
        self._cache: OrderedDict[StructuredOutput, llguidance.LLMatcher | ValidationError] = OrderedDict()
        self._lock = threading.Lock()
        self.mask_threads = mask_threads or min(MAX_MASK_THREADS, os.cpu_count() or 1)
        self._mask_executor: llguidance.LLExecutor | None = None  # its threads start with the first batch of masks

    def compile(self, constraint: StructuredOutput) -> llguidance.LLMatcher:
        """A matcher at the start of ``constraint``'s grammar, kept as the template new matchers copy."""
        with self._lock:
            template = self._cache.get(constraint)
            if template is not None:
                self._cache.move_to_end(constraint)
        if template is None:
            try:
                template = self._build(constraint)
            except ValidationError as exc:
                template = exc
            with self._lock:
                self._cache[constraint] = template
                if len(self._cache) > self._max_cached:
                    self._cache.popitem(last=False)
        if isinstance(template, ValidationError):  # a fresh one each time, not one growing traceback
            raise ValidationError(template.message, param=template.param)
        return template

    def _build(self, constraint: StructuredOutput) -> llguidance.LLMatcher:
        what = f"the {constraint.kind.value}"
        template = llguidance.LLMatcher(
            self._tokenizer, self._grammar(constraint), log_level=0, limits=self._parser_limits
        )
        if template.is_error():
            raise refusal(what, template.get_error(), self.limits)
        self._check_first_step(template, what)
        return template

    def _check_first_step(self, template: llguidance.LLMatcher, what: str) -> None:
        """Refuse a grammar that fails at its first token, which every sample would then fail on."""
        first = template.deep_copy()
        first.consume_tokens(first.compute_ff_tokens())  # text the grammar forces first (a tool call's head)
        if first.is_error():
            raise refusal(what, first.get_error(), self.limits)
        mask = np.zeros(self._num_words, dtype=np.int32)
        first.unsafe_compute_mask_ptr(mask.ctypes.data, mask.nbytes)
        allowed = allowed_token_ids(mask, self._vocab_size)
        if first.is_error() and passed_bound(first.get_error()) is not None:
            raise refusal(what, first.get_error(), self.limits)
        if first.is_error() or allowed.size == 0:  # llguidance finds no token to go on with
            raise ValidationError(f"structured_output: no text satisfies {what}", param="structured_output")
        allowed = allowed[allowed != self._eos_token_id]
        spread = np.unique(np.linspace(0, allowed.size - 1, min(FIRST_TOKENS_TRIED, allowed.size)).astype(int))
        for token_id in allowed[spread]:  # the first, the last and some between
            probe = first.deep_copy()  # as a sample takes it: after its mask
            if probe.consume_token(int(token_id)):
                probe.unsafe_compute_mask_ptr(mask.ctypes.data, mask.nbytes)
            if probe.is_error():
                raise refusal(what, probe.get_error(), self.limits)

    def new_matcher(self, compiled: llguidance.LLMatcher) -> LLGuidanceMatcher:
        return LLGuidanceMatcher(compiled.deep_copy(), self._num_words, self._eos_token_id)

    def fill_bitmasks(self, matchers: list[LLGuidanceMatcher], bitmask: np.ndarray) -> list[str | None]:
        """Implements :class:`hetero_core.structured_output.BatchMaskFiller`: the masks on the executor's threads."""
        if (
            bitmask.dtype != np.int32
            or bitmask.shape != (len(matchers), self._num_words)
            or not bitmask.flags["C_CONTIGUOUS"]
        ):
            raise ValueError(
                f"the bitmask must be {len(matchers)} rows of {self._num_words} contiguous int32 words,"
                f" got {bitmask.shape} {bitmask.dtype}"
            )
        if self._mask_executor is None:
            self._mask_executor = llguidance.LLExecutor(num_threads=self.mask_threads)
        pairs = [(matcher._matcher, row) for row, matcher in enumerate(matchers)]
        self._mask_executor.unsafe_compute_mask_ptr(pairs, bitmask.ctypes.data, self._num_words * 4, len(matchers))
        return [matcher.problem() for matcher in matchers]

    @property
    def num_cached_grammars(self) -> int:
        return len(self._cache)

    def _grammar(self, constraint: StructuredOutput) -> str:
        kind, value = constraint.kind, constraint.value
        if kind is ConstraintKind.GRAMMAR and value.dialect not in self.grammar_dialects:
            raise ValidationError(
                f"structured_output: llguidance does not read grammars in the {value.dialect!r} dialect"
                f" (it reads: {', '.join(self.grammar_dialects)})",
                param="structured_output",
            )
        try:
            if kind is ConstraintKind.JSON_SCHEMA:
                return llguidance.LLMatcher.grammar_from_json_schema(value, defaults=self._json_options)
            if kind is ConstraintKind.JSON_OBJECT:
                return llguidance.LLMatcher.grammar_from_json_schema(ANY_JSON_OBJECT, defaults=self._json_options)
            if kind is ConstraintKind.CHOICE:
                return llguidance.grammar_from("choice", json.dumps(list(value)))
            if kind is ConstraintKind.REGEX:  # \d means [0-9], as in JSON schema patterns
                return llguidance.LLMatcher.grammar_from_lark(f"start: /{llguidance.regex_to_lark(value, 'd')}/")
            if kind is ConstraintKind.TOOL_CALLS:
                return llguidance.LLMatcher.grammar_from_lark(tool_calls_grammar(value))
            return llguidance.grammar_from(value.dialect, value.text)
        except ValueError as exc:
            raise ValidationError(
                f"structured_output: the {kind.value} cannot be used: {exc}", param="structured_output"
            ) from exc
