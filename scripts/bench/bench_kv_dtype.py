"""Decode speed with an f16 vs a q8_0 KV cache, short and long context, in alternating runs: prints figures.

Each run is `python -m edgellm bench MODEL --prompt-tokens N --json --kv-cache-dtype T` in a fresh process
(decode is measured after an N-token prompt, so N sets the context the attention reads). With --base DIR,
the f16 cache of another checkout (e.g. a worktree of the commit before a change) runs in the same rotation.
Reports each round and the medians; the machine's load moves every figure, alternation keeps the
comparison fair.

  python scripts/bench/bench_kv_dtype.py [--model smollm2-135m] [--contexts 128 2000] [--rounds 3]
                                   [--gen-tokens 64] [--base /path/to/old/checkout]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from functools import partial
from pathlib import Path

from edgellm.testing.ab import alternate, medians

ROOT = Path(__file__).resolve().parents[2]


def bench(tree: Path, model: str, ctx: int, gen: int, dtype: str | None) -> dict:
    cmd = [sys.executable, "-m", "edgellm", "bench", model, "--prompt-tokens", str(ctx)]
    cmd += ["--gen-tokens", str(gen), "--repeat", "1", "--json"]
    cmd += ["--kv-cache-dtype", dtype] if dtype else []
    proc = subprocess.run(cmd, cwd=tree, capture_output=True, text=True, check=False)
    if proc.returncode:
        sys.exit(f"{' '.join(cmd)} (in {tree}) failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--contexts", type=int, nargs="+", default=[128, 2000])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--gen-tokens", type=int, default=64)
    ap.add_argument("--base", type=Path, default=None, help="another checkout: its f16 cache joins the runs")
    a = ap.parse_args()
    variants = [("f16", ROOT, "f16"), ("q8_0", ROOT, "q8_0")]
    if a.base:
        variants.insert(0, ("base f16", a.base, None))  # the old CLI may not know --kv-cache-dtype
    for ctx in a.contexts:
        runs = {
            name: partial(bench, tree, a.model, ctx, a.gen_tokens, dtype) for name, tree, dtype in variants
        }

        def end_round(r: int, row: dict[str, dict], ctx: int = ctx) -> None:
            figures = ", ".join(f"{name} {res['decode_tok_s']:.1f}" for name, res in row.items())
            print(f"{a.model} ctx {ctx} round {r + 1}: decode tok/s " + figures, flush=True)

        med = medians(alternate(runs, a.rounds, end_round=end_round), key=lambda res: res["decode_tok_s"])
        ratios = ", ".join(f"{k} {v:.1f}" for k, v in med.items())
        print(f"{a.model} ctx {ctx} medians: {ratios}; q8_0/f16 {med['q8_0'] / med['f16']:.3f}", end="")
        print(f", f16/base {med['f16'] / med['base f16']:.3f}" if a.base else "", flush=True)


if __name__ == "__main__":
    main()
