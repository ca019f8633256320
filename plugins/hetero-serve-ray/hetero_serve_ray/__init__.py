"""hetero-infer on Ray: data-parallel engine replicas behind one OpenAI endpoint, and offline batches over them.

``RayBackend`` and ``DataParallelEngine`` import Ray, so they load on first use
(``hetero-infer`` loads this plugin for every engine it builds).
"""

from __future__ import annotations

from typing import Any

from hetero_serve_ray.routing import LeastLoaded, PrefixAffinity, RandomRouting, ReplicaLoad, RoutingPolicy

__all__ = ["DataParallelEngine", "LeastLoaded", "PrefixAffinity", "RandomRouting", "RayBackend", "ReplicaLoad", "RoutingPolicy"]


def __getattr__(name: str) -> Any:
    if name == "RayBackend":
        from hetero_serve_ray.backend import RayBackend

        return RayBackend
    if name == "DataParallelEngine":
        from hetero_serve_ray.offline import DataParallelEngine

        return DataParallelEngine
    raise AttributeError(f"module 'hetero_serve_ray' has no attribute {name!r}")
