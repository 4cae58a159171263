"""Which package may import which: host code shared by backends (quants/) imports no backend, and no
backend imports another's modules, so a backend can be removed or replaced without touching the others;
no module of edgellm/ or tui/ imports, however lazily, one that imports it back; the front-ends load
neither Numba nor a backend; and an architecture is defined in its one file of edgellm/arch/, which gguf/
reads through the registry without branching on architecture names or loading a backend."""

import ast
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from edgellm.testing.limits import HANG_S
from edgellm.testing.paths import ROOT

PKG = ROOT / "edgellm"
CYCLE_CHECKED = ("edgellm", "tui")


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def imports_under(
    files: list[Path], package: str, imports: Callable[[Path], set[str]] = imported_modules
) -> list[str]:
    """ "FILE imports MODULE" for each module of `package` (itself or below it) that a file imports."""
    return sorted(
        f"{f.relative_to(PKG)} imports {m}"
        for f in files
        for m in imports(f)
        if m == package or m.startswith(package + ".")
    )


def modules_loaded_by(imports: str, prefixes: tuple[str, ...]) -> str:
    """The modules named `prefixes*` that a fresh interpreter has loaded after running `imports`, as the
    printed sorted list (a failure's stderr in the assertion)."""
    code = f"import sys\n{imports}\nprint(sorted(m for m in sys.modules if m.startswith({prefixes!r})))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=HANG_S
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [
        ("quants", "edgellm.backends"),
        ("backends/cuda", "edgellm.backends.cpu"),
        ("backends/cpu", "edgellm.backends.cuda"),
        ("engine", "edgellm.server"),
        ("gguf", "edgellm.backends"),
    ],
)
def test_package_does_not_import(package: str, forbidden: str) -> None:
    files = sorted((PKG / package).rglob("*.py"))
    assert files, package
    offenders = imports_under(files, forbidden)
    assert not offenders, offenders


