"""What edgellm does not implement, named the way a user would look it up: one table of the architectures
llama.cpp loads and edgellm refuses (with the features each one needs), and one of the tensors and
`{arch}.*` keys that mark such a feature in any file. A refusal says which feature is missing (e.g.
"gemma4: per-layer embeddings, shared-KV layers, ...") instead of only the architecture's or the tensor's
name: gguf/config.py arch_spec_of for an architecture, gguf/understood.py for a tensor or key of a
supported one. It lives beside the architecture files (no SPEC: the registry skips it), since gguf/ keeps
no per-architecture table (tests/test_layering.py).

Only data lives here: tests/gguf/test_unimplemented.py walks every entry (a file of each architecture, a
llama file with each tensor and each key) and checks that the refusal names the feature. An architecture
that gets its file in edgellm/arch/ leaves ARCHITECTURES (the test fails while it is in both).
"""

from __future__ import annotations

from collections.abc import Iterable

# general.architecture -> the features llama.cpp's src/models/<arch>.cpp runs that edgellm does not
ARCHITECTURES: dict[str, tuple[str, ...]] = {
    "gemma4": (
        "per-layer embeddings (per_layer_token_embd, per_layer_model_proj, inp_gate/proj/post_norm)",
        "shared-KV layers (attention.shared_kv_layers)",
        "sliding-window layers with their own head size and rope base",
        "proportional rope through rope_freqs on the global layers",
        "layer_output_scale",
        "mixture of experts beside a dense FFN (26B-A4B)",
    ),
    "gemma3n": (
        "AltUp (altup_* tensors, 4 streams)",
        "LAuReL (laurel_l/laurel_r, rank 64)",
        "per-layer embeddings (per_layer_token_embd, per_layer_model_proj)",
        "shared-KV layers",
        "activation sparsity (Gaussian top-k on the FFN gate)",
    ),
    "deepseek": ("shared experts and leading dense layers",),
    "qwen3vl": ("multimodal rope sections (rope.dimension_sections, M-RoPE)", "deepstack layers"),
    "qwen3vlmoe": ("multimodal rope sections (rope.dimension_sections, M-RoPE)", "deepstack layers"),
    "qwen2vl": ("multimodal rope sections (rope.dimension_sections, M-RoPE)",),
    "mamba": ("state-space (Mamba) layers: ssm_* tensors, a recurrent state",),
    "mamba2": ("state-space (Mamba 2) layers: ssm_* tensors, a recurrent state",),
    "jamba": ("state-space (Mamba) layers beside attention", "mixture of experts on alternate layers"),
    "falcon-h1": ("state-space (Mamba 2) heads in parallel with attention", "µP multipliers"),
    "granitehybrid": ("state-space (Mamba 2) layers beside attention",),
    "nemotron_h": ("state-space (Mamba 2) layers beside attention",),
    "rwkv6": ("RWKV time mixing (time_mix_* tensors, a recurrent state)",),
    "rwkv7": ("RWKV time mixing (time_mix_* tensors, a recurrent state)",),
    "t5": ("an encoder-decoder (cross-attention, relative position buckets)",),
    "falcon": ("parallel attention and FFN from one norm",),
    "command-r": ("parallel attention and FFN from one LayerNorm", "logit scale"),
    "cohere2": ("parallel attention and FFN from one LayerNorm", "sliding-window layers without rope"),
    "phi2": ("parallel attention and FFN", "partial rotary embedding"),
    "stablelm": ("partial rotary embedding with LayerNorm",),
    "minimax-m2": ("sigmoid expert gating with a selection bias (exp_probs_b)", "Q/K norms over all heads"),
    "ernie4_5-moe": ("mixture of experts after leading dense layers",),
    "hunyuan-moe": ("shared experts", "Q/K norms after rope"),
    "exaone4": ("sliding-window layers without rope",),
    "apertus": ("xIELU activation",),
}

