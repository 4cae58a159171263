"""Oracle cases: tiny random-weight GGUFs whose logits llama.cpp computed (tests/fixtures/oracle/<case>.npz).

Each `OracleCase` says how to write one file with `write_tiny_model` (architecture, tensor types, shape,
metadata overrides, extra tensors) and which tokens to score: a sequence long enough that positions past 1,000
are covered, since rope scaling (frequency factors, linear, YaRN) shows only at long range.
scripts/fixtures/make_oracle_fixtures.py runs llama.cpp on each and saves its logits at `fixture_positions`;
tests/gguf/test_oracle_cases.py rewrites the file (checking its sha256 against the fixture's, so a change of
the writer is caught rather than compared against stale logits) and compares edgellm's logits with them.

Tolerances (the issue's bar): NMSE = sum((x - ref)^2) / sum(ref^2) (ggml's test-backend-ops measure) below
NMSE_FLOAT for F32/F16/BF16 weights and NMSE_QUANT when any matrix is block-quantized, and the same top-1
token wherever llama.cpp's own top-1/top-2 gap exceeds TOP1_MIN_GAP.

The case type, its scoring and tolerances: testing/oracle/case.py; each feature family's cases and the
metadata they add: testing/oracle/families.py. Adding a case: one entry in CASES or its family's builder (a
feature's cases next to each other, named `<arch>_<feature>`), then `python
scripts/fixtures/make_oracle_fixtures.py <case>` where llama-cpp-python is installed, and commit the .npz.
"""

from __future__ import annotations

from edgellm.testing.oracle.case import (  # noqa: F401 - the public names, importable from here
    FLOAT_TYPES,
    GEMMA2,
    GEMMA3,
    GPT2,
    N_FIXTURE_POSITIONS,
    NMSE_FLOAT,
    NMSE_QUANT,
    OLMO3,
    SMALL,
    TOP1_MIN_GAP,
    WIDE,
    OracleCase,
    T,
    nmse,
    score_edgellm,
    top1_agreement,
)
from edgellm.testing.oracle.families import (  # noqa: F401
    F32_,
    GEMMA2_CAPS,
    GPT_OSS_MODEL,
    GPT_OSS_QTYPES,
    GPT_OSS_WRITER,
    GPT_OSS_YARN,
    GRANITE_LOGIT_ONLY,
    LFM2,
    LFM2_WIDE,
    LLAMA_BIASES,
    MOE,
    MOE_QTYPES,
    OLMO3_SWA,
    OLMOE,
    QKV_BIASES,
    QWEN2MOE,
    QWEN3MOE,
    SOME_BIASES,
    SWA_FLAGS,
    SWA_PATTERN,
    U32,
    bias_tensors,
    fused_qkv,
    gpt_oss_cases,
    issue56_cases,
    lfm2_cases,
    llama3_rope_factors,
    moe_cases,
    phi3_smollm3_cases,
    quant_cases,
    qwen35_cases,
    rope_cases,
)
from edgellm.testing.synthetic.models import DEFAULT_QTYPES, Typed

