"""Micro-benchmark of the CPU dequant-matmul kernels.

GEMV (M=1) is timed cold: the script cycles over enough copies of the matrix to exceed L3, so weights come
from RAM as in decode. GEMM (M=8/64/128) is timed hot (one matrix), as in prefill where each weight is
reused by every token. Prints GB/s of weight bytes (GGUF and repacked) and us/call, for 1 and 2 threads,
as the median over repetitions (the box is shared: medians are steadier than best times). The thread
counts alternate call by call after one warm-up (edgellm/testing/ab.py); GEMV and GEMM do not (a cold
GEMV sweep would push the GEMM's matrix out of cache).

    EDGELLM_CPU_TIER=avx2 python scripts/bench/bench_kernels.py [--quick] \
        [--set smollm2|gemma|all] [--threads 2]

EDGELLM_CPU_TIER (edgellm/backends/cpu/tiers.py) picks the kernel tier timed; set it on the command line,
as it must be in the environment before Numba is imported.
"""

from __future__ import annotations

import argparse
import copy
import time
from collections.abc import Callable
from functools import partial

import edgellm  # noqa: F401 - first: its environment settings (threading layer, a forced tier's target)

# isort: split

import numba  # noqa: E402
import numpy as np  # noqa: E402
from gguf import GGMLQuantizationType as T  # noqa: E402

from edgellm.backends.cpu.matmul import matmul_cpu  # noqa: E402
from edgellm.backends.cpu.packed import PackedWeight, pack_weight, pack_weight_tiled  # noqa: E402
from edgellm.backends.cpu.tiers import active_tier  # noqa: E402
from edgellm.quants import BLOCK_DTYPES, get_traits  # noqa: E402
from edgellm.testing.ab import alternate, medians  # noqa: E402

L3_BYTES = 32 * 2**20
CASE_SETS = {  # (qtype, N, K): shapes of the model tensors
    "smollm2": [  # wqkv, wo, gate|up, down (Q4_1), tied output (Q8_0); plus the brief's Q8_0 shapes
        (T.Q4_1, 960, 576),
        (T.Q4_1, 576, 576),
        (T.Q4_1, 3072, 576),
        (T.Q4_1, 576, 1536),
        (T.Q8_0, 768, 576),
        (T.Q8_0, 576, 576),
        (T.Q8_0, 3072, 576),
        (T.Q8_0, 576, 1536),
        (T.Q8_0, 49152, 576),
    ],
    # the 1B bench model (scripts/fixtures/make_bench_model.py): Q|K, V, wo, gate|up, down, output
    "llama1b": [
        (T.Q4_K, 2560, 2048),
        (T.Q6_K, 512, 2048),
        (T.Q4_K, 2048, 2048),
        (T.Q4_K, 16384, 2048),
        (T.Q6_K, 2048, 8192),
        (T.Q6_K, 49152, 2048),
    ],
    "gemma": [
        (T.Q4_K, 640, 2048),
        (T.Q5_0, 640, 2048),
        (T.Q6_K, 640, 2048),
    ],
}
CASE_SETS["all"] = CASE_SETS["smollm2"] + CASE_SETS["gemma"] + CASE_SETS["llama1b"]


def random_raw(qtype: T, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    raw = rng.integers(0, 256, (rows, get_traits(qtype).row_bytes(cols)), dtype=np.uint8)
    blocks = raw.view(BLOCK_DTYPES[qtype])
    for field in blocks.dtype.names:
        if blocks.dtype[field].base == np.dtype("<f2"):
            blocks[field] = rng.uniform(-0.05, 0.05, blocks[field].shape).astype(np.float16)
    return raw


def timed(threads: int, fn: Callable[[], None]) -> float:
    """Seconds of one fn() on `threads` threads."""
    numba.set_num_threads(threads)
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def median_times(fn: Callable[[], None], threads_list: list[int], reps: int) -> dict[int, float]:
    """Median seconds of fn() per thread count, the counts alternating, after a warm-up of each (compile /
    load from cache)."""
    return medians(alternate({t: partial(timed, t, fn) for t in threads_list}, reps, warmup=1))


def bench_case(
    qtype: T,
    rows: int,
    cols: int,
    reps: int,
    rng: np.random.Generator,
    threads_list: list[int],
    ms: list[int],
) -> None:
    raw = random_raw(qtype, rows, cols, rng)
    gguf_bytes = raw.nbytes
    # the layout the CPU backend uses on this tier (tile16 on a tile tier, int8 rows otherwise)
    pack = pack_weight_tiled if active_tier().tiles is not None else pack_weight
    first = pack(qtype, raw, rows, cols)
    n_copies = max(1, -(-2 * L3_BYTES // first.nbytes))  # 2x L3 worth of weights for the cold GEMV
    weights: list[PackedWeight] = [first] + [copy.deepcopy(first) for _ in range(n_copies - 1)]
    label = f"{qtype.name} {rows}x{cols}"
    x1 = rng.standard_normal((1, cols)).astype(np.float32)
    out1 = np.empty((1, rows), np.float32)

    def gemv_all() -> None:
        for w in weights:
            matmul_cpu(x1, w, out1)

    gemv = median_times(gemv_all, threads_list, reps)
    gemm = {}
    for m_rows in ms:
        x = rng.standard_normal((m_rows, cols)).astype(np.float32)
        out = np.empty((m_rows, rows), np.float32)
        gemm[m_rows] = median_times(partial(matmul_cpu, x, first, out), threads_list, max(3, reps // 2))
    for threads in threads_list:
        t = gemv[threads] / len(weights)
        print(
            f"{label:22s} thr={threads} GEMV cold  {t * 1e6:9.1f} us/call  "
            f"{gguf_bytes / t / 1e9:6.1f} GB/s gguf  {first.nbytes / t / 1e9:6.1f} GB/s repacked",
            flush=True,
        )
        for m_rows in ms:
            t = gemm[m_rows][threads]
            print(
                f"{label:22s} thr={threads} GEMM M={m_rows:<4d} {t * 1e6:9.1f} us/call  "
                f"{t * 1e6 / m_rows:8.1f} us/token  {m_rows * rows * cols / t / 1e9:6.1f} GMAC/s",
                flush=True,
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--set", choices=sorted(CASE_SETS), default="smollm2", help="which shapes")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="thread counts to time")
    parser.add_argument("--m", type=int, nargs="*", default=[8, 128], help="GEMM batch sizes to time")
    args = parser.parse_args()
    print(f"numba {numba.__version__}, cpu tier: {active_tier().name}, threading layer: ", end="")
    rng = np.random.default_rng(0)
    warm = pack_weight(T.Q8_0, random_raw(T.Q8_0, 8, 64, rng), 8, 64)
    matmul_cpu(np.ones((1, 64), np.float32), warm, np.empty((1, 8), np.float32))
    print(numba.threading_layer(), flush=True)
    for qtype, rows, cols in CASE_SETS[args.set]:
        bench_case(qtype, rows, cols, 5 if args.quick else 11, rng, args.threads, args.m)


if __name__ == "__main__":
    main()
