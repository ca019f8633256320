"""The attention-backend seam: what an attention implementation provides to the ``torch`` executor, and how it is found.

The executor runs everything but attention (embeddings, projections, norms,
MLP, the paged KV cache tensors, sampling). Attention comes from a backend:

- :meth:`AttentionBackend.configure` checks the device and KV cache dtype
  once, at load, and returns the cache dtype the backend reads (a wrong
  combination raises :class:`~hetero_core.errors.ConfigError` naming it);
- :meth:`AttentionBackend.inputs` builds the backend's own per-step inputs
  from the step's :class:`~hetero_core.step_layout.StepLayout`, once per
  step; every layer gets the same object. It must carry ``slot_mapping``
  (``[T]`` int64 on the device): the model writes the step's new keys and
  values into those cache slots before it calls attention;
- :meth:`AttentionBackend.attend` runs one layer's attention;
- :meth:`AttentionBackend.graph_inputs` builds the inputs of a decode-only
  step from the decode graphs' static buffers, inside the captured step
  (device ops only: no host reads, no tensors from host data); a backend
  whose ``supports_graphs`` is false is never asked, and the executor
  refuses ``decode_graphs=true`` with it.

The executor's ``attention`` option picks one: ``auto`` (``numba`` on the
CPU, ``torch`` elsewhere), a name some plugin registers through the
``register_attention_backends`` hook (:mod:`hetero_executor_torch.hookspecs`;
this plugin registers ``torch`` and ``numba``), or, from Python, a backend
object itself. The names are those of the plugins the engine's config and
the environment select (:class:`AttentionBackends`): a disabled plugin's
backends are gone, a broken plugin's are listed as broken.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, runtime_checkable

import torch

from hetero_core.errors import ConfigError, EngineError
from hetero_core.plugins import PluginManager, create_plugin_manager
from hetero_core.step_layout import StepLayout

HOOK = "register_attention_backends"


@runtime_checkable
class AttentionBackend(Protocol):
    name: str
    supports_graphs: bool

    def configure(self, device: torch.device, kv_cache_dtype: torch.dtype) -> torch.dtype:
        """The KV cache dtype this backend reads on ``device`` (``kv_cache_dtype`` or its own);
        ConfigError if it cannot run there."""
        ...

    def inputs(self, step: StepLayout, slot_mapping: torch.Tensor) -> Any:
        """The step's attention inputs (with ``slot_mapping``, already on the device), shared by every layer."""
        ...

    def graph_inputs(
        self, slot_mapping: torch.Tensor, block_tables: torch.Tensor, context_lens: torch.Tensor, block_size: int
    ) -> Any:
        """Inputs of a decode-only step from static buffers: one decode per row, ``block_tables`` ``[rows, width]``
        int32, ``context_lens`` ``[rows]`` int32 (cached tokens, this one included)."""
        ...

    def attend(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        inputs: Any,
        scale: float,
    ) -> torch.Tensor:
        """Attention output ``[T, heads, head_size]``; the caches ``[blocks, block_size, kv_heads, head_size]`` already
        hold the step's keys/values."""
        ...


