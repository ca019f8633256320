"""Calling observer hooks so that a failing observer harms nothing but itself.

Observers only watch. Each implementation is called on its own; one that
raises is logged with its plugin's name and the hook's, and the engine goes
on as if it had returned: the other observers still run and no result is lost.
"""

from __future__ import annotations

from typing import Any

import pluggy

from hetero_core.logs import get_logger

log = get_logger(__name__)


class Observers:
    """The implementations of one observer hook, resolved once; calling this calls each of them."""

    def __init__(self, hook: pluggy.HookCaller) -> None:
        self.hook_name = hook.name
        # pluggy's order: last registered first, tryfirst/trylast respected
        self._impls = list(reversed(hook.get_hookimpls()))

    def __bool__(self) -> bool:
        return bool(self._impls)

    def __call__(self, **kwargs: Any) -> None:
        for impl in self._impls:
            try:
                impl.function(*(kwargs[name] for name in impl.argnames))
            except Exception as exc:  # an observer's fault is its own: log it and go on
                log.error(
                    "observer hook failed",
                    plugin=impl.plugin_name,
                    hook=self.hook_name,
                    error=f"{type(exc).__name__}: {exc}",
                    exc_info=exc,
                )
