"""Gemma 3's vision tower: SigLIP ViT, 2-D average pooling, the soft-embedding norm and the input
projection (llama.cpp tools/mtmd/models/siglip.cpp, PROJECTOR_TYPE_GEMMA3).

    x = conv2d(image [3, S, S], v.patch_embd.weight, stride p) + v.patch_embd.bias   # [N = (S/p)^2, E]
    x += v.position_embd.weight                                                     # learned, [N, E]
    for each block:
        x += attn_out(attention(q, k, v of LayerNorm(x) * ln1 + b))   (all N patches both ways)
        x += ffn_down(gelu(ffn_up(LayerNorm(x) * ln2 + b)))
    x = LayerNorm(x) * post_ln + b                                                  # [N, E]
    x = avg_pool_2d over k x k patches (k = clip.vision.projector.scale_factor, default 4)  # [N / k^2, E]
    x = rmsnorm(x) * mm.soft_emb_norm.weight
    out = x @ mm.input_projection.weight                                            # [N / k^2, n_embd_text]

The image is resized to S x S (bilinear, aspect kept, padded with black) and normalised per channel.
Wrapped in the prompt as <start_of_image> (embeddings) <end_of_image>; the text model attends over the
image's tokens non-causally (mtmd_decode_use_non_causal), and takes them unscaled (gemma3.cpp scales
token embeddings only).
"""

from __future__ import annotations

import numpy as np

from edgellm.backends.cpu.layernorm_gelu import gelu_cpu, layernorm_cpu
from edgellm.vision.clip_file import TensorReader, VisionParams
from edgellm.vision.image import normalize, resize_padded

DEFAULT_POOL = 4  # clip.cpp: every Gemma 3 size pools 4 x 4 patches; tiny test models say otherwise


def _f16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).astype(np.float32)


class Linear:
    """y = x @ W.T + b, with ggml's CPU rounding: an F16 weight multiplies activations rounded to f16."""

    def __init__(self, r: TensorReader, name: str, n_out: int, n_in: int, bias: bool = True) -> None:
        self.w = r.get(name + ".weight", (n_out, n_in))  # [out, in]
        self.half = r.gguf.tensors[name + ".weight"].qtype.name in ("F16", "BF16")
        self.b = r.get(name + ".bias", (n_out,)) if bias and r.has(name + ".bias") else None

    def __call__(self, x: np.ndarray) -> np.ndarray:
        y = (_f16(x) if self.half else x) @ self.w.T
        return y + self.b if self.b is not None else y


def _layernorm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    out = np.empty_like(x)
    layernorm_cpu(np.ascontiguousarray(x), w, b, np.float32(eps), out)  # the text models' LayerNorm kernel
    return out


class Block:
    def __init__(self, r: TensorReader, il: int, e: int, f: int) -> None:
        p = f"v.blk.{il}."
        self.ln1 = (r.get(p + "ln1.weight", (e,)), r.get(p + "ln1.bias", (e,)))
        self.ln2 = (r.get(p + "ln2.weight", (e,)), r.get(p + "ln2.bias", (e,)))
        self.q, self.k, self.v = (Linear(r, p + f"attn_{n}", e, e) for n in "qkv")
        self.o = Linear(r, p + "attn_out", e, e)
        up, down = r.gguf.tensors.get(p + "ffn_up.weight"), r.gguf.tensors.get(p + "ffn_down.weight")
        if up is not None and down is not None and tuple(down.shape) == (f, e):
            # older converters wrote up and down swapped; clip.cpp swaps them back (is_ffn_swapped)
            self.up, self.down = Linear(r, p + "ffn_down", f, e), Linear(r, p + "ffn_up", e, f)
        else:
            self.up, self.down = Linear(r, p + "ffn_up", f, e), Linear(r, p + "ffn_down", e, f)


