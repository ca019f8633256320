"""Finding plugins, and surviving the ones that are broken.

Plugins come from three places, all through the same hooks: the built-in
reference components (:mod:`hetero_core.builtin`), installed distributions
that declare an entry point in the ``hetero_infer`` group, and modules named
in ``config.plugins.load``. ``HETERO_DISABLE_PLUGINS=a,b`` (or
``config.plugins.disable``) blocks plugins by name before they load.
``HETERO_PLUGINS=a,b`` loads only those of the installed plugins (the
built-ins still load unless disabled); a component whose plugin it leaves
out is then unknown, an error that lists the names on offer. A name in
either list that names no plugin is an error listing the installed ones.

A plugin that fails to import, to register or to describe its components is
*broken*: it is logged and listed by name (``PluginManager.broken``,
``hetero-infer plugins``) and the others work; choosing one of its
components says so.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import os
from typing import Any, Callable, Iterable

import pluggy

from hetero_core import hookspecs
from hetero_core.builtin import plugin as builtin_plugin
from hetero_core.components import EXTENSION_POINTS, ComponentRegistry, Registration, describe_options
from hetero_core.errors import ConfigError
from hetero_core.logs import get_logger

__all__ = [
    "EXTENSION_POINTS",
    "ComponentRegistry",
    "PluginManager",
    "Registration",
    "create_plugin_manager",
    "describe_plugins",
]

log = get_logger(__name__)

ENTRY_POINT_GROUP = "hetero_infer"
DISABLE_ENV = "HETERO_DISABLE_PLUGINS"
ALLOW_ENV = "HETERO_PLUGINS"
BUILTIN_PLUGIN = "builtin"


class PluginManager(pluggy.PluginManager):
    """pluggy's manager, plus what could not load and the versions of what did."""

    def __init__(self) -> None:
        super().__init__(ENTRY_POINT_GROUP)
        self.broken: dict[str, str] = {}  # plugin name -> why it does not work
        self.versions: dict[str, str] = {}  # plugin name -> its distribution's version
        self.disabled: dict[str, Callable[[], Any]] = {}  # disabled plugin name -> how to load it (to explain)

    def mark_broken(self, name: str, problem: str) -> None:
        self.broken[name] = problem
        log.warning("plugin is broken and left out", plugin=name, problem=problem)
        plugin = self.get_plugin(name)
        if plugin is not None:
            self.unregister(plugin)


def _env_names(variable: str) -> list[str] | None:
    value = os.environ.get(variable)
    if value is None:
        return None
    return [name.strip() for name in value.split(",") if name.strip()]


def _entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


def _check_names(names: Iterable[str], known: Iterable[str], what: str) -> None:
    unknown = sorted(set(names) - set(known))
    if unknown:
        raise ConfigError(
            f"{what} names no installed plugin: {', '.join(map(repr, unknown))}; installed: {', '.join(sorted(known))}",
            param="plugins",
        )


def create_plugin_manager(
    *,
    disable: Iterable[str] = (),
    load: Iterable[str] = (),
    entry_points: bool = True,
    builtin: bool = True,
) -> PluginManager:
    """A plugin manager with the hook specs, the built-ins and the installed plugins loaded.

    :param disable: plugin names to block, on top of ``HETERO_DISABLE_PLUGINS``.
    :param load: importable module paths to register as plugins.
    :param entry_points: load the ``hetero_infer`` entry points (tests pass False
        and register inline plugins themselves).
    :param builtin: register :mod:`hetero_core.builtin`.
    """
    pm = PluginManager()
    pm.add_hookspecs(hookspecs)
    pm.hook.hetero_add_hookspecs.call_historic(kwargs={"pluginmanager": pm})
    installed = _entry_points() if entry_points else {}
    load = list(load)
    disabled = [*(_env_names(DISABLE_ENV) or []), *disable]
    allowed = _env_names(ALLOW_ENV) if entry_points else None
    if entry_points:  # with inline plugins only (tests), the names cannot be known yet
        _check_names(disabled, [BUILTIN_PLUGIN, *installed, *load], f"{DISABLE_ENV} / plugins.disable")
    if allowed is not None:
        _check_names(allowed, installed, ALLOW_ENV)
    for name in disabled:
        pm.set_blocked(name)
        if name in installed:
            pm.disabled[name] = installed[name].load
        elif name == BUILTIN_PLUGIN:
            pm.disabled[name] = lambda: builtin_plugin
    if builtin and not pm.is_blocked(BUILTIN_PLUGIN):
        pm.register(builtin_plugin, name=BUILTIN_PLUGIN)
        pm.versions[BUILTIN_PLUGIN] = importlib.metadata.version("hetero-core")
    for name, entry_point in sorted(installed.items()):
        if pm.is_blocked(name) or (allowed is not None and name not in allowed):
            continue
        _load_entry_point(pm, name, entry_point)
    for module_path in load:
        _load_module(pm, module_path)
    _check_hooks(pm)
    return pm


