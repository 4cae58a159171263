"""The steps of scripts/gpu/gpu_check.sh, one process each (the shell gives each its own timeout); every step
writes WORK/part_STEP.json and `merge` joins them into one JSON of figures.

    python scripts/gpu/gpu_check.py STEP --work DIR [--sim]

STEP: versions, models, compare, bench, splitk, graphs, profile, tests or merge (compare, bench, splitk and
graphs, and the sizes of every step: gpu_check_measure.py).

--sim: the tiny shapes of real_shapes.SIM_SHAPES and the fewest tokens that still run every step, for the
Numba CUDA simulator (NUMBA_ENABLE_CUDASIM=1, set by the shell script).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from gpu_check_measure import (  # a sibling: a script's own folder is first on sys.path
    MODELS,
    ROOT,
    SIZES,
    model_path,
    step_bench,
    step_compare,
    step_graphs,
    step_splitk,
)


def write_part(work: Path, name: str, data: dict) -> None:
    """WORK/part_NAME.json; NAME is the step, or STEP-MODEL for a step run per model in parallel."""
    (work / f"part_{name}.json").write_text(json.dumps(data, indent=1, default=float))


# --- steps -----------------------------------------------------------------------------------------------
def step_versions(args: argparse.Namespace) -> dict:
    import gguf
    import numba
    from numba import cuda

    from edgellm.backends.cuda.config import SIMULATOR

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "numba": numba.__version__,
        "gguf": getattr(gguf, "__version__", None) or _dist_version("gguf"),
        "gguf_from": str(Path(gguf.__file__).parent),
        "numba_cuda": _dist_version("numba-cuda"),
        "cuda_core": _dist_version("cuda-core"),
        "simulator": SIMULATOR,
    }
    if SIMULATOR:
        info["device"] = "the Numba CUDA simulator"
    else:
        dev = cuda.get_current_device()
        info["device"] = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
        info["compute_capability"] = list(dev.compute_capability)
        info["driver_cuda_version"] = list(cuda.cudadrv.driver.driver.get_version())
        info["runtime_cuda_version"] = list(cuda.runtime.get_version())
    return info


def _dist_version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def step_models(args: argparse.Namespace) -> dict:
    from edgellm.testing.real_shapes import write_real_shape_model

    out = {}
    for name in args.models or MODELS:
        t0 = time.perf_counter()
        path = write_real_shape_model(name, model_path(args.work, name), sim=args.sim)
        out[name] = {"bytes": path.stat().st_size, "seconds": time.perf_counter() - t0}
    return out


def step_profile(args: argparse.Namespace) -> dict:
    """Per-kernel launches and times at batch-1 decode, fused (scripts/profile/cuda_profile.py's
    measurement)."""
    from edgellm.testing.cuda.profile import Decoder, profile

    sz = SIZES[args.sim]
    out = {}
    for name in args.models or sz["profile_models"]:
        dec = Decoder(model_path(args.work, name), prompt=4, steps=sz["profile_steps"])
        out[name] = profile(dec, fuse=True, steps=sz["profile_steps"], warmup=int(sz["warm"]))
    return out


def step_tests(args: argparse.Namespace) -> dict:
    """The CUDA test files on the device (EDGELLM_CUDA_TESTS=gpu); in the simulator one quick case, to run
    the step itself (the full simulator run is part of the default test suite)."""
    files = [f"tests/cuda/test_cuda_{name}.py"
             for name in ("backend", "row_ops", "kv_cache", "engine", "fused", "arch_logits", "attention",
                          "real_shapes", "sampling")]  # fmt: skip
    if args.sim:
        files = ["tests/cuda/test_cuda_engine.py", "-k", "test_top_k_and_argmax_match_numpy and 1"]
    env = dict(os.environ, EDGELLM_CUDA_TESTS="gpu")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *files]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=args.timeout)
    out = (proc.stdout + proc.stderr).strip().splitlines()
    print("\n".join(out[-40:]))
    return {
        "returncode": proc.returncode,
        "summary": out[-1] if out else "",
        "seconds": time.perf_counter() - t0,
    }


def step_merge(args: argparse.Namespace) -> dict:
    """One JSON: each step's figures and how the step ended (rc 124: its timeout)."""
    report: dict[str, Any] = {"sim": args.sim, "steps": {}}
    steps_file = args.work / "steps.tsv"
    for line in steps_file.read_text().splitlines() if steps_file.exists() else []:
        name, rc, limit, secs = line.split()
        report["steps"][name] = {"rc": int(rc), "timeout_s": int(limit), "seconds": float(secs)}
    for part in sorted(args.work.glob("part_*.json")):
        report.setdefault(part.stem[5:].split("-")[0], {}).update(json.loads(part.read_text()))
    args.out.write_text(json.dumps(report, indent=1))
    print(f"wrote {args.out}")
    return report


STEPS = {
    "versions": step_versions,
    "models": step_models,
    "compare": step_compare,
    "bench": step_bench,
    "splitk": step_splitk,
    "graphs": step_graphs,
    "profile": step_profile,
    "tests": step_tests,
    "merge": step_merge,
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("step", choices=list(STEPS))
    ap.add_argument("--work", type=Path, required=True, help="scratch folder shared by the steps")
    ap.add_argument("--sim", action="store_true", help="tiny shapes for the CUDA simulator")
    ap.add_argument(
        "--models", type=lambda s: [m for m in s.split(",") if m], help="subset of " + ",".join(MODELS)
    )
    ap.add_argument("--out", type=Path, help="merge: the JSON to write")
    ap.add_argument("--timeout", type=float, default=None, help="tests: seconds for the pytest run")
    args = ap.parse_args()
    if args.step == "merge" and args.out is None:
        ap.error("merge needs --out")
    data = STEPS[args.step](args)
    if args.step != "merge":
        per_model = args.step == "models" and args.models
        write_part(args.work, args.step + ("-" + "-".join(args.models) if per_model else ""), data)
        print(json.dumps(data, indent=1, default=float)[:4000])


if __name__ == "__main__":
    main()
