"""The engine's side of structured output: compile at submission, allowed tokens at each step.

The grammar engine (a ``structured_output`` component, chosen by
``config.structured_output``) is built by the first request that asks for
structured output, so an engine that never sees one never loads it. Its
faults are its own: a constraint it fails to compile is an
``ExecutionError`` naming the plugin, and a matcher that fails fails only
its sample.

A step's masks are filled together, as the rows of one bitmask, by the
backend's ``fill_bitmasks`` where it has one
(:class:`~hetero_core.structured_output.BatchMaskFiller`), else one matcher
after another. When that call raises, each matcher is asked alone, so
only the failing ones fail. The masks are filled on the stepping thread
before the step runs: a sample's next mask depends on the token the step
samples for it, so it cannot be computed earlier.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from hetero_core.components import ComponentRegistry
from hetero_core.config import EngineConfig
from hetero_core.errors import EngineError, ExecutionError, ValidationError
from hetero_core.logs import get_logger
from hetero_core.protocols import Tokenizer
from hetero_core.sequence import Sequence
from hetero_core.structured_output import (
    BatchMaskFiller,
    ConstraintKind,
    StructuredOutput,
    StructuredOutputBackend,
    is_allowed,
    new_bitmask,
)

log = get_logger(__name__)


class Grammars:
    """Compiles requests' constraints and gives constrained samples their allowed next tokens."""

    def __init__(self, config: EngineConfig, registry: ComponentRegistry, tokenizer: Tokenizer) -> None:
        self._config = config
        self._registry = registry
        self._tokenizer = tokenizer
        self._backend: StructuredOutputBackend | None = None
        self._lock = threading.Lock()
        self.plugin = ""  # the grammar engine's plugin, once built

    def backend(self) -> StructuredOutputBackend:
        """The grammar engine ``config.structured_output`` names, built on first use (``ConfigError`` if not
        installed)."""
        with self._lock:
            if self._backend is None:
                spec = self._config.structured_output
                self.plugin = self._registry.get("structured_output", spec.name).plugin
                self._backend = self._registry.create("structured_output", spec.name, spec.options, self._tokenizer)
            return self._backend

    def compile(self, constraint: StructuredOutput) -> Any:
        """The compiled grammar of a request's constraint (``ValidationError`` when it cannot be compiled).

        A grammar in a dialect the backend does not read is refused here, naming both.
        """
        backend = self.backend()
        if constraint.kind is ConstraintKind.GRAMMAR and constraint.value.dialect not in backend.grammar_dialects:
            reads = ", ".join(map(repr, backend.grammar_dialects)) or "none"
            raise ValidationError(
                "structured_output: the structured-output backend"
                f" {self._config.structured_output.name!r} does not read"
                f" grammars in the {constraint.value.dialect!r} dialect (it reads: {reads})",
                param="structured_output",
            )
        try:
            return backend.compile(constraint)
        except EngineError:
            raise
        except Exception as exc:  # a fault of the backend, not of the request
            log.error(
                "structured-output backend failed to compile",
                plugin=self.plugin,
                error=f"{type(exc).__name__}: {exc}",
                exc_info=exc,
            )
            raise ExecutionError(
                f"structured-output plugin {self.plugin!r} failed to compile the constraint (details in the log)"
            ) from exc

    def allowed_tokens(self, seqs: list[Sequence]) -> tuple[np.ndarray, dict[int, str]]:
        """The allowed next tokens of constrained samples: row ``i`` of the bitmask is ``seqs[i]``'s.

        Also returns why any sample could not have its mask (by ``seq_id``);
        its row is then undefined and the sample must not run.
        """
        bitmask = new_bitmask(len(seqs), self._tokenizer.vocab_size)
        problems: dict[int, str] = {}
        rows = []
        for row, seq in enumerate(seqs):
            try:
                if seq.matcher is None:
                    seq.matcher = self.backend().new_matcher(seq.request.grammar)
                rows.append(row)
            except Exception as exc:  # the grammar engine's fault: this sample fails alone
                problems[seq.seq_id] = self.failed(exc)
        if len(rows) > 1 and isinstance(self._backend, BatchMaskFiller):
            together = self._fill_together(self._backend, [seqs[row].matcher for row in rows], bitmask, rows)
            if together is not None:
                for row, problem in zip(rows, together, strict=True):
                    if problem is not None:
                        problems[seqs[row].seq_id] = self._failed(problem)
                return bitmask, problems
        for row in rows:
            try:
                seqs[row].matcher.fill_bitmask(bitmask, row)
            except Exception as exc:  # this sample fails alone
                problems[seqs[row].seq_id] = self.failed(exc)
        return bitmask, problems

    def allowed_tokens_along(self, seq: Sequence, proposed: list[int]) -> tuple[np.ndarray, int]:
        """The allowed tokens at ``seq``'s next position and after each proposal the grammar allows.

        Returns the masks (one row per position: the next token's, then one
        after each kept proposal) and how many proposals are kept: those
        before the first the grammar forbids or that completes the text. The
        matcher is advanced through them and rolled back, so it ends as it
        began. Raises what the grammar engine raises (the caller fails the
        sample alone, as :meth:`allowed_tokens` does).
        """
        if seq.matcher is None:
            seq.matcher = self.backend().new_matcher(seq.request.grammar)
        matcher = seq.matcher
        bitmask = new_bitmask(len(proposed) + 1, self._tokenizer.vocab_size)
        matcher.fill_bitmask(bitmask, 0)
        kept = 0
        try:
            for token in proposed:
                if not is_allowed(bitmask[kept], token) or matcher.is_finished or not matcher.accept_token(token):
                    break
                kept += 1
                matcher.fill_bitmask(bitmask, kept)
        finally:
            if kept:
                matcher.rollback(kept)
        return bitmask[: kept + 1], kept

    def failed(self, exc: Exception) -> str:
        """Log a matcher's exception; the reason its request is given."""
        return self._failed(f"{type(exc).__name__}: {exc}", exc)

    def _fill_together(
        self, backend: BatchMaskFiller, matchers: list[Any], bitmask: np.ndarray, rows: list[int]
    ) -> list[str | None] | None:
        """``fill_bitmasks`` into the rows ``rows`` of ``bitmask``: per matcher None or its problem; None if the call
        failed."""
        target = bitmask if len(rows) == len(bitmask) else np.ascontiguousarray(bitmask[rows])
        try:
            problems = backend.fill_bitmasks(matchers, target)
            if not isinstance(problems, list) or len(problems) != len(matchers):
                raise TypeError(
                    f"fill_bitmasks returned {type(problems).__name__}, not a list of {len(matchers)} problems"
                )
        except Exception as exc:  # the batch call's fault: each matcher is asked alone
            log.warning(
                "structured-output backend failed to fill a batch of masks; filling them one by one",
                plugin=self.plugin,
                error=f"{type(exc).__name__}: {exc}",
                exc_info=exc,
            )
            return None
        if target is not bitmask:
            bitmask[rows] = target
        return [None if problem is None else str(problem) for problem in problems]

    def _failed(self, error: str, exc: Exception | None = None) -> str:
        """Log a matcher's failure; the reason its request is given."""
        log.error("structured-output matcher failed", plugin=self.plugin, error=error, exc_info=exc)
        return f"structured-output plugin {self.plugin!r} could not compute the allowed tokens"
