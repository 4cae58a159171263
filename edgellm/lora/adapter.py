"""A GGUF LoRA adapter (what llama.cpp's convert_lora_to_gguf.py writes), bound to the base model it adapts.

The file: `general.type = adapter`, `adapter.type = lora`, `adapter.lora.alpha` (f32; absent = 0),
`general.architecture` = the base's; per adapted base matrix W [n_out, n_in] two tensors named after it:
`<W's name>.lora_a` [r, n_in] and `<W's name>.lora_b` [n_out, r] (numpy order; ggml's ne reversed), so that
W x + scale * B (A x) is the adapted product (llama-graph.cpp's build_lora_mm), with
scale = user_scale * alpha / r, or user_scale when alpha is 0 (llama_adapter_lora_weight::get_scale, r being
lora_b's ne[0]). `*_norm.weight` tensors are skipped, as llama.cpp skips them; any other suffix is refused.

edgellm fuses some base matrices (attention Q|K|V into one wqkv, FFN gate|up into one gate_up:
arch/common.py's load_attention / load_feed_forward): a binding maps each adapted base tensor to the fused
matmul it is part of and the output columns it fills there (LoraSlot).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType
from gguf import quants as gguf_quants

from edgellm.gguf.load import load_gguf
from edgellm.gguf.model_config import ModelConfig
from edgellm.gguf.reader import GGUFError, GGUFFile
from edgellm.quants.traits import get_traits

T = GGMLQuantizationType
# A and B types read (llama.cpp runs any; these are what convert_lora_to_gguf.py writes: --outtype)
ADAPTER_TYPES = frozenset({T.F32, T.F16, T.BF16, T.Q8_0})


class LoraError(ValueError):
    """An adapter that cannot be used with this base model; the message names the file and the mismatch."""


@dataclass(frozen=True)
class LoraPart:
    """One adapted base tensor inside the matmul that computes it."""

    tensor: str  # the base tensor's name (blk.0.attn_q.weight)
    a: np.ndarray  # [r, n_in] float32
    b: np.ndarray  # [n_cols, r] float32
    factor: float  # alpha / r (1 when alpha is 0): the user's scale times this is llama.cpp's scale
    col0: int  # the output columns of the fused matmul this tensor fills: [col0, col0 + n_cols)
    # what llama.cpp's CPU rounds each product's input to for A's and B's types (their vec_dot: "f32",
    # "f16", "bf16", "q8_0"): apply.py rounds the same, so F16 / BF16 / Q8_0 adapters match it to ~1e-9
    a_dot: str = "f32"
    b_dot: str = "f32"

    @property
    def rank(self) -> int:
        return self.a.shape[0]


# The matmul a part belongs to: (layer, "wqkv" | "wo" | "gate_up" | "down"), or (-1, "output").
SlotKey = tuple[int, str]


@dataclass
class LoraAdapter:
    path: str
    alpha: float
    parts: dict[SlotKey, list[LoraPart]] = field(default_factory=dict)
    task_name: str = ""

    @property
    def n_tensors(self) -> int:
        return sum(len(p) for p in self.parts.values())

    @property
    def ranks(self) -> list[int]:
        return sorted({p.rank for ps in self.parts.values() for p in ps})


def base_slots(cfg: ModelConfig, base: GGUFFile) -> dict[str, tuple[SlotKey, int]]:
    """Every base tensor an adapter may name -> (its matmul, its first output column there), as the
    shared blocks of arch/common.py fuse them."""
    H, Hkv, d, f = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.n_ff
    slots: dict[str, tuple[SlotKey, int]] = {}
    for il in range(cfg.n_layers):
        p = f"blk.{il}."
        if cfg.qkv_fused[il]:
            slots[p + "attn_qkv.weight"] = ((il, "wqkv"), 0)
        else:
            for name, col0 in (("attn_q", 0), ("attn_k", H * d), ("attn_v", (H + Hkv) * d)):
                slots[p + name + ".weight"] = ((il, "wqkv"), col0)
        slots[p + "attn_output.weight"] = ((il, "wo"), 0)
        if p + "ffn_gate_inp.weight" in base.tensors:  # a mixture of experts (no dense FFN matmuls)
            continue
        if cfg.gated_ffn and not cfg.gate_up_fused:
            slots[p + "ffn_gate.weight"] = ((il, "gate_up"), 0)
            slots[p + "ffn_up.weight"] = ((il, "gate_up"), f)
        else:  # fused gate|up (Phi-3), or up alone (no gate: StarCoder 2, GPT-2)
            slots[p + "ffn_up.weight"] = ((il, "gate_up"), 0)
        slots[p + "ffn_down.weight"] = ((il, "down"), 0)
    if "output.weight" in base.tensors:
        slots["output.weight"] = ((-1, "output"), 0)
    return {name: slot for name, slot in slots.items() if name in base.tensors}


def _vec_dot(g: GGUFFile, name: str) -> str:
    return get_traits(g.tensors[name].qtype).vec_dot


def _read(g: GGUFFile, name: str) -> np.ndarray:
    t = g.tensors[name]
    if t.qtype not in ADAPTER_TYPES:
        names = ", ".join(sorted(q.name for q in ADAPTER_TYPES))
        raise LoraError(f"{g.path}: tensor {name!r} is {t.type_name}; LoRA tensors must be one of {names}")
    if len(t.shape) != 2:
        raise LoraError(f"{g.path}: tensor {name!r} has shape {t.shape}; a LoRA tensor is a matrix")
    raw = np.ascontiguousarray(t.data, dtype=np.uint8)
    return np.ascontiguousarray(gguf_quants.dequantize(raw, t.qtype).reshape(t.shape), dtype=np.float32)


def load_adapter(path: str | Path, base: GGUFFile, cfg: ModelConfig, model: Any = None) -> LoraAdapter:
    """Read the adapter at `path` and bind it to `base` (the model's GGUF, `cfg` its config; `model`, the
    loaded model: its forward must be the shared one the LoRA hooks are in). LoraError on any mismatch."""
    path = str(path)
    try:
        g = load_gguf(path)
    except (GGUFError, OSError) as e:
        raise LoraError(f"cannot read LoRA adapter {path}: {e}") from e
    kind = g.get("general.type")
    if kind != "adapter":
        raise LoraError(
            f"{path}: general.type is {kind!r}, not 'adapter' (is it a model rather than a LoRA?)"
        )
    if g.get("adapter.type") != "lora":
        raise LoraError(
            f"{path}: adapter.type is {g.get('adapter.type')!r}; only 'lora' adapters are supported"
        )
    arch = g.get("general.architecture")
    if arch != base.architecture:
        raise LoraError(
            f"{path}: adapter for architecture {arch!r}, but the base model is {base.architecture!r}"
        )
    if "adapter.alora.invocation_tokens" in g.metadata:
        raise LoraError(f"{path}: activated LoRA (adapter.alora.invocation_tokens) is not supported")
    _check_forward(path, cfg, model)
    alpha = float(g.get("adapter.lora.alpha", 0.0) or 0.0)
    pairs: dict[str, dict[str, str]] = {}
    for name in g.tensors:
        for suffix in (".lora_a", ".lora_b"):
            if name.endswith(suffix):
                pairs.setdefault(name[: -len(suffix)], {})[suffix] = name
                break
        else:
            if not name.endswith("_norm.weight"):  # llama.cpp skips adapted norms (not applied)
                raise LoraError(f"{path}: tensor {name!r} has an unexpected suffix (not .lora_a / .lora_b)")
    if not pairs:
        raise LoraError(f"{path}: no .lora_a / .lora_b tensors")
    slots = base_slots(cfg, base)
    adapter = LoraAdapter(path, alpha, task_name=str(g.get("adapter.lora.task_name", "") or ""))
    for target, pair in sorted(pairs.items()):
        if len(pair) != 2:
            raise LoraError(f"{path}: the LoRA pair for {target!r} is missing one of .lora_a / .lora_b")
        if target not in base.tensors:
            raise LoraError(f"{path}: LoRA tensor {target!r} does not exist in the base model (wrong base?)")
        if target not in slots:
            raise LoraError(f"{path}: LoRA on {target!r} is not supported (edgellm adapts the attention, "
                            "dense feed-forward and output matrices)")  # fmt: skip
        a, b = _read(g, pair[".lora_a"]), _read(g, pair[".lora_b"])
        n_out, n_in = base.tensors[target].shape
        if a.shape[1] != n_in or b.shape[0] != n_out:
            raise LoraError(
                f"{path}: LoRA for {target!r} has A {a.shape} and B {b.shape}, which do not fit the base "
                f"tensor's shape ({n_out}, {n_in}) (wrong base model?)"
            )
        if a.shape[0] != b.shape[1] or a.shape[0] == 0:
            raise LoraError(
                f"{path}: LoRA for {target!r}: A {a.shape} and B {b.shape} disagree on the rank "
                "(lora_a must be [rank, n_in], lora_b [n_out, rank])"
            )
        if not (np.isfinite(a).all() and np.isfinite(b).all()):
            raise LoraError(f"{path}: LoRA for {target!r} holds non-finite values")
        rank = b.shape[1]
        slot, col0 = slots[target]
        factor = alpha / rank if alpha else 1.0
        dots = _vec_dot(g, pair[".lora_a"]), _vec_dot(g, pair[".lora_b"])
        part = LoraPart(target, a, np.ascontiguousarray(b), factor, col0, *dots)
        adapter.parts.setdefault(slot, []).append(part)
    return adapter


def _check_forward(path: str, cfg: ModelConfig, model: Any) -> None:
    """The updates are added by the shared forward (arch/llama.py's LlamaModel._layers and arch/common.py's
    blocks); an architecture with its own refuses adapters rather than ignoring them."""
    if model is None:
        return
    from edgellm.arch.llama import LlamaModel

    if not isinstance(model, LlamaModel) or type(model)._layers is not LlamaModel._layers:
        raise LoraError(f"{path}: LoRA adapters are not supported for {cfg.arch} models (its own layer loop)")
