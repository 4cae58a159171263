"""The oracle cases of each feature family (rope scaling, quant types, biases, Phi-3 / SmolLM3, mixture of
experts, LFM2, gpt-oss) and the metadata / tensors they add; oracle_cases.CASES gathers them."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from gguf import GGUFValueType

from edgellm.testing.oracle.case import GEMMA3, SMALL, WIDE, OracleCase, T
from edgellm.testing.synthetic.models import DEFAULT_QTYPES, Typed


def llama3_rope_factors(
    head_dim: int, base: float, factor: float, low: float = 1.0, high: float = 4.0, orig_ctx: int = 8192
) -> np.ndarray:
    """rope_freqs.weight as convert_hf_to_gguf.py computes it from a Llama 3.1+ rope_scaling ("llama3"):
    1 for wavelengths under orig_ctx / high, `factor` over orig_ctx / low, smoothly in between. f32 [d/2]."""
    freqs = 1.0 / (np.float32(base) ** (np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)))
    out = []
    for freq in freqs.astype(np.float32):
        wavelen = 2 * math.pi / float(freq)
        if wavelen < orig_ctx / high:
            out.append(1.0)
        elif wavelen > orig_ctx / low:
            out.append(factor)
        else:
            smooth = (orig_ctx / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, np.float32)


def rope_cases() -> dict[str, OracleCase]:
    """Rope scaling: llama3 frequency factors, linear, YaRN, Gemma 3's local-layer base."""
    yarn = {"qwen3.rope.scaling.type": "yarn", "qwen3.rope.scaling.factor": 4.0,
            "qwen3.rope.scaling.original_context_length": Typed(32768, U32)}  # fmt: skip

    def strong(n_pairs: int) -> dict[str, np.ndarray]:
        return {"rope_freqs.weight": np.geomspace(1.0, 64.0, n_pairs).astype(np.float32)}

    def gemma3(metadata: dict[str, Any], note: str) -> OracleCase:
        """Gemma 3's local layers see keys up to the window away: a wide one lets their rope matter."""
        return OracleCase(
            "gemma3", model=GEMMA3, metadata=metadata, writer={"sliding_window": 512}, note=note
        )

    return {
        "llama_rope_freqs_llama32": OracleCase(
            "llama",
            model=WIDE,
            writer={"rope_base": 500000.0},
            # Llama 3.2 1B / 3B: head size 64, base 500000, factor 32, low / high 1 / 4, original 8192
            extra_tensors={"rope_freqs.weight": llama3_rope_factors(64, 500000.0, 32.0)},
            note="llama, Llama 3.2's rope_freqs.weight (head 64, base 5e5)",
        ),
        "llama_rope_freqs_strong": OracleCase(
            "llama", extra_tensors=strong(8), note="llama, frequency factors 1..64"
        ),
        "llama_rope_freqs_strong_q4_k": OracleCase(
            "llama",
            "Q4_K",
            model=WIDE,
            writer={"quantize_kquants": True},
            extra_tensors=strong(32),
            note="llama, frequency factors 1..64, Q4_K matrices",
        ),
        "llama_rope_linear4": OracleCase(
            "llama",
            metadata={"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 4.0},
            note="llama, linear rope scaling x4",
        ),
        "qwen3_rope_yarn4": OracleCase(
            "qwen3", metadata=yarn, writer={"rope_base": 1e6}, note="qwen3, YaRN x4 from 32k (base 1e6)"
        ),
        "qwen3_rope_yarn4_attn": OracleCase(
            "qwen3",
            metadata={**yarn, "qwen3.rope.scaling.attn_factor": 0.8},
            writer={"rope_base": 1e6},
            note="qwen3, YaRN x4 and rope.scaling.attn_factor 0.8",
        ),
        "gemma3_rope_linear8": gemma3(
            {"gemma3.rope.scaling.type": "linear", "gemma3.rope.scaling.factor": 8.0},
            "gemma3, linear x8 (global layers only, as the 4B-27B files)",
        ),
        "gemma3_rope_base_swa": gemma3(
            {"gemma3.rope.freq_base_swa": 100.0}, "gemma3, local layers' rope base 100 (rope.freq_base_swa)"
        ),
    }


def bias_tensors(model: Mapping[str, int], roles: tuple[str, ...]) -> dict[str, tuple[int, ...]]:
    """Every layer's bias of each role ("attn_q", "ffn_down", ...) -> its shape (OracleCase.extra_tensors)."""
    m = model
    rows = {
        "attn_q": m["n_heads"] * m["head_dim"],
        "attn_k": m["n_kv_heads"] * m["head_dim"],
        "attn_v": m["n_kv_heads"] * m["head_dim"],
        "attn_output": m["n_embd"],
        "ffn_gate": m["n_ff"],
        "ffn_up": m["n_ff"],
        "ffn_down": m["n_embd"],
    }
    return {f"blk.{il}.{role}.bias": (rows[role],) for il in range(m["n_layers"]) for role in roles}


QKV_BIASES = ("attn_q", "attn_k", "attn_v")
LLAMA_BIASES = (*QKV_BIASES, "attn_output", "ffn_gate", "ffn_up", "ffn_down")
SOME_BIASES = ("attn_k", "ffn_up", "attn_output")  # a stacked matrix with one part biased, the others zero


def quant_cases() -> dict[str, OracleCase]:
    """llama with every matrix in one type, for each type edgellm runs (quants/traits.py)."""
    from edgellm.quants.traits import QUANT_TRAITS

    cases = {}
    for qtype in QUANT_TRAITS:
        if qtype == T.F32:
            continue
        k_quant = qtype.name.endswith("_K")
        cases[f"llama_{qtype.name.lower()}"] = OracleCase(
            "llama",
            qtype.name,
            model=WIDE if QUANT_TRAITS[qtype].block_size == 256 else SMALL,
            writer={"quantize_kquants": True} if k_quant else {},
            note=f"every matrix {qtype.name}",
        )
    return cases


SWA_PATTERN = "gemma3.attention.sliding_window_pattern"
U32 = GGUFValueType.UINT32
SWA_FLAGS = Typed([True, False, True, True, False, False, True], GGUFValueType.ARRAY, GGUFValueType.BOOL)
F32_ = GGUFValueType.FLOAT32
# Gemma 2's real caps (50 on Q.K, 30 on the logits) barely touch a tiny model's scores (|Q.K| of a few
# units): caps of that size make both matter, so a kernel that skipped one fails the case.
GEMMA2_CAPS = {"gemma2.attn_logit_softcapping": 1.5, "gemma2.final_logit_softcapping": 15.0}
# Granite with only its required multiplier: the others absent (llama.cpp's 0: off)
OLMO3_SWA = {"olmo2.attention.sliding_window": Typed(4, U32), "olmo2.rope.freq_base_swa": Typed(500.0, F32_)}
GRANITE_LOGIT_ONLY = {f"granite.{k}": None for k in ("embedding_scale", "residual_scale", "attention.scale")}

def fused_qkv(qtypes: Any, note: str, arch: str = "llama", biases: bool = False) -> OracleCase:
    """A case whose layers have one attn_qkv (and attn_qkv.bias) in place of attn_q/k/v (and their biases)."""
    m = SMALL
    rows = (m["n_heads"] + 2 * m["n_kv_heads"]) * m["head_dim"]
    kinds = ("weight", "bias") if biases else ("weight",)
    layers = range(m["n_layers"])
    skip = [f"blk.{il}.attn_{x}.{kind}" for il in layers for x in "qkv" for kind in kinds]
    extra: dict[str, tuple[int, ...]] = {f"blk.{il}.attn_qkv.weight": (rows, m["n_embd"]) for il in layers}
    if biases:
        extra |= {f"blk.{il}.attn_qkv.bias": (rows,) for il in layers}
    return OracleCase(arch, qtypes, extra_tensors=extra, writer={"skip_tensors": skip}, note=note)


def phi3_smollm3_cases() -> dict[str, OracleCase]:
    """Phi-3 (fused Q|K|V and gate|up, LongRoPE's factor sets chosen by the context window, its attention
    factor, a window llama.cpp ignores), SmolLM3 (no rope in every 4th layer), and a fused attn_qkv on the
    architectures that read it in place of attn_q/k/v."""

    def factors(n_pairs: int) -> dict[str, np.ndarray]:
        """Short factors near 1 and long ones up to 40, rising with the pair (as Phi-3.5's)."""
        return {"rope_factors_short.weight": np.geomspace(1.0, 2.0, n_pairs).astype(np.float32),
                "rope_factors_long.weight": np.geomspace(1.0, 40.0, n_pairs).astype(np.float32)}  # fmt: skip

    def phi3(qtypes: Any = "F32", orig: int = 1024, n_rot: int = 16, note: str = "", **kw: Any) -> OracleCase:
        """n_ctx 1200 against an original context of `orig`: the long factors above it, the short below."""
        md = {"phi3.rope.scaling.original_context_length": orig, "phi3.rope.dimension_count": n_rot,
              "phi3.rope.scaling.attn_factor": Typed(1.19, F32_)}  # fmt: skip
        return OracleCase("phi3", qtypes, metadata=md, extra_tensors=factors(n_rot // 2), note=note, **kw)

    m = SMALL
    separate = {f"blk.{il}.attn_{x}.{kind}": (rows,) if kind == "bias" else (rows, m["n_embd"])
                for il in range(m["n_layers"]) for kind in ("weight", "bias")
                for x, rows in (("q", 64), ("k", 32), ("v", 32))}  # fmt: skip
    phi3_separate = {"skip_tensors": [f"blk.{il}.attn_qkv.weight" for il in range(m["n_layers"])]}
    smollm3 = dict(SMALL, n_layers=5)  # layer 3 without rope, layers 0-2 and 4 with
    return {
        "phi3_f32": phi3(note="phi3, fused QKV and gate|up, long factors (n_ctx 1200 > original 1024)"),
        "phi3_short": phi3(orig=2048, note="phi3, short factors (n_ctx 1200 <= original 2048)"),
        "phi3_ctx_pad": phi3(orig=1250, note="phi3, original 1250 against n_ctx 1200"),
        "phi3_mix": phi3(DEFAULT_QTYPES, note="phi3, long factors, block-32 mix"),
        "phi3_q8_0": phi3("Q8_0", note="phi3, long factors, Q8_0 (the CPU's fused layer)"),
        "phi3_partial_rope": phi3(n_rot=8, note="phi3, rope on 8 of 16 dims per head (as Phi-4-mini)"),
        "phi3_separate_qkv": OracleCase(
            "phi3", metadata={"phi3.rope.scaling.original_context_length": 1024},
            extra_tensors={**separate, **factors(8)}, writer=phi3_separate,
            note="phi3, separate Q/K/V weights and biases, long factors"),
        "smollm3_f32": OracleCase("smollm3", model=smollm3, note="smollm3, 5 layers, layer 3 without rope"),
        "smollm3_mix": OracleCase("smollm3", DEFAULT_QTYPES, model=smollm3, note="smollm3, block-32 mix"),
        "smollm3_q8_0": OracleCase("smollm3", "Q8_0", model=smollm3,
                                   note="smollm3, Q8_0 (the fused layer, the NoPE layer through the blocks)"),
        "llama_qkv_fused": fused_qkv("F32", "llama, attn_qkv.weight"),
        "llama_qkv_fused_q8_0": fused_qkv("Q8_0", "llama, attn_qkv.weight, Q8_0"),
        "qwen2_qkv_fused_bias": fused_qkv("F32", "qwen2, attn_qkv.weight and attn_qkv.bias", "qwen2", True),
    }


# Mixture of experts (arch/moe.py): 8 experts, top 2, of the FFN width (qwen3moe: top 4, of width 64, its
# expert_feed_forward_length unlike the dense width); OLMoE without grouped-query attention, as llama.cpp
# reads it.
MOE = {"n_expert": 8, "n_expert_used": 2}
QWEN3MOE = {**MOE, "n_expert_used": 4, "n_ff_exp": 64}
QWEN2MOE = {**MOE, "n_ff_exp": 64, "n_ff_shexp": 96}  # with its shared expert
OLMOE: dict[str, int] = dict(SMALL, n_kv_heads=4)
# the experts in three block-32 types, attention in the default mix
MOE_QTYPES = {**DEFAULT_QTYPES, "ffn_gate_exps": T.Q4_0, "ffn_up_exps": T.Q8_0, "ffn_down_exps": T.Q5_1}


def moe_cases() -> dict[str, OracleCase]:
    return {
        "qwen3moe_f32": OracleCase("qwen3moe", writer=QWEN3MOE, note="qwen3moe, 8 experts of 64, top 4, F32"),
        "qwen3moe_mix": OracleCase("qwen3moe", MOE_QTYPES, writer=QWEN3MOE,
                                   note="qwen3moe, experts Q4_0/Q8_0/Q5_1, block-32 mix"),
        "qwen3moe_q4_k": OracleCase("qwen3moe", "Q4_K", model=WIDE, writer={**QWEN3MOE, "n_ff_exp": 256,
                                    "quantize_kquants": True}, note="qwen3moe, every matrix Q4_K (256 wide)"),
        "llama_moe_f32": OracleCase("llama", writer=MOE,
                                    note="llama with experts (Mixtral), top 2 of 8, F32"),
        "llama_moe_mix": OracleCase("llama", MOE_QTYPES, writer=MOE,
                                    note="llama with experts, Q4_0/Q8_0/Q5_1 experts"),
        "olmoe_f32": OracleCase("olmoe", model=OLMOE, writer=MOE,
                                note="olmoe, top 2 of 8 (weights not renormalised), F32"),
        "olmoe_mix": OracleCase("olmoe", MOE_QTYPES, model=OLMOE, writer=MOE, note="olmoe, block-32 mix"),
        "qwen2moe_f32": OracleCase("qwen2moe", writer=QWEN2MOE,
                                   note="qwen2moe, top 2 of 8 of 64 and a shared expert of 96, F32"),
        "qwen2moe_mix": OracleCase("qwen2moe", MOE_QTYPES, writer=QWEN2MOE,
                                   note="qwen2moe, shared expert Q8_0, block-32 mix"),
    }


# LFM2: 6 layers, conv, attention, conv, conv, attention, conv (synthetic_lfm2.lfm2_conv_layers); heads
# spanning the width, as llama.cpp's LFM2 requires
LFM2: dict[str, int] = dict(SMALL, n_layers=6)
LFM2_WIDE: dict[str, int] = dict(WIDE, n_layers=3)  # conv, attention, conv


def lfm2_cases() -> dict[str, OracleCase]:
    return {
        "lfm2_f32": OracleCase("lfm2", model=LFM2, note="lfm2, 4 short-conv and 2 attention layers, F32"),
        "lfm2_tied_q8_0": OracleCase("lfm2", "Q8_0", model=LFM2, writer={"tied": True},
                                     note="lfm2, Q8_0, output tied to token_embd (as the released files)"),
        "lfm2_q4_k": OracleCase("lfm2", "Q4_K", model=LFM2_WIDE, writer={"quantize_kquants": True},
                                note="lfm2, 256 wide, every matrix Q4_K (conv kernels F32)"),
    }


# Qwen 3.5 (arch/qwen35.py): 6 layers, DeltaNet x3, full attention, DeltaNet x2 (synthetic_qwen35.py: 2 key
# heads tiled over 4 value heads of 16, conv 4); attention heads of 32 (Q twice that: q | gate), rope on half
# the head in sections [3, 3, 2, 0]. 1,100 tokens cross the scorer's 512-token prefill chunks twice, each
# carrying the DeltaNet state across.
QWEN35: dict[str, int] = dict(SMALL, head_dim=32, n_layers=6)
QWEN35MOE = {"n_expert": 8, "n_expert_used": 2, "n_ff_exp": 64, "n_ff_shexp": 96}
# sections whose fourth part has pairs (position 0 for text: not rotated): of 8 pairs, sector = i % 4, the
# pairs of sector 3 (i = 3 and 7, one of them fast enough to matter) are the fourth section's
QWEN35_SECTIONS = {
    "qwen35.rope.dimension_sections": Typed([1, 1, 1, 1], GGUFValueType.ARRAY, GGUFValueType.INT32)
}


def qwen35_mtp_layer(n_layers: int, e: int = 64, d: int = 32, ff: int = 128) -> dict[str, tuple[int, ...]]:
    """A multi-token-prediction head as layer n_layers (after the trunk), as the converter writes Qwen 3.5's
    mtp.* weights: a full-attention layer (4 heads, 2 KV heads) with the nextn projections and norms."""
    layer = {
        "attn_norm": (e,), "attn_q": (2 * 4 * d, e), "attn_k": (2 * d, e), "attn_v": (2 * d, e),
        "attn_q_norm": (d,), "attn_k_norm": (d,), "attn_output": (e, 4 * d), "post_attention_norm": (e,),
        "ffn_gate": (ff, e), "ffn_up": (ff, e), "ffn_down": (e, ff),
        "nextn.eh_proj": (e, 2 * e), "nextn.enorm": (e,), "nextn.hnorm": (e,),
    }  # fmt: skip
    return {f"blk.{n_layers}.{name}.weight": shape for name, shape in layer.items()}


def qwen35_cases() -> dict[str, OracleCase]:
    n = QWEN35["n_layers"]
    mtp = {"qwen35.block_count": n + 1, "qwen35.nextn_predict_layers": Typed(1, GGUFValueType.UINT32)}
    # the converter's per-layer flags (a BOOL array) win over full_attention_interval, here a wrong 2
    flags = [(il + 1) % 4 != 0 for il in range(n)]
    recurrent = {"qwen35.full_attention_interval": 2,
                 "qwen35.attention.recurrent_layers": Typed(flags, GGUFValueType.ARRAY, GGUFValueType.BOOL)}
    return {
        "qwen35_f32": OracleCase("qwen35", model=QWEN35,
                                 note="qwen35, 5 Gated DeltaNet and 1 gated attention layers, F32"),
        "qwen35_tied_q8_0": OracleCase("qwen35", "Q8_0", model=QWEN35, writer={"tied": True},
                                       note="qwen35, Q8_0, output tied to token_embd"),
        "qwen35_rope_sections": OracleCase("qwen35", model=QWEN35, metadata=QWEN35_SECTIONS,
                                           note="qwen35, rope sections [1, 1, 1, 1]: pairs 3, 7 unrotated"),
        "qwen35_recurrent_layers": OracleCase("qwen35", model=QWEN35, metadata=recurrent,
                                              note="qwen35, layer kinds from attention.recurrent_layers"),
        "qwen35_mtp_layer": OracleCase("qwen35", model=QWEN35, metadata=mtp,
                                       extra_tensors=qwen35_mtp_layer(n),
                                       note="qwen35 with an MTP layer (skipped, as llama.cpp)"),
        "qwen35moe_f32": OracleCase("qwen35moe", model=QWEN35, writer=QWEN35MOE,
                                    note="qwen35moe, top 2 of 8 experts of 64, shared expert of 96, F32"),
        # Q8_0 throughout: with the block-32 mix (Q4_0 experts) a near-tie in the routing flips between
        # llama.cpp's own batched and token-by-token runs (NMSE 1.8e-3 between them), and the DeltaNet state
        # carries the flip on to every later token
        "qwen35moe_q8_0": OracleCase("qwen35moe", "Q8_0", model=QWEN35, writer=QWEN35MOE,
                                     note="qwen35moe, Q8_0 experts and shared expert"),
        "qwen3next_f32": OracleCase("qwen3next", model=QWEN35, writer=QWEN35MOE,
                                    note="qwen3next, ssm_ba, key heads interleaved, plain NEOX rope, F32"),
    }  # fmt: skip


# gpt-oss (arch/gpt_oss.py): 3 layers (0 and 2 local, 1 global) with its real window of 128 tokens, rope
# base 150000 and YaRN x32 from 4096; 8 experts of 64, top 2; gate / up weights 4x the default spread so
# that the clamp at 7 bites (a few % of values), sinks ~N(2, 1) (testing/synthetic/models.py) so that they
# take a share.
GPT_OSS_MODEL: dict[str, int] = dict(SMALL, n_layers=3)
GPT_OSS_WRITER = {"n_expert": 8, "n_expert_used": 2, "n_ff_exp": 64, "sliding_window": 128,
                  "rope_base": 150000.0, "weight_scale": {"ffn_gate_exps": 4.0, "ffn_up_exps": 4.0}}
GPT_OSS_YARN = {"gpt-oss.rope.scaling.type": "yarn", "gpt-oss.rope.scaling.factor": 32.0,
                "gpt-oss.rope.scaling.original_context_length": Typed(4096, U32)}
# the released files' layout: MXFP4 experts, the rest 8-bit / 16-bit
GPT_OSS_QTYPES = {"*": T.Q8_0, "attn_output": T.F16, "ffn_gate_exps": T.MXFP4, "ffn_up_exps": T.MXFP4,
                  "ffn_down_exps": T.MXFP4}


def gpt_oss_cases() -> dict[str, OracleCase]:
    def case(qtypes: Any, note: str) -> OracleCase:
        return OracleCase(
            "gpt-oss", qtypes, model=GPT_OSS_MODEL, metadata=GPT_OSS_YARN, writer=GPT_OSS_WRITER, note=note
        )

    return {
        "gpt_oss_f32": case("F32", "gpt-oss, sinks, window 128 on even layers, YaRN x32, top 2 of 8, F32"),
        "gpt_oss_mxfp4": case(GPT_OSS_QTYPES, "gpt-oss, MXFP4 experts, Q8_0 / F16 elsewhere"),
    }



# ---- issue 56's families (Ministral 3, Seed-OSS, GLM-4.5 MoE, DeepSeek 2/3 MLA): a block of its own -----
# Ministral 3's YaRN as its files carry it (factor 16, beta_fast / beta_slow read from the file, log
# multiplier 1: HF's mscale_all_dim) and its temperature tuning, with an original context of 256 so that
# the 1,100 scored positions cover four temperature steps and YaRN's long-range rotation.
MISTRAL3_YARN = {
    "mistral3.rope.scaling.type": "yarn",
    "mistral3.rope.scaling.factor": Typed(16.0, F32_),
    "mistral3.rope.scaling.original_context_length": Typed(256, U32),
    "mistral3.rope.scaling.yarn_beta_fast": Typed(16.0, F32_),
    "mistral3.rope.scaling.yarn_beta_slow": Typed(2.0, F32_),
    "mistral3.rope.scaling.yarn_log_multiplier": Typed(1.0, F32_),
    "mistral3.attention.temperature_scale": Typed(0.1, F32_),
}


def issue56_cases() -> dict[str, OracleCase]:
    return {
        **glm4moe_cases(),
        **deepseek2_cases(),
        **nextn_cases(),
        **llama4_cases(),
        "mistral3_f32": OracleCase("mistral3", metadata=MISTRAL3_YARN,
                                   note="mistral3, YaRN x16 (betas 16/2, log mul 1), temperature 0.1/256"),
        "mistral3_mix": OracleCase("mistral3", DEFAULT_QTYPES, metadata=MISTRAL3_YARN,
                                   note="mistral3, YaRN + temperature, block-32 mix"),
        "mistral3_q8_0": OracleCase("mistral3", "Q8_0", metadata=MISTRAL3_YARN,
                                    note="mistral3, YaRN + temperature, Q8_0"),
        "mistral3_plain": OracleCase("mistral3", note="mistral3 without YaRN or temperature, F32"),
        "seed_oss_f32": OracleCase("seed_oss", note="seed_oss (QKV biases, FFN norm post_attention_norm)"),
        "seed_oss_mix": OracleCase("seed_oss", DEFAULT_QTYPES, note="seed_oss, block-32 mix"),
    }  # fmt: skip


# GLM-4.5 MoE: 3 layers (1 dense, 2 of 8 experts 32 wide, top 2, 1 shared expert), half of each head
# rotated, sigmoid gating with a selection bias, weights renormalised and scaled by 2.5 (the writer's
# defaults: testing/synthetic/metadata.py); a wide selection bias so that it changes which experts are chosen.
GLM4MOE_MODEL: dict[str, int] = dict(SMALL, n_layers=3)
GLM4MOE_WRITER = {
    "n_expert": 8, "n_expert_used": 2, "n_ff_exp": 32, "weight_scale": {"exp_probs_b.bias": 10.0}
}  # fmt: skip


def glm4moe_cases() -> dict[str, OracleCase]:
    def case(qtypes: Any, note: str, metadata: Mapping[str, Any] | None = None) -> OracleCase:
        return OracleCase("glm4moe", qtypes, model=GLM4MOE_MODEL, writer=GLM4MOE_WRITER,
                          metadata=metadata or {}, note=note)  # fmt: skip

    return {
        "glm4moe_f32": case("F32", "glm4moe, 1 dense + 2 MoE layers, sigmoid + exp_probs_b, shared expert"),
        "glm4moe_mix": case(MOE_QTYPES, "glm4moe, experts Q4_0/Q8_0/Q5_1, block-32 mix"),
        "glm4moe_softmax_plain": case(
            "F32", "glm4moe, softmax gating, no renormalisation or scale",
            {"glm4moe.expert_gating_func": Typed(1, U32), "glm4moe.expert_weights_norm": False,
             "glm4moe.expert_weights_scale": Typed(1.0, F32_)}),
    }  # fmt: skip


# DeepSeek 2 / 3 with multi-head latent attention at head_dim 16 (the writer's sizes: latent 32, rope 16,
# nope 32, value 16, q-LoRA 32): 3 layers (1 dense, 2 of 8 experts 32 wide, top 2, 1 shared expert);
# V3's sigmoid gating with exp_probs_b, groups and YaRN with the log multiplier; V2-Lite's plain form.
DEEPSEEK2_MODEL: dict[str, int] = dict(SMALL, n_layers=3, n_kv_heads=1)
DEEPSEEK2_YARN = {
    "deepseek2.rope.scaling.type": "yarn",
    "deepseek2.rope.scaling.factor": Typed(40.0, F32_),
    "deepseek2.rope.scaling.original_context_length": Typed(256, U32),
    "deepseek2.rope.scaling.yarn_log_multiplier": Typed(0.1, F32_),
    "deepseek2.expert_group_count": Typed(4, U32),
    "deepseek2.expert_group_used_count": Typed(2, U32),
}
DEEPSEEK2_LITE = {"deepseek2.attention.q_lora_rank": Typed(0, U32),
                  "deepseek2.expert_gating_func": Typed(1, U32), "deepseek2.expert_weights_norm": False,
                  "deepseek2.expert_weights_scale": Typed(1.0, F32_)}  # fmt: skip


def deepseek2_cases() -> dict[str, OracleCase]:
    def case(qtypes: Any, note: str, metadata: Mapping[str, Any], **writer: Any) -> OracleCase:
        return OracleCase("deepseek2", qtypes, model=DEEPSEEK2_MODEL, writer={**GLM4MOE_WRITER, **writer},
                          metadata=metadata, note=note)  # fmt: skip

    return {
        "deepseek2_v3_f32": case("F32", "deepseek2 MLA + q-LoRA, V3 sigmoid/bias/groups, YaRN x40 log mul",
                                 DEEPSEEK2_YARN),
        "deepseek2_v3_q8_0": case("Q8_0", "deepseek2 V3 form, Q8_0", DEEPSEEK2_YARN),
        "deepseek2_lite_f32": case("F32", "deepseek2 MLA without q-LoRA (V2-Lite), softmax gating",
                                   DEEPSEEK2_LITE),
        # the released files' latent of 512 (K 576 there, past the 512 head bound of the other archs);
        # F32: with Q8_0 weights this file drifts (docs/oracle_cases.md)
        "deepseek2_wide_latent": OracleCase(
            "deepseek2", model=dict(DEEPSEEK2_MODEL, n_heads=2, head_dim=256),
            writer=GLM4MOE_WRITER, metadata=DEEPSEEK2_YARN,
            note="deepseek2, latent 512 + rope 256: a K head of 768, F32"),
    }  # fmt: skip


def nextn_layer(il: int, n_embd: int = 64) -> dict[str, Any]:
    """A multi-token prediction layer's own tensors at layer il (GLM-4.5's, DeepSeek V3's converters);
    with block_count il + 1 and nextn_predict_layers 1, llama.cpp skips the whole layer."""
    p = f"blk.{il}.nextn."
    return {p + "eh_proj.weight": (n_embd, 2 * n_embd), p + "enorm.weight": (n_embd,),
            p + "hnorm.weight": (n_embd,), p + "shared_head_norm.weight": (n_embd,)}  # fmt: skip


def nextn_cases() -> dict[str, OracleCase]:
    """GLM-4.5 and DeepSeek V3 files as released: one more layer, a multi-token prediction one, skipped."""
    glm = dict(GLM4MOE_MODEL, n_layers=4)
    deepseek = dict(DEEPSEEK2_MODEL, n_layers=4)
    mtp = {"glm4moe.nextn_predict_layers": Typed(1, U32)}
    ds_mtp = {**DEEPSEEK2_YARN, "deepseek2.nextn_predict_layers": Typed(1, U32)}
    return {
        "glm4moe_nextn": OracleCase("glm4moe", model=glm, writer=GLM4MOE_WRITER, extra_tensors=nextn_layer(3),
                                    metadata=mtp, note="glm4moe, block_count 4, the last an MTP layer"),
        "deepseek2_nextn": OracleCase("deepseek2", model=deepseek, writer=GLM4MOE_WRITER,
                                      extra_tensors=nextn_layer(3), metadata=ds_mtp,
                                      note="deepseek2 V3 form with an MTP layer (skipped)"),
    }  # fmt: skip


# Llama 4: 4 layers (3 chunked rope layers with the L2 norm, the 4th without rope and with the temperature),
# the experts (8 of 32 wide, top 2, weight on the input, a shared expert) on layers 1 and 3, rope_freqs
LLAMA4_MODEL: dict[str, int] = dict(SMALL, n_layers=4)
LLAMA4_WRITER = {"n_expert": 8, "n_expert_used": 2, "n_ff_exp": 32}


def llama4_cases() -> dict[str, OracleCase]:
    factors = {"rope_freqs.weight": llama3_rope_factors(16, 10000.0, 8.0, orig_ctx=256)}
    return {
        "llama4_f32": OracleCase("llama4", model=LLAMA4_MODEL, writer=LLAMA4_WRITER, extra_tensors=factors,
                                 note="llama4, iRoPE + L2 norm, experts on layers 1/3 (weight before FFN)"),
        "llama4_mix": OracleCase("llama4", MOE_QTYPES, model=LLAMA4_MODEL, writer=LLAMA4_WRITER,
                                 note="llama4, block-32 mix, no rope_freqs"),
    }  # fmt: skip
