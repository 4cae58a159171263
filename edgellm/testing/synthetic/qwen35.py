"""Qwen 3.5's (and Qwen3-Next's) part of the synthetic writer (testing/synthetic/models.py): its layer kinds
(Gated DeltaNet, gated full attention), tensors and extra metadata keys as llama.cpp's Qwen3.5 converter
writes them and its llama_model_qwen35 reads them (src/models/qwen35.cpp)."""

from __future__ import annotations

from typing import Any

from gguf import GGUFValueType

FULL_ATTENTION_INTERVAL = 4  # every 4th layer is full attention, as every released Qwen 3.5
CONV_KERNEL = 4  # ssm.conv_kernel of every released Qwen 3.5
SSM_STATE = 16  # ssm.state_size: the key and value head size (128 in the real ones)
SSM_K_HEADS = 2  # ssm.group_count: key heads
SSM_V_HEADS = 4  # ssm.time_step_rank: value heads, a multiple of the key heads (they are tiled over them)
# rope.dimension_sections: the t, h, w sections spanning the rotated pairs (the real [11, 11, 10, 0] over
# 32 pairs); the rotated dims are half the head here (a quarter in the real ones)
ROPE_SECTIONS = [3, 3, 2, 0]


def qwen35_recurrent_layers(n_layers: int) -> list[bool]:
    return [(il + 1) % FULL_ATTENTION_INTERVAL != 0 for il in range(n_layers)]


def qwen35_shapes(
    arch: str,
    n_layers: int,
    n_embd: int,
    n_heads: int,
    n_kv_heads: int,
    head_dim: int,
    n_ff: int,
    n_vocab: int,
    tied: bool,
) -> dict[str, tuple[int, ...]]:
    """Tensor name -> numpy-order shape (ggml's ne reversed), in layer order (the experts replace the dense
    FFN after: synthetic.with_experts); qwen3next: one ssm_ba in place of ssm_beta and ssm_alpha."""
    e, S, Hk, Hv = n_embd, SSM_STATE, SSM_K_HEADS, SSM_V_HEADS
    conv = 2 * Hk * S + Hv * S  # q | k | v channels
    shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (n_vocab, e)}
    for il, recurrent in enumerate(qwen35_recurrent_layers(n_layers)):
        p = f"blk.{il}."
        shapes[p + "attn_norm.weight"] = (e,)
        if recurrent:
            shapes[p + "attn_qkv.weight"] = (conv, e)
            shapes[p + "attn_gate.weight"] = (Hv * S, e)
            shapes[p + "ssm_conv1d.weight"] = (conv, CONV_KERNEL)
            shapes[p + "ssm_dt.bias"] = (Hv,)
            shapes[p + "ssm_a"] = (Hv,)
            if arch == "qwen3next":
                shapes[p + "ssm_ba.weight"] = (2 * Hv, e)
            else:
                shapes[p + "ssm_beta.weight"] = (Hv, e)
                shapes[p + "ssm_alpha.weight"] = (Hv, e)
            shapes[p + "ssm_norm.weight"] = (S,)
            shapes[p + "ssm_out.weight"] = (e, Hv * S)
        else:
            shapes[p + "attn_q.weight"] = (2 * n_heads * head_dim, e)  # per head [q | gate]
            shapes[p + "attn_k.weight"] = (n_kv_heads * head_dim, e)
            shapes[p + "attn_v.weight"] = (n_kv_heads * head_dim, e)
            shapes[p + "attn_q_norm.weight"] = (head_dim,)
            shapes[p + "attn_k_norm.weight"] = (head_dim,)
            shapes[p + "attn_output.weight"] = (e, n_heads * head_dim)
        shapes[p + "post_attention_norm.weight"] = (e,)
        shapes[p + "ffn_gate.weight"] = (n_ff, e)
        shapes[p + "ffn_up.weight"] = (n_ff, e)
        shapes[p + "ffn_down.weight"] = (e, n_ff)
    shapes["output_norm.weight"] = (e,)
    if not tied:
        shapes["output.weight"] = (n_vocab, e)
    return shapes


Metadata = dict[str, tuple[Any, GGUFValueType, GGUFValueType | None]]  # key -> (value, type, element type)


def qwen35_metadata(arch: str, head_dim: int) -> Metadata:
    """The keys beyond the common ones: the DeltaNet sizes, the layer pattern, the partial multi-section
    rope (gguf-py writes the sections as INT32)."""
    U32, p = GGUFValueType.UINT32, arch + "."
    return {
        p + "ssm.conv_kernel": (CONV_KERNEL, U32, None),
        p + "ssm.state_size": (SSM_STATE, U32, None),
        p + "ssm.group_count": (SSM_K_HEADS, U32, None),
        p + "ssm.time_step_rank": (SSM_V_HEADS, U32, None),
        p + "ssm.inner_size": (SSM_STATE * SSM_V_HEADS, U32, None),
        p + "full_attention_interval": (FULL_ATTENTION_INTERVAL, U32, None),
        p + "rope.dimension_count": (head_dim // 2, U32, None),
        p + "attention.key_length": (head_dim, U32, None),
        p + "attention.value_length": (head_dim, U32, None),
    } | ({} if arch == "qwen3next" else {  # Qwen3-Next's rope has no sections
        p + "rope.dimension_sections": (ROPE_SECTIONS, GGUFValueType.ARRAY, GGUFValueType.INT32),
    })  # fmt: skip
