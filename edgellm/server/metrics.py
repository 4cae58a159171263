"""Prometheus text exposition for /metrics: latency histograms the server records per finished request,
plus the engine's gauges and counters (EngineStats). Hand-written (a few dozen lines) rather than a
prometheus_client dependency; names follow Prometheus conventions (`_seconds`, `_total`)."""

from __future__ import annotations

import bisect
from collections import Counter

from edgellm.engine.outputs import RequestMetrics
from edgellm.engine.protocol import EngineStats

TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 20.0, 60.0)
ITL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5)
E2E_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 60.0, 120.0, 300.0)


class Histogram:
    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)  # last one is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.count += 1

    def lines(self, name: str, labels: str) -> list[str]:
        out, cumulative = [], 0
        for le, c in zip((*(repr(b) for b in self.buckets), "+Inf"), self.counts, strict=True):
            cumulative += c
            out.append(f'{name}_bucket{{{labels},le="{le}"}} {cumulative}')
        out += [f"{name}_sum{{{labels}}} {self.sum!r}", f"{name}_count{{{labels}}} {self.count}"]
        return out


class ServerMetrics:
    def __init__(self, model_name: str) -> None:
        self.labels = f'model_name="{model_name}"'
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.e2e = Histogram(E2E_BUCKETS)
        self.finished: Counter[str] = Counter()  # finish_reason -> requests
        self.http_errors: Counter[int] = Counter()  # status -> responses

    def observe_request(self, m: RequestMetrics, finish_reason: str) -> None:
        self.finished[finish_reason] += 1
        if m.ttft is not None:
            self.ttft.observe(m.ttft)
        for dt in m.inter_token_latencies:
            self.itl.observe(dt)
        if m.finished_time is not None:
            self.e2e.observe(m.finished_time - m.arrival_time)

    def render(self, s: EngineStats) -> str:
        lb = self.labels
        lines: list[str] = []

        def metric(name: str, kind: str, help_: str, value: float | int) -> None:
            lines.extend([f"# HELP {name} {help_}", f"# TYPE {name} {kind}", f"{name}{{{lb}}} {value}"])

        def hist(name: str, help_: str, h: Histogram) -> None:
            lines.extend([f"# HELP {name} {help_}", f"# TYPE {name} histogram", *h.lines(name, lb)])

        hist(
            "edgellm_time_to_first_token_seconds",
            "Time from arrival to the first generated token.",
            self.ttft,
        )
        hist("edgellm_inter_token_latency_seconds", "Time between consecutive generated tokens.", self.itl)
        hist("edgellm_e2e_request_latency_seconds", "Time from arrival to the end of a request.", self.e2e)
        metric("edgellm_prompt_tokens_total", "counter", "Prompt tokens admitted.", s.prompt_tokens_total)
        metric("edgellm_generation_tokens_total", "counter", "Tokens generated.", s.generated_tokens_total)
        metric(
            "edgellm_cached_prompt_tokens_total",
            "counter",
            "Prompt tokens served from the prefix cache.",
            s.cached_tokens_total,
        )
        metric("edgellm_num_requests_running", "gauge", "Requests being generated.", s.num_running)
        metric("edgellm_num_requests_waiting", "gauge", "Requests waiting for a slot.", s.num_waiting)
        metric(
            "edgellm_kv_cache_usage_ratio",
            "gauge",
            "Fraction of KV blocks held by live requests.",
            s.kv_usage,
        )
        metric("edgellm_kv_cache_blocks_used", "gauge", "KV blocks held by live requests.", s.kv_blocks_used)
        metric("edgellm_kv_cache_blocks_total", "gauge", "KV blocks in the cache.", s.kv_blocks_total)
        metric(
            "edgellm_prefix_cache_hit_rate",
            "gauge",
            "Share of looked-up prompt blocks found in the prefix cache.",
            s.prefix_cache_hit_rate,
        )
        metric(
            "edgellm_num_preemptions_total", "counter", "Requests preempted for KV space.", s.num_preemptions
        )
        metric(
            "edgellm_spec_draft_tokens_total",
            "counter",
            "Speculative draft tokens verified.",
            s.spec_draft_tokens_total,
        )
        metric(
            "edgellm_spec_accepted_tokens_total",
            "counter",
            "Speculative draft tokens accepted.",
            s.spec_accepted_tokens_total,
        )
        metric(
            "edgellm_spec_pauses_total",
            "counter",
            "Times a sequence's speculation paused (draft acceptance under the break-even).",
            s.spec_pauses_total,
        )
        metric(
            "edgellm_spec_acceptance_rate",
            "gauge",
            "Share of speculative draft tokens accepted.",
            s.spec_acceptance_rate,
        )
        metric(
            "edgellm_spec_mean_accepted_length",
            "gauge",
            "Tokens a sequence gains per verify step (accepted drafts + 1).",
            s.spec_mean_accepted_length,
        )
        name = "edgellm_request_success_total"
        lines += [f"# HELP {name} Finished requests by finish reason.", f"# TYPE {name} counter"]
        lines += [f'{name}{{{lb},finished_reason="{r}"}} {c}' for r, c in sorted(self.finished.items())]
        name = "edgellm_http_errors_total"
        lines += [f"# HELP {name} Error responses by HTTP status.", f"# TYPE {name} counter"]
        lines += [f'{name}{{{lb},status="{st}"}} {c}' for st, c in sorted(self.http_errors.items())]
        return "\n".join(lines) + "\n"
