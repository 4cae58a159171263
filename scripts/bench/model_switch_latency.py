"""Switching cost of `edgellm serve --models`: a request's latency when its model is cold (its server and
engine start on this request), warm, and cold again after --models-max pushed it out.

    python scripts/bench/model_switch_latency.py [--models smollm2-135m,gemma3-270m] [--rounds 3]

Each round starts a fresh router (--models-max 1) and times the five requests in that order (the order is
what makes a model cold or warm); --rounds rounds through edgellm/testing/ab.py. Prints one JSON line per
round and the medians: seconds from sending a 4-token greedy chat request to its full answer, per model and
state.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from functools import partial

from edgellm.testing.ab import alternate, medians
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


def switch_round(models: str) -> dict[str, float]:
    """One router's five timed requests: each model cold, warm, and the first cold again after the second
    pushed it out."""
    a, b = models.split(",")
    proc, url = start_router(models, models_max=1)
    try:
        return {f"{a}_cold": timed_request(url, a), f"{a}_warm": timed_request(url, a),
                f"{b}_cold_evicting_{a}": timed_request(url, b), f"{b}_warm": timed_request(url, b),
                f"{a}_cold_again": timed_request(url, a)}  # fmt: skip
    finally:
        stop_server(proc)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="smollm2-135m,gemma3-270m")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    if len(args.models.split(",")) != 2:
        ap.error(f"--models takes two models, comma-separated: got {args.models!r}")

    def report(r: int, _: str, row: dict[str, float]) -> None:
        print(json.dumps({"round": r, **{k: round(v, 3) for k, v in row.items()}}), flush=True)

    [rows] = alternate({"switch": partial(switch_round, args.models)}, args.rounds, report=report).values()
    med = medians({k: [row[k] for row in rows] for k in rows[0]})  # per request, over the rounds
    print(json.dumps({"median_s": {k: round(v, 3) for k, v in med.items()}}))


if __name__ == "__main__":
    main()
