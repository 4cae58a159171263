"""Load test for the OpenAI-compatible server: N concurrent streaming clients share a fixed number of
chat requests; reports requests/s, output tokens/s, TTFT and inter-token latency p50/p95/p99, errors and
goodput (share of requests with TTFT < 1 s and their own ITL p95 < 100 ms).

Bounded and local by design: the URL must be a loopback address, the request count is fixed, and every
request has a timeout.

    python scripts/bench/load_test.py --url http://127.0.0.1:8080 --clients 1 8 16 64 --requests 64
    python -m edgellm.server.loadgen ...            # the same
    python scripts/bench/load_test.py ... --json          # machine-readable

`main(argv)` is what `edgellm bench --url ...` calls; `run_level(...)` / `format_table(rows)` for callers
that build their own report.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import sys
import time
from dataclasses import dataclass, field
from urllib.parse import urlparse

try:  # the openai client's HTTP library: httpx, or httpx2 in recent openai releases
    import httpx
except ImportError:
    import httpx2 as httpx  # type: ignore[no-redef]

PROMPTS = [
    "Explain why the sky is blue in a few sentences.",
    "Write a short poem about the sea.",
    "List three uses of a paperclip.",
    "What is the difference between a list and a tuple in Python?",
    "Describe a sunrise over the mountains.",
    "Give me a recipe for a simple tomato soup.",
    "Why do cats purr?",
    "Summarize the plot of a detective story you invent.",
]
GOOD_TTFT_S = 1.0
GOOD_ITL_P95_S = 0.1


@dataclass
class RequestResult:
    ok: bool
    ttft: float = 0.0
    itls: list[float] = field(default_factory=list)
    tokens: int = 0
    error: str = ""


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    k = (len(s) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


async def one_request(client: httpx.AsyncClient, url: str, body: dict) -> RequestResult:
    t0 = time.perf_counter()
    last = None
    res = RequestResult(ok=False)
    try:
        async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                await r.aread()
                res.error = f"HTTP {r.status_code}"
                return res
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    res.ok = True
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    res.error = chunk["error"].get("message", "error")
                    return res
                if chunk.get("usage"):
                    res.tokens = chunk["usage"]["completion_tokens"]
                for c in chunk.get("choices", []):
                    if c.get("delta", {}).get("content"):
                        now = time.perf_counter()
                        if last is None:
                            res.ttft = now - t0
                        else:
                            res.itls.append(now - last)
                        last = now
    except (httpx.HTTPError, ValueError) as e:
        res.error = repr(e)
    if res.ok and last is None:  # nothing generated: count time to the end as TTFT
        res.ttft = time.perf_counter() - t0
    return res


async def run_level(url: str, clients: int, requests: int, max_tokens: int, timeout: float) -> dict:
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(requests):
        queue.put_nowait(i)
    results: list[RequestResult] = []
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)

    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:

        async def worker() -> None:
            while True:
                try:
                    i = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                body = {
                    "messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
                    "max_tokens": max_tokens,
                    "temperature": 0.7,
                    "seed": i,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                }
                results.append(await one_request(client, url, body))

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(clients)))
        wall = time.perf_counter() - t0
    ok = [r for r in results if r.ok]
    ttfts = [r.ttft for r in ok]
    itls = [x for r in ok for x in r.itls]
    good = [
        r for r in ok if r.ttft < GOOD_TTFT_S and (not r.itls or percentile(r.itls, 0.95) < GOOD_ITL_P95_S)
    ]
    return {
        "clients": clients,
        "requests": requests,
        "errors": len(results) - len(ok),
        "wall_s": wall,
        "requests_per_s": len(ok) / wall,
        "output_tok_per_s": sum(r.tokens for r in ok) / wall,
        "ttft_p50_ms": 1e3 * percentile(ttfts, 0.5),
        "ttft_p95_ms": 1e3 * percentile(ttfts, 0.95),
        "ttft_p99_ms": 1e3 * percentile(ttfts, 0.99),
        "itl_p50_ms": 1e3 * percentile(itls, 0.5),
        "itl_p95_ms": 1e3 * percentile(itls, 0.95),
        "itl_p99_ms": 1e3 * percentile(itls, 0.99),
        "goodput": len(good) / len(results) if results else 0.0,
        "first_error": next((r.error for r in results if not r.ok), ""),
    }


def format_table(rows: list[dict]) -> str:
    head = (
        "| clients | requests | req/s | out tok/s | TTFT p50/p95/p99 (ms) | ITL p50/p95/p99 (ms) "
        "| errors | goodput |\n"
        "|---:|---:|---:|---:|---:|---:|---:|---:|"
    )
    lines = [head]
    for r in rows:
        lines.append(
            f"| {r['clients']} | {r['requests']} | {r['requests_per_s']:.2f} | {r['output_tok_per_s']:.1f} | "
            f"{r['ttft_p50_ms']:.0f} / {r['ttft_p95_ms']:.0f} / {r['ttft_p99_ms']:.0f} | "
            f"{r['itl_p50_ms']:.0f} / {r['itl_p95_ms']:.0f} / {r['itl_p99_ms']:.0f} | "
            f"{r['errors']} | {100 * r['goodput']:.0f}% |"
        )
    return "\n".join(lines)


def _check_loopback(url: str) -> None:
    host = urlparse(url).hostname or ""
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise SystemExit(f"refusing to load-test {url}: only loopback addresses are allowed")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8080")
    p.add_argument("--clients", type=int, nargs="+", default=[1, 8, 16, 64])
    p.add_argument("--requests", type=int, default=64, help="requests per concurrency level")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    url = a.url.rstrip("/")
    _check_loopback(url)
    if a.requests < 1 or a.requests > 10_000 or min(a.clients) < 1 or max(a.clients) > 1024:
        raise SystemExit("requests must be in 1..10000 and clients in 1..1024")
    rows = []
    for n in a.clients:
        rows.append(asyncio.run(run_level(url, n, max(a.requests, n), a.max_tokens, a.timeout)))
        if not a.json:
            print(f"done: {n} clients", file=sys.stderr, flush=True)
    print(json.dumps(rows, indent=1) if a.json else format_table(rows))
    return 1 if any(r["errors"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
