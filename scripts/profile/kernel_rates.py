"""Multiply-adds per second of one tile matmul per quant type on a CPU tier: where prefill time goes.

    EDGELLM_CPU_TIER=avx2 python scripts/profile/kernel_rates.py Q4_K Q6_K [--rows 128] [--threads 1]

Times matmul_cpu of x [rows, K] by a [N, K] weight of valid random blocks (median of 7 samples after a
warm-up, each sample enough back-to-back calls to last ~20 ms, so a decode-sized call of 0.1 ms is not
timer noise) and prints GMAC/s, the weight's GB/s, and MAC per cycle per thread where --ghz gives the
clock. A weight larger than the last-level cache (e.g. --n 262144 at --k 2048) streams from DRAM; a
smaller one is read from cache after the first call. Set EDGELLM_CPU_TIER when the process starts (it
picks the instructions Numba compiles for).
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
        t0 = time.perf_counter()
        matmul_cpu(x, w, out, args.threads, tier.index)
        calls = max(1, int(0.02 / max(time.perf_counter() - t0, 1e-6)))
        times = []
        for _ in range(7):
            t0 = time.perf_counter()
            for _ in range(calls):
                matmul_cpu(x, w, out, args.threads, tier.index)
            times.append((time.perf_counter() - t0) / calls)
        dt = statistics.median(times)
        per_cycle = f", {macs / dt / 1e9 / args.ghz / args.threads:.1f} MAC/cycle/thread" if args.ghz else ""
        shape = f"[{args.rows}, {args.k}] x [{args.n}, {args.k}]"
        rates = f"{macs / dt / 1e9:.1f} GMAC/s, {w.nbytes / dt / 1e9:.1f} GB/s of weights{per_cycle}"
        print(f"{tier.name} {name} {shape}: {dt * 1e3:.3f} ms, {rates}")


if __name__ == "__main__":
    main()
