"""Multiply-adds per second of one tile matmul per quant type on a CPU tier: where prefill time goes.

    EDGELLM_CPU_TIER=avx2 python scripts/profile/kernel_rates.py Q4_K Q6_K [--rows 128] [--threads 1]

Times matmul_cpu of x [rows, K] by a [N, K] weight of valid random blocks (median of 7 calls after a
warm-up) and prints GMAC/s, and MAC per cycle per thread where --ghz gives the clock. Set EDGELLM_CPU_TIER
when the process starts (it picks the instructions Numba compiles for).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from gguf import GGMLQuantizationType

from edgellm.backends.cpu.matmul import matmul_cpu
from edgellm.backends.cpu.packed import pack_weight_tiled
from edgellm.backends.cpu.tiers import active_tier
from edgellm.testing.kernel_refs import random_raw


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("qtypes", nargs="+", help="GGML type names, e.g. Q4_K Q6_K Q8_0")
    ap.add_argument("--rows", type=int, default=128, help="activation rows (tokens)")
    ap.add_argument("--n", type=int, default=2048, help="weight rows")
    ap.add_argument("--k", type=int, default=8192, help="weight columns")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--ghz", type=float, default=0.0, help="clock, for MAC per cycle")
    args = ap.parse_args()
    tier = active_tier()
    rng = np.random.default_rng(0)
    macs = args.rows * args.n * args.k
    for name in args.qtypes:
        qtype = GGMLQuantizationType[name]
        w = pack_weight_tiled(qtype, random_raw(qtype, args.n, args.k, rng), args.n, args.k)
        x = rng.standard_normal((args.rows, args.k)).astype(np.float32)
        out = np.empty((args.rows, args.n), np.float32)
        matmul_cpu(x, w, out, args.threads, tier.index)  # compiles
        times = []
        for _ in range(7):
            t0 = time.perf_counter()
            matmul_cpu(x, w, out, args.threads, tier.index)
            times.append(time.perf_counter() - t0)
        dt = statistics.median(times)
        per_cycle = f", {macs / dt / 1e9 / args.ghz / args.threads:.1f} MAC/cycle/thread" if args.ghz else ""
        print(f"{tier.name} {name} [{args.rows}, {args.k}] x [{args.n}, {args.k}]: {dt * 1e3:.1f} ms, "
              f"{macs / dt / 1e9:.1f} GMAC/s{per_cycle}")  # fmt: skip


if __name__ == "__main__":
    main()
