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


# The engine core's modules: they run in the core process only.
CORE_MODULES = (
    "edgellm.arch",
    "edgellm.backends",
    "edgellm.engine.block_manager",
    "edgellm.engine.core_process",
    "edgellm.engine.engine_core",
    "edgellm.engine.guidance",
    "edgellm.engine.model_runner",
    "edgellm.engine.pooling",
    "edgellm.engine.prefix_cache",
    "edgellm.engine.request",
    "edgellm.engine.scheduler",
    "edgellm.engine.scheduler_types",
    "edgellm.engine.sequence",
    "edgellm.engine.spec.build",
    "edgellm.engine.spec.draft",
    "edgellm.engine.spec.speculator",
)
# The front-end's side of the engine: what LLM, the server and the TUI import of it.
FRONT_END_MODULES = ["engine/checks.py", "engine/core_client.py", "engine/core_spec.py", "engine/frontend.py",
                     "engine/outputs.py", "engine/protocol.py", "llm.py"]  # fmt: skip


def top_level_imports(path: Path) -> set[str]:
    """Modules a file imports when it is imported (not those inside functions or `if TYPE_CHECKING:`)."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def is_core(module: str) -> bool:
    return any(module == m or module.startswith(m + ".") for m in CORE_MODULES)


@pytest.mark.parametrize("name", FRONT_END_MODULES)
def test_front_end_modules_import_nothing_of_the_core(name: str) -> None:
    offenders = sorted(m for m in top_level_imports(PKG / name) if is_core(m))
    assert not offenders, offenders


def test_protocol_imports_nothing_of_edgellm() -> None:
    """The messages are shared by both sides: plain dataclasses, the types they name only for checkers."""
    assert not [m for m in top_level_imports(PKG / "engine/protocol.py") if m.startswith("edgellm")]


def test_front_ends_load_no_model_runner_or_backend() -> None:
    """LLM, the server and the TUI reach the engine core through protocol.py's messages: importing them
    loads no model, runner, backend, scheduler or step loop."""
    code = (
        "import sys, edgellm, edgellm.cli, edgellm.server.app, tui.app\n"
        f"core = {CORE_MODULES!r}\n"
        "print(sorted(m for m in sys.modules if any(m == c or m.startswith(c + '.') for c in core)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=PKG.parent, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
