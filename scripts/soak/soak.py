"""Soak test for `edgellm serve`: minutes of mixed load, then checks that every request was answered
correctly and that nothing leaked.

    python scripts/soak/soak.py --minutes 10                     # starts its own server (smollm2-135m)
    python scripts/soak/soak.py --minutes 3 --url http://127.0.0.1:8080 --pid 1234   # a running server

The mix (soak_traffic.py, soak_bad_requests.py): greedy and sampled chat and completion requests,
streaming and not, through the openai client and raw httpx; n>1 with stop strings; clients that leave
after the first chunk, mid-stream or while waiting for a non-streamed answer; over-long prompts and
malformed bodies (4xx expected, never 5xx); attacks on the HTTP layer (near-miss paths with a foreign
Host header, folded headers, wrong Authorization values: 4xx, never a redirect); and bursts of long
requests that overflow the KV cache so the scheduler preempts. Greedy answers are compared with
references taken from the idle server first.

At the end it waits for the server to go idle and checks /metrics (0 running, 0 waiting, KV blocks
back to the idle count, no 5xx), /health, and the server's RSS growth after warm-up (from
/proc/PID/status). It prints a summary and exits 1 if any check fails.

Bounded: traffic goes to loopback only, the load stops after --minutes (or --max-requests), every
request has a timeout, and a server it started is stopped on exit. The server it starts has the
smallest KV cache that holds one context (ctx/16 + 1 blocks), through `--kv-cache-memory`, and a random
`--api-key` that the good requests send.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import openai
from soak_bad_requests import (
    OVERLONG_NAMES,
    RAW,
    http_attacks,
    malformed_bodies,
    overlong_bodies,
    send_bad,
    send_raw,
)
from soak_report import SoakReport, evaluate, format_summary, parse_metrics
from soak_server import check_loopback, eog_ids, read_rss_kb, start_server, stop_server
from soak_traffic import (
    CHAT_PROMPTS,
    COMPLETION_PROMPTS,
    DROP_KINDS,
    KINDS,
    LONG_PROMPTS,
    SHORT_TOKENS,
    Failed,
    Reference,
    Result,
    Traffic,
    chat_body,
    completion_body,
    httpx,
    long_greedy,
)

BAD_WEIGHT = 4  # share of malformed / over-long requests in the mix, against KINDS' weights


async def take_references(t: Traffic) -> None:
    """Greedy answers from the idle server, one request at a time."""
    for p in CHAT_PROMPTS:
        r = (
            await t.http.post(
                f"{t.url}/v1/chat/completions", json=chat_body(t, p, max_tokens=SHORT_TOKENS, temperature=0)
            )
        ).json()
        t.chat_refs[p] = Reference(
            r["choices"][0]["message"]["content"],
            r["choices"][0]["finish_reason"],
            r["usage"]["completion_tokens"],
        )
    for refs, prompts, n in (
        (t.completion_refs, COMPLETION_PROMPTS, SHORT_TOKENS),
        (t.long_refs, LONG_PROMPTS, 0),
    ):
        for p in prompts:
            extra = {"logit_bias": t.no_eos, "max_tokens": t.long_tokens} if n == 0 else {"max_tokens": n}
            r = await t.http.post(
                f"{t.url}/v1/completions", json=completion_body(t, p, temperature=0, **extra)
            )
            r = r.json()
            refs[p] = Reference(
                r["choices"][0]["text"], r["choices"][0]["finish_reason"], r["usage"]["completion_tokens"]
            )


async def run_one(kind: str, coro, timeout: float) -> Result:
    t0 = time.monotonic()
    res = Result(kind, "ok")
    try:
        status = await asyncio.wait_for(coro, timeout)
        res.status = status if isinstance(status, int) else 200
        res.outcome = "dropped" if kind in DROP_KINDS else "rejected" if res.status >= 400 else "ok"
    except Failed as e:
        res.outcome, res.status, res.detail = "wrong", e.status, str(e)
    except (openai.APIStatusError, httpx.HTTPStatusError) as e:
        res.status = e.status_code if isinstance(e, openai.APIStatusError) else e.response.status_code
        res.outcome, res.detail = ("5xx" if res.status >= 500 else "status"), str(e)[:300]
    except (TimeoutError, httpx.TimeoutException, openai.APITimeoutError):
        res.outcome, res.detail = "stuck", f"no answer in {timeout:.0f} s"
    except Exception as e:  # noqa: BLE001 - any other failure is reported, not fatal to the soak
        res.outcome, res.detail = "error", repr(e)[:300]
    if res.status is not None and res.status >= 500:
        res.outcome = "5xx"
    res.latency = time.monotonic() - t0
    return res


async def health(url: str, tries: int = 3) -> int | str:
    """/health's status on a new connection (a pooled one may have been closed by the server after a
    500), retried a few times; the last error's repr if it never answered."""
    status: int | str = "no answer"
    for i in range(tries):
        try:
            async with httpx.AsyncClient(timeout=10) as c:
                status = (await c.get(f"{url}/health")).status_code
            if status == 200:
                break
        except httpx.HTTPError as e:
            status = repr(e)
        await asyncio.sleep(1.0 * (i + 1))
    return status


