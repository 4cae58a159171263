"""Micro-benchmark of CPU paged attention at decode (one token), f16 vs q8_0 KV cache: prints figures.

Shapes of SmolLM2-135M (9 query / 3 KV heads, head 64) and Gemma 3 270M (4 / 1, head 256), at several
context lengths; the two cache types alternate, --calls calls each, --rounds rounds after one warm-up
(edgellm/testing/ab.py). Reports the median per call of wall time and of the calling thread's CPU time
(with --threads 1 the CPU time barely moves when the machine is shared), and the KV bytes the call reads.
Also runs against another checkout's kernels, for before/after comparisons: --tree DIR runs the script
again with DIR first on PYTHONPATH, so its edgellm is imported (a checkout with edgellm/testing/ab.py).

    python scripts/bench/bench_attention_kv.py [--contexts 128 2000] [--calls 200] [--rounds 7] [--threads 1]
                                         [--tree DIR]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from functools import partial
from pathlib import Path

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--contexts", type=int, nargs="+", default=[128, 2000])
ap.add_argument("--calls", type=int, default=200)
ap.add_argument("--rounds", type=int, default=7)
ap.add_argument("--threads", type=int, default=1)
ap.add_argument("--tree", type=Path, help="a checkout whose edgellm to time (default: the installed one)")
args = ap.parse_args()
os.environ["NUMBA_NUM_THREADS"] = str(args.threads)
os.environ.setdefault("NUMBA_THREADING_LAYER_PRIORITY", "omp tbb workqueue")
if args.tree is not None:
    tree, path = str(args.tree.resolve()), os.environ.get("PYTHONPATH", "")
    if path.split(os.pathsep)[0] != tree:  # once: the run again imports DIR's edgellm
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, (tree, path))))
        os.execve(sys.executable, [sys.executable, *sys.argv], env)

import numpy as np  # noqa: E402

import edgellm  # noqa: E402
from edgellm.backends.cpu.attention import attention_paged_cpu  # noqa: E402
from edgellm.backends.cpu.backend import NO_SINKS  # noqa: E402
from edgellm.backends.cpu.kv_cache import CPU_KV_KERNELS  # noqa: E402
from edgellm.testing.ab import alternate, medians  # noqa: E402

CACHES = {name: (k.alloc, k.write) for name, k in CPU_KV_KERNELS.items()}

SHAPES = {"smollm2": (9, 3, 64), "gemma3": (4, 1, 256)}  # H, Hkv, head dim
BS = 16


def time_calls(q, kc, vc, tables, seq, pos, out) -> tuple[float, float]:  # noqa: ANN001
    """--calls decode attention calls: microseconds per call, wall and the calling thread's CPU."""
    t0, c0 = time.perf_counter(), time.thread_time()
    for _ in range(args.calls):
        attention_paged_cpu(q, kc, vc, tables, seq, pos, 0, 0.125, 0.0, NO_SINKS, args.threads, out)
    return (time.perf_counter() - t0) / args.calls * 1e6, (time.thread_time() - c0) / args.calls * 1e6


def main() -> None:
    rng = np.random.default_rng(0)
    tree = Path(edgellm.__file__).resolve().parents[1]
    print(f"edgellm from {tree}, {args.threads} thread(s), {args.calls} calls x {args.rounds} rounds")
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
            variants = {
                name: partial(time_calls, q, kc, vc, tables, seq, pos, out)
                for name, (kc, vc, _) in caches.items()
            }
            results = alternate(variants, args.rounds, warmup=1)  # the warm-up loads the kernels
            wall, cpu = medians(results, key=lambda t: t[0]), medians(results, key=lambda t: t[1])
            line = [
                f"{name} {wall[name]:.1f} us wall / {cpu[name]:.1f} us cpu ({nbytes / 1e6:.2f} MB)"
                for name, (_, _, nbytes) in caches.items()
            ]
            print(f"{shape} ctx {ctx}: " + "; ".join(line), flush=True)


if __name__ == "__main__":
    main()
