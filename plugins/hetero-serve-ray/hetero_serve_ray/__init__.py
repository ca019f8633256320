"""hetero-infer on Ray: data-parallel engine replicas behind one OpenAI endpoint, and offline batches over them.

``RayBackend`` and ``DataParallelEngine`` import Ray, so they load on first use
(``hetero-infer`` loads this plugin for every engine it builds).

Importing the package sets ``RAY_DEDUP_LOGS=0`` (unless the environment sets
it): Ray reads it on import, and without it folds the replicas' similar log
lines ("repeated 25x across cluster"), so requests would be missing from the
log. A program that imports Ray first sets it itself.
"""

from __future__ import annotations

import os
from typing import Any

os.environ.setdefault("RAY_DEDUP_LOGS", "0")

from hetero_serve_ray.routing import LeastLoaded, PrefixAffinity, RandomRouting, ReplicaLoad, RoutingPolicy  # noqa: E402

__all__ = [
    "DataParallelEngine",
    "LeastLoaded",
    "PrefixAffinity",
    "RandomRouting",
    "RayBackend",
    "ReplicaLoad",
    "RoutingPolicy",
]


def __getattr__(name: str) -> Any:
    if name == "RayBackend":
        from hetero_serve_ray.backend import RayBackend

        return RayBackend
    if name == "DataParallelEngine":
        from hetero_serve_ray.offline import DataParallelEngine

        return DataParallelEngine
    raise AttributeError(f"module 'hetero_serve_ray' has no attribute {name!r}")
