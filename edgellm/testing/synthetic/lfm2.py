"""LFM2's part of the synthetic writer (testing/synthetic/models.py): its layer kinds, tensors and extra
metadata keys as llama.cpp's LFM2 converter (conversion/lfm2.py) writes them."""

from __future__ import annotations

from typing import Any

from gguf import GGUFValueType

L_CACHE = 3  # lfm2.shortconv.l_cache of every released LFM2


def lfm2_conv_layers(n_layers: int) -> list[bool]:
    """Which layers are short convolutions: all but il % 3 == 1 (the real ones have 2 or 3 conv layers
    between attention layers): conv, attention, conv, conv, attention, conv, ..."""
    return [il % 3 != 1 for il in range(n_layers)]


def lfm2_shapes(
    n_layers: int, n_embd: int, n_kv_heads: int, head_dim: int, n_ff: int, n_vocab: int, tied: bool
) -> dict[str, tuple[int, ...]]:
    """Tensor name -> numpy-order shape, in the converter's order; the conv kernel [n_embd, l_cache]
    (ggml's {l_cache, n_embd}: the checkpoint's [n_embd, 1, l_cache] squeezed)."""
    e, kv = n_embd, n_kv_heads * head_dim
    shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (n_vocab, e)}
    for il, conv in enumerate(lfm2_conv_layers(n_layers)):
        p = f"blk.{il}."
        shapes[p + "attn_norm.weight"] = (e,)
        if conv:
            shapes[p + "shortconv.in_proj.weight"] = (3 * e, e)  # B | C | x
            shapes[p + "shortconv.conv.weight"] = (e, L_CACHE)
            shapes[p + "shortconv.out_proj.weight"] = (e, e)
        else:
            shapes[p + "attn_q.weight"] = (e, e)
            shapes[p + "attn_k.weight"] = (kv, e)
            shapes[p + "attn_v.weight"] = (kv, e)
            shapes[p + "attn_q_norm.weight"] = (head_dim,)
            shapes[p + "attn_k_norm.weight"] = (head_dim,)
            shapes[p + "attn_output.weight"] = (e, e)
        shapes[p + "ffn_norm.weight"] = (e,)
        shapes[p + "ffn_gate.weight"] = (n_ff, e)
        shapes[p + "ffn_up.weight"] = (n_ff, e)
        shapes[p + "ffn_down.weight"] = (e, n_ff)
    shapes["token_embd_norm.weight"] = (e,)  # the final norm, under the converter's name
    if not tied:
        shapes["output.weight"] = (n_vocab, e)
    return shapes


Metadata = dict[str, tuple[Any, GGUFValueType, GGUFValueType | None]]  # key -> (value, type, element type)


def lfm2_metadata(n_layers: int, n_kv_heads: int) -> Metadata:
    """The keys that differ from the common ones: head_count_kv per layer (0 for a conv layer; gguf-py's
    add_array writes Python ints as INT32) and the conv width."""
    counts = [0 if conv else n_kv_heads for conv in lfm2_conv_layers(n_layers)]
    return {
        "lfm2.attention.head_count_kv": (counts, GGUFValueType.ARRAY, GGUFValueType.INT32),
        "lfm2.shortconv.l_cache": (L_CACHE, GGUFValueType.UINT32, None),
    }