# A tensor's role (the name after "blk.N.", or a global tensor's name) -> the feature it carries; a key
# ending "*" matches every role that starts with it.
TENSOR_FEATURES: dict[str, str] = {
    "per_layer_token_embd.weight": "per-layer embeddings",
    "per_layer_model_proj.weight": "per-layer embeddings",
    "per_layer_proj_norm.weight": "per-layer embeddings",
    "inp_gate.weight": "per-layer embeddings",
    "proj.weight": "per-layer embeddings",
    "post_norm.weight": "per-layer embeddings",
    "layer_output_scale.weight": "a per-layer output scale (layer_output_scale)",
    "altup_*": "AltUp",
    "laurel_*": "LAuReL",
    "attn_q_a*": "multi-head latent attention (q-LoRA)",
    "attn_q_b.weight": "multi-head latent attention (q-LoRA)",
    "attn_kv_a*": "multi-head latent attention (MLA)",
    "attn_kv_b.weight": "multi-head latent attention in the legacy unsplit attn_kv_b form (re-convert)",
    "attn_k_b.weight": "multi-head latent attention (MLA)",
    "attn_v_b.weight": "multi-head latent attention (MLA)",
    "exp_probs_b.bias": "an expert-selection bias (exp_probs_b, sigmoid gating)",
    "nextn.*": "multi-token prediction layers",
    "ssm_*": "state-space (Mamba) layers",
    "time_mix_*": "RWKV time mixing",
    "channel_mix_*": "RWKV channel mixing",
    "cls.weight": "a classifier head (rerankers)",
    "cls.bias": "a classifier head (rerankers)",
    "cls.output.weight": "a classifier head (rerankers)",
    "token_types.weight": "token-type embeddings (BERT)",
}

# An {arch}.* key's suffix -> the feature it selects (a key ending "*": every suffix that starts with it)
KEY_FEATURES: dict[str, str] = {
    "embedding_length_per_layer_input": "per-layer embeddings",
    "attention.shared_kv_layers": "shared-KV layers",
    "attention.q_lora_rank": "multi-head latent attention (q-LoRA)",
    "attention.kv_lora_rank": "multi-head latent attention (MLA)",
    "attention.key_length_mla": "multi-head latent attention (MLA)",
    "attention.value_length_mla": "multi-head latent attention (MLA)",
    "leading_dense_block_count": "leading dense layers before the experts",
    "expert_shared_count": "shared experts",
    "expert_weights_scale": "a scale on the experts' weights",
    "expert_weights_norm": "renormalised expert weights",
    "expert_gating_func": "an expert gating function (sigmoid gating)",
    "interleave_moe_layer_step": "experts on every n-th layer only",
    "attention.temperature_scale": "attention temperature tuning",
    "attention.temperature_length": "attention temperature tuning",
    "attention.indexer.*": "a sparse-attention indexer (DeepSeek sparse attention)",
    "rope.dimension_sections": "multimodal rope sections (M-RoPE)",
    "ssm.*": "state-space (Mamba) layers",
    "wkv.*": "RWKV time mixing",
    "nextn_predict_layers": "multi-token prediction layers",
    "router_logit_softcapping": "a soft-capped expert router",
    "swin_norm": "Swin norms",
    "attention.max_alibi_bias": "ALiBi position biases",
    "attention.clamp_kqv": "clamped Q/K/V",
    "attention.relative_buckets_count": "relative position buckets (T5)",
    "use_parallel_residual": "parallel attention and FFN",
}


def _lookup(table: dict[str, str], name: str) -> str | None:
    if name in table:
        return table[name]
    return next((f for k, f in table.items() if k.endswith("*") and name.startswith(k[:-1])), None)


def tensor_feature(role: str) -> str | None:
    """The unimplemented feature a tensor of this role ("attn_kv_a_mqa.weight") carries, None if unknown."""
    return _lookup(TENSOR_FEATURES, role)


def key_feature(suffix: str) -> str | None:
    """The unimplemented feature an {arch}.<suffix> key selects, None if unknown."""
    return _lookup(KEY_FEATURES, suffix)


def features_in_file(arch: str, tensor_roles: Iterable[str], key_suffixes: Iterable[str]) -> list[str]:
    """The features a file of `arch` needs, in order, each once: the table's for its architecture, then
    those its tensors and keys mark."""
    found = list(ARCHITECTURES.get(arch, ()))
    for name in [tensor_feature(r) for r in tensor_roles] + [key_feature(s) for s in key_suffixes]:
        if name is not None and not any(name in f or f in name for f in found):
            found.append(name)
    return found