def _load_entry_point(pm: PluginManager, name: str, entry_point: importlib.metadata.EntryPoint) -> None:
    try:
        plugin = entry_point.load()
        pm.register(plugin, name=name)
    except Exception as exc:  # a broken plugin harms only itself
        pm.mark_broken(name, f"cannot load entry point {entry_point.value!r}: {type(exc).__name__}: {exc}")
        return
    if entry_point.dist is not None:
        pm.versions[name] = entry_point.dist.version


def _load_module(pm: PluginManager, module_path: str) -> None:
    """A plugin named in ``config.plugins.load``: the user asked for it, so failing to import it is an error."""
    if pm.is_blocked(module_path) or pm.has_plugin(module_path):
        return
    try:
        module = importlib.import_module(module_path)
    except Exception as exc:
        raise ConfigError(
            f"cannot import plugin module {module_path!r}: {type(exc).__name__}: {exc}", param="plugins.load"
        ) from exc
    if pm.is_registered(module):  # also installed as an entry point: loaded already
        return
    try:
        pm.register(module, name=module_path)
    except pluggy.PluginValidationError as exc:
        raise ConfigError(f"plugin module {module_path!r} is invalid: {exc}", param="plugins.load") from exc


def _check_hooks(pm: PluginManager) -> None:
    """An implementation of a hook that does not exist (a typo) breaks its plugin, loudly."""
    while True:
        try:
            pm.check_pending()
        except pluggy.PluginValidationError as exc:
            name = pm.get_name(exc.plugin)
            if name not in pm.versions and name != BUILTIN_PLUGIN:  # named in plugins.load: the user's own
                raise ConfigError(f"plugin {name!r} implements an unknown hook: {exc}", param="plugins.load") from exc
            pm.mark_broken(name, f"implements an unknown hook: {exc}")
        else:
            return


def describe_plugins(pm: PluginManager) -> list[dict[str, Any]]:
    """Each plugin: name, version, hooks, components with their options; broken ones with their problem."""
    registry = ComponentRegistry(pm)
    added = _added_points(pm)
    described = []
    for name, plugin in sorted(pm.list_name_plugin(), key=lambda item: item[0]):
        if plugin is None:  # blocked
            continue
        components = {
            point: {r.name: describe_options(r) for r in registry.registrations(point) if r.plugin == name}
            for point in EXTENSION_POINTS
        }
        components.update({point: {n: {} for n in names.get(name, ())} for point, names in added.items()})
        described.append(
            {
                "name": name,
                "version": pm.versions.get(name),
                "hooks": sorted(impl.name for impl in pm.get_hookcallers(plugin) or ()),
                "components": {point: found for point, found in components.items() if found},
            }
        )
    described += [{"name": name, "broken": problem} for name, problem in sorted(pm.broken.items())]
    return sorted(described, key=lambda p: p["name"])


def _added_points(pm: PluginManager) -> dict[str, dict[str, list[str]]]:
    """The points plugins add with their own ``register_*`` specs (``hetero_add_hookspecs``): point -> plugin ->
    the names it registers there. A plugin whose hook raises is broken, as for the core's points."""
    added: dict[str, dict[str, list[str]]] = {}
    for hook_name, caller in vars(pm.hook).items():
        if not hook_name.startswith("register_") or caller.spec is None or caller.spec.namespace is hookspecs:
            continue
        names: dict[str, list[str]] = {}
        for impl in caller.get_hookimpls():
            registered = names.setdefault(impl.plugin_name, [])
            try:
                impl.function(register=functools.partial(_record_name, registered))
            except Exception as exc:
                names.pop(impl.plugin_name, None)
                pm.mark_broken(impl.plugin_name, f"its {hook_name} hook raised {type(exc).__name__}: {exc}")
        added[hook_name.removeprefix("register_").removesuffix("s")] = names
    return added


def _record_name(names: list[str], name: str, *_args: Any, **_kwargs: Any) -> None:
    """A ``register`` callback that only notes the names registered."""
    names.append(name)
