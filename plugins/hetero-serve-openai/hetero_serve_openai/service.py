"""What every endpoint shares: the backend, the served model's name, the metrics and the generations in flight."""

from __future__ import annotations

import time

import attrs

from hetero_core.config import EngineConfig
from hetero_core.serving import ServingBackend
from hetero_serve_openai.errors import APIError
from hetero_serve_openai.generation import Generation
from hetero_serve_openai.metrics import ServerMetrics


@attrs.define
class Service:
    config: EngineConfig
    backend: ServingBackend
    model_name: str
    metrics: ServerMetrics
    live: set[Generation] = attrs.field(factory=set)  # generations whose client is still waiting
    started: int = attrs.field(factory=lambda: int(time.time()))  # the model cards' ``created``

    def ready_backend(self, requested_model: str | None) -> ServingBackend:
        """The backend, if it serves ``requested_model`` and can take a request now; else the APIError saying why."""
        if requested_model is not None and requested_model != self.model_name:
            raise APIError(
                404,
                f"the model {requested_model!r} does not exist; this server serves {self.model_name!r}",
                param="model",
                code="model_not_found",
            )
        if self.backend.error is not None:
            raise APIError(503, "the backend is out of service")
        if not self.backend.is_ready:
            raise APIError(503, "the model is still loading", headers={"Retry-After": "5"})
        return self.backend

    def end_all(self, failure: APIError) -> int:
        """Fail every generation still in flight with ``failure`` (the drain timeout passed); how many there were."""
        ending = list(self.live)
        for generation in ending:
            generation.end(failure)
        return len(ending)
