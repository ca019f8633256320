"""Offline generation over data-parallel replicas: the Python face of ``--input-file --data-parallel-size N``."""

from __future__ import annotations

from typing import Any

from hetero_core.config import EngineConfig
from hetero_serve_openai.client import BackendClient
from hetero_serve_ray.backend import RayBackend
from hetero_serve_ray.options import RayBackendOptions


class DataParallelEngine(BackendClient):
    """``data_parallel_size`` engines on Ray, used like one: ``generate(items, params)`` and ``stream(item, params)``.

    >>> with DataParallelEngine(EngineConfig(data_parallel_size=2)) as engine:  # doctest: +SKIP
    ...     choices = engine.generate(["Hello", [{"role": "user", "content": "Hi"}]], GenerationParams(max_tokens=8))

    ``generate`` returns every item's choices in input order (text, token ids, finish reason,
    prompt token count, failure); ``options`` are :class:`~hetero_serve_ray.options.RayBackendOptions`' fields
    (routing, resources, restarts), checked the same way as in ``server.backend_options``.
    """

    def __init__(self, config: EngineConfig | None = None, *, ready_timeout: float = 600.0, **options: Any) -> None:
        super().__init__(
            RayBackend(config or EngineConfig(), RayBackendOptions(**options)), ready_timeout=ready_timeout
        )
