"""Figures for `edgellm serve --replicas` against the single server, on this machine, measured in
alternating rounds with all servers up at once (so background load hits both alike):

* prefix: 8 + 8 chats on two ~1,000-token system prompts, interleaved (one of each in flight): which
  replica served each prefix, and TTFT of the first request of a prefix (miss) and of the rest (hits),
  Ray (2 replicas x 1 thread) vs one server with 1 thread;
* overhead: sequential 1-token requests, median latency, Ray vs one server of the same size (1 thread);
* throughput: aggregate output tok/s with 16 clients (edgellm.server.loadgen), Ray 2 x 1 thread vs one
  server x 2 threads (and x 1 thread). On a 2-core machine that measures the overhead of the Ray path,
  not scaling.

    python scripts/bench/ray_serve_bench.py [--rounds 3] [--model smollm2-135m]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time

from edgellm.server.loadgen import run_level
from edgellm.testing.ab import round_order
from edgellm.testing.servers import LONG_SYSTEM_PROMPTS, httpx, start_server, stop_server, stream_chat


def question(i: int) -> list[dict]:
    return [{"role": "user", "content": f"Question {i}: say something short."}]


async def prefix_round(url: str, tag: str) -> dict:
    """8 + 8 interleaved chats on two long system prompts made new by `tag` (no hits from earlier rounds)."""
    async with httpx.AsyncClient(timeout=600) as client:
        rows = []
        for i in range(8):
            pair = []
            for k, text in LONG_SYSTEM_PROMPTS.items():
                msgs = [{"role": "system", "content": f"[{tag}-{k}] {text}"}, *question(i)]
                pair.append(stream_chat(client, url, msgs, max_tokens=4))
            rows += zip(LONG_SYSTEM_PROMPTS, await asyncio.gather(*pair), strict=True)
    bad = [r for _, r in rows if r["error"] is not None]
    assert not bad, bad
    return {
        "miss_ttft": [r["ttft"] for k in LONG_SYSTEM_PROMPTS for kk, r in rows if kk == k][::8],
        "hit_ttft": [r["ttft"] for i, (_, r) in enumerate(rows) if i >= 2],
        "hit_cached": [r["cached"] for i, (_, r) in enumerate(rows) if i >= 2],
        "replicas": {k: [r["replica"] for kk, r in rows if kk == k] for k in LONG_SYSTEM_PROMPTS},
    }


async def overhead_round(url: str, n: int = 20) -> list[float]:
    """Latency of n sequential one-token chat requests (a short prompt, cached after the first)."""
    async with httpx.AsyncClient(timeout=120) as client:
        out = []
        for _ in range(n):
            r = await stream_chat(client, url, question(0), max_tokens=1)
            assert r["error"] is None, r
            out.append(r["seconds"])
    return out[1:]


def ms(values: list[float]) -> str:
    return f"{1000 * statistics.median(values):.0f} ms"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=32, help="requests per throughput round (16 clients)")
    ap.add_argument("--max-tokens", type=int, default=64)
    a = ap.parse_args()
    common = ("--ctx", "2048")
    t0 = time.monotonic()
    servers = {"ray 2x1": start_server(a.model, *common, "--replicas", "2", "--threads-per-replica", "1")}
    print(f"ray server up in {time.monotonic() - t0:.0f} s", flush=True)
    servers["single x1"] = start_server(a.model, *common, "--threads", "1")
    servers["single x2"] = start_server(a.model, *common, "--threads", "2")
    urls = {name: url for name, (_, url) in servers.items()}
    prefix: dict[str, list[dict]] = {"ray 2x1": [], "single x1": []}
    overhead: dict[str, list[float]] = {"ray 2x1": [], "single x1": []}
    tput: dict[str, list[float]] = {"ray 2x1": [], "single x2": [], "single x1": []}
    try:
        for rnd in range(a.rounds):  # each group's servers alternate who goes first
            for name in round_order(prefix, rnd, "reverse"):
                prefix[name].append(asyncio.run(prefix_round(urls[name], f"r{rnd}")))
            for name in round_order(overhead, rnd, "reverse"):
                overhead[name] += asyncio.run(overhead_round(urls[name]))
            for name in round_order(tput, rnd, "reverse"):
                row = asyncio.run(run_level(urls[name], 16, a.requests, a.max_tokens, 300.0))
                assert row["errors"] == 0, row
                tput[name].append(row["output_tok_per_s"])
            print(f"round {rnd + 1}/{a.rounds} done", flush=True)
    finally:
        for proc, _ in servers.values():
            stop_server(proc)

    print(f"\n{a.rounds} rounds, alternating; the machine was shared with other work while measuring")
    for rnd, r in enumerate(prefix["ray 2x1"]):
        print(f"prefix round {rnd + 1}, replicas per prefix: {r['replicas']}")
    for name, rounds in prefix.items():
        miss = [t for r in rounds for t in r["miss_ttft"]]
        hit = [t for r in rounds for t in r["hit_ttft"]]
        cached = statistics.median([c for r in rounds for c in r["hit_cached"]])
        print(
            f"{name:>10}: TTFT miss median {ms(miss)} (n={len(miss)}), hit median {ms(hit)} (n={len(hit)}), "
            f"cached tokens per hit median {cached:.0f}"
        )
    hit = {n: statistics.median([t for r in rs for t in r["hit_ttft"]]) for n, rs in prefix.items()}
    print(f"hit TTFT ratio ray/single: {hit['ray 2x1'] / hit['single x1']:.2f}")
    o = {n: statistics.median(v) for n, v in overhead.items()}
    print(
        f"1-token request latency median: ray {ms(overhead['ray 2x1'])}, single {ms(overhead['single x1'])}; "
        f"Ray path adds {1000 * (o['ray 2x1'] - o['single x1']):.0f} ms per request"
    )
    for name, v in tput.items():
        per_round = [round(x, 1) for x in v]
        print(
            f"{name:>10}: 16 clients, output tok/s per round {per_round}, median {statistics.median(v):.1f}"
        )
    t = {n: statistics.median(v) for n, v in tput.items()}
    print(
        f"tok/s ratio ray 2x1 / single x2: {t['ray 2x1'] / t['single x2']:.2f}, / single x1: "
        f"{t['ray 2x1'] / t['single x1']:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