# fmt: off
CASES: dict[str, OracleCase] = {
    # ---- architectures, F32 weights and the default mix of block-32 types
    "llama_f32": OracleCase("llama", note="llama, F32"),
    "qwen2_f32": OracleCase("qwen2", note="qwen2 (QKV biases), F32"),
    "qwen3_f32": OracleCase("qwen3", note="qwen3 (Q/K norms), F32"),
    "gemma3_f32": OracleCase("gemma3", model=GEMMA3, note="gemma3, 7 layers (5 local, 1 global, 1 local)"),
    "llama_mix": OracleCase("llama", DEFAULT_QTYPES, note="llama, Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/F16 mix"),
    "qwen2_mix": OracleCase("qwen2", DEFAULT_QTYPES, note="qwen2, block-32 mix"),
    "qwen3_mix": OracleCase("qwen3", DEFAULT_QTYPES, note="qwen3, block-32 mix"),
    "gemma3_mix": OracleCase("gemma3", DEFAULT_QTYPES, model=GEMMA3, note="gemma3, block-32 mix"),
    # ---- every quant type edgellm runs, one at a time
    **quant_cases(),
    # ---- biases: llama.cpp applies every one a llama file has, and Q/K/V biases on every architecture
    "llama_bias": OracleCase("llama", extra_tensors=bias_tensors(SMALL, LLAMA_BIASES),
                             note="llama, all seven biases per layer"),
    "llama_bias_mix": OracleCase("llama", DEFAULT_QTYPES, extra_tensors=bias_tensors(SMALL, LLAMA_BIASES),
                                 note="llama, all biases, block-32 mix"),
    "llama_bias_q8_0": OracleCase("llama", "Q8_0", extra_tensors=bias_tensors(SMALL, LLAMA_BIASES),
                                  note="llama, all biases, Q8_0 (the CPU's fused layer)"),
    "llama_bias_some": OracleCase("llama", extra_tensors=bias_tensors(SMALL, SOME_BIASES),
                                  note="llama, K, up and output biases only (the others zero)"),
    "qwen3_qkv_bias": OracleCase("qwen3", extra_tensors=bias_tensors(SMALL, QKV_BIASES),
                                 note="qwen3 with Q/K/V biases"),
    # ---- Gemma 3's local/global layers from gemma3.attention.sliding_window_pattern (a period, or flags)
    "gemma3_pattern_3": OracleCase("gemma3", model=GEMMA3, metadata={SWA_PATTERN: Typed(3, U32)},
                                   note="gemma3, pattern 3: local, local, global, ..."),
    "gemma3_pattern_flags": OracleCase("gemma3", model=GEMMA3, metadata={SWA_PATTERN: SWA_FLAGS},
                                       note="gemma3, per-layer flags 1011001"),
    "gemma3_all_local": OracleCase("gemma3", model=GEMMA3, metadata={SWA_PATTERN: Typed(0, U32)},
                                   note="gemma3, pattern 0: every layer local"),
    # ---- rope scaling
    **rope_cases(),
    # ---- Gemma 2: attention and final logit soft-capping, post norms, even layers local (window 4)
    "gemma2_f32": OracleCase("gemma2", model=GEMMA2, metadata=GEMMA2_CAPS,
                             note="gemma2, 3 layers, attention cap 1.5, logit cap 15"),
    "gemma2_mix": OracleCase("gemma2", DEFAULT_QTYPES, model=GEMMA2, metadata=GEMMA2_CAPS,
                             note="gemma2, caps 1.5 / 15, block-32 mix"),
    "gemma2_q8_0": OracleCase("gemma2", "Q8_0", model=GEMMA2, metadata=GEMMA2_CAPS,
                              note="gemma2, caps 1.5 / 15, Q8_0 (the CPU's fused layer)"),
    "gemma2_default_caps": OracleCase("gemma2", model=GEMMA2, note="gemma2, the converter's caps 50 / 30"),
    "gemma2_freq_base_swa": OracleCase(
        "gemma2", model=GEMMA2, metadata={**GEMMA2_CAPS, "gemma2.rope.freq_base_swa": Typed(500.0, F32_)},
        note="gemma2, local layers at rope base 500"),
    # ---- Granite 3.x: embedding, residual, attention and logit multipliers
    "granite_f32": OracleCase("granite", note="granite, embedding 2, residual 0.5, attention 0.5, logit 2"),
    "granite_mix": OracleCase("granite", DEFAULT_QTYPES, note="granite, the four multipliers, block-32 mix"),
    "granite_q8_0": OracleCase("granite", "Q8_0",
                               note="granite, Q8_0 (the CPU's fused layer)"),
    "granite_bias": OracleCase("granite", extra_tensors=bias_tensors(SMALL, LLAMA_BIASES),
                               note="granite, all seven biases per layer"),
    "granite_logit_scale_only": OracleCase("granite", metadata=GRANITE_LOGIT_ONLY,
                                           note="granite, logit_scale only (the other multipliers off)"),
    # ---- OLMo 2: post-norms only, Q/K norms over the whole projection; OLMo 3's sliding window
    "olmo2_f32": OracleCase("olmo2", note="olmo2, F32"),
    "olmo2_mix": OracleCase("olmo2", DEFAULT_QTYPES, note="olmo2, block-32 mix"),
    "olmo2_q8_0": OracleCase("olmo2", "Q8_0", note="olmo2, Q8_0"),
    "olmo2_swa": OracleCase("olmo2", model=OLMO3, metadata=OLMO3_SWA,
                            note="olmo2, OLMo 3's window 4 on layers il % 4 < 3 (freq_base_swa: unused)"),
    # ---- LayerNorm with biases, biased ungated GELU MLP: StarCoder 2 (rope, GQA), GPT-2 (learned
    # positions, fused QKV; MHA as the real ones)
    "starcoder2_f32": OracleCase("starcoder2", note="starcoder2, F32"),
    "starcoder2_mix": OracleCase("starcoder2", DEFAULT_QTYPES, note="starcoder2, block-32 mix"),
    "gpt2_f32": OracleCase("gpt2", model=GPT2, note="gpt2, F32 (position_embd F32)"),
    "gpt2_q8_0": OracleCase("gpt2", "Q8_0", model=GPT2, note="gpt2, Q8_0 (position_embd too)"),
    "gpt2_tied": OracleCase("gpt2", DEFAULT_QTYPES, model=GPT2, writer={"tied": True},
                            note="gpt2, block-32 mix, no output.weight (tied)"),
    # ---- Phi-3, SmolLM3, fused Q|K|V
    **phi3_smollm3_cases(),
    # ---- mixture of experts: qwen3moe, Mixtral-style llama, OLMoE
    **moe_cases(),
    # ---- LFM2: short convolutions (a per-sequence conv state) beside attention
    **lfm2_cases(),
    # ---- Qwen 3.5: Gated DeltaNet (a per-sequence conv window and matrix state) beside gated attention
    **qwen35_cases(),
    # ---- gpt-oss: attention sinks, alternating windows, YaRN, biased experts with swiglu_oai, MXFP4
    **gpt_oss_cases(),
    # ---- issue 56: Ministral 3 (YaRN keys, temperature tuning), Seed-OSS, GLM-4.5 MoE, DeepSeek 2 (MLA)
    **issue56_cases(),
}
# fmt: on
