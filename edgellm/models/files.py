"""What the catalog (catalog.py) and the Hugging Face Hub puller (hub.py) share: the error for a model that
cannot be found or fetched, and a file's SHA-256, which both check downloads against."""

from __future__ import annotations

import hashlib
from pathlib import Path


class ModelNotFoundError(FileNotFoundError):
    pass


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    return h.hexdigest()
