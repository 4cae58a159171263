"""Metadata of the synthetic writer (testing/synthetic/models.py): each architecture's hyper-parameter keys
and its tiny tokenizer (tiny_vocab.py), with the keys and value types llama.cpp's convert_hf_to_gguf.py writes
(LFM2's extra keys: testing/synthetic/lfm2.py)."""

from __future__ import annotations

from typing import Any

from gguf import GGUFValueType

from edgellm.testing.harmony import HARMONY_SPECIALS, HARMONY_TEMPLATE
from edgellm.testing.synthetic.lfm2 import lfm2_metadata
from edgellm.testing.synthetic.qwen35 import qwen35_metadata
from edgellm.testing.synthetic.shapes import LAYER_NORM_ARCHS
from edgellm.testing.tiny_vocab import CONTROL, bpe_vocab, spm_vocab

GEMMA_ARCHS = ("gemma2", "gemma3")  # SentencePiece vocabulary, head size always written
# written by llama.cpp's LlamaModel converter (and its subclasses)
LLAMA_ROPE_ARCHS = ("llama", "granite", "smollm3", "mistral3", "llama4")
BPE_PRE = {
    "llama": "default", "granite": "default", "smollm3": "default", "starcoder2": "starcoder",
    "gpt2": "gpt-2", "lfm2": "lfm2", "gpt-oss": "gpt-4o", "qwen35": "qwen35",
    "qwen35moe": "qwen35",
}  # fmt: skip
# Granite's four multipliers (the real 3.x 2B has 12, 0.22, 1/64 and 8: with tiny random weights those
# leave the embedding so dominant that a wrong attention scale moves the logits by NMSE 1e-5 only). These
# each move them by NMSE 5e-3 or more when dropped.
GRANITE_SCALES = {"embedding_scale": 2.0, "residual_scale": 0.5, "attention.scale": 0.5, "logit_scale": 2.0}


def _vocab_padding(n_base: int, n_vocab: int | None) -> list[str]:
    """Control tokens that bring a base vocabulary of n_base tokens up to n_vocab."""
    if n_vocab is None:
        return []
    if n_vocab < n_base:
        raise ValueError(f"n_vocab must be at least the base vocabulary's {n_base} tokens, got {n_vocab}")
    return [f"<extra_{i}>" for i in range(n_vocab - n_base)]


