"""The hook the ``torch`` plugin adds to the plugin manager (through ``hetero_add_hookspecs``): attention backends.

Same marker, same registration style as the core's discovery hooks
(:mod:`hetero_core.hookspecs`).
"""

from __future__ import annotations

from hetero_core.hookspecs import Register, hookspec


@hookspec
def register_attention_backends(register: Register) -> None:
    """Register attention backends for the ``torch`` executor.

    Called once per plugin when an executor resolves its ``attention`` option
    (and for ``hetero-infer plugins``).

    :param register: call ``register(name, factory)`` for each backend.
        ``factory()`` takes no arguments and returns an
        :class:`~hetero_executor_torch.AttentionBackend`. A name already
        registered by any plugin raises ``ConfigError`` naming both plugins.
    :return: nothing.
    """
