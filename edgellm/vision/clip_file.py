"""The mmproj file's shared part, as clip.cpp's clip_model_loader reads it: the clip.vision.* keys
(checked) and the tensors as float32 arrays with their shapes checked; each projector's module
(vision/<type>.py) builds on these."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from edgellm.gguf.reader import GGUFError, GGUFFile


@dataclass
class VisionParams:
    """clip.vision.* as clip_model_loader reads them (clip-impl.h's KEY_*)."""

    projector: str  # clip.projector_type (or clip.vision.projector_type for a mixed-modality file)
    image_size: int  # the encoder's square input side, pixels
    patch_size: int
    n_embd: int
    n_ff: int
    n_layers: int
    n_heads: int
    eps: float  # LayerNorm epsilon
    image_mean: np.ndarray  # [3]
    image_std: np.ndarray  # [3]
    projection_dim: int  # the text model's width the embeddings are for
    use_gelu: bool


class TensorReader:
    """The file's tensors as float32 numpy arrays (numpy order: GGUF's ne reversed), shape-checked."""

    def __init__(self, gguf: GGUFFile) -> None:
        self.gguf = gguf

    def has(self, name: str) -> bool:
        return name in self.gguf.tensors

    def get(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        t = self.gguf.tensors.get(name)
        if t is None:
            raise GGUFError(f"{self.gguf.path}: missing tensor {name!r}")
        if tuple(t.shape) != tuple(shape):
            raise GGUFError(f"{self.gguf.path}: tensor {name!r} has shape {t.shape}, expected {shape}")
        raw = np.asarray(t.data)
        if t.qtype == GGMLQuantizationType.F32:
            w = raw.view(np.float32)
        else:  # F16, BF16, Q8_0, ...: gguf-py's reference dequantization
            w = dequantize(raw, t.qtype)
        return np.ascontiguousarray(w, np.float32).reshape(shape)


def _key(g: GGUFFile, key: str, kind: type, default: Any = None) -> Any:
    v = g.get(key, default)
    if v is None:
        raise GGUFError(f"{g.path}: mmproj metadata has no {key}")
    if kind is int and (isinstance(v, bool) or not isinstance(v, int | np.integer) or v <= 0):
        raise GGUFError(f"{g.path}: {key} = {v!r} is not a positive integer")
    if kind is float and (not isinstance(v, int | float | np.floating) or not np.isfinite(v) or v <= 0):
        raise GGUFError(f"{g.path}: {key} = {v!r} is not a positive number")
    return kind(v)


def read_params(g: GGUFFile) -> VisionParams:
    if not g.get("clip.has_vision_encoder", False):
        raise GGUFError(f"{g.path}: this mmproj file has no vision encoder (clip.has_vision_encoder)")
    projector = g.get("clip.vision.projector_type") or g.get("clip.projector_type")
    if not isinstance(projector, str):
        raise GGUFError(f"{g.path}: mmproj metadata has no clip.projector_type")
    p = "clip.vision."
    mean, std = (np.asarray(g.get(p + k, []), np.float32) for k in ("image_mean", "image_std"))
    if mean.shape != (3,) or std.shape != (3,) or not (np.all(std > 0) and np.all(np.isfinite(mean))):
        raise GGUFError(f"{g.path}: {p}image_mean / image_std must be 3 finite values (std > 0)")
    params = VisionParams(
        projector=projector,
        image_size=_key(g, p + "image_size", int),
        patch_size=_key(g, p + "patch_size", int),
        n_embd=_key(g, p + "embedding_length", int),
        n_ff=_key(g, p + "feed_forward_length", int),
        n_layers=_key(g, p + "block_count", int),
        n_heads=_key(g, p + "attention.head_count", int),
        eps=_key(g, p + "attention.layer_norm_epsilon", float),
        image_mean=mean,
        image_std=std,
        projection_dim=_key(g, p + "projection_dim", int, 0) if g.get(p + "projection_dim") else 0,
        use_gelu=bool(g.get("clip.use_gelu", False)),
    )
    if params.n_embd % params.n_heads:
        raise GGUFError(f"{g.path}: vision width {params.n_embd} is not a multiple of {params.n_heads} heads")
    if params.image_size % params.patch_size or params.image_size > 4096:
        raise GGUFError(f"{g.path}: image_size {params.image_size} is not a multiple of the patch size "
                        f"{params.patch_size} (or is over 4096)")  # fmt: skip
    return params
