"""A chat's time to first token while a big embedding request runs, against the same chat idle (issue 23's
fairness target: within 2x). Starts `edgellm serve MODEL` on loopback, times --chats streamed 4-token chats
alone, then again while one /v1/embeddings request of --inputs short strings runs, and prints one JSON line:
the medians, their ratio, and the embedding request's own time and inputs/s.

    python scripts/bench/fairness_ttft.py smollm2-135m --inputs 2048 --chats 7
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time

try:  # the openai client's HTTP library: httpx, or its successor httpx2 in recent openai releases
    import httpx
except ImportError:
    import httpx2 as httpx  # type: ignore[no-redef]

from edgellm.testing.servers import start_server, stop_server

CHAT = {
    "messages": [{"role": "user", "content": "Say hi."}],
    "max_tokens": 4,
    "stream": True,
    "temperature": 0,
}


def first_token_s(url: str) -> float:
    t = time.perf_counter()
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=CHAT, timeout=300) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                delta = json.loads(line[6:])["choices"][0]["delta"]
                if delta.get("content"):
                    return time.perf_counter() - t
    raise RuntimeError("the chat streamed no text")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--inputs", type=int, default=2048)
    ap.add_argument("--chats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    proc, url = start_server(args.model, *(["--threads", str(args.threads)] if args.threads else []))
    try:
        first_token_s(url)  # warm-up: the first request pays one-time costs
        idle = [first_token_s(url) for _ in range(args.chats)]
        texts = [f"short string number {i}" for i in range(args.inputs)]
        batch: dict = {}

        def embed() -> None:
            t = time.perf_counter()
            r = httpx.post(f"{url}/v1/embeddings", json={"input": texts}, timeout=1800)
            batch.update(status=r.status_code, seconds=time.perf_counter() - t)

        worker = threading.Thread(target=embed)
        worker.start()
        time.sleep(1.0)  # the batch is queued and stepping
        during = []
        for _ in range(args.chats):
            if not worker.is_alive():
                break
            during.append(first_token_s(url))
            time.sleep(0.3)
        worker.join()
        if len(during) < args.chats:
            print(f"warning: the batch ended after {len(during)} chats", file=sys.stderr)
        out = {
            "idle_ttft_median_s": round(statistics.median(idle), 4),
            "during_ttft_median_s": round(statistics.median(during), 4),
            "during_ttft_max_s": round(max(during), 4),
            "ratio": round(statistics.median(during) / statistics.median(idle), 2),
            "chats_during": len(during),
            "embed_status": batch["status"],
            "embed_seconds": round(batch["seconds"], 2),
            "embed_inputs_per_s": round(args.inputs / batch["seconds"], 1),
        }
        print(json.dumps(out))
    finally:
        stop_server(proc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
