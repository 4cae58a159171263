"""Loading an mmproj GGUF (llama.cpp's clip.cpp: clip_model_loader): the clip.* keys every vision
projector shares, checked, then the projector type's own module (one file per type) reads its tensors.
A file whose projector type edgellm does not implement, or that has no vision encoder (audio only), is
refused naming it: never a silently different image."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from edgellm.gguf.reader import GGUFError, load_gguf_part
from edgellm.vision.clip_file import TensorReader, VisionParams, read_params
from edgellm.vision.image import ImageError, decode_image


class Projector(Protocol):
    """What a projector module's class provides (vision/<type>.py)."""

    begin: str  # the text before an image's embeddings (its token text), "" for none
    end: str  # the text after them
    non_causal: bool  # the text model attends over the image's tokens both ways (mtmd_decode_use_non_causal)

    def n_tokens(self) -> int: ...

    def encode(self, rgb: np.ndarray) -> np.ndarray:
        """[n_tokens, projection_dim] float32 embeddings of one decoded RGB image [H, W, 3] uint8."""


def _projectors() -> dict[str, Any]:
    from edgellm.vision.gemma3 import Gemma3Projector

    return {"gemma3": Gemma3Projector}


SUPPORTED_PROJECTORS = ("gemma3",)


class VisionEncoder:
    """An mmproj file ready to encode images for one text model."""

    def __init__(self, path: str | Path, n_embd_text: int | None = None) -> None:
        self.path = Path(path)
        gguf = load_gguf_part(self.path)
        self.params = read_params(gguf)
        cls = _projectors().get(self.params.projector)
        if cls is None:
            raise GGUFError(
                f"{self.path}: mmproj projector type {self.params.projector!r} is not supported "
                f"(edgellm supports: {', '.join(SUPPORTED_PROJECTORS)})"
            )
        self.projector: Projector = cls(self.params, TensorReader(gguf))
        self.n_embd_out = self.projector.n_embd_out
        if n_embd_text is not None and self.n_embd_out != n_embd_text:
            raise GGUFError(
                f"{self.path}: the projector makes {self.n_embd_out}-wide embeddings, the text model is "
                f"{n_embd_text} wide: this mmproj is for another model"
            )

    @property
    def name(self) -> str:
        return self.params.projector

    def encode_bytes(self, data: bytes) -> tuple[np.ndarray, str]:
        """(embeddings [n_tokens, n_embd_text] float32, the image's content hash): the hash of the encoded
        bytes keys the prefix cache, so the same image in a later request reuses its KV."""
        rgb = decode_image(data)
        return self.projector.encode(rgb), hashlib.sha256(data).hexdigest()


def load_mmproj(path: str | Path, n_embd_text: int | None = None) -> VisionEncoder:
    """The mmproj at path, checked against the text model's width when given. GGUFError naming what is
    wrong or unsupported."""
    return VisionEncoder(path, n_embd_text)


__all__ = ["ImageError", "VisionEncoder", "VisionParams", "load_mmproj"]
