"""The ``llguidance`` structured-output backend: compiled grammars cached per constraint, one matcher per sample."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict

import llguidance
import numpy as np

from hetero_core.errors import ExecutionError, ValidationError
from hetero_core.protocols import Tokenizer
from hetero_core.structured_output import ConstraintKind, StructuredOutput, num_bitmask_words
from hetero_structured_llguidance.vocabulary import llguidance_tokenizer

ANY_JSON_OBJECT = {"type": "object"}


class LLGuidanceMatcher:
    """Implements :class:`hetero_core.structured_output.GrammarMatcher` over an ``llguidance.LLMatcher``."""

    def __init__(self, matcher: llguidance.LLMatcher, num_words: int, eos_token_id: int) -> None:
        self._matcher = matcher
        self._num_words = num_words
        self._eos_token_id = eos_token_id

    def fill_bitmask(self, bitmask: np.ndarray, row: int) -> None:
        target = bitmask[row]
        if target.dtype != np.int32 or target.shape != (self._num_words,) or not target.flags["C_CONTIGUOUS"]:
            raise ValueError(f"a bitmask row must be {self._num_words} contiguous int32 words, got {target.shape} {target.dtype}")
        self._matcher.unsafe_compute_mask_ptr(target.ctypes.data, target.nbytes)
        if self._matcher.is_error():
            raise ExecutionError(f"the grammar matcher failed: {self._matcher.get_error()}", param="structured_output")

    def accept_token(self, token_id: int) -> bool:
        if token_id == self._eos_token_id:
            # a complete grammar has stopped: it then takes EOS, though validate_tokens says otherwise
            return self._matcher.is_accepting() and self._matcher.consume_token(token_id)
        if self._matcher.validate_tokens([token_id]) != 1:
            return False
        return self._matcher.consume_token(token_id)

    def rollback(self, num_tokens: int) -> None:
        if num_tokens and not self._matcher.rollback(num_tokens):
            raise ExecutionError(f"the grammar matcher cannot roll back {num_tokens} tokens: {self._matcher.get_error()}")

    def fork(self) -> LLGuidanceMatcher:
        return LLGuidanceMatcher(self._matcher.deep_copy(), self._num_words, self._eos_token_id)

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
      recently used ones are dropped).
    """

    def __init__(self, tokenizer: Tokenizer, *, whitespace_flexible: bool = False, max_cached_grammars: int = 256) -> None:
        self._tokenizer = llguidance_tokenizer(tokenizer)
        self._num_words = num_bitmask_words(tokenizer.vocab_size)
        self._eos_token_id = tokenizer.eos_token_id
        self._json_options = (
            {} if whitespace_flexible else {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
        )
        self._max_cached = max_cached_grammars
        self._cache: OrderedDict[StructuredOutput, llguidance.LLMatcher] = OrderedDict()
        self._lock = threading.Lock()

    def compile(self, constraint: StructuredOutput) -> llguidance.LLMatcher:
        """A matcher at the start of ``constraint``'s grammar, kept as the template new matchers copy."""
        with self._lock:
            template = self._cache.get(constraint)
            if template is not None:
                self._cache.move_to_end(constraint)
                return template
        template = llguidance.LLMatcher(self._tokenizer, self._grammar(constraint), log_level=0)
        if template.is_error():
            raise ValidationError(
                f"structured_output: the {constraint.kind.value} cannot be used: {template.get_error().strip()}",
                param="structured_output",
            )
        with self._lock:
            self._cache[constraint] = template
            if len(self._cache) > self._max_cached:
                self._cache.popitem(last=False)
        return template

    def new_matcher(self, compiled: llguidance.LLMatcher) -> LLGuidanceMatcher:
        return LLGuidanceMatcher(compiled.deep_copy(), self._num_words, self._eos_token_id)

    @property
    def num_cached_grammars(self) -> int:
        return len(self._cache)

    def _grammar(self, constraint: StructuredOutput) -> str:
        kind, value = constraint.kind, constraint.value
        try:
            if kind is ConstraintKind.JSON_SCHEMA:
                return llguidance.LLMatcher.grammar_from_json_schema(value, defaults=self._json_options)
            if kind is ConstraintKind.JSON_OBJECT:
                return llguidance.LLMatcher.grammar_from_json_schema(ANY_JSON_OBJECT, defaults=self._json_options)
            if kind is ConstraintKind.CHOICE:
                return llguidance.grammar_from("choice", json.dumps(list(value)))
            if kind is ConstraintKind.REGEX:  # \d means [0-9], as in JSON schema patterns
                return llguidance.LLMatcher.grammar_from_lark(f"start: /{llguidance.regex_to_lark(value, 'd')}/")
            return llguidance.grammar_from("grammar", value)
        except ValueError as exc:
            raise ValidationError(f"structured_output: the {kind.value} cannot be used: {exc}", param="structured_output") from exc
