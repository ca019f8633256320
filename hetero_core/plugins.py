"""Finding plugins and the components they register.

Plugins come from three places, all through the same hooks: the built-in
reference components (:mod:`hetero_core.builtin`), installed distributions
that declare an entry point in the ``hetero_infer`` group, and modules named
in ``config.plugins.load``. ``HETERO_DISABLE_PLUGINS=a,b`` (or
``config.plugins.disable``) blocks plugins by name before they load;
``HETERO_PLUGINS=a,b`` loads only those installed plugins (the built-ins
still load unless disabled).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import os
from typing import Any, Callable, Iterable

import attrs
import pluggy

from hetero_core import hookspecs
from hetero_core.builtin import plugin as builtin_plugin
from hetero_core.errors import ConfigError

ENTRY_POINT_GROUP = "hetero_infer"
DISABLE_ENV = "HETERO_DISABLE_PLUGINS"
ALLOW_ENV = "HETERO_PLUGINS"
BUILTIN_PLUGIN = "builtin"

# extension point -> the discovery hook that fills it
EXTENSION_POINTS: dict[str, str] = {
    "tokenizer": "register_tokenizers",
    "scheduler": "register_scheduler_policies",
    "cache_allocator": "register_cache_allocators",
    "executor": "register_executors",
    "serving_backend": "register_serving_backends",
}


def _env_names(variable: str) -> list[str] | None:
    value = os.environ.get(variable)
    if value is None:
        return None
    return [name.strip() for name in value.split(",") if name.strip()]


def create_plugin_manager(
    *,
    disable: Iterable[str] = (),
    load: Iterable[str] = (),
    entry_points: bool = True,
    builtin: bool = True,
) -> pluggy.PluginManager:
    """A plugin manager with the hook specs, the built-ins and the installed plugins loaded.

    :param disable: plugin names to block, on top of ``HETERO_DISABLE_PLUGINS``.
    :param load: importable module paths to register as plugins.
    :param entry_points: load the ``hetero_infer`` entry points (tests pass False
        and register inline plugins themselves).
    :param builtin: register :mod:`hetero_core.builtin`.
    """
    pm = pluggy.PluginManager(ENTRY_POINT_GROUP)
    pm.add_hookspecs(hookspecs)
    for name in [*(_env_names(DISABLE_ENV) or []), *disable]:
        pm.set_blocked(name)
    if builtin and not pm.is_blocked(BUILTIN_PLUGIN):
        pm.register(builtin_plugin, name=BUILTIN_PLUGIN)
    if entry_points:
        allowed = _env_names(ALLOW_ENV)
        if allowed is None:
            pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
        else:
            for name in allowed:
                pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP, name=name)
    for module_path in load:
        if pm.is_blocked(module_path) or pm.has_plugin(module_path):
            continue
        try:
            module = importlib.import_module(module_path)
        except ImportError as exc:
            raise ConfigError(f"cannot import plugin module {module_path!r}: {exc}", param="plugins.load") from exc
        pm.register(module, name=module_path)
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        raise ConfigError(f"plugin {pm.get_name(exc.plugin)!r} implements an unknown hook: {exc}") from exc
    return pm


@attrs.frozen
class Registration:
    """One named component factory and the plugin that registered it."""

    point: str
    name: str
    factory: Callable[..., Any]
    plugin: str


class ComponentRegistry:
    """Every component the loaded plugins register, by extension point and name."""

    def __init__(self, pm: pluggy.PluginManager) -> None:
        self._registrations: dict[str, dict[str, Registration]] = {point: {} for point in EXTENSION_POINTS}
        for point, hook_name in EXTENSION_POINTS.items():
            for impl in getattr(pm.hook, hook_name).get_hookimpls():
                impl.function(register=self._register_callback(point, impl.plugin_name))

    def _register_callback(self, point: str, plugin: str) -> Callable[[str, Callable[..., Any]], None]:
        def register(name: str, factory: Callable[..., Any]) -> None:
            if not isinstance(name, str) or not name:
                raise ConfigError(f"plugin {plugin!r} registered a {point} with an invalid name {name!r}")
            if not callable(factory):
                raise ConfigError(f"plugin {plugin!r} registered {point} {name!r} with a factory that is not callable")
            existing = self._registrations[point].get(name)
            if existing is not None:
                raise ConfigError(
                    f"{point} name {name!r} is registered twice: by plugin {existing.plugin!r} and by plugin {plugin!r};"
                    f" disable one of them (HETERO_DISABLE_PLUGINS or plugins.disable)"
                )
            self._registrations[point][name] = Registration(point, name, factory, plugin)

        return register

    def names(self, point: str) -> list[str]:
        return sorted(self._registrations[point])

    def registrations(self, point: str) -> list[Registration]:
        return [self._registrations[point][name] for name in self.names(point)]

    def get(self, point: str, name: str) -> Registration:
        registration = self._registrations[point].get(name)
        if registration is None:
            installed = ", ".join(repr(n) for n in self.names(point)) or "none"
            raise ConfigError(f"unknown {point} {name!r}; installed: {installed}", param=point)
        return registration

    def create(self, point: str, name: str, options: dict[str, Any], *args: Any) -> Any:
        """Call the factory registered as ``name`` with ``args`` and the keyword ``options``."""
        registration = self.get(point, name)
        try:
            inspect.signature(registration.factory).bind(*args, **options)
        except TypeError as exc:
            raise ConfigError(f"{point} {name!r} does not accept options {sorted(options)}: {exc}", param=point) from exc
        except ValueError:  # no signature to check (a builtin); let the call decide
            pass
        return registration.factory(*args, **options)


def _plugin_version(pm: pluggy.PluginManager, plugin: Any) -> str | None:
    for registered, dist in pm.list_plugin_distinfo():
        if registered is plugin:
            return dist.version
    if plugin is builtin_plugin:
        return importlib.metadata.version("hetero-core")
    return None


def describe_plugins(pm: pluggy.PluginManager) -> list[dict[str, Any]]:
    """Each loaded plugin: name, version, the hooks it implements and the components it registers."""
    registry = ComponentRegistry(pm)
    described = []
    for name, plugin in sorted(pm.list_name_plugin(), key=lambda item: item[0]):
        if plugin is None:  # blocked
            continue
        components = {
            point: [r.name for r in registry.registrations(point) if r.plugin == name] for point in EXTENSION_POINTS
        }
        described.append(
            {
                "name": name,
                "version": _plugin_version(pm, plugin),
                "hooks": sorted(impl.name for impl in pm.get_hookcallers(plugin) or ()),
                "components": {point: names for point, names in components.items() if names},
            }
        )
    return described
