"""The components plugins register, their typed options, and building one by name.

A plugin registers ``register(name, factory, options=Options)`` where
``Options`` is an attrs class declared beside the factory: its fields are
the component's options, with types, defaults and validators. The config's
options for the component (``{"name": "torch", "dtype": "float32"}``) are
checked against it before the factory runs, so an unknown option is a
``ConfigError`` that lists the accepted ones, a bad value one that names the
option, and ``hetero-infer plugins`` can show every component's options.
The factory is then called with the point's arguments and the validated
options as keywords (see :mod:`hetero_core.hookspecs`). A component
registered without an options class has its factory's keyword parameters
checked instead.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Mapping

import attrs
import pluggy

from hetero_core.errors import ConfigError, EngineError
from hetero_core.logs import get_logger

log = get_logger(__name__)

# extension point -> the discovery hook that fills it
EXTENSION_POINTS: dict[str, str] = {
    "tokenizer": "register_tokenizers",
    "scheduler": "register_scheduler_policies",
    "cache_allocator": "register_cache_allocators",
    "executor": "register_executors",
    "structured_output": "register_structured_output_backends",
    "speculator": "register_speculators",
    "serving_backend": "register_serving_backends",
    "command": "register_commands",
}
# the positional arguments each point's factory takes before its options
FACTORY_ARGUMENTS: dict[str, tuple[str, ...]] = {
    "tokenizer": ("config",),
    "scheduler": (),
    "cache_allocator": ("num_blocks", "block_size"),
    "executor": ("config",),
    "structured_output": ("tokenizer",),
    "speculator": ("config", "model_info", "components"),
    "serving_backend": ("config",),
    "command": ("argv",),
}


@attrs.frozen
class Registration:
    """One named component factory, the plugin that registered it and its options class (if declared)."""

    point: str
    name: str
    factory: Callable[..., Any]
    plugin: str
    options: type | None = None

    def accepted_options(self) -> list[str] | None:
        """The option names; None when the factory takes any keyword (``**options``) and declares no class."""
        if self.options is not None:
            return [f.name for f in attrs.fields(self.options)]
        try:
            parameters = list(inspect.signature(self.factory).parameters.values())
        except ValueError:  # no signature to read (a builtin): the call decides
            return None
        if any(p.kind is p.VAR_KEYWORD for p in parameters):
            return None
        fixed = len(FACTORY_ARGUMENTS[self.point])
        return [p.name for p in parameters[fixed:] if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]

    def validate_options(self, options: Mapping[str, Any]) -> dict[str, Any]:
        """The options as the factory's keywords, checked; ``ConfigError`` naming what is wrong."""
        accepted = self.accepted_options()
        unknown = sorted(set(options) - set(accepted)) if accepted is not None else []
        if unknown:
            raise ConfigError(
                f"{self.point} {self.name!r} has no option {', '.join(map(repr, unknown))};"
                f" accepted: {', '.join(accepted) or 'none'}",
                param=f"{self.point}.{unknown[0]}",
            )
        if self.options is None:
            return dict(options)
        try:
            validated = self.options(**options)
        except EngineError as exc:
            raise ConfigError(
                f"{self.point} {self.name!r} option {exc.message}", param=f"{self.point}.{exc.param}"
            ) from exc
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{self.point} {self.name!r} options are invalid: {exc}", param=self.point) from exc
        return attrs.asdict(validated, recurse=False)


def describe_options(registration: Registration) -> dict[str, dict[str, Any]]:
    """Each option: its type and default, as ``hetero-infer plugins`` shows them."""
    if registration.options is not None:
        return {
            f.name: {"type": _type_name(f.type), "default": _default(f.default)}
            for f in attrs.fields(registration.options)
        }
    described = {}
    accepted = registration.accepted_options()
    if accepted is None:
        return {"**": {"type": "any keyword the factory takes", "default": None}}
    parameters = inspect.signature(registration.factory).parameters
    for name in accepted:
        parameter = parameters[name]
        described[name] = {
            "type": _type_name(parameter.annotation) if parameter.annotation is not parameter.empty else None,
            "default": None if parameter.default is parameter.empty else parameter.default,
        }
    return described


def _default(default: Any) -> Any:
    """A field's default as JSON shows it: a factory's product (``{}`` for ``factory=dict``), None when there is
    none."""
    if isinstance(default, attrs.Factory):
        return None if default.takes_self else default.factory()
    return None if default is attrs.NOTHING else default


def _type_name(annotation: Any) -> str:
    return annotation if isinstance(annotation, str) else getattr(annotation, "__name__", repr(annotation))


