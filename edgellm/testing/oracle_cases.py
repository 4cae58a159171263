"""Oracle cases: tiny random-weight GGUFs whose logits llama.cpp computed (tests/fixtures/oracle/<case>.npz).

Each `OracleCase` says how to write one file with `write_tiny_model` (architecture, tensor types, shape,
metadata overrides, extra tensors) and which tokens to score: a sequence long enough that positions past
1,000 are covered, since rope scaling (frequency factors, linear, YaRN) shows only at long range.
scripts/make_oracle_fixtures.py runs llama.cpp on each and saves its logits at `fixture_positions`;
tests/test_oracle_cases.py rewrites the file (checking its sha256 against the fixture's, so a change of the
writer is caught rather than compared against stale logits) and compares edgellm's logits with them.

Tolerances (the issue's bar): NMSE = sum((x - ref)^2) / sum(ref^2) (ggml's test-backend-ops measure) below
NMSE_FLOAT for F32/F16/BF16 weights and NMSE_QUANT when any matrix is block-quantized, and the same top-1
token wherever llama.cpp's own top-1/top-2 gap exceeds TOP1_MIN_GAP.

Adding a case: one entry in CASES (a feature's cases next to each other, named `<arch>_<feature>`), then
`python scripts/make_oracle_fixtures.py <case>` where llama-cpp-python is installed, and commit the .npz.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType

from edgellm.testing.synthetic import DEFAULT_QTYPES, Typed, write_tiny_model

T = GGMLQuantizationType
FLOAT_TYPES = frozenset({T.F32, T.F16, T.BF16})
NMSE_FLOAT = 1e-4
NMSE_QUANT = 1e-3
TOP1_MIN_GAP = 0.05
N_FIXTURE_POSITIONS = 24

# Shape of the default case: 2 layers, 64 wide (a few hundred KiB; llama.cpp and edgellm score 1,100
# tokens in about a second). k-quant matrices need 256-value rows: every matrix's row width
# (n_embd, n_heads * head_dim, n_ff) a multiple of 256.
SMALL: dict[str, int] = dict(n_layers=2, n_embd=64, n_heads=4, n_kv_heads=2, head_dim=16, n_ff=128)
WIDE: dict[str, int] = dict(n_layers=2, n_embd=256, n_heads=4, n_kv_heads=2, head_dim=64, n_ff=256)
# Gemma 3's pattern (five sliding-window layers, then a global one) needs 7 layers to hold both kinds twice
# over the first block; the window is far shorter than the sequence so that it matters.
GEMMA3: dict[str, int] = dict(SMALL, n_layers=7)
# Gemma 2 alternates local and global layers: 3 layers hold both kinds and a second local one.
GEMMA2: dict[str, int] = dict(SMALL, n_layers=3)
# OLMo 3's pattern (three local layers, then a global one) over 5 layers: both kinds, and local after global
OLMO3: dict[str, int] = dict(SMALL, n_layers=5)
GPT2: dict[str, int] = dict(SMALL, n_kv_heads=4)  # GPT-2 has as many K/V heads as Q heads


@dataclass(frozen=True)
class OracleCase:
    arch: str
    qtypes: Mapping[str, Any] | str = "F32"  # write_tiny_model's qtypes
    model: Mapping[str, int] = field(default_factory=lambda: SMALL)  # write_tiny_model's shape arguments
    metadata: Mapping[str, Any] = field(default_factory=dict)  # metadata_overrides (Typed for new keys)
    extra_tensors: Mapping[str, Any] = field(default_factory=dict)  # name -> shape (random) or array
    writer: Mapping[str, Any] = field(default_factory=dict)  # any other write_tiny_model keyword
    n_ctx: int = 1200
    n_tokens: int = 1100
    seed: int = 0
    note: str = ""  # what the case covers, for the report

    def write(self, path: str | Path) -> Path:
        return write_tiny_model(
            path,
            self.arch,
            self.qtypes,
            seed=self.seed,
            context_length=max(self.n_ctx, 2048),
            metadata_overrides=dict(self.metadata),
            extra_tensors=dict(self.extra_tensors),
            **self.model,
            **self.writer,
        )

    @property
    def quantized(self) -> bool:
        """Whether any matrix of the file is block-quantized (the looser NMSE bound applies)."""
        types = [self.qtypes] if isinstance(self.qtypes, str) else list(self.qtypes.values())
        return any(T[t.upper()] not in FLOAT_TYPES if isinstance(t, str) else T(t) not in FLOAT_TYPES
                   for t in types)  # fmt: skip

    @property
    def nmse_limit(self) -> float:
        return NMSE_QUANT if self.quantized else NMSE_FLOAT

    def tokens(self, n_vocab: int) -> np.ndarray:
        """[n_tokens] int32: the scored sequence, random ids over the whole vocabulary (seeded)."""
        rng = np.random.default_rng(10_000 + self.seed)
        return rng.integers(0, n_vocab, self.n_tokens).astype(np.int32)

    def fixture_positions(self) -> np.ndarray:
        """[N_FIXTURE_POSITIONS] int32, ascending: the first 4 tokens, 8 spread over the sequence, and 12
        over its last 100 positions (past 1,000 for the default length), the last 4 included."""
        n = self.n_tokens
        tail = min(100, n // 2)
        spread = np.linspace(4, n - tail - 1, 8)
        last = np.concatenate([np.linspace(n - tail, n - 5, 8), np.arange(n - 4, n)])
        pos = np.unique(np.concatenate([np.arange(4), spread, last]).round().astype(np.int64))
        return pos.astype(np.int32)


def score_edgellm(
    path: str | Path,
    tokens: np.ndarray,
    positions: np.ndarray,
    n_ctx: int,
    chunk: int = 512,
    edit: Callable[[Any], None] | None = None,
) -> np.ndarray:
    """edgellm's logits [len(positions), n_vocab] float32 for the teacher-forced `tokens`, on the CPU
    backend, in process: the file goes through the same checks as LLM() (config, then validate_model), the
    context window is llama.cpp's n_ctx (LongRoPE chooses its factors by it), and the prompt goes through
    prefill chunks as the engine schedules them. edit(model): changes the loaded model before it runs (the
    tests that take a feature out, to show that the match depends on it)."""
    from edgellm.arch import ARCHITECTURES
    from edgellm.backends.cpu.backend import CpuBackend
    from edgellm.engine.model_runner import ModelRunner, RunItem
    from edgellm.gguf.config import config_from_gguf
    from edgellm.gguf.load import load_gguf
    from edgellm.gguf.validation import validate_model

    g = load_gguf(str(path))
    cfg = config_from_gguf(g)
    validate_model(g, cfg)
    cfg.set_context(n_ctx)
    be = CpuBackend()
    block_size = 16
    n_blocks = -(-len(tokens) // block_size)
    model = ARCHITECTURES[cfg.arch](cfg, g, be)
    if edit is not None:
        edit(model)
    runner = ModelRunner(model, cfg, be, n_blocks, block_size)
    table, ids, rows = list(range(n_blocks)), [int(t) for t in tokens], []
    for start in range(0, len(ids), chunk):
        rows += runner.run([RunItem(table, ids[start : start + chunk], start, all_logits=True)])
    return np.concatenate(rows)[positions].astype(np.float32)


def nmse(x: np.ndarray, ref: np.ndarray) -> float:
    """sum((x - ref)^2) / sum(ref^2), in float64."""
    x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    return float(((x - ref) ** 2).sum() / (ref**2).sum())


def top1_agreement(x: np.ndarray, ref: np.ndarray, min_gap: float = TOP1_MIN_GAP) -> tuple[int, int]:
    """(agreeing rows, rows where ref's top-1/top-2 gap exceeds min_gap): x, ref [P, n_vocab]."""
    top2 = np.sort(ref, axis=-1)[:, -2:]
    decided = (top2[:, 1] - top2[:, 0]) > min_gap
    agree = x.argmax(-1) == ref.argmax(-1)
    return int((agree & decided).sum()), int(decided.sum())


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


def _rope_cases() -> dict[str, OracleCase]:
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


def _quant_cases() -> dict[str, OracleCase]:
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


def _phi3_smollm3_cases() -> dict[str, OracleCase]:
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


def _moe_cases() -> dict[str, OracleCase]:
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


def _lfm2_cases() -> dict[str, OracleCase]:
    return {
        "lfm2_f32": OracleCase("lfm2", model=LFM2, note="lfm2, 4 short-conv and 2 attention layers, F32"),
        "lfm2_tied_q8_0": OracleCase("lfm2", "Q8_0", model=LFM2, writer={"tied": True},
                                     note="lfm2, Q8_0, output tied to token_embd (as the released files)"),
        "lfm2_q4_k": OracleCase("lfm2", "Q4_K", model=LFM2_WIDE, writer={"quantize_kquants": True},
                                note="lfm2, 256 wide, every matrix Q4_K (conv kernels F32)"),
    }


# gpt-oss (arch/gpt_oss.py): 3 layers (0 and 2 local, 1 global) with its real window of 128 tokens, rope
# base 150000 and YaRN x32 from 4096; 8 experts of 64, top 2; gate / up weights 4x the default spread so
# that the clamp at 7 bites (a few % of values), sinks ~N(2, 1) (synthetic.py) so that they take a share.
GPT_OSS_MODEL: dict[str, int] = dict(SMALL, n_layers=3)
GPT_OSS_WRITER = {"n_expert": 8, "n_expert_used": 2, "n_ff_exp": 64, "sliding_window": 128,
                  "rope_base": 150000.0, "weight_scale": {"ffn_gate_exps": 4.0, "ffn_up_exps": 4.0}}
GPT_OSS_YARN = {"gpt-oss.rope.scaling.type": "yarn", "gpt-oss.rope.scaling.factor": 32.0,
                "gpt-oss.rope.scaling.original_context_length": Typed(4096, U32)}
# the released files' layout: MXFP4 experts, the rest 8-bit / 16-bit
GPT_OSS_QTYPES = {"*": T.Q8_0, "attn_output": T.F16, "ffn_gate_exps": T.MXFP4, "ffn_up_exps": T.MXFP4,
                  "ffn_down_exps": T.MXFP4}


def _gpt_oss_cases() -> dict[str, OracleCase]:
    def case(qtypes: Any, note: str) -> OracleCase:
        return OracleCase(
            "gpt-oss", qtypes, model=GPT_OSS_MODEL, metadata=GPT_OSS_YARN, writer=GPT_OSS_WRITER, note=note
        )

    return {
        "gpt_oss_f32": case("F32", "gpt-oss, sinks, window 128 on even layers, YaRN x32, top 2 of 8, F32"),
        "gpt_oss_mxfp4": case(GPT_OSS_QTYPES, "gpt-oss, MXFP4 experts, Q8_0 / F16 elsewhere"),
    }


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
    **_quant_cases(),
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
    **_rope_cases(),
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
    **_phi3_smollm3_cases(),
    # ---- mixture of experts: qwen3moe, Mixtral-style llama, OLMoE
    **_moe_cases(),
    # ---- LFM2: short convolutions (a per-sequence conv state) beside attention
    **_lfm2_cases(),
    # ---- gpt-oss: attention sinks, alternating windows, YaRN, biased experts with swiglu_oai, MXFP4
    **_gpt_oss_cases(),
}
# fmt: on
