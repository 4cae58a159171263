"""Source checks of the CUDA backend that need no GPU: every kernel is compiled with cache=True, so the
processes of scripts/gpu/gpu_check.sh (and every engine start) load compiled kernels instead
of recompiling."""

from __future__ import annotations

import ast

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