class ComponentRegistry:
    """Every component the loaded plugins register, by extension point and name."""

    def __init__(self, pm: pluggy.PluginManager) -> None:
        self._pm = pm
        self._registrations: dict[str, dict[str, Registration]] = {point: {} for point in EXTENSION_POINTS}
        for point, hook_name in EXTENSION_POINTS.items():
            for impl in getattr(pm.hook, hook_name).get_hookimpls():
                try:
                    impl.function(register=self._register_callback(point, impl.plugin_name))
                except ConfigError:
                    raise
                except Exception as exc:  # a plugin whose hook raises is broken; the others still register
                    self._forget(impl.plugin_name)
                    mark_broken = getattr(pm, "mark_broken", None)
                    problem = f"its {hook_name} hook raised {type(exc).__name__}: {exc}"
                    if mark_broken is None:
                        raise ConfigError(f"plugin {impl.plugin_name!r}: {problem}") from exc
                    mark_broken(impl.plugin_name, problem)

    def _forget(self, plugin: str) -> None:
        for registrations in self._registrations.values():
            for name in [n for n, r in registrations.items() if r.plugin == plugin]:
                del registrations[name]

    def _register_callback(self, point: str, plugin: str) -> Callable[..., None]:
        def register(name: str, factory: Callable[..., Any], options: type | None = None) -> None:
            if not isinstance(name, str) or not name:
                raise ConfigError(f"plugin {plugin!r} registered a {point} with an invalid name {name!r}")
            if not callable(factory):
                raise ConfigError(f"plugin {plugin!r} registered {point} {name!r} with a factory that is not callable")
            if options is not None and not attrs.has(options):
                raise ConfigError(
                    f"plugin {plugin!r} registered {point} {name!r} with options that are not an attrs class"
                )
            existing = self._registrations[point].get(name)
            if existing is not None:
                raise ConfigError(
                    f"{point} name {name!r} is registered twice: by plugin {existing.plugin!r}"
                    f" and by plugin {plugin!r};"
                    f" disable one of them (HETERO_DISABLE_PLUGINS or plugins.disable)"
                )
            self._registrations[point][name] = Registration(point, name, factory, plugin, options)

        return register

    def names(self, point: str) -> list[str]:
        return sorted(self._registrations[point])

    def registrations(self, point: str) -> list[Registration]:
        return [self._registrations[point][name] for name in self.names(point)]

    def get(self, point: str, name: str) -> Registration:
        registration = self._registrations[point].get(name)
        if registration is None:
            installed = ", ".join(repr(n) for n in self.names(point)) or "none"
            raise ConfigError(
                f"unknown {point} {name!r}; installed: {installed}{self._why_missing(point, name)}", param=point
            )
        return registration

    def _why_missing(self, point: str, name: str) -> str:
        """A hint when a disabled or broken plugin may be the one that provides ``name``."""
        for plugin, load in getattr(self._pm, "disabled", {}).items():
            if name in _names_registered_by(load, point):
                return (
                    f"; {point} {name!r} is provided by plugin {plugin!r}, which is disabled"
                    " (HETERO_DISABLE_PLUGINS or plugins.disable)"
                )
        broken = getattr(self._pm, "broken", {})
        if broken:
            return "; broken plugins, which may provide it: " + "; ".join(
                f"{p!r} ({why})" for p, why in sorted(broken.items())
            )
        return ""

    def create(self, point: str, name: str, options: Mapping[str, Any], *args: Any) -> Any:
        """Call the factory registered as ``name`` with ``args`` and the validated keyword ``options``.

        A factory that fails with anything but an ``EngineError`` (a model
        file that does not load, ...) is a ``ConfigError`` naming the plugin.
        """
        registration = self.get(point, name)
        keywords = registration.validate_options(options)
        try:
            return registration.factory(*args, **keywords)
        except EngineError:
            raise
        except Exception as exc:
            raise ConfigError(
                f"{point} {name!r} (plugin {registration.plugin!r}) failed to start: {type(exc).__name__}: {exc}",
                param=point,
            ) from exc


def _names_registered_by(load: Callable[[], Any], point: str) -> set[str]:
    """The names a (disabled) plugin would register for ``point``, asked without registering it."""
    names: set[str] = set()
    try:
        hook = getattr(load(), EXTENSION_POINTS[point], None)
        if hook is not None:
            hook(register=lambda name, *_args, **_kwargs: names.add(name))
    except Exception:  # a disabled plugin may well be broken too: then it provides nothing
        return set()
    return names
