"""Compile every CUDA kernel for a real GPU target (PTX, sm_90 by default) with the argument types it is
launched with, on a machine with no GPU: the simulator runs kernels as Python and types nothing, so a kernel
that cannot compile (a type unification error, an unsupported call) would otherwise first fail on a device.

    python scripts/gpu/cuda_compile_check.py [--cc 9.0] [--tests 'PYTEST ARGS'] [--ptx-dir DIR]

Phase 1 (a subprocess, NUMBA_ENABLE_CUDASIM=1): runs CUDA test cases with launch() recording each
kernel's argument types. Phase 2 (a subprocess without the simulator): compiles each (kernel, types) with
numba.cuda.compile_ptx. Needs NVVM/NVRTC that numba-cuda can find (e.g. `pip install --target DIR
nvidia-cuda-nvcc nvidia-cuda-nvrtc`, then LD_LIBRARY_PATH=DIR/nvidia/cu13/lib PYTHONPATH=DIR); no driver.
Exit status 0 when every recorded signature compiled (and the grouped matmuls use 16-byte loads).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_TESTS = " ".join(
    f"tests/cuda/test_cuda_{name}.py"
    for name in ("backend", "row_ops", "kv_cache", "engine", "fused", "arch_logits", "attention")
)


def _describe(a: object) -> list:
    """A launch argument as JSON: ["array", dtype, ndim, contiguous] or ["scalar", numba type name]."""
    import numpy as np

    if hasattr(a, "shape") and hasattr(a, "dtype") and getattr(a, "ndim", 0) > 0:
        arr = np.asarray(a._ary if hasattr(a, "_ary") else a)  # the simulator's array wraps numpy's
        return ["array", arr.dtype.str, arr.ndim, bool(arr.flags.c_contiguous)]
    if isinstance(a, bool | np.bool_):
        return ["scalar", "boolean"]
    if isinstance(a, int):
        return ["scalar", "int64"]
    if isinstance(a, float):
        return ["scalar", "float64"]
    return ["scalar", np.dtype(type(a)).name]


def record(out: Path, pytest_args: list[str]) -> int:
    """Phase 1: run the tests in the simulator, recording (module, qualname, closure, arg types)."""
    import pytest

    from edgellm.backends.cuda import config

    seen: set[str] = set()
    plain = config.launch

    def recording(kernel: object, grid: object, block: object, *args: object) -> None:
        f = kernel.py_func
        cells = [c.cell_contents for c in (f.__closure__ or ()) if isinstance(c.cell_contents, int)]
        seen.add(json.dumps([f.__module__, f.__qualname__, cells, [_describe(a) for a in args]]))
        plain(kernel, grid, block, *args)

    config.launch = recording  # before the kernel modules import it by name
    rc = pytest.main(["-q", "-p", "no:cacheprovider", *pytest_args])
    out.write_text(json.dumps(sorted(seen), indent=0))
    return int(rc)


def _kernels(module: object) -> list:
    found = []
    for v in vars(module).values():
        for k in v.values() if isinstance(v, dict) else [v]:
            if hasattr(k, "py_func") and hasattr(k, "targetoptions") and not k.targetoptions.get("device"):
                found.append(k)
    return found


def compile_all(sigs: Path, cc: tuple[int, int], ptx_dir: Path | None) -> int:
    """Phase 2: compile_ptx for each recorded signature; prints one line per kernel variant."""
    import importlib

    import numpy as np
    from numba import cuda, types
    from numba.np.numpy_support import from_dtype

    def closure_ints(f: object) -> list[int]:
        return [c.cell_contents for c in (f.__closure__ or ()) if isinstance(c.cell_contents, int)]

    import numba.cuda.dispatcher as cuda_dispatcher

    class Target:  # non-inlined device functions ask the current device for its compute capability
        compute_capability = cc

    cuda_dispatcher.get_current_device = lambda: Target

    failed = 0
    for i, line in enumerate(json.loads(sigs.read_text())):
        module, qualname, cells, args = json.loads(line)
        # factory-made kernels close over launch geometry that differs between the simulator and a GPU:
        # every variant of the same name is compiled
        same = [k for k in _kernels(importlib.import_module(module)) if k.py_func.__qualname__ == qualname]
        exact = [k for k in same if closure_ints(k.py_func) == cells]
        if not same:
            failed += 1
            print(f"FAIL {module}.{qualname}: not found")
            continue
        argtys = [
            types.Array(from_dtype(np.dtype(a[1])), a[2], "C" if a[3] else "A") if a[0] == "array"
            else getattr(types, a[1])
            for a in args
        ]  # fmt: skip
        for j, kernel in enumerate(exact or same):
            name = f"{qualname.split('.')[-1]}{closure_ints(kernel.py_func) or ''}"
            try:
                ptx, _ = cuda.compile_ptx(kernel.py_func, tuple(argtys), cc=cc, fastmath=False)
            except Exception as e:  # noqa: BLE001 - report every kernel, then fail
                failed += 1
                print(f"FAIL {name}: {type(e).__name__}: {str(e)[:2000]}")
                continue
            if ptx_dir:
                (ptx_dir / f"{name}_{i}_{j}.ptx").write_text(ptx)
            v4 = ptx.count("ld.global.v4.")
            if name.startswith("matmul_grouped") and not v4:
                failed += 1
                print(f"FAIL {name}: no 16-byte loads (ld.global.v4) in its PTX")
                continue
            print(f"ok   {name} ({len(ptx.splitlines())} PTX lines, {v4} 16-byte loads)")
    return 1 if failed else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cc", default="9.0", help="compute capability to compile for")
    ap.add_argument("--tests", default=DEFAULT_TESTS, help="pytest arguments of the recording run")
    ap.add_argument("--ptx-dir", type=Path, help="write each kernel's PTX here")
    ap.add_argument("--phase", choices=["record", "compile"], help=argparse.SUPPRESS)
    ap.add_argument("--sigs", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.phase == "record":
        sys.exit(record(args.sigs, shlex.split(args.tests)))
    if args.phase == "compile":
        cc = tuple(int(x) for x in args.cc.split("."))
        sys.exit(compile_all(args.sigs, cc, args.ptx_dir))
    with tempfile.TemporaryDirectory() as tmp:
        sigs = Path(tmp) / "sigs.json"
        me = [sys.executable, __file__, "--sigs", str(sigs), "--tests", args.tests, "--cc", args.cc]
        env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
        rec = subprocess.run([*me, "--phase", "record"], cwd=ROOT, env=env, capture_output=True, text=True)
        if not sigs.exists():
            sys.exit(f"recording run failed:\n{(rec.stdout + rec.stderr)[-4000:]}")
        print(f"recorded {len(json.loads(sigs.read_text()))} kernel signatures (tests rc {rec.returncode})")
        env.pop("NUMBA_ENABLE_CUDASIM")
        if args.ptx_dir:
            args.ptx_dir.mkdir(parents=True, exist_ok=True)
            me += ["--ptx-dir", str(args.ptx_dir)]
        sys.exit(subprocess.run([*me, "--phase", "compile"], cwd=ROOT, env=env).returncode)


if __name__ == "__main__":
    main()
