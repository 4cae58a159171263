"""Source checks of the CUDA backend that need no GPU: every kernel is compiled with cache=True, so the
processes of scripts/gpu/gpu_check.sh (and every engine start) load compiled kernels instead of recompiling;
and every CUDA test file that leaves its cases to the simulator run is in that run."""

from __future__ import annotations

import ast
from pathlib import Path

from edgellm.testing.paths import ROOT

CUDA_DIR = ROOT / "edgellm" / "backends" / "cuda"


def _jit_kernels() -> list[tuple[str, str, ast.expr]]:
    """(file, function, decorator) for each @cuda.jit(...) that is not a device function."""
    found = []
    for path in sorted(CUDA_DIR.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef):
                continue
            for dec in node.decorator_list:
                target = dec.func if isinstance(dec, ast.Call) else dec
                if ast.unparse(target) != "cuda.jit":
                    continue
                kw = {k.arg: ast.unparse(k.value) for k in getattr(dec, "keywords", [])}
                if kw.get("device") != "True":
                    found.append((path.name, node.name, dec))
    return found


def test_every_cuda_kernel_is_cached() -> None:
    kernels = _jit_kernels()
    assert len(kernels) >= 15  # the walk found the kernels
    uncached = [
        f"{f}:{name}"
        for f, name, dec in kernels
        if not (isinstance(dec, ast.Call) and any(k.arg == "cache" and ast.unparse(k.value) == "True"
                                                   for k in dec.keywords))
    ]  # fmt: skip
    assert not uncached, f"@cuda.jit kernels without cache=True: {uncached}"


def test_every_file_that_defers_to_the_simulator_run_is_in_it(tmp_path: Path) -> None:
    """A CUDA test file skips its cases outside the simulator subprocess (tests/background_runs.py); one
    missing from that run's list would never run by default."""
    from tests import background_runs

    marker = "simulator subprocess" + '", allow_module_level=True'
    deferring = {p for p in (ROOT / "tests").rglob("test_*.py") if marker in p.read_text()}
    cmd, _ = background_runs._cuda_tests(tmp_path)
    run = {ROOT / arg for arg in cmd if arg.endswith(".py")}
    assert len(deferring) >= 7  # the walk found them
    assert not deferring - run, sorted(str(p.relative_to(ROOT)) for p in deferring - run)