def model_metadata(
    arch: str,
    n_layers: int,
    n_embd: int,
    n_heads: int,
    n_kv_heads: int,
    head_dim: int,
    n_ff: int,
    context_length: int,
    rope_base: float,
    rms_eps: float,
    sliding_window: int,
    n_vocab: int | None = None,
) -> dict[str, tuple[Any, GGUFValueType, GGUFValueType | None]]:
    """Key -> (value, type, array element type) as llama.cpp's convert_hf_to_gguf.py writes them."""
    U32, F32, STR, BOOL, ARR = (
        GGUFValueType.UINT32,
        GGUFValueType.FLOAT32,
        GGUFValueType.STRING,
        GGUFValueType.BOOL,
        GGUFValueType.ARRAY,
    )
    md: dict[str, tuple[Any, GGUFValueType, GGUFValueType | None]] = {
        "general.type": ("model", STR, None),
        # not "phi3" for phi3: llama.cpp then looks up Phi-3's SentencePiece tokens (</s>), which a tiny BPE
        # vocabulary lacks
        "general.name": ("Tiny Phi 3" if arch == "phi3" else f"Tiny {arch}", STR, None),
        "general.quantization_version": (2, U32, None),
    }
    p = arch + "."
    md[p + "block_count"] = (n_layers, U32, None)
    md[p + "context_length"] = (context_length, U32, None)
    md[p + "embedding_length"] = (n_embd, U32, None)
    md[p + "feed_forward_length"] = (n_ff, U32, None)
    md[p + "attention.head_count"] = (n_heads, U32, None)
    md[p + "attention.head_count_kv"] = (n_kv_heads, U32, None)
    md[p + "rope.freq_base"] = (rope_base, F32, None)
    if arch in LAYER_NORM_ARCHS:
        md[p + "attention.layer_norm_epsilon"] = (rms_eps, F32, None)
        if arch == "gpt2":  # no rope
            del md[p + "rope.freq_base"]
    else:
        md[p + "attention.layer_norm_rms_epsilon"] = (rms_eps, F32, None)
    if arch in LLAMA_ROPE_ARCHS or arch == "phi3":
        md[p + "rope.dimension_count"] = (head_dim, U32, None)
    if arch == "phi3":  # Phi-3's converter: the original context (LongRoPE's switch) and the window
        md[p + "rope.scaling.original_context_length"] = (context_length, U32, None)
        md[p + "attention.sliding_window"] = (sliding_window, U32, None)
    # The converters write the head size whenever it is not n_embd / n_heads (always for Gemma).
    if arch in GEMMA_ARCHS or head_dim != n_embd // n_heads:
        md[p + "attention.key_length"] = (head_dim, U32, None)
        md[p + "attention.value_length"] = (head_dim, U32, None)
    if arch == "gemma2":  # Gemma 2's config values (convert_hf_to_gguf.py Gemma2Model)
        md[p + "attn_logit_softcapping"] = (50.0, F32, None)
        md[p + "final_logit_softcapping"] = (30.0, F32, None)
    if arch == "granite":
        md.update({p + k: (v, F32, None) for k, v in GRANITE_SCALES.items()})
    if arch == "lfm2":
        md.update(lfm2_metadata(n_layers, n_kv_heads))
    if arch in ("qwen35", "qwen35moe", "qwen3next"):
        md.update(qwen35_metadata(arch, head_dim))
    if arch == "gpt-oss":
        md[p + "attention.sliding_window"] = (sliding_window, U32, None)
    if arch == "llama4":  # Maverick's interleave: the experts on every second layer
        md[p + "interleave_moe_layer_step"] = (2, U32, None)
    if arch == "deepseek2":  # DeepSeek V3's layout at head_dim d: latent 2d, rope d, nope 2d, value d
        r = 2 * head_dim
        md[p + "attention.head_count_kv"] = (1, U32, None)
        md[p + "attention.key_length"] = (r + head_dim, U32, None)
        md[p + "attention.value_length"] = (r, U32, None)
        md[p + "attention.key_length_mla"] = (3 * head_dim, U32, None)
        md[p + "attention.value_length_mla"] = (head_dim, U32, None)
        md[p + "rope.dimension_count"] = (head_dim, U32, None)
        md[p + "attention.q_lora_rank"] = (2 * head_dim, U32, None)
        md[p + "attention.kv_lora_rank"] = (r, U32, None)
        md[p + "leading_dense_block_count"] = (1, U32, None)
        md[p + "expert_shared_count"] = (1, U32, None)
        md[p + "expert_weights_norm"] = (True, BOOL, None)
        md[p + "expert_weights_scale"] = (2.5, F32, None)
        md[p + "expert_gating_func"] = (2, U32, None)
    if arch == "glm4moe":  # GLM-4.5-Air's settings: half the head rotated, 1 dense layer, 1 shared expert
        md[p + "rope.dimension_count"] = (head_dim // 2, U32, None)
        md[p + "leading_dense_block_count"] = (1, U32, None)
        md[p + "expert_shared_count"] = (1, U32, None)
        md[p + "expert_weights_norm"] = (True, BOOL, None)
        md[p + "expert_weights_scale"] = (2.5, F32, None)
        md[p + "expert_gating_func"] = (2, U32, None)
    if arch in GEMMA_ARCHS:
        md[p + "attention.sliding_window"] = (sliding_window, U32, None)
        tokens, types, scores = spm_vocab()
        extra = _vocab_padding(len(tokens), n_vocab)
        tokens, types, scores = tokens + extra, types + [CONTROL] * len(extra), scores + [0.0] * len(extra)
        md.update(
            {
                "tokenizer.ggml.model": ("llama", STR, None),
                "tokenizer.ggml.pre": ("default", STR, None),
                "tokenizer.ggml.tokens": (tokens, ARR, STR),
                "tokenizer.ggml.scores": (scores, ARR, F32),
                "tokenizer.ggml.token_type": (types, ARR, GGUFValueType.INT32),
                "tokenizer.ggml.bos_token_id": (2, U32, None),
                "tokenizer.ggml.eos_token_id": (1, U32, None),
                "tokenizer.ggml.unknown_token_id": (3, U32, None),
                "tokenizer.ggml.padding_token_id": (0, U32, None),
                "tokenizer.ggml.add_bos_token": (True, BOOL, None),
                "tokenizer.ggml.add_eos_token": (False, BOOL, None),
                "tokenizer.ggml.add_space_prefix": (False, BOOL, None),
            }
        )
    else:
        specials = HARMONY_SPECIALS if arch == "gpt-oss" else ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        tokens, types, merges = bpe_vocab(specials)
        extra = _vocab_padding(len(tokens), n_vocab)
        tokens, types = tokens + extra, types + [CONTROL] * len(extra)
        if arch in LLAMA_ROPE_ARCHS or arch == "lfm2":
            md[p + "vocab_size"] = (len(tokens), U32, None)
        md.update(
            {
                "tokenizer.ggml.model": ("gpt2", STR, None),
                "tokenizer.ggml.pre": (BPE_PRE.get(arch, "qwen2"), STR, None),
                "tokenizer.ggml.tokens": (tokens, ARR, STR),
                "tokenizer.ggml.token_type": (types, ARR, GGUFValueType.INT32),
                "tokenizer.ggml.merges": (merges, ARR, STR),
                "tokenizer.ggml.bos_token_id": (0, U32, None),
                "tokenizer.ggml.eos_token_id": (2, U32, None),
                "tokenizer.ggml.padding_token_id": (0, U32, None),
                "tokenizer.ggml.add_bos_token": (False, BOOL, None),
            }
        )
        if arch == "gpt-oss":
            md["tokenizer.chat_template"] = (HARMONY_TEMPLATE, STR, None)
    return md
