"""Batch-1 speed beside other busy processes: llama.cpp, edgellm with GNU OpenMP's default spinning, and
edgellm as shipped (`import edgellm` sets GOMP_SPINCOUNT=1000), on an idle machine and with N processes
each spinning a core: every (setting, busy) pair once a round, --rounds rounds (edgellm/testing/ab.py).
Prints one JSON line per run and the medians per (setting, busy).

    python scripts/bench/busy_machine.py smollm2-135m --rounds 3 --busy 0 1
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from functools import partial
from pathlib import Path

from edgellm.models.catalog import resolve_model
from edgellm.testing.ab import alternate, medians

LLAMACPP_BENCH = Path(__file__).resolve().parents[3] / "shared" / "bench" / "llamacpp_bench.py"
SETTINGS = {  # name: extra environment (None: llama.cpp)
    "llama.cpp": None,
    "edgellm, libgomp default spin": {"GOMP_SPINCOUNT": "300000"},
    "edgellm": {},
}


def run_one(name: str, model: str, path: str, prompt: int, gen: int, threads: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    extra = SETTINGS[name]
    if extra is None:
        cmd = [sys.executable, str(LLAMACPP_BENCH), path, str(prompt), str(gen), str(threads)]
    else:
        env.update(extra)
        cmd = [
            sys.executable,
            "-m",
            "edgellm",
            "bench",
            model,
            "--prompt-tokens",
            str(prompt),
            "--gen-tokens",
            str(gen),
            "--threads",
            str(threads),
            "--json",
        ]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise SystemExit(f"{name} failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_busy(name: str, busy: int, *args: str | int) -> dict:
    """run_one beside `busy` processes each spinning a core."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
    try:
        return run_one(name, *args)
    finally:
        for p in spinners:
            p.kill()
            p.wait()


def report(r: int, key: tuple[str, int], res: dict) -> None:
    name, busy = key
    figures = {k: round(res[k], 1) for k in ("prefill_tok_s", "decode_tok_s")}
    print(json.dumps({"round": r, "setting": name, "busy": busy, **figures}), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--busy", type=int, nargs="+", default=[0, 1], help="numbers of busy processes to try")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=43)
    ap.add_argument("--gen-tokens", type=int, default=64)
    ap.add_argument("--spins", type=int, nargs="*", default=[], help="also edgellm at these GOMP_SPINCOUNTs")
    args = ap.parse_args()
    SETTINGS.update({f"edgellm, GOMP_SPINCOUNT={n}": {"GOMP_SPINCOUNT": str(n)} for n in args.spins})
    path = str(resolve_model(args.model))
    run_args = (args.model, path, args.prompt_tokens, args.gen_tokens, args.threads)
    variants = {
        (name, busy): partial(run_busy, name, busy, *run_args) for busy in args.busy for name in SETTINGS
    }
    results = alternate(variants, args.rounds, report=report)
    med = medians(results, key=lambda res: res["decode_tok_s"])
    for (name, busy), runs in results.items():
        per_round = ", ".join(f"{res['decode_tok_s']:.1f}" for res in runs)
        print(f"busy={busy}  {name:32s} decode median {med[name, busy]:7.1f} tok/s  rounds {per_round}")


if __name__ == "__main__":
    main()
