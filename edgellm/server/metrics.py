"""/metrics for one server: latency histograms the server records per finished request, counters of
finished requests and error responses, and the engine's gauges and counters (EngineStats) read at each
scrape; written by prometheus-client (the Prometheus project's own library: label escaping, the text
format both Prometheus and OpenMetrics parsers read). Names follow Prometheus conventions (`_seconds`,
`_total`); every sample carries the `model_name` label."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from edgellm.engine.outputs import RequestMetrics
from edgellm.engine.protocol import EngineStats

TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 20.0, 60.0)
ITL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5)
E2E_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 60.0, 120.0, 300.0)
CONTENT_TYPE = CONTENT_TYPE_LATEST

# EngineStats field -> (metric name, kind, help): read from the engine at each scrape.
ENGINE_METRICS = {
    "prompt_tokens_total": ("edgellm_prompt_tokens", "counter", "Prompt tokens admitted."),
    "generated_tokens_total": ("edgellm_generation_tokens", "counter", "Tokens generated."),
    "cached_tokens_total": ("edgellm_cached_prompt_tokens", "counter",
                            "Prompt tokens served from the prefix cache."),
    "num_running": ("edgellm_num_requests_running", "gauge", "Requests being generated."),
    "num_waiting": ("edgellm_num_requests_waiting", "gauge", "Requests waiting for a slot."),
    "kv_usage": ("edgellm_kv_cache_usage_ratio", "gauge", "Fraction of KV blocks held by live requests."),
    "kv_blocks_used": ("edgellm_kv_cache_blocks_used", "gauge", "KV blocks held by live requests."),
    "kv_blocks_total": ("edgellm_kv_cache_blocks_total", "gauge", "KV blocks in the cache."),
    "prefix_cache_hit_rate": ("edgellm_prefix_cache_hit_rate", "gauge",
                              "Share of looked-up prompt blocks found in the prefix cache."),
    "num_preemptions": ("edgellm_num_preemptions", "counter", "Requests preempted for KV space."),
    "spec_draft_tokens_total": ("edgellm_spec_draft_tokens", "counter", "Speculative draft tokens verified."),
    "spec_accepted_tokens_total": ("edgellm_spec_accepted_tokens", "counter",
                                   "Speculative draft tokens accepted."),
    "spec_pauses_total": ("edgellm_spec_pauses", "counter",
                          "Times a sequence's speculation paused (draft acceptance under the break-even)."),
    "spec_acceptance_rate": ("edgellm_spec_acceptance_rate", "gauge",
                             "Share of speculative draft tokens accepted."),
    "spec_mean_accepted_length": ("edgellm_spec_mean_accepted_length", "gauge",
                                  "Tokens a sequence gains per verify step (accepted drafts + 1)."),
}  # fmt: skip


class _EngineCollector:
    """The engine's EngineStats as metric families, from the snapshot render() was handed."""

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self.stats: EngineStats | None = None

    def collect(self) -> Iterator[Metric]:
        if self.stats is None:
            return
        for field, (name, kind, help_) in ENGINE_METRICS.items():
            family = (CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(
                name, help_, labels=["model_name"]
            )
            family.add_metric([self.model_name], getattr(self.stats, field))
            yield family


class ServerMetrics:
    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.engine = _EngineCollector(model_name)
        self.registry.register(self.engine)
        labels, reg = ["model_name"], self.registry

        def hist(name: str, help_: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, help_, labels, buckets=buckets, registry=reg).labels(model_name)

        self.ttft = hist("edgellm_time_to_first_token_seconds",
                         "Time from arrival to the first generated token.", TTFT_BUCKETS)  # fmt: skip
        self.itl = hist("edgellm_inter_token_latency_seconds",
                        "Time between consecutive generated tokens.", ITL_BUCKETS)  # fmt: skip
        self.e2e = hist("edgellm_e2e_request_latency_seconds",
                        "Time from arrival to the end of a request.", E2E_BUCKETS)  # fmt: skip
        finished = Counter("edgellm_request_success", "Finished requests by finish reason.",
                           [*labels, "finished_reason"], registry=reg)  # fmt: skip
        errors = Counter("edgellm_http_errors", "Error responses by HTTP status.", [*labels, "status"],
                         registry=reg)  # fmt: skip
        self._finished = lambda reason: finished.labels(model_name, reason)
        self._errors = lambda status: errors.labels(model_name, str(status))

    def observe_request(self, m: RequestMetrics, finish_reason: str) -> None:
        self._finished(finish_reason).inc()
        if m.ttft is not None:
            self.ttft.observe(m.ttft)
        for dt in m.inter_token_latencies:
            self.itl.observe(dt)
        if m.finished_time is not None:
            self.e2e.observe(m.finished_time - m.arrival_time)

    def count_error(self, status: int) -> None:
        self._errors(status).inc()

    def render(self, stats: EngineStats) -> str:
        self.engine.stats = stats
        return generate_latest(self.registry).decode()
