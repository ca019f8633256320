"""The engine's side of structured output: compile at submission, allowed tokens at each step.

The grammar engine (a ``structured_output`` component, chosen by
``config.structured_output``) is built by the first request that asks for
structured output, so an engine that never sees one never loads it. Its
faults are its own: a constraint it fails to compile is an
``ExecutionError`` naming the plugin, and a matcher that fails fails only
its sample.
"""

from __future__ import annotations

import threading
from typing import Any

from hetero_core.components import ComponentRegistry
from hetero_core.config import EngineConfig
from hetero_core.errors import EngineError, ExecutionError
from hetero_core.logs import get_logger
from hetero_core.protocols import Tokenizer
from hetero_core.sequence import Sequence
from hetero_core.structured_output import StructuredOutput, StructuredOutputBackend, new_bitmask

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
        """The grammar engine ``config.structured_output`` names, built on first use (``ConfigError`` if not installed)."""
        with self._lock:
            if self._backend is None:
                spec = self._config.structured_output
                self.plugin = self._registry.get("structured_output", spec.name).plugin
                self._backend = self._registry.create("structured_output", spec.name, spec.options, self._tokenizer)
            return self._backend

    def compile(self, constraint: StructuredOutput) -> Any:
        """The compiled grammar of a request's constraint (``ValidationError`` when it cannot be compiled)."""
        backend = self.backend()
        try:
            return backend.compile(constraint)
        except EngineError:
            raise
        except Exception as exc:  # a fault of the backend, not of the request
            log.error("structured-output backend failed to compile", plugin=self.plugin, error=f"{type(exc).__name__}: {exc}", exc_info=exc)
            raise ExecutionError(f"structured-output plugin {self.plugin!r} failed to compile the constraint (details in the log)") from exc

    def allowed_tokens(self, seq: Sequence) -> tuple[Any, str | None]:
        """The bitmask row of the tokens a constrained sample may take next; or None and why it cannot have one."""
        try:
            if seq.matcher is None:
                seq.matcher = self.backend().new_matcher(seq.request.grammar)
            bitmask = new_bitmask(1, self._tokenizer.vocab_size)
            seq.matcher.fill_bitmask(bitmask, 0)
        except Exception as exc:  # the grammar engine's fault: this sample fails alone
            log.error("structured-output matcher failed", plugin=self.plugin, error=f"{type(exc).__name__}: {exc}", exc_info=exc)
            return None, f"structured-output plugin {self.plugin!r} could not compute the allowed tokens"
        return bitmask[0], None
