"""Tiny random-weight mmproj files with llama.cpp's keys and tensor names (tools/mtmd/clip-impl.h), for
the vision tests and the llama.cpp fixtures: a `gemma3` projector (SigLIP ViT + pooling + soft-emb norm +
input projection) sized to a tiny text model's width; and a small PNG to show it."""

from __future__ import annotations

import io
from pathlib import Path

import gguf
import numpy as np


def write_tiny_mmproj(
    path: str | Path,
    n_embd_text: int,
    *,
    projector: str = "gemma3",
    image_size: int = 32,
    patch_size: int = 4,
    n_embd: int = 32,
    n_ff: int = 64,
    n_layers: int = 2,
    n_heads: int = 4,
    pool: int = 2,
    seed: int = 0,
    dtype: type = np.float32,
) -> Path:
    """Write a tiny random gemma3 mmproj to path: (image_size / patch_size / pool)^2 tokens per image,
    each n_embd_text wide. `projector` is written as given (a refusal test names another type)."""
    path = Path(path)
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(path, "clip")
    w.add_string("clip.projector_type", projector)
    w.add_bool("clip.has_vision_encoder", True)
    w.add_bool("clip.has_text_encoder", False)
    w.add_bool("clip.use_gelu", True)
    p = "clip.vision."
    w.add_uint32(p + "image_size", image_size)
    w.add_uint32(p + "patch_size", patch_size)
    w.add_uint32(p + "embedding_length", n_embd)
    w.add_uint32(p + "feed_forward_length", n_ff)
    w.add_uint32(p + "block_count", n_layers)
    w.add_uint32(p + "attention.head_count", n_heads)
    w.add_float32(p + "attention.layer_norm_epsilon", 1e-6)
    w.add_uint32(p + "projection_dim", n_embd_text)
    w.add_uint32(p + "projector.scale_factor", pool)
    w.add_array(p + "image_mean", [0.5, 0.5, 0.5])
    w.add_array(p + "image_std", [0.5, 0.5, 0.5])
    n_patches = (image_size // patch_size) ** 2

    def mat(*shape: int, gain: float = 1.0) -> np.ndarray:  # ~N(0, gain^2/cols): activations stay O(1)
        return (gain * rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(dtype)

    def vec(n: int, mean: float = 0.0, std: float = 0.1) -> np.ndarray:
        return (mean + std * rng.standard_normal(n)).astype(np.float32)

    w.add_tensor("v.patch_embd.weight", mat(n_embd, 3, patch_size, patch_size, gain=patch_size))
    w.add_tensor("v.patch_embd.bias", vec(n_embd))
    w.add_tensor(
        "v.position_embd.weight", (0.5 * rng.standard_normal((n_patches, n_embd))).astype(np.float32)
    )
    for il in range(n_layers):
        b = f"v.blk.{il}."
        for n in ("attn_q", "attn_k", "attn_v", "attn_out"):
            w.add_tensor(b + n + ".weight", mat(n_embd, n_embd))
            w.add_tensor(b + n + ".bias", vec(n_embd))
        for n in ("ln1", "ln2"):
            w.add_tensor(b + n + ".weight", vec(n_embd, 1.0))
            w.add_tensor(b + n + ".bias", vec(n_embd))
        w.add_tensor(b + "ffn_up.weight", mat(n_ff, n_embd))
        w.add_tensor(b + "ffn_up.bias", vec(n_ff))
        w.add_tensor(b + "ffn_down.weight", mat(n_embd, n_ff))
        w.add_tensor(b + "ffn_down.bias", vec(n_embd))
    w.add_tensor("v.post_ln.weight", vec(n_embd, 1.0))
    w.add_tensor("v.post_ln.bias", vec(n_embd))
    w.add_tensor("mm.soft_emb_norm.weight", vec(n_embd, 1.0))
    w.add_tensor("mm.input_projection.weight", mat(n_embd, n_embd_text, gain=np.sqrt(n_embd_text / n_embd)))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def tiny_png(width: int = 40, height: int = 24, seed: int = 0) -> bytes:
    """A small PNG of smooth colour gradients plus noise (resizing it changes it visibly)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    img = np.stack(
        [x * 255 / max(width - 1, 1), y * 255 / max(height - 1, 1), (x + y) * 127 / (width + height)], -1
    )
    img = np.clip(img + rng.integers(-40, 40, img.shape), 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="PNG")
    return buf.getvalue()
