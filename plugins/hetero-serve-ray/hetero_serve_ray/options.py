"""The ``ray`` serving backend's options (``server.backend_options``), checked before Ray is imported."""

from __future__ import annotations

from typing import Any, Mapping

import attrs

from hetero_core.errors import ConfigError
from hetero_core.validators import named_options, number_in, optional

MAX_SECONDS = 3600.0


def _routing_name(_instance: Any, attribute: Any, value: Any) -> None:
    if not isinstance(value, str) or not value:
        raise ConfigError(
            f"{attribute.name} must be a policy name or 'package.module:factory', got {value!r}", param=attribute.name
        )


def _address(_instance: Any, attribute: Any, value: Any) -> None:
    if value is not None and (not isinstance(value, str) or not value):
        raise ConfigError(f"{attribute.name} must be host:port, 'auto' or null, got {value!r}", param=attribute.name)


@attrs.frozen
class RayBackendOptions:
    """What :class:`~hetero_serve_ray.backend.RayBackend` takes besides the config.

    :param address: the Ray cluster the replicas join (``host:port``, or ``auto`` for the one ``ray start`` made
        on this machine); None starts a private one-machine cluster.
    :param routing: a policy of :mod:`hetero_serve_ray.routing` by name, or ``"module:factory"``.
    :param routing_options: keyword options for the policy.
    :param num_cpus_per_replica: CPUs Ray reserves for each replica; also its default thread count.
    :param num_gpus_per_replica: GPUs Ray reserves for each replica (a fraction shares one).
    :param num_threads_per_replica: ``OMP_NUM_THREADS`` in each replica (default: its CPUs, rounded up).
    :param max_restarts: how often Ray restarts a replica that died (-1: always).
    :param health_check_interval: seconds between checks that a ready replica still answers.
    :param health_check_timeout: seconds a replica may take to answer one.
    """

    address: str | None = attrs.field(default=None, validator=_address)
    routing: str = attrs.field(default="prefix_affinity", validator=_routing_name)
    routing_options: Mapping[str, Any] = attrs.field(factory=dict, converter=named_options("routing_options"))
    num_cpus_per_replica: float = attrs.field(default=1, validator=number_in(0, 1024, error=ConfigError))
    num_gpus_per_replica: float = attrs.field(default=0, validator=number_in(0, 64, error=ConfigError))
    num_threads_per_replica: int | None = attrs.field(
        default=None, validator=optional(number_in(1, 1024, integer=True, error=ConfigError))
    )
    max_restarts: int = attrs.field(default=-1, validator=number_in(-1, 1_000_000, integer=True, error=ConfigError))
    health_check_interval: float = attrs.field(default=1.0, validator=number_in(0.01, MAX_SECONDS, error=ConfigError))
    health_check_timeout: float = attrs.field(default=10.0, validator=number_in(0.01, MAX_SECONDS, error=ConfigError))
