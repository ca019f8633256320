"""Prometheus metrics under vLLM's names, so existing dashboards work.

Counters and gauges are read from the engine's own counters at scrape time
(they cannot drift from what the engine did); latency histograms are
observed by the request handlers as tokens reach the client.
"""

from __future__ import annotations

from typing import Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from hetero_core.metrics import EngineMetrics
from hetero_core.sequence import FinishReason
from hetero_core.serving import SINGLE_ENGINE

LATENCY_BUCKETS = (
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)


GAUGES = (
    ("vllm:num_requests_running", "Sequences holding KV blocks.", "num_running"),
    ("vllm:num_requests_waiting", "Sequences waiting for admission.", "num_waiting"),
    ("vllm:kv_cache_usage_perc", "Fraction of KV blocks in use.", "kv_cache_usage"),
    ("vllm:gpu_cache_usage_perc", "Fraction of KV blocks in use (older name).", "kv_cache_usage"),
    (
        "hetero:spec_decode_mean_accepted_length",
        "Speculative proposals kept per verifying sequence step.",
        "mean_accepted_length",
    ),
)
COUNTERS = (
    ("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", "prefix_cache_queries"),
    ("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache.", "prefix_cache_hits"),
    ("vllm:prompt_tokens", "Prompt tokens submitted.", "prompt_tokens"),
    ("vllm:generation_tokens", "Tokens generated.", "generation_tokens"),
    ("vllm:num_preemptions", "Sequences preempted.", "num_preemptions"),
    ("vllm:spec_decode_num_drafts", "Sequence steps that verified speculative proposals.", "speculative_verifications"),
    ("vllm:spec_decode_num_draft_tokens", "Speculative tokens proposed.", "speculative_proposed_tokens"),
    ("vllm:spec_decode_num_accepted_tokens", "Speculative tokens kept.", "speculative_accepted_tokens"),
)


class EngineCollector(Collector):
    """Exports the engines' counters and gauges when Prometheus scrapes; replicas get a ``replica`` label."""

    def __init__(self, model_name: str, metrics: Callable[[], Mapping[str, EngineMetrics]]) -> None:
        self.model_name = model_name
        self.metrics = metrics

    def collect(self) -> Iterator:
        by_replica = self.metrics()
        if not by_replica:
            return
        replicated = SINGLE_ENGINE not in by_replica
        labels = ["model_name", "replica"] if replicated else ["model_name"]

        def values(replica: str) -> list[str]:
            return [self.model_name, replica] if replicated else [self.model_name]

        for family_type, table in ((GaugeMetricFamily, GAUGES), (CounterMetricFamily, COUNTERS)):
            for name, doc, field in table:
                family = family_type(name, doc, labels=labels)
                for replica, metrics in by_replica.items():
                    family.add_metric(values(replica), getattr(metrics, field))
                yield family
        finished = CounterMetricFamily(
            "vllm:request_success", "Finished requests by finish reason.", labels=[*labels, "finished_reason"]
        )
        for replica, metrics in by_replica.items():
            for reason in FinishReason:
                finished.add_metric([*values(replica), reason.value], metrics.requests_finished[reason])
        yield finished


class ServerMetrics:
    """The app's registry: engine counters plus latency histograms."""

    def __init__(self, model_name: str, metrics: Callable[[], Mapping[str, EngineMetrics]]) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(EngineCollector(model_name, metrics))
        self.model_name = model_name

        def histogram(name: str, doc: str) -> Histogram:
            return Histogram(name, doc, ["model_name"], buckets=LATENCY_BUCKETS, registry=self.registry).labels(
                model_name
            )

        self.time_to_first_token = histogram("vllm:time_to_first_token_seconds", "Time to the first token.")
        self.inter_token_latency = histogram(
            "vllm:inter_token_latency_seconds", "Time between consecutive tokens of a sample."
        )
        self.time_per_output_token = histogram(
            "vllm:time_per_output_token_seconds",
            "Time between consecutive tokens of a sample (older name of inter_token_latency).",
        )
        self.request_time_per_output_token = histogram(
            "vllm:request_time_per_output_token_seconds",
            "Per sample: time from its first to its last token over the tokens after the first.",
        )
        self.e2e_latency = histogram("vllm:e2e_request_latency_seconds", "Time from arrival to the last token.")

    def observe_inter_token_latency(self, seconds: float) -> None:
        self.inter_token_latency.observe(seconds)
        self.time_per_output_token.observe(seconds)
