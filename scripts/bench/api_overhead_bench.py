"""Per-request latency of each API route against the OpenAI chat route on the same prompt (issue 28's
"within 5%" check): one `edgellm serve`, the same greedy conversation and token budget on every route,
requests sent one at a time and interleaved route by route, each round starting one route later (so drift
in the machine's load, and a route's place in the round, hit all alike),
whole and streamed (time to the last byte). Prints the median and p90 per route and the ratio of medians
to the OpenAI route's. Not a test: run it on a quiet machine.

    python scripts/bench/api_overhead_bench.py [--model smollm2-135m] [--rounds 30] [--max-tokens 32]
"""

from __future__ import annotations

import argparse
import statistics
import time
from functools import partial
from typing import Any

import httpx

from edgellm.testing.ab import alternate
from edgellm.testing.servers import start_server, stop_server

SYSTEM, USER = "You are a helpful assistant.", "Write a short paragraph about the sea."


def bodies(max_tokens: int) -> dict[str, tuple[str, dict[str, Any]]]:
    """route label -> (path, body): the same conversation, budget and greedy sampling for each API."""
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}]
    # Greedy on the same rendered conversation: every route generates the same tokens.
    ollama_opts = {"temperature": 0, "num_predict": max_tokens}
    greedy = {"temperature": 0}
    return {
        "openai chat": ("/v1/chat/completions", {"messages": msgs, "max_tokens": max_tokens, **greedy}),
        "ollama chat": ("/api/chat", {"messages": msgs, "options": ollama_opts}),
        "ollama generate": ("/api/generate", {"system": SYSTEM, "prompt": USER, "options": ollama_opts}),
        "anthropic messages": (
            "/v1/messages",
            {"system": SYSTEM, "messages": msgs[1:], "max_tokens": max_tokens, **greedy},
        ),
        "openai responses": (
            "/v1/responses",
            {"instructions": SYSTEM, "input": USER, "max_output_tokens": max_tokens, **greedy},
        ),
    }


# route path -> the reply's generated-token count, from each API's own usage fields
OUTPUT_TOKENS = {
    "/v1/chat/completions": lambda j: j["usage"]["completion_tokens"],
    "/api/chat": lambda j: j["eval_count"],
    "/api/generate": lambda j: j["eval_count"],
    "/v1/messages": lambda j: j["usage"]["output_tokens"],
    "/v1/responses": lambda j: j["usage"]["output_tokens"],
}


def timed(client: httpx.Client, url: str, path: str, body: dict[str, Any]) -> float:
    t0 = time.perf_counter()
    with client.stream("POST", url + path, json=body) as r:
        for _ in r.iter_bytes():
            pass
        r.raise_for_status()
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("server_args", nargs="*", help="extra `edgellm serve` arguments (after --)")
    args = ap.parse_args()
    routes = bodies(args.max_tokens)
    cases = {f"{name}{' (stream)' if s else ''}": (path, {**b, "stream": s})
             for name, (path, b) in routes.items() for s in (False, True)}  # fmt: skip
    proc, url = start_server(args.model, *args.server_args)
    times: dict[str, list[float]] = {}
    try:
        with httpx.Client(timeout=600) as client:
            for _ in range(args.warmup):
                for path, body in cases.values():
                    timed(client, url, path, body)
            # The ratios compare like with like only if every route generates as many tokens.
            counts = {
                name: OUTPUT_TOKENS[path](client.post(url + path, json={**b, "stream": False}).json())
                for name, (path, b) in routes.items()
            }
            print("generated tokens per route:", counts)
            if len(set(counts.values())) != 1:
                raise SystemExit("the routes generated different token counts: the ratios would mislead")
            # Each round starts one route later: a route's place in the round (right after a stream
            # ended, say) is not its cost.
            runs = {label: partial(timed, client, url, path, body) for label, (path, body) in cases.items()}
            times = alternate(runs, args.rounds, order="rotate")
    finally:
        stop_server(proc)
    print(f"{'route':32} {'median ms':>10} {'p90 ms':>8} {'vs openai':>10}")
    for label, ts in times.items():
        base = statistics.median(times["openai chat (stream)" if "stream" in label else "openai chat"])
        med, p90 = statistics.median(ts), sorted(ts)[int(0.9 * (len(ts) - 1))]
        print(f"{label:32} {med * 1e3:10.1f} {p90 * 1e3:8.1f} {med / base:9.3f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