class Gemma3Projector:
    begin = "<start_of_image>"
    end = "<end_of_image>"
    non_causal = True

    def __init__(self, params: VisionParams, r: TensorReader) -> None:
        self.p = params
        e, f, ps, s = params.n_embd, params.n_ff, params.patch_size, params.image_size
        if not params.use_gelu:  # clip.cpp would use gelu_quick; Gemma 3's files all say use_gelu
            raise ValueError(f"{r.gguf.path}: a gemma3 projector without clip.use_gelu is not supported")
        self.side = s // ps  # patches per side
        self.pool = int(r.gguf.get("clip.vision.projector.scale_factor", DEFAULT_POOL))
        if self.pool <= 0 or self.side % self.pool:
            raise ValueError(f"{r.gguf.path}: {self.side} patches per side do not pool by {self.pool}")
        self.patch_w = r.get("v.patch_embd.weight", (e, 3, ps, ps)).reshape(e, 3 * ps * ps)  # [E, 3*p*p]
        self.patch_half = r.gguf.tensors["v.patch_embd.weight"].qtype.name in ("F16", "BF16")
        self.patch_b = r.get("v.patch_embd.bias", (e,))
        self.pos = r.get("v.position_embd.weight", (self.side * self.side, e))  # [N, E]
        self.blocks = [Block(r, il, e, f) for il in range(params.n_layers)]
        self.post_ln = (r.get("v.post_ln.weight", (e,)), r.get("v.post_ln.bias", (e,)))
        self.soft_norm = r.get("mm.soft_emb_norm.weight", (e,))
        proj = r.gguf.tensors.get("mm.input_projection.weight")
        n_out = proj.shape[1] if proj is not None and len(proj.shape) == 2 else 0
        self.proj = r.get("mm.input_projection.weight", (e, n_out))  # [E, n_embd_text]: x @ proj
        self.proj_half = proj.qtype.name in ("F16", "BF16")
        self.n_embd_out = n_out

    def n_tokens(self) -> int:
        return (self.side // self.pool) ** 2

    def preprocess(self, rgb: np.ndarray) -> np.ndarray:
        """[3, S, S] float32: mtmd_image_preprocessor_fixed_size with Gemma 3's bilinear resize."""
        s = self.p.image_size
        return normalize(resize_padded(rgb, s, s, "bilinear"), self.p.image_mean, self.p.image_std)

    def patches(self, img: np.ndarray) -> np.ndarray:
        """[N, 3*p*p] rows in conv2d's order: patch (py, px) at row py * side + px, each [c, ky, kx]."""
        ps, n = self.p.patch_size, self.side
        x = img.reshape(3, n, ps, n, ps).transpose(1, 3, 0, 2, 4).reshape(n * n, 3 * ps * ps)
        return _f16(x) if self.patch_half else x  # im2col makes an F16 kernel's input f16

    def encode(self, rgb: np.ndarray) -> np.ndarray:
        e, h = self.p.n_embd, self.p.n_heads
        d = e // h
        x = self.patches(self.preprocess(rgb)) @ self.patch_w.T + self.patch_b + self.pos  # [N, E]
        n = x.shape[0]
        for b in self.blocks:
            a = _layernorm(x, *b.ln1, self.p.eps)
            # clip.cpp's flash attention on the CPU reads Q, K and V as f16
            q, k, v = (_f16(lin(a)).reshape(n, h, d).transpose(1, 0, 2) for lin in (b.q, b.k, b.v))
            att = np.empty((n, h, d), np.float32)
            for hd in range(h):  # one head's [N, N] scores at a time (4096 patches: 64 MB, not 1 GB)
                s = (q[hd] @ k[hd].T) * np.float32(1.0 / np.sqrt(d))
                s = np.exp(s - s.max(axis=-1, keepdims=True))
                s /= s.sum(axis=-1, keepdims=True)
                att[:, hd] = s @ v[hd]
            att = att.reshape(n, e)  # [N, E]
            x = x + b.o(att)
            hmid = np.ascontiguousarray(b.up(_layernorm(x, *b.ln2, self.p.eps)), np.float32)  # [N, F]
            gelu_cpu(hmid)  # llama.cpp's f16-table GELU
            x = x + b.down(hmid)
        x = _layernorm(x.astype(np.float32), *self.post_ln, self.p.eps)
        k_, m = self.pool, self.side // self.pool
        x = x.reshape(m, k_, m, k_, e).mean(axis=(1, 3), dtype=np.float32).reshape(m * m, e)  # [M, E]
        x = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + np.float32(self.p.eps)) * self.soft_norm
        out = (_f16(x) if self.proj_half else x) @ self.proj
        return np.ascontiguousarray(out, np.float32)  # [M, n_embd_text]
