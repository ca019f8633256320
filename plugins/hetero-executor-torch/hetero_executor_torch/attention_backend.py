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
CPU when the ``hetero_kernels`` package is installed, else ``torch``), a
built-in name (``torch``, ``numba``), a name registered in the ``hetero_infer.attention`` entry-point
group (its value: a callable taking no arguments that returns a backend), or,
from Python, a backend object itself.
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any, Callable, Protocol, runtime_checkable

import torch

from hetero_core.errors import ConfigError
from hetero_core.step_layout import StepLayout

ENTRY_POINT_GROUP = "hetero_infer.attention"


@runtime_checkable
class AttentionBackend(Protocol):
    name: str
    supports_graphs: bool

    def configure(self, device: torch.device, kv_cache_dtype: torch.dtype) -> torch.dtype:
        """The KV cache dtype this backend reads on ``device`` (``kv_cache_dtype`` or its own); ConfigError if it cannot run there."""
        ...

    def inputs(self, step: StepLayout, slot_mapping: torch.Tensor) -> Any:
        """The step's attention inputs (with ``slot_mapping``, already on the device), shared by every layer."""
        ...

    def graph_inputs(self, slot_mapping: torch.Tensor, block_tables: torch.Tensor, context_lens: torch.Tensor, block_size: int) -> Any:
        """Inputs of a decode-only step from static buffers: one decode per row, ``block_tables`` ``[rows, width]``
        int32, ``context_lens`` ``[rows]`` int32 (cached tokens, this one included)."""
        ...

    def attend(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, inputs: Any, scale: float
    ) -> torch.Tensor:
        """Attention output ``[T, heads, head_size]``; the caches ``[blocks, block_size, kv_heads, head_size]`` already hold the step's keys/values."""
        ...


def _built_in() -> dict[str, Callable[[], AttentionBackend]]:
    from hetero_executor_torch.attention import TorchAttention
    from hetero_executor_torch.kernel_attention import NumbaCpuAttention

    return {"torch": TorchAttention, "numba": NumbaCpuAttention}


def available() -> dict[str, Callable[[], AttentionBackend]]:
    """Every backend name with its factory: the built-in ones, then the entry points' (a built-in name is not overridden)."""
    factories: dict[str, Callable[[], AttentionBackend]] = {}
    for point in entry_points(group=ENTRY_POINT_GROUP):
        factories[point.name] = point.load
    return {**{name: _load(load) for name, load in factories.items()}, **_built_in()}


def _load(load: Callable[[], Any]) -> Callable[[], AttentionBackend]:
    return lambda: load()()


def _kernels_installed() -> bool:
    try:
        import hetero_kernels  # noqa: F401
    except ImportError:
        return False
    return True


def resolve(attention: str | AttentionBackend, device: torch.device) -> AttentionBackend:
    """The backend named by ``attention`` (``auto``: the fastest one for ``device``), or ``attention`` itself when it is a backend."""
    if attention == "auto":
        attention = "numba" if device.type == "cpu" and _kernels_installed() else "torch"
    if not isinstance(attention, str):
        if not isinstance(attention, AttentionBackend):
            raise ConfigError(f"executor option attention must be a backend name or an AttentionBackend; got {attention!r}", param="attention")
        return attention
    factories = available()
    if attention not in factories:
        raise ConfigError(f"executor option attention must be one of {', '.join(sorted(factories))}; got {attention!r}", param="attention")
    backend = factories[attention]()
    if not isinstance(backend, AttentionBackend):
        raise ConfigError(f"attention backend {attention!r} does not provide the AttentionBackend interface", param="attention")
    return backend
