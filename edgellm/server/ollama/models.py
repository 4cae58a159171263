"""What Ollama's /api/tags, /api/ps and /api/show say about the served model, from its GGUF metadata."""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gguf

if TYPE_CHECKING:
    from edgellm.server.state import ServerState


def _details(meta: Mapping[str, Any]) -> dict[str, Any]:
    arch = str(meta.get("general.architecture", ""))
    try:
        quant = gguf.LlamaFileType(meta.get("general.file_type")).name.removeprefix("MOSTLY_")
    except ValueError:
        quant = ""
    return {
        "parent_model": "",
        "format": "gguf",
        "family": arch,
        "families": [arch],
        "parameter_size": str(meta.get("general.size_label", "")),
        "quantization_level": quant,
    }


def model_entry(state: ServerState, name: str) -> dict[str, Any]:
    return file_entry(state.llm.path, state.llm.metadata, name)


def file_entry(path: Path, meta: Mapping[str, Any], name: str) -> dict[str, Any]:
    """/api/tags' entry for the model file at `path` with GGUF metadata `meta` (the multi-model router
    lists models it has not loaded this way)."""
    stat = path.stat()
    modified = dt.datetime.fromtimestamp(stat.st_mtime, dt.UTC).isoformat().replace("+00:00", "Z")
    return {
        "name": name,
        "model": name,
        "modified_at": modified,
        "size": stat.st_size,
        "digest": file_digest(path),
        "details": _details(meta),
    }


def file_digest(path: Path) -> str:
    """A digest of the file's identity (path, size, time), not of its bytes: hashing GBs per /api/tags is
    not worth it, and no client pulls by it here."""
    stat = path.stat()
    return hashlib.sha256(f"{path}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()


def pull_progress(path: Path) -> list[dict[str, Any]]:
    """/api/pull's stream for a model that is here already, in Ollama's steps (clients draw progress bars
    from `total`/`completed`): its one layer is complete."""
    digest, size = file_digest(path), path.stat().st_size
    return [
        {"status": "pulling manifest"},
        {"status": f"pulling {digest[:12]}", "digest": f"sha256:{digest}", "total": size, "completed": size},
        {"status": "verifying sha256 digest"},
        {"status": "writing manifest"},
        {"status": "success"},
    ]


def show_body(state: ServerState) -> dict[str, Any]:
    llm, meta = state.llm, state.llm.metadata
    arch = str(meta.get("general.architecture", ""))
    info = {k: v for k, v in meta.items() if k.startswith("general.") and isinstance(v, str | int | float)}
    # The context length this server serves (what a client may size its prompts to), not the trained one.
    info.update({f"{arch}.context_length": llm.n_ctx, f"{arch}.embedding_length": llm.config.n_embd})
    template = state.template.source if state.template is not None else ""
    caps = ["completion"] + (["tools"] if state.template is not None else [])
    if not llm.config.causal:  # an encoder (arch/encoder.py): Ollama's word for an embedding-only model
        caps = ["embedding"]
    caps += ["vision"] if llm.vision is not None else []  # Ollama's word for image input
    return {
        "license": str(meta.get("general.license", "")),
        "modelfile": f"# served by edgellm\nFROM {llm.path}\n",
        "parameters": "",
        "template": template,
        "details": _details(llm.metadata),
        "model_info": info,
        "capabilities": caps,
        "modified_at": model_entry(state, state.model_name)["modified_at"],
    }
