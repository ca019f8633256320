"""Prometheus metrics under vLLM's names, so existing dashboards work.

Counters and gauges are read from the engine's own counters at scrape time
(they cannot drift from what the engine did); latency histograms are
observed by the request handlers as tokens reach the client.
"""

from __future__ import annotations

from typing import Callable, Iterator

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from hetero_core.metrics import EngineMetrics
from hetero_core.sequence import FinishReason

LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)


class EngineCollector(Collector):
    """Exports the engine's counters and gauges when Prometheus scrapes."""

    def __init__(self, model_name: str, metrics: Callable[[], EngineMetrics | None]) -> None:
        self.model_name = model_name
        self.metrics = metrics

    def collect(self) -> Iterator:
        metrics = self.metrics()
        if metrics is None:
            return
        labels = ["model_name"]
        value = [self.model_name]

        def gauge(name: str, doc: str, amount: float) -> GaugeMetricFamily:
            family = GaugeMetricFamily(name, doc, labels=labels)
            family.add_metric(value, amount)
            return family

        def counter(name: str, doc: str, amount: float) -> CounterMetricFamily:
            family = CounterMetricFamily(name, doc, labels=labels)
            family.add_metric(value, amount)
            return family

        yield gauge("vllm:num_requests_running", "Sequences holding KV blocks.", metrics.num_running)
        yield gauge("vllm:num_requests_waiting", "Sequences waiting for admission.", metrics.num_waiting)
        yield gauge("vllm:kv_cache_usage_perc", "Fraction of KV blocks in use.", metrics.kv_cache_usage)
        yield gauge("vllm:gpu_cache_usage_perc", "Fraction of KV blocks in use (older name).", metrics.kv_cache_usage)
        yield counter("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", metrics.prefix_cache_queries)
        yield counter("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache.", metrics.prefix_cache_hits)
        yield counter("vllm:prompt_tokens", "Prompt tokens submitted.", metrics.prompt_tokens)
        yield counter("vllm:generation_tokens", "Tokens generated.", metrics.generation_tokens)
        yield counter("vllm:num_preemptions", "Sequences preempted.", metrics.num_preemptions)
        finished = CounterMetricFamily(
            "vllm:request_success", "Finished requests by finish reason.", labels=["model_name", "finished_reason"]
        )
        for reason in FinishReason:
            finished.add_metric([self.model_name, reason.value], metrics.requests_finished[reason])
        yield finished


class ServerMetrics:
    """The app's registry: engine counters plus latency histograms."""

    def __init__(self, model_name: str, metrics: Callable[[], EngineMetrics | None]) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(EngineCollector(model_name, metrics))
        self.model_name = model_name

        def histogram(name: str, doc: str) -> Histogram:
            return Histogram(name, doc, ["model_name"], buckets=LATENCY_BUCKETS, registry=self.registry).labels(model_name)

        self.time_to_first_token = histogram("vllm:time_to_first_token_seconds", "Time to the first token.")
        self.inter_token_latency = histogram("vllm:inter_token_latency_seconds", "Time between consecutive tokens of a sample.")
        self.time_per_output_token = histogram(
            "vllm:time_per_output_token_seconds", "Time between consecutive tokens of a sample (older name of inter_token_latency)."
        )
        self.request_time_per_output_token = histogram(
            "vllm:request_time_per_output_token_seconds", "Per sample: time from its first to its last token over the tokens after the first."
        )
        self.e2e_latency = histogram("vllm:e2e_request_latency_seconds", "Time from arrival to the last token.")

    def observe_inter_token_latency(self, seconds: float) -> None:
        self.inter_token_latency.observe(seconds)
        self.time_per_output_token.observe(seconds)
