"""Offline generation over data-parallel replicas: the Python face of ``--input-file --data-parallel-size N``."""

from __future__ import annotations

from typing import Any

from hetero_core.config import EngineConfig
from hetero_core.server.client import BackendClient
from hetero_serve_ray.backend import RayBackend


class DataParallelEngine(BackendClient):
    """``data_parallel_size`` engines on Ray, used like one: ``generate(items, params)`` and ``stream(item, params)``.

    >>> with DataParallelEngine(EngineConfig(data_parallel_size=2)) as engine:  # doctest: +SKIP
    ...     choices = engine.generate(["Hello", [{"role": "user", "content": "Hi"}]], GenerationParams(max_tokens=8))

    ``generate`` returns every item's choices in input order (text, token ids, finish reason,
    prompt token count, error); ``options`` are :class:`RayBackend`'s (routing, resources, restarts).
    """

    def __init__(self, config: EngineConfig | None = None, *, ready_timeout: float = 600.0, **options: Any) -> None:
        super().__init__(RayBackend(config or EngineConfig(), **options), ready_timeout=ready_timeout)
