"""A replica's counters across its restarts and front-end failures, without a cluster;
a refused connection explained."""

from __future__ import annotations

from hetero_core.metrics import EngineMetrics
from hetero_core.sequence import FinishReason
from hetero_serve_ray.cluster import connection_failure
from hetero_serve_ray.fleet import Replica, add_counters


def engine_counters(submitted: int, finished: int, running: int) -> EngineMetrics:
    metrics = EngineMetrics(
        requests_submitted=submitted, generation_tokens=10 * finished, num_running=running, kv_cache_usage=0.5
    )
    metrics.requests_finished[FinishReason.LENGTH] = finished
    return metrics


def test_counters_add_up_over_incarnations_and_gauges_are_the_live_ones() -> None:
    replica = Replica(0, actor=None, is_ready=True, metrics=engine_counters(5, 4, 1))
    replica.count_failure()
    replica.past = add_counters(replica.past, replica.metrics)  # Ray restarted it
    replica.metrics = engine_counters(2, 1, 1)
    total = replica.counters()
    assert (total.requests_submitted, total.generation_tokens, total.num_running, total.kv_cache_usage) == (
        7,
        50,
        1,
        0.5,
    )
    assert total.requests_finished[FinishReason.LENGTH] == 5 and total.requests_finished[FinishReason.ERROR] == 1
    replica.is_ready = False  # lost again: counters stay, gauges go to 0
    lost = replica.counters()
    assert lost.requests_submitted == 7 and (lost.num_running, lost.kv_cache_usage) == (0, 0.0)
    assert replica.past.requests_submitted == 5  # counters() changed nothing


def test_an_authentication_failure_in_rays_exception_chain_is_named() -> None:
    cause = RuntimeError(
        "Failed to connect to GCS. Last connection error: Traceback (most recent call last):\n  ...\n"
        "ray.exceptions.AuthenticationError: RPC error: InvalidAuthToken: Authentication token is missing or incorrect."
        " Note: RAY_AUTH_MODE is currently 'disabled' (not 'token')."
    )
    refused = ConnectionError("Failed to connect to Ray cluster at 10.0.0.1:6379")
    refused.__cause__ = cause
    message = connection_failure("10.0.0.1:6379", refused)
    assert message.startswith("the Ray cluster at 10.0.0.1:6379 uses token authentication and refused this process")
    assert (
        "(RPC error: InvalidAuthToken: Authentication token is missing or incorrect)" in message
        and "RAY_AUTH_MODE=token" in message
    )
    unreachable = ConnectionError("Failed to connect to Ray cluster at 10.0.0.1:6379")
    unreachable.__cause__ = RuntimeError("Failed to connect to GCS. Last connection error: timed out")
    assert connection_failure("10.0.0.1:6379", unreachable) == "Failed to connect to Ray cluster at 10.0.0.1:6379"
