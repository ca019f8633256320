"""The ``torch`` plugin: adds the attention-backend hook, registers the built-in backends and the ``torch`` executor."""

from __future__ import annotations

from typing import Any

import attrs

from hetero_core.errors import ConfigError
from hetero_core.hookspecs import Register, hookimpl
from hetero_core.validators import boolean, number_in, one_of, optional
from hetero_executor_torch import hookspecs
from hetero_executor_torch.attention import TorchAttention
from hetero_executor_torch.attention_backend import AttentionBackend, AttentionBackends, resolve
from hetero_executor_torch.executor import TorchExecutor, resolve_device
from hetero_executor_torch.kernel_attention import NumbaCpuAttention
from hetero_executor_torch.quantized import WEIGHT_FORMATS

DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16")


def _device(_instance: Any, attribute: Any, value: Any) -> None:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{attribute.name} must be auto, cpu, cuda or cuda:N, got {value!r}", param=attribute.name)


def _decode_graphs(_instance: Any, attribute: Any, value: Any) -> None:
    if value not in (True, False, "auto") or value in (0, 1) and not isinstance(value, bool):
        raise ConfigError(f"{attribute.name} must be true, false or 'auto', got {value!r}", param=attribute.name)


def _attention(_instance: Any, attribute: Any, value: Any) -> None:
    """A backend name (resolved, with the names on offer, when the executor is built) or, from Python, a backend."""
    if not (isinstance(value, str) and value or isinstance(value, AttentionBackend)):
        raise ConfigError(
            f"{attribute.name} must be auto, an attention backend name or an AttentionBackend, got {value!r}",
            param=attribute.name,
        )


def _weight_cache(_instance: Any, attribute: Any, value: Any) -> None:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{attribute.name} must be auto, off or a directory, got {value!r}", param=attribute.name)


@attrs.frozen
class TorchExecutorOptions:
    """The ``torch`` executor's options (see :class:`TorchExecutor` for what each does)."""

    dtype: str = attrs.field(default="auto", validator=one_of(DTYPE_CHOICES, error=ConfigError))
    kv_cache_dtype: str = attrs.field(default="auto", validator=one_of(DTYPE_CHOICES, error=ConfigError))
    device: str = attrs.field(default="auto", validator=_device)
    num_threads: int | None = attrs.field(
        default=None, validator=optional(number_in(1, 4096, integer=True, error=ConfigError))
    )
    attention: str | AttentionBackend = attrs.field(default="auto", validator=_attention)
    decode_graphs: bool | str = attrs.field(default="auto", validator=_decode_graphs)
    weights: str = attrs.field(default="auto", validator=one_of(WEIGHT_FORMATS, error=ConfigError))
    dense_copy: bool = attrs.field(default=False, validator=boolean(error=ConfigError))
    weight_cache: str = attrs.field(default="auto", validator=_weight_cache)
    weight_cache_max_gib: float = attrs.field(
        default=16.0, validator=number_in(0, 2**20, low_open=True, error=ConfigError)
    )


def torch_executor(
    config: Any, attention: str | AttentionBackend = "auto", device: str = "auto", **options: Any
) -> TorchExecutor:
    """The ``torch`` executor, its ``attention`` name resolved among the backends of the plugins ``config`` selects."""
    if isinstance(attention, str):
        attention = resolve(attention, resolve_device(device), AttentionBackends.for_config(config))
    return TorchExecutor(config, attention=attention, device=device, **options)


@hookimpl
def hetero_add_hookspecs(pluginmanager: Any) -> None:
    pluginmanager.add_hookspecs(hookspecs)


@hookimpl
def register_attention_backends(register: Register) -> None:
    register("torch", TorchAttention)
    register("numba", NumbaCpuAttention)


@hookimpl
def register_executors(register: Register) -> None:
    register("torch", torch_executor, options=TorchExecutorOptions)
