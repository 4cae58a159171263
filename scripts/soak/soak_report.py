"""The checks and the printed summary of scripts/soak/soak.py, kept apart from the traffic so they can be
tested on made-up figures."""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from soak_traffic import OK_OUTCOMES, Result

FAILURE_OUTCOMES = ("wrong", "5xx", "status", "error", "stuck")


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text -> {name{other labels}: value}, without the model_name label."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[re.sub(r'model_name="[^"]*",?', "", name).replace("{}", "")] = float(value)
    return out


def server_5xx(metrics: dict[str, float]) -> int:
    return int(
        sum(v for k, v in metrics.items() if re.match(r'edgellm_http_errors_total\{status="5\d\d"\}', k))
    )


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


@dataclass
class SoakReport:
    results: list[Result]
    sent: int  # requests started; each must have a Result
    idle_metrics: dict[str, float]  # before the load
    end_metrics: dict[str, float] | None  # once the server went idle again (None: it never did)
    health_status: int | None
    server_alive: bool
    rss_series: list[tuple[float, int]] = field(default_factory=list)  # (seconds, kB) over the run
    rss_after_warmup_kb: int | None = None
    rss_end_kb: int | None = None
    expect_preemption: bool = True
    max_rss_growth: float = 0.05
    stopped_early: str | None = None


def preemptions(r: SoakReport) -> float:
    name = "edgellm_num_preemptions_total"
    return (r.end_metrics or {}).get(name, 0) - r.idle_metrics.get(name, 0)


def rss_peak_kb(r: SoakReport, since: float) -> int | None:
    after = [kb for t, kb in r.rss_series if t >= since]
    return max(after) if after else None


def evaluate(r: SoakReport) -> list[tuple[str, bool, str]]:
    """(check, passed, detail) for every check the soak makes."""
    checks: list[tuple[str, bool, str]] = []
    bad = [x for x in r.results if x.outcome not in OK_OUTCOMES]
    checks.append(
        (
            "every request finished correctly or got its 4xx",
            not bad,
            f"{len(bad)} failed" + (" (listed above)" if bad else ""),
        )
    )
    client_5xx = sum(1 for x in r.results if x.status is not None and x.status >= 500)
    checks.append(("no 5xx seen by the clients", client_5xx == 0, f"{client_5xx}"))
    lost = r.sent - len(r.results)
    checks.append(("no lost requests (each one answered or failed)", lost == 0, f"{lost} lost"))
    checks.append(("load ran its full time", r.stopped_early is None, r.stopped_early or ""))
    checks.append(("server process alive", r.server_alive, ""))
    checks.append(("/health is 200 at the end", r.health_status == 200, f"status {r.health_status}"))
    m = r.end_metrics
    if m is None:
        checks.append(("server idle at the end (0 running, 0 waiting)", False, "/metrics did not answer"))
        return checks
    running, waiting = m.get("edgellm_num_requests_running"), m.get("edgellm_num_requests_waiting")
    checks.append(
        (
            "server idle at the end (0 running, 0 waiting)",
            running == 0 and waiting == 0,
            f"{running}, {waiting}",
        )
    )
    used, idle_used = (
        m.get("edgellm_kv_cache_blocks_used"),
        r.idle_metrics.get("edgellm_kv_cache_blocks_used"),
    )
    checks.append(
        ("KV blocks back to the idle count", used == idle_used, f"{used} used, {idle_used} when idle")
    )
    n5 = server_5xx(m)
    checks.append(("no 5xx in the server's /metrics", n5 == 0, f"{n5}"))
    if r.expect_preemption:
        pre = preemptions(r)
        checks.append(("the KV cache ran out (preemptions happened)", pre > 0, f"{pre:.0f} preemptions"))
    if r.rss_after_warmup_kb and r.rss_end_kb:
        growth = r.rss_end_kb / r.rss_after_warmup_kb - 1
        checks.append(
            (
                f"RSS growth after warm-up < {r.max_rss_growth:.0%}",
                growth < r.max_rss_growth,
                f"{r.rss_after_warmup_kb / 1024:.0f} -> {r.rss_end_kb / 1024:.0f} MiB ({growth:+.1%})",
            )
        )
    return checks


def failure_lines(results: list[Result]) -> list[str]:
    """Failed requests grouped by kind, case and outcome: count and the first one's detail."""
    groups: dict[tuple[str, str, str], list[Result]] = defaultdict(list)
    for x in results:
        if x.outcome not in OK_OUTCOMES:
            case = x.detail.split(":", 1)[0] if x.kind in ("malformed", "overlong") else ""
            groups[(x.kind, case, x.outcome)].append(x)
    if not groups:
        return []
    lines = ["failures (count, kind, case, outcome: first detail):"]
    for (kind, case, outcome), xs in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        lines.append(f"  {len(xs):6d}  {kind} {case} {outcome}: {xs[0].detail[:400]}")
    return lines


def format_summary(r: SoakReport, checks: list[tuple[str, bool, str]], warmup_end: float) -> str:
    lines = []
    by_kind: dict[str, Counter[str]] = defaultdict(Counter)
    latencies: dict[str, list[float]] = defaultdict(list)
    for x in r.results:
        by_kind[x.kind][x.outcome] += 1
        if x.outcome == "ok":
            latencies[x.kind].append(x.latency)
    cols = ["ok", "rejected", "dropped", *FAILURE_OUTCOMES]
    head = (
        f"{'kind':30s} {'total':>6s} " + " ".join(f"{c:>8s}" for c in cols) + f" {'p50 s':>7s} {'p99 s':>7s}"
    )
    lines += ["requests by kind and outcome (latency: end to end, correct answers only):", head]
    for kind in sorted(by_kind):
        c, lat = by_kind[kind], latencies[kind]
        counts = " ".join(f"{c[o]:8d}" for o in cols)
        p50, p99 = percentile(lat, 0.5), percentile(lat, 0.99)
        lines.append(f"{kind:30s} {sum(c.values()):6d} {counts} {p50:7.2f} {p99:7.2f}")
    total = Counter(x.outcome for x in r.results)
    all_lat = [x for v in latencies.values() for x in v]
    lines.append(
        f"{'all':30s} {len(r.results):6d} "
        + " ".join(f"{total[o]:8d}" for o in cols)
        + f" {percentile(all_lat, 0.5):7.2f} {percentile(all_lat, 0.99):7.2f}"
    )
    statuses = Counter(x.status for x in r.results if x.status is not None)
    n4 = sum(v for s, v in statuses.items() if 400 <= s < 500)
    n5 = sum(v for s, v in statuses.items() if s >= 500)
    lines.append(
        f"HTTP statuses of the checked responses: {dict(sorted(statuses.items()))} (4xx {n4}, 5xx {n5})"
    )
    stuck = total["stuck"]
    lines.append(
        f"requests sent {r.sent}, answered {len(r.results)}, lost {r.sent - len(r.results)}, stuck {stuck}"
    )
    m = r.end_metrics or {}
    if m:
        used, total_blocks = m.get("edgellm_kv_cache_blocks_used"), m.get("edgellm_kv_cache_blocks_total")
        lines.append(
            f"server /metrics at the end: running {m.get('edgellm_num_requests_running')}, waiting "
            f"{m.get('edgellm_num_requests_waiting')}, KV blocks used {used} of {total_blocks} (idle: "
            f"{r.idle_metrics.get('edgellm_kv_cache_blocks_used')}), preemptions {preemptions(r):.0f}, "
            f"5xx {server_5xx(m)}"
        )
        finished = {
            k.split('"')[1]: int(v) for k, v in m.items() if k.startswith("edgellm_request_success_total")
        }
        lines.append(f"server finish reasons: {finished}")
    if r.rss_series:

        def mib(kb: int | None) -> str:
            return "n/a" if kb is None else f"{kb / 1024:.1f}"

        peak = rss_peak_kb(r, warmup_end)
        lines.append(
            f"server RSS MiB: after warm-up {mib(r.rss_after_warmup_kb)}, end {mib(r.rss_end_kb)}, "
            f"peak after warm-up {mib(peak)}"
        )
        step = max(1, len(r.rss_series) // 40)
        series = ", ".join(f"{t:.0f}s:{kb / 1024:.1f}" for t, kb in r.rss_series[::step])
        lines.append(f"RSS series (MiB): {series}")
    else:
        lines.append("server RSS: not measured (no server pid: pass --pid with --url)")
    lines += failure_lines(r.results)
    lines.append("checks:")
    lines += [f"  {'PASS' if ok else 'FAIL'}  {name}" + (f"  ({d})" if d else "") for name, ok, d in checks]
    return "\n".join(lines)