class AttentionBackends:
    """The attention backends that the plugins of one plugin manager register, by name.

    A plugin whose hook raises is marked broken (its backends left out), as
    for the core's discovery hooks; a name registered twice is a
    ``ConfigError`` naming both plugins.
    """

    def __init__(self, pm: PluginManager) -> None:
        self._pm = pm
        self._factories: dict[str, tuple[Callable[[], AttentionBackend], str]] = {}  # name -> (factory, plugin)
        hook = getattr(pm.hook, HOOK, None)  # absent when the torch plugin itself is not loaded
        for impl in hook.get_hookimpls() if hook is not None else ():
            try:
                impl.function(register=self._register_callback(impl.plugin_name))
            except ConfigError:
                raise
            except Exception as exc:  # a broken plugin harms only itself
                self._factories = {
                    name: entry for name, entry in self._factories.items() if entry[1] != impl.plugin_name
                }
                pm.mark_broken(impl.plugin_name, f"its {HOOK} hook raised {type(exc).__name__}: {exc}")

    @classmethod
    def for_config(cls, config: Any) -> AttentionBackends:
        """The backends of the plugins that ``config.plugins`` and the environment select, as the engine's are."""
        return cls(create_plugin_manager(disable=config.plugins.disable, load=config.plugins.load))

    def _register_callback(self, plugin: str) -> Callable[..., None]:
        def register(name: str, factory: Callable[[], AttentionBackend]) -> None:
            if not isinstance(name, str) or not name or name == "auto":
                raise ConfigError(f"plugin {plugin!r} registered an attention backend with an invalid name {name!r}")
            if not callable(factory):
                raise ConfigError(
                    f"plugin {plugin!r} registered attention backend {name!r} with a factory that is not callable"
                )
            if name in self._factories:
                raise ConfigError(
                    f"attention backend {name!r} is registered twice: by plugin {self._factories[name][1]!r} and by "
                    f"plugin {plugin!r};"
                    " disable one of them (HETERO_DISABLE_PLUGINS or plugins.disable)"
                )
            self._factories[name] = (factory, plugin)

        return register

    def names(self) -> list[str]:
        return sorted(self._factories)

    def plugin(self, name: str) -> str:
        """The plugin that registers backend ``name``."""
        return self._factories[name][1]

    def create(self, name: str) -> AttentionBackend:
        """A new backend ``name``; ``ConfigError`` listing the names on offer when none is registered so."""
        if name not in self._factories:
            raise ConfigError(
                f"executor option attention must be one of auto, {', '.join(self.names())}; "
                f"got {name!r}{self._why_missing(name)}",
                param="attention",
            )
        factory, plugin = self._factories[name]
        try:
            backend = factory()
        except EngineError:
            raise
        except Exception as exc:
            raise ConfigError(
                f"attention backend {name!r} (plugin {plugin!r}) failed to start: {type(exc).__name__}: {exc}",
                param="attention",
            ) from exc
        if not isinstance(backend, AttentionBackend):
            raise ConfigError(
                f"attention backend {name!r} (plugin {plugin!r}) does not provide the AttentionBackend interface",
                param="attention",
            )
        return backend

    def _why_missing(self, name: str) -> str:
        """A hint when a disabled or broken plugin may be the one that provides ``name``."""
        for plugin, load in self._pm.disabled.items():
            provided: list[str] = []
            try:
                hook = getattr(load(), HOOK, None)
                if hook is not None:
                    hook(register=lambda registered, *_args, _into=provided: _into.append(registered))
            except Exception:  # a disabled plugin may well be broken too: then it provides nothing
                continue
            if name in provided:
                return (
                    f"; attention backend {name!r} is provided by plugin {plugin!r}, which is disabled "
                    "(HETERO_DISABLE_PLUGINS or plugins.disable)"
                )
        if self._pm.broken:
            return "; broken plugins, which may provide it: " + "; ".join(
                f"{p!r} ({why})" for p, why in sorted(self._pm.broken.items())
            )
        return ""


def resolve(
    attention: str | AttentionBackend, device: torch.device, backends: AttentionBackends | None = None
) -> AttentionBackend:
    """The backend named by ``attention`` among ``backends`` (by default those of the installed plugins; ``auto``:
    the fastest one for ``device``), or ``attention`` itself when it is a backend."""
    if not isinstance(attention, str):
        if not isinstance(attention, AttentionBackend):
            raise ConfigError(
                f"executor option attention must be a backend name or an AttentionBackend; got {attention!r}",
                param="attention",
            )
        return attention
    if attention == "auto":
        attention = "numba" if device.type == "cpu" else "torch"
    if backends is None:
        backends = AttentionBackends(create_plugin_manager())
    return backends.create(attention)