def test_front_ends_load_no_numba() -> None:
    """The model and its kernels live in the engine-core process; LLM, the server and the TUI only talk to
    it. Importing Numba in a front-end would cost its process ~60 MB and half a second for nothing."""
    code = (
        "import sys, edgellm, edgellm.cli.commands, edgellm.server.app, tui.app\n"
        "print(sorted(m for m in ('numba', 'llvmlite') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=PKG.parent, timeout=HANG_S
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
FRONT_END_MODULES = ["config.py", "engine/checks.py", "engine/config.py", "engine/core_client.py",
                     "engine/frontend.py", "engine/outputs.py", "engine/protocol.py", "llm.py"]  # fmt: skip


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
        "import sys, edgellm, edgellm.cli.commands, edgellm.server.app, tui.app\n"
        f"core = {CORE_MODULES!r}\n"
        "print(sorted(m for m in sys.modules if any(m == c or m.startswith(c + '.') for c in core)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=PKG.parent, timeout=HANG_S
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# ---- import cycles ---------------------------------------------------------------------------------
def module_files(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    """Dotted module name -> file, for every module of `packages` under `root`."""
    out = {}
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def module_imports(name: str, path: Path, known: dict[str, Path]) -> dict[str, int]:
    """The modules of `known` that `name` imports -> the line of the first such import. Every import
    counts: at module level, inside a function (a lazy import still runs, and is how a cycle hides),
    and under `if TYPE_CHECKING` (a cycle for the reader and the type checker). `from P import x` names
    the submodule P.x when there is one, else P; relative imports resolve against the module's package."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    out: dict[str, int] = {}

    def add(target: str, line: int) -> None:
        if target != name and target in known:
            out.setdefault(target, line)

    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = alias.name
                while target and target not in known:  # `import a.b.c` where only a.b is ours
                    target = target.rpartition(".")[0]
                add(target, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                add(sub if sub in known else module, node.lineno)
    return out


def import_cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """One cycle (a, b, ..., a) through each strongly connected group of modules (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    cycles = []
    for group in groups:  # the shortest way from the group's first module back to it, breadth first
        start = min(group)
        came_from: dict[str, str] = {}
        frontier = [start]
        while start not in came_from:
            step = []
            for v in frontier:
                for w in sorted(graph[v]):
                    if w in group and w not in came_from:
                        came_from[w] = v
                        step.append(w)
            frontier = step
        path = [start]
        while came_from[path[-1]] != start:
            path.append(came_from[path[-1]])
        cycles.append([start, *reversed(path[1:]), start])
    return cycles


def describe_cycle(cycle: list[str], graph: dict[str, dict[str, int]]) -> str:
    return " -> ".join(
        f"{a} (line {graph[a][b]})" if b else a for a, b in zip(cycle, [*cycle[1:], None], strict=True)
    )


def package_cycles(root: Path, packages: tuple[str, ...]) -> list[str]:
    known = module_files(root, packages)
    graph = {name: module_imports(name, path, known) for name, path in known.items()}
    return [describe_cycle(c, graph) for c in import_cycles(graph)]


def test_no_import_cycle() -> None:
    """A cycle makes import order matter and hides in lazy imports; the shared piece belongs in a module
    both sides import."""
    cycles = package_cycles(ROOT, CYCLE_CHECKED)
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_the_cycle_walk_finds_lazy_relative_and_type_only_cycles(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from . import b\n")  # pkg.sub -> pkg.sub.b
    (pkg / "a.py").write_text("def f():\n    from pkg.sub import b\n")  # lazy: pkg.a -> pkg.sub.b
    (pkg / "sub" / "b.py").write_text("from ..a import f\n")  # relative: pkg.sub.b -> pkg.a
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.d\n")
    (pkg / "d.py").write_text("import pkg.c\nimport json\n")
    (pkg / "e.py").write_text("import pkg.d\n")  # imports into a cycle without being in it
    assert package_cycles(tmp_path, ("pkg",)) == [
        "pkg.a (line 2) -> pkg.sub.b (line 1) -> pkg.a",
        "pkg.c (line 3) -> pkg.d (line 1) -> pkg.c",
    ]


def test_front_ends_load_no_backend() -> None:
    """A front-end names a backend for the engine core to load; the kernels of neither backend (their
    Numba code, CUDA's driver) are loaded where requests are parsed."""
    imports = (
        "import edgellm, edgellm.cli.commands, edgellm.llm, edgellm.engine.core_client, edgellm.server.app,"
        " tui.app"
    )
    assert modules_loaded_by(imports, ("edgellm.backends.cpu", "edgellm.backends.cuda")) == "[]"


# ---- architectures ---------------------------------------------------------------------------------
def test_arch_files_load_no_backend() -> None:
    """An architecture's spec is read by gguf/ in a front-end (LLM checks a file before starting the engine
    core): its file imports a backend's types only for the checker or inside the functions that run."""
    offenders = imports_under(sorted((PKG / "arch").glob("*.py")), "edgellm.backends", top_level_imports)
    assert not offenders, offenders


def test_reading_every_arch_spec_loads_no_backend() -> None:
    imports = (
        "import edgellm.gguf.config, edgellm.gguf.validation\n"
        "from edgellm.arch.registry import arch_spec, supported_architectures\n"
        "assert all(arch_spec(a) is not None for a in supported_architectures())"
    )
    assert modules_loaded_by(imports, ("edgellm.backends", "numba", "llvmlite")) == "[]"


def test_gguf_reaches_architectures_through_the_registry_only() -> None:
    """gguf/ names no architecture's module: what an architecture adds is in its file's SPEC, which
    arch/registry.py finds, so adding an architecture touches no file of gguf/."""
    allowed = {"edgellm.arch.registry", "edgellm.arch.spec"}
    imports = imports_under(sorted((PKG / "gguf").glob("*.py")), "edgellm.arch")
    offenders = [line for line in imports if line.rsplit(" ", 1)[1] not in allowed]
    assert not offenders, offenders


def architecture_branches(path: Path, root: Path = PKG) -> list[str]:
    """The lines of `path` that test or look up which architecture a file is: a comparison with, or a
    subscript / .get() by, a name `arch` or an attribute `.arch` / `.architecture`."""

    def is_arch(node: ast.AST) -> bool:
        return (isinstance(node, ast.Name) and node.id == "arch") or (
            isinstance(node, ast.Attribute) and node.attr in ("arch", "architecture")
        )

    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (
            (isinstance(node, ast.Compare) and any(map(is_arch, [node.left, *node.comparators])))
            or (isinstance(node, ast.Subscript) and is_arch(node.slice))
            or (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "get"
                and node.args
                and is_arch(node.args[0])
            )
        ):
            lines.append(f"{path.relative_to(root)}:{node.lineno}")
    return lines


def test_gguf_does_not_branch_on_the_architecture() -> None:
    """A per-architecture fact in gguf/ (`if arch == "x"`, a table keyed by architecture) would split that
    architecture's definition over two files: gguf/ reads each fact from the architecture's spec."""
    offenders = [line for f in sorted((PKG / "gguf").glob("*.py")) for line in architecture_branches(f)]
    assert not offenders, offenders


def test_the_branch_walk_finds_comparisons_and_tables(tmp_path: Path) -> None:
    src = tmp_path / "probe.py"
    src.write_text(
        "if arch == 'x': pass\nif cfg.arch in NAMES: pass\nT[g.architecture]\nT.get(arch, 0)\nf(arch)\n"
    )
    assert architecture_branches(src, tmp_path) == ["probe.py:1", "probe.py:2", "probe.py:3", "probe.py:4"]


def test_server_config_loads_no_web_stack() -> None:
    """The command line builds a ServerConfig (checking its flags) before deciding what to start: that
    loads neither the server's package nor Starlette and uvicorn."""
    assert not imports_under([PKG / "config.py"], "edgellm.server")
    imports = "from edgellm.config import ServerConfig\nServerConfig(api_key='k')"
    assert modules_loaded_by(imports, ("edgellm.server", "starlette", "uvicorn")) == "[]"


# ---- the shape of the tree -------------------------------------------------------------------------
def test_few_modules_at_the_top() -> None:
    """The top of edgellm/ is a table of contents: the user's API (llm.py), the server's settings and the
    process-level helpers; everything else lives in the package of its seam."""
    top = sorted(p.name for p in PKG.glob("*.py"))
    assert len(top) <= 8, top


def prefix_siblings(folder: Path) -> dict[str, list[str]]:
    """`prefix` -> its files, for each prefix that 3 or more `<prefix>_*.py` files of `folder` share."""
    groups: dict[str, list[str]] = {}
    for path in sorted(folder.glob("*_*.py")):
        if not path.name.startswith("__"):
            groups.setdefault(path.name.split("_", 1)[0], []).append(path.name)
    return {prefix: names for prefix, names in groups.items() if len(names) >= 3}


def test_no_prefix_named_siblings() -> None:
    """Three files named `grammar_*.py` side by side are a package that was not made: a folder of them."""
    folders = sorted({p.parent for root in ("edgellm", "tui") for p in (ROOT / root).rglob("*.py")})
    offenders = {str(f.relative_to(ROOT)): g for f in folders if (g := prefix_siblings(f))}
    assert not offenders, offenders


def test_the_prefix_walk_finds_three_siblings(tmp_path: Path) -> None:
    for name in ("grammar_a.py", "grammar_b.py", "grammar_c.py", "chat_a.py", "chat_b.py", "__init__.py"):
        (tmp_path / name).write_text("")
    assert prefix_siblings(tmp_path) == {"grammar": ["grammar_a.py", "grammar_b.py", "grammar_c.py"]}


LEAF_PACKAGES = ("chat", "grammar", "sampling", "models")


@pytest.mark.parametrize("package", LEAF_PACKAGES)
def test_leaf_packages_import_no_engine_core_server_or_tui(package: str) -> None:
    """Chat templates, grammars, sampling and model files are used by the front-ends and the core alike:
    they import neither side's machinery (lazily neither), so either can load them alone."""
    files = sorted((PKG / package).rglob("*.py"))
    assert files, package
    offenders = [
        f"{f.relative_to(PKG)} imports {m}"
        for f in files
        for m in imported_modules(f)
        if is_core(m) or m.startswith(("edgellm.server", "edgellm.cli", "tui"))
    ]
    assert not offenders, offenders


# The server's API packages: each a translation onto the shared front-end (server/*.py) and HTTP layer
# (server/http/). server/multi/ (the router of several models) is above them and may use their pieces.
API_PACKAGES = ("ollama", "anthropic", "responses")


@pytest.mark.parametrize("package", [*API_PACKAGES, "http"])
def test_server_api_packages_do_not_import_each_other(package: str) -> None:
    others = [p for p in (*API_PACKAGES, "multi") if p != package]
    files = sorted((PKG / "server" / package).rglob("*.py"))
    assert files, package
    offenders = [line for other in others for line in imports_under(files, f"edgellm.server.{other}")]
    assert not offenders, offenders


def test_shared_server_modules_import_no_api_package() -> None:
    """The front-end the APIs share (server/*.py but the app that mounts them all) sits below them."""
    files = [p for p in sorted((PKG / "server").glob("*.py")) if p.name not in ("app.py", "__init__.py")]
    apis = [f"edgellm.server.{api}" for api in (*API_PACKAGES, "multi")]
    offenders = [line for api in apis for line in imports_under(files, api)]
    assert not offenders, offenders
