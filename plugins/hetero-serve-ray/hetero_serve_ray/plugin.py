"""Registers the ``ray`` serving backend (Ray is imported only when one is built)."""

from __future__ import annotations

import inspect
from typing import Any

from hetero_core.errors import ConfigError
from hetero_core.hookspecs import Register, hookimpl


def ray_backend(config: Any, **options: Any) -> Any:
    """``data_parallel_size`` engine replicas as Ray actors; ``options`` are :class:`RayBackend`'s."""
    from hetero_serve_ray.backend import RayBackend

    try:
        inspect.signature(RayBackend).bind(config, **options)
    except TypeError as exc:
        raise ConfigError(f"serving_backend 'ray' does not accept options {sorted(options)}: {exc}", param="backend_options") from exc
    return RayBackend(config, **options)


@hookimpl
def register_serving_backends(register: Register) -> None:
    register("ray", ray_backend)
