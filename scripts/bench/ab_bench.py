"""Old vs new on a shared machine: `edgellm bench --json` run alternately in two source trees, N rounds,
then the medians and new/old ratios of decode and prefill tok/s. Alternating spreads the machine's other
load over both trees alike; a quiet machine still gives the figures that count.

    python scripts/bench/ab_bench.py OLD_TREE NEW_TREE MODEL [--rounds 3] [--threads 2] [--prompt 128]
        [--gen 128]

Each run is `python -m edgellm bench ...` with the tree as working directory, so it imports that tree's
edgellm (not the installed one).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from functools import partial

from edgellm.testing.ab import alternate, medians

KEYS = ("decode_tok_s", "prefill_tok_s")


def run(tree: str, args: argparse.Namespace) -> dict:
    cmd = [
        sys.executable, "-m", "edgellm", "bench", args.model, "--prompt-tokens", str(args.prompt),
        "--gen-tokens", str(args.gen), "--threads", str(args.threads), "--json",
    ]  # fmt: skip
    out = subprocess.run(cmd, cwd=tree, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("model")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--gen", type=int, default=128)
    args = ap.parse_args()
    trees = {"old": args.old, "new": args.new}

    def report(r: int, name: str, res: dict) -> None:
        figures = ", ".join(f"{k} {res[k]:.1f}" for k in KEYS)
        print(f"round {r + 1} {name}: {figures}", flush=True)

    results = alternate(
        {name: partial(run, tree, args) for name, tree in trees.items()}, args.rounds, report=report
    )
    for k in KEYS:
        med = medians(results, key=lambda res, k=k: res[k])
        old, new = med["old"], med["new"]
        print(f"{args.model} {k}: median old {old:.1f}, new {new:.1f}, new/old {new / old:.3f}")


if __name__ == "__main__":
    main()
