"""Opening a model: its file read by reader.py and, when that is the first part of a split model, every other
part brought and joined by split.py."""

from __future__ import annotations

from pathlib import Path

from edgellm.gguf.reader import GGUFFile, load_gguf_part
from edgellm.gguf.split import join_split_parts


def load_gguf(path: str | Path) -> GGUFFile:
    """Parse the header, metadata and tensor table of a GGUF file; tensor data stays memory-mapped. The
    first part of a split model (split.count > 1 in its metadata) brings every part (split.py)."""
    g = load_gguf_part(path)
    if "split.count" in g.metadata or "split.no" in g.metadata:
        return join_split_parts(g)
    return g