class Load:
    def __init__(self, t: Traffic, a: argparse.Namespace, end: float) -> None:
        self.t, self.a, self.end = t, a, end
        self.results: list[Result] = []
        self.sent = 0
        self.stopped_early: str | None = None  # why the load stopped before its time
        skip = set(a.exclude)
        cases = malformed_bodies(t.model) + overlong_bodies(t) + http_attacks(a.api_key)
        self.bad = [b for b in cases if b[0] not in skip]
        kinds = {k: v for k, v in KINDS.items() if k not in skip}
        self.names = [*kinds, *(["bad"] if self.bad else [])]
        self.weights = [w for _, w in kinds.values()] + ([BAD_WEIGHT] if self.bad else [])

    def more(self) -> bool:
        return time.monotonic() < self.end and self.sent < self.a.max_requests and not self.stopped_early

    async def one(self, kind: str) -> None:
        if kind == "bad":
            await self.one_bad(self.t.rng.choice(self.bad))
            return
        self.sent += 1
        await self.record(await run_one(kind, KINDS[kind][0](self.t), self.a.request_timeout))

    async def one_bad(self, case: tuple[str, str, bytes, set[int]]) -> None:
        name, path, raw, accepted = case
        self.sent += 1
        kind = "overlong" if name in OVERLONG_NAMES else "malformed"
        send = send_raw if path == RAW else send_bad
        res = await run_one(kind, send(self.t, path, raw, accepted), self.a.request_timeout)
        res.detail = f"{name}: {res.detail}"
        await self.record(res)

    async def record(self, res: Result) -> None:
        """Keep the result; after a server error, stop the load if the server is no longer healthy
        (a dead engine answers every request at once: the soak would only count the same failure)."""
        self.results.append(res)
        if res.outcome in ("5xx", "error") and not self.stopped_early:
            status = await health(self.t.url)
            if status != 200 and not self.stopped_early:
                self.stopped_early = f"/health answered {status} after {self.sent} requests"
                print(f"soak: stopping the load: {self.stopped_early}", flush=True)

    async def worker(self) -> None:
        while self.more():
            await self.one(self.t.rng.choices(self.names, self.weights)[0])

    async def bursts(self, size: int) -> None:
        """Waves of long greedy requests, all at once: together they need more KV blocks than there are."""
        while self.more():
            n = min(size, self.a.max_requests - self.sent)
            await asyncio.gather(*(self._long() for _ in range(n)))

    async def _long(self) -> None:
        self.sent += 1
        await self.record(await run_one("long_greedy_burst", long_greedy(self.t), self.a.request_timeout))


async def sample_rss(pid: int, t0: float, series: list[tuple[float, int]], every: float) -> None:
    while True:
        kb = read_rss_kb(pid)
        if kb is not None:
            series.append((time.monotonic() - t0, kb))
        await asyncio.sleep(every)


