"""Tiny random LoRA adapters for a synthetic base model (testing/synthetic/models.py), laid out as llama.cpp's
convert_lora_to_gguf.py writes them: general.type = adapter, adapter.type = lora, adapter.lora.alpha,
and per adapted base matrix W [n_out, n_in] (numpy order) `<W's name>.lora_a` [r, n_in] and
`<W's name>.lora_b` [n_out, r]. The bytes are a function of the arguments alone (fixtures record sha256).

Example:
    base = write_tiny_model(tmp_path / "base.gguf", "llama", "F32")
    a = write_tiny_lora(tmp_path / "a.gguf", base, rank=4, seed=1)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from gguf import GGMLQuantizationType

from edgellm.gguf.load import load_gguf

T = GGMLQuantizationType
# the attention and feed-forward matrices of every layer (roles: the name without blk.N. and .weight)
ALL_ROLES = ("attn_q", "attn_k", "attn_v", "attn_qkv", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def _encode(w: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    return w if qtype == T.F32 else gguf.quants.quantize(w, qtype)


def write_tiny_lora(
    path: str | Path,
    base: str | Path,
    *,
    rank: int = 4,
    alpha: float | None = 8.0,
    roles: Iterable[str] = ALL_ROLES,
    layers: Iterable[int] | None = None,
    seed: int = 1,
    qtype_a: GGMLQuantizationType | str = T.F32,
    qtype_b: GGMLQuantizationType | str = T.F32,
    b_std: float = 0.5,
    arch: str | None = None,
    extra_tensors: Mapping[str, np.ndarray] | None = None,
    shape_overrides: Mapping[str, tuple[int, ...]] | None = None,
    metadata_overrides: Mapping[str, Any] | None = None,
) -> Path:
    """A random rank-`rank` adapter on the base matrices of `roles` (in `layers`; default every layer;
    role "output": output.weight, when the base has one)
    of the base GGUF at `base`; returns `path`. alpha None leaves adapter.lora.alpha out (llama.cpp: the
    scale is then the user's alone). A ~ N(0, 1/n_in), B ~ N(0, b_std^2 / r): each update is of the order
    of the base product, so outputs with and without the adapter differ. arch: the file's architecture
    (default the base's). extra_tensors: name -> F32 array written as is; shape_overrides: tensor name ->
    the (numpy-order) shape to write it with (mismatch tests); metadata_overrides: key -> value (None
    deletes: general.type, adapter.type, adapter.lora.alpha)."""
    g = load_gguf(base)
    rng = np.random.default_rng(seed)
    qa, qb = (
        T[qtype_a] if isinstance(qtype_a, str) else qtype_a,
        T[qtype_b] if isinstance(qtype_b, str) else qtype_b,
    )
    layer_set = None if layers is None else set(layers)
    shape_overrides = dict(shape_overrides or {})
    w = gguf.GGUFWriter(str(path), arch or g.architecture)
    md: dict[str, Any] = {"general.type": "adapter", "adapter.type": "lora"}
    if alpha is not None:
        md["adapter.lora.alpha"] = float(alpha)
    md.update(metadata_overrides or {})
    for key, value in md.items():
        if value is None:
            continue
        if key == "general.type":
            w.add_type(value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        else:
            w.add_string(key, value)
    roles = tuple(roles)
    for name, t in g.tensors.items():
        parts = name.split(".")
        if name == "output.weight":  # the vocabulary projection (role "output")
            if "output" not in roles:
                continue
        elif len(parts) != 4 or parts[0] != "blk" or parts[2] not in roles or parts[3] != "weight":
            continue
        elif layer_set is not None and int(parts[1]) not in layer_set:
            continue
        n_out, n_in = t.shape
        a_shape = shape_overrides.get(name + ".lora_a", (rank, n_in))
        b_shape = shape_overrides.get(name + ".lora_b", (n_out, rank))
        a = (rng.standard_normal(a_shape) / np.sqrt(a_shape[1])).astype(np.float32)
        b = (rng.standard_normal(b_shape) * b_std / np.sqrt(b_shape[1])).astype(np.float32)
        w.add_tensor(name + ".lora_a", _encode(a, qa), raw_dtype=qa if qa != T.F32 else None)
        w.add_tensor(name + ".lora_b", _encode(b, qb), raw_dtype=qb if qb != T.F32 else None)
    for name, arr in (extra_tensors or {}).items():
        w.add_tensor(name, np.asarray(arr, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)
