"""Registers the ``ray`` serving backend (Ray is imported only when one is built)."""

from __future__ import annotations

from typing import Any

from hetero_core.hookspecs import Register, hookimpl
from hetero_serve_ray.options import RayBackendOptions


def ray_backend(config: Any, **options: Any) -> Any:
    """``data_parallel_size`` engine replicas as Ray actors; ``options`` are :class:`RayBackendOptions`'s fields."""
    from hetero_serve_ray.backend import RayBackend

    return RayBackend(config, RayBackendOptions(**options))


@hookimpl
def register_serving_backends(register: Register) -> None:
    register("ray", ray_backend, options=RayBackendOptions)