async def metrics(t: Traffic) -> dict[str, float]:
    return parse_metrics((await t.http.get(f"{t.url}/metrics")).text)


async def wait_idle(
    t: Traffic, idle: dict[str, float], timeout: float, proc: subprocess.Popen | None
) -> dict[str, float] | None:
    deadline, m = time.monotonic() + timeout, None
    while time.monotonic() < deadline and (proc is None or proc.poll() is None):
        try:
            m = await metrics(t)
        except httpx.HTTPError:
            m = None
        if (
            m
            and m["edgellm_num_requests_running"] == 0
            and m["edgellm_num_requests_waiting"] == 0
            and (m["edgellm_kv_cache_blocks_used"] == idle["edgellm_kv_cache_blocks_used"])
        ):
            return m
        await asyncio.sleep(0.5)
    return m


async def soak(a: argparse.Namespace, url: str, pid: int | None, proc: subprocess.Popen | None) -> int:
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=16)
    auth = {"Authorization": f"Bearer {a.api_key}"} if a.api_key else {}
    http = httpx.AsyncClient(timeout=a.request_timeout, limits=limits, headers=auth)
    key = a.api_key or "soak"
    api = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=a.request_timeout)
    model = (await http.get(f"{url}/v1/models")).json()["data"][0]
    no_eos = {str(i): -100 for i in a.no_eos_ids}
    t = Traffic(
        url, model["id"], model["max_model_len"], http, api, random.Random(a.seed), no_eos, a.long_tokens
    )
    t.one_token_id = (await http.post(f"{url}/tokenize", json={"content": "hello"})).json()["tokens"][-1]
    t0 = time.monotonic()
    await take_references(t)
    idle = await metrics(t)
    blocks = idle["edgellm_kv_cache_blocks_total"]
    per_long = math.ceil((8 + a.long_tokens) / 16)  # a long prompt is a few tokens
    burst = a.burst or min(16, math.ceil(1.5 * blocks / per_long))
    print(
        f"soak: {t.model} at {url} (pid {pid}), context {t.ctx}, {blocks:.0f} KV blocks; references taken in "
        f"{time.monotonic() - t0:.0f} s; {a.workers} workers + bursts of {burst} long requests for "
        f"{a.minutes} min (warm-up {a.warmup:.0f} s)",
        flush=True,
    )
    series: list[tuple[float, int]] = []
    t_load = time.monotonic()
    sampler = asyncio.ensure_future(sample_rss(pid, t_load, series, a.rss_every)) if pid else None
    load = Load(t, a, t_load + a.minutes * 60)
    for case in load.bad:  # every bad request once, whatever the mix draws later
        await load.one_bad(case)
    tasks = [asyncio.ensure_future(load.worker()) for _ in range(a.workers)]
    if "long_greedy_burst" not in a.exclude:
        tasks.append(asyncio.ensure_future(load.bursts(burst)))
    await asyncio.sleep(min(a.warmup, a.minutes * 60))
    rss_warm = read_rss_kb(pid) if pid else None
    print(f"soak: warm-up over after {load.sent} requests; RSS {rss_warm} kB", flush=True)
    done, pending = await asyncio.wait(tasks, timeout=a.minutes * 60 - a.warmup + a.request_timeout + 30)
    for task in pending:  # cannot happen while run_one bounds every request; counted as lost if it does
        task.cancel()
    end = await wait_idle(t, idle, a.idle_timeout, proc)
    if sampler:
        sampler.cancel()
    final_health = await health(url)
    report = SoakReport(
        results=load.results,
        sent=load.sent,
        idle_metrics=idle,
        end_metrics=end,
        health_status=final_health if isinstance(final_health, int) else None,
        server_alive=proc.poll() is None if proc else isinstance(final_health, int),
        rss_series=series,
        rss_after_warmup_kb=rss_warm,
        rss_end_kb=read_rss_kb(pid) if pid else None,
        expect_preemption=proc is not None and "long_greedy_burst" not in a.exclude,
        stopped_early=load.stopped_early,
        max_rss_growth=a.max_rss_growth,
    )
    await http.aclose()
    await api.close()
    checks = evaluate(report)
    print(format_summary(report, checks, a.warmup), flush=True)
    return 0 if all(ok for _, ok, _ in checks) else 1


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=10.0, help="length of the load (after the references)")
    p.add_argument("--url", default=None, help="a running server (loopback only) instead of starting one")
    p.add_argument("--pid", type=int, default=None, help="with --url: the server's pid, for the RSS check")
    p.add_argument("--model", default="smollm2-135m", help="catalog name or .gguf path (started server)")
    p.add_argument("--ctx", type=int, default=512, help="context of the started server")
    p.add_argument("--max-num-seqs", type=int, default=8)
    p.add_argument("--max-queue", type=int, default=64)
    p.add_argument("--threads", type=int, default=1, help="kernel threads of the started server")
    p.add_argument("--kv-cache-bytes", type=int, default=0, help="KV budget; 0: one context's worth")
    p.add_argument("--workers", type=int, default=6, help="clients sending the mixed requests")
    p.add_argument("--burst", type=int, default=0, help="long requests per wave (0: 1.5x the KV cache)")
    p.add_argument("--long-tokens", type=int, default=160, help="tokens each long request generates")
    p.add_argument("--no-eos-ids", type=int, nargs="*", default=None, help="end ids the long requests ban")
    p.add_argument("--max-requests", type=int, default=100_000)
    p.add_argument("--request-timeout", type=float, default=300.0, help="a request slower than this is stuck")
    p.add_argument(
        "--idle-timeout", type=float, default=60.0, help="wait this long for the server to go idle"
    )
    p.add_argument(
        "--warmup", type=float, default=None, help="seconds before the RSS baseline (20%% of the run)"
    )
    p.add_argument("--max-rss-growth", type=float, default=0.05)
    p.add_argument("--rss-every", type=float, default=2.0, help="seconds between RSS samples")
    p.add_argument("--start-timeout", type=float, default=600.0, help="for the server to load (cold Numba)")
    p.add_argument(
        "--api-key", default=None, help="the key of the server at --url (a started server gets a random one)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--exclude",
        nargs="*",
        default=[],
        help="request kinds or bad-request names to leave out (e.g. to get past a known bug)",
    )
    a = p.parse_args(argv)
    if a.minutes <= 0 or a.workers < 1 or a.max_requests < 1 or a.burst < 0 or a.long_tokens < 1:
        p.error("--minutes, --workers, --max-requests and --long-tokens must be positive, --burst >= 0")
    bad = malformed_bodies("") + http_attacks("key")
    known = {*KINDS, "long_greedy_burst", *OVERLONG_NAMES, *(b[0] for b in bad)}
    if set(a.exclude) - known:
        p.error(f"--exclude: unknown {sorted(set(a.exclude) - known)}; known: {sorted(known)}")
    if a.url is None and a.api_key is None:
        a.api_key = f"soak-{secrets.token_hex(8)}"
    if a.warmup is None:
        a.warmup = min(120.0, max(20.0, a.minutes * 60 * 0.2))
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if a.no_eos_ids is None:
        a.no_eos_ids = [] if a.url else eog_ids(a.model)
    if a.url:
        check_loopback(a.url)
        return asyncio.run(soak(a, a.url.rstrip("/"), a.pid, None))
    with tempfile.NamedTemporaryFile("w", prefix="edgellm-soak-", suffix=".log", delete=False) as log:
        proc, url = start_server(a, log)
        try:
            code = asyncio.run(soak(a, url, proc.pid, proc))
        finally:
            stop_server(proc)
    if proc.returncode not in (0, -signal.SIGINT):
        tail = Path(log.name).read_text(errors="replace").splitlines()[-15:]
        print(f"the server exited with {proc.returncode}; the end of its log:", *tail, sep="\n")
    print(f"server log: {log.name}")
    return code


if __name__ == "__main__":
    sys.exit(main())
