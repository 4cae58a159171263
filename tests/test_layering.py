"""Which package may import which: host code shared by backends (quants/) imports no backend, and no
backend imports another's modules, so a backend can be removed or replaced without touching the others."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from edgellm.testing.paths import ROOT

PKG = ROOT / "edgellm"


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [
        ("quants", "edgellm.backends"),
        ("backends/cuda", "edgellm.backends.cpu"),
        ("backends/cpu", "edgellm.backends.cuda"),
        ("engine", "edgellm.server"),
    ],
)
def test_package_does_not_import(package: str, forbidden: str) -> None:
    files = sorted((PKG / package).rglob("*.py"))
    assert files, package
    offenders = {
        f"{f.relative_to(PKG)} imports {m}"
        for f in files
        for m in imported_modules(f)
        if m == forbidden or m.startswith(forbidden + ".")
    }
    assert not offenders, sorted(offenders)


def test_front_ends_load_no_numba() -> None:
    """The model and its kernels live in the engine-core process; LLM, the server and the TUI only talk to
    it. Importing Numba in a front-end would cost its process ~60 MB and half a second for nothing."""
    code = (
        "import sys, edgellm, edgellm.cli, edgellm.server.app, tui.app\n"
        "print(sorted(m for m in ('numba', 'llvmlite') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=PKG.parent, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
