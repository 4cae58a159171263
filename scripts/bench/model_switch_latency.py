"""Switching cost of `edgellm serve --models`: a request's latency when its model is cold (its server and
engine start on this request), warm, and cold again after --models-max pushed it out.

    python scripts/bench/model_switch_latency.py [--models smollm2-135m,gemma3-270m] [--rounds 3]

Prints one JSON line per round and the medians: seconds from sending a 4-token greedy chat request to its
full answer, per model and state.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time

from edgellm.testing.servers import httpx, start_server, stop_server


def start_router(models: str, models_max: int) -> tuple[subprocess.Popen, str]:
    args = ("--models", models, "--models-max", str(models_max), "--keep-alive", "600")
    return start_server(None, *args)


def timed_request(url: str, model: str) -> float:
    messages = [{"role": "user", "content": "Hello"}]
    body = {"model": model, "messages": messages, "max_tokens": 4, "temperature": 0}
    t0 = time.perf_counter()
    r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=600)
    r.raise_for_status()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="smollm2-135m,gemma3-270m")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    a, b = args.models.split(",")
    rows = []
    for rnd in range(args.rounds):
        proc, url = start_router(args.models, models_max=1)
        try:
            row = {"round": rnd, f"{a}_cold": timed_request(url, a), f"{a}_warm": timed_request(url, a),
                   f"{b}_cold_evicting_{a}": timed_request(url, b), f"{b}_warm": timed_request(url, b),
                   f"{a}_cold_again": timed_request(url, a)}  # fmt: skip
        finally:
            stop_server(proc)
        rows.append(row)
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
    keys = [k for k in rows[0] if k != "round"]
    print(json.dumps({"median_s": {k: round(statistics.median(r[k] for r in rows), 3) for k in keys}}))


if __name__ == "__main__":
    main()
