"""Commands that plugins add to ``hetero-infer`` through the ``register_commands`` hook.

``hetero-infer NAME ARGS...`` with a NAME the core does not own runs the
command a plugin registered under it; the seed's ``--serve`` flag is the
``serve`` command. The plugins are found as for any engine, under the
environment's ``HETERO_PLUGINS`` / ``HETERO_DISABLE_PLUGINS`` (the config
file is the command's to read). A command the project's own plugins
provide names the distribution to install when it is missing.
"""

from __future__ import annotations

import importlib.metadata

from hetero_core.components import ComponentRegistry
from hetero_core.errors import ConfigError
from hetero_core.plugins import create_plugin_manager

CORE_COMMANDS = ("generate", "plugins", "bench", "export-tokenizer")
SERVE_FLAG = "--serve"  # the seed's spelling of ``hetero-infer serve``
# the project's plugin commands, and the distribution that adds each
COMMAND_PLUGINS = {"serve": "hetero-serve-openai", "batch": "hetero-serve-openai"}


def plugin_command(argv: list[str]) -> tuple[str, list[str]] | None:
    """``(name, its arguments)`` when ``argv`` asks for a command the core does not own; None otherwise."""
    if argv and not argv[0].startswith("-") and argv[0] not in CORE_COMMANDS:
        return argv[0], argv[1:]
    if SERVE_FLAG in argv:
        rest = [arg for arg in argv if arg != SERVE_FLAG]
        return "serve", rest[1:] if rest[:1] == ["generate"] else rest
    return None


def run_command(name: str, argv: list[str]) -> int:
    """Run the command registered as ``name`` with ``argv``; its exit status."""
    registry = ComponentRegistry(create_plugin_manager())
    try:
        registration = registry.get("command", name)
    except ConfigError as exc:
        distribution = COMMAND_PLUGINS.get(name)
        if distribution is not None and not _is_installed(distribution):
            raise ConfigError(
                f"the {name} command needs the plugin {distribution}, which is not installed:"
                f" pip install {distribution}",
                param="command",
            ) from exc
        raise ConfigError(f"{exc.message} (the core's commands: {', '.join(CORE_COMMANDS)})", param="command") from exc
    return registration.factory(argv)


def _is_installed(distribution: str) -> bool:
    try:
        importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True
