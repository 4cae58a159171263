"""Which package may import which: host code shared by backends (quants/) imports no backend, and no
backend imports another's modules, so a backend can be removed or replaced without touching the others."""

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "edgellm"


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
