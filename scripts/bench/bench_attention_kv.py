"""Micro-benchmark of CPU paged attention at decode (one token), f16 vs q8_0 KV cache: prints figures.

Shapes of SmolLM2-135M (9 query / 3 KV heads, head 64) and Gemma 3 270M (4 / 1, head 256), at several
context lengths; the two cache types alternate call by call. Reports the median per call of wall time and of
the calling thread's CPU time (with --threads 1 the CPU time barely moves when the machine is shared), and
the KV bytes the call reads. Also runs against an older checkout's f16 kernel (--tree DIR: its edgellm is
imported instead; a tree without the KV table runs f16 only), for before/after comparisons.

    python scripts/bench/bench_attention_kv.py [--contexts 128 2000] [--calls 200] [--rounds 7] [--threads 1]
                                         [--tree DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--contexts", type=int, nargs="+", default=[128, 2000])
ap.add_argument("--calls", type=int, default=200)
ap.add_argument("--rounds", type=int, default=7)
ap.add_argument("--threads", type=int, default=1)
ap.add_argument("--tree", type=Path, default=Path(__file__).resolve().parents[2])
args = ap.parse_args()
os.environ["NUMBA_NUM_THREADS"] = str(args.threads)
os.environ.setdefault("NUMBA_THREADING_LAYER_PRIORITY", "omp tbb workqueue")
sys.path.insert(0, str(args.tree))

import numpy as np  # noqa: E402

from edgellm.backends.cpu.attention import attention_paged_cpu  # noqa: E402
from edgellm.backends.cpu.backend import NO_SINKS  # noqa: E402

try:
    from edgellm.backends.cpu.kv_cache import CPU_KV_KERNELS  # noqa: E402

    CACHES = {name: (k.alloc, k.write) for name, k in CPU_KV_KERNELS.items()}
except ImportError:  # a checkout before the KV table: its f16 cache only
    from edgellm.backends.cpu.ops import write_kv_cpu  # noqa: E402

    def _alloc_f16(n_blocks: int, bs: int, n_kv: int, d: int, dv: int) -> tuple[np.ndarray, np.ndarray]:
        return np.zeros((n_blocks, n_kv, d, bs), np.uint16), np.zeros((n_blocks, bs, n_kv, dv), np.uint16)

    CACHES = {"f16": (_alloc_f16, write_kv_cpu)}

SHAPES = {"smollm2": (9, 3, 64), "gemma3": (4, 1, 256)}  # H, Hkv, head dim
BS = 16


def main() -> None:
    rng = np.random.default_rng(0)
    print(f"edgellm from {args.tree}, {args.threads} thread(s), {args.calls} calls x {args.rounds} rounds")
    for shape, (H, n_kv, d) in SHAPES.items():
        for ctx in args.contexts:
            nb = ctx // BS + 1
            k = rng.standard_normal((ctx, n_kv, d)).astype(np.float32)
            v = rng.standard_normal((ctx, n_kv, d)).astype(np.float32)
            caches = {}
            for name, (alloc, write) in CACHES.items():
                kc, vc = alloc(nb, BS, n_kv, d, d)
                write(k, v, kc, vc, np.arange(ctx, dtype=np.int64))
                caches[name] = (kc, vc, (kc.nbytes + vc.nbytes) * ctx / (nb * BS))
            tables = np.arange(nb, dtype=np.int32)[None]
            q = rng.standard_normal((1, H, d)).astype(np.float32)
            out = np.empty((1, H, d), np.float32)
            seq, pos = np.zeros(1, np.int32), np.array([ctx - 1], np.int32)
            wall: dict[str, list[float]] = {n: [] for n in caches}
            cpu: dict[str, list[float]] = {n: [] for n in caches}
            for _ in range(args.rounds + 1):  # the first round warms up (and loads the kernels)
                for name, (kc, vc, _) in caches.items():
                    t0, c0 = time.perf_counter(), time.thread_time()
                    for _ in range(args.calls):
                        attention_paged_cpu(
                            q, kc, vc, tables, seq, pos, 0, 0.125, 0.0, NO_SINKS, args.threads, out
                        )
                    wall[name].append((time.perf_counter() - t0) / args.calls * 1e6)
                    cpu[name].append((time.thread_time() - c0) / args.calls * 1e6)
            line = []
            for name, (_, _, nbytes) in caches.items():
                w, c = statistics.median(wall[name][1:]), statistics.median(cpu[name][1:])
                line.append(f"{name} {w:.1f} us wall / {c:.1f} us cpu ({nbytes / 1e6:.2f} MB)")
            print(f"{shape} ctx {ctx}: " + "; ".join(line), flush=True)


if __name__ == "__main__":
    main()
