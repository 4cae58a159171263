"""Rotary embedding parameters from GGUF metadata, as llama.cpp (0.3.36) reads and applies them.

One `RopeParams` per layer kind holds what llama.cpp's `ggml_rope_ext` takes (rope base, frequency scale,
YaRN's extrapolation mix, attention factor and correction betas, the original context, llama3 frequency
factors). What it computes per rotated pair i at position p (ggml-cpu rope_yarn / ggml_rope_cache_init):

    theta_extrap = p * base^(-2i/n_rot) / freq_factors[i]
    theta_interp = freq_scale * theta_extrap
    mix          = ext_factor * ramp_i        (ramp: 1 below YaRN's low correction dim, 0 above the high one)
    theta        = theta_interp * (1 - mix) + theta_extrap * mix
    cos, sin     = cos(theta) * mscale, sin(theta) * mscale
    mscale       = attn_factor * (1 + 0.1 ln(1 / freq_scale)) with YaRN (ext_factor != 0), else attn_factor

theta is p times a per-pair frequency, so `inv_freq` folds everything but p into one vector and the
backends rotate by cos/sin(p * inv_freq[i]) * mscale (tables on the CPU, inline on CUDA).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np
from gguf import GGMLQuantizationType

from edgellm.gguf.metadata import INT32_MAX, get_float, get_int, get_str
from edgellm.gguf.reader import GGUFError, GGUFFile

# YaRN's correction-dim betas and its extrapolation mix: llama.cpp takes them from the context parameters
# (llama-cpp-python's defaults 32 / 1, ext_factor 1 under YaRN, 0 otherwise) for these architectures;
# the file's rope.scaling.yarn_* keys are read only by others (grok, deepseek2).
YARN_BETA_FAST = 32.0
YARN_BETA_SLOW = 1.0
# rope.scaling.type values (llama.cpp's LLAMA_ROPE_SCALING_TYPES). A missing key means "linear" there,
# which with no factor scales nothing.
SCALING_TYPES = ("none", "linear", "yarn")
# The llama3 frequency factors, read where an architecture's spec says (ArchSpec.rope_freq_factors)
FREQ_FACTORS_TENSOR = "rope_freqs.weight"
# LongRoPE's two factor sets (Phi-3: arch/phi3.py)
LONGROPE_TENSORS = ("rope_factors_long.weight", "rope_factors_short.weight")
CONTEXT_PAD = 256  # llama-context.cpp rounds n_ctx up to a multiple of this


@dataclass(frozen=True, eq=False)
class RopeParams:
    """One layer kind's rotary embedding, ggml_rope_ext's parameters. Hashed and compared by identity:
    the backends key their tables / device arrays by the object (a model makes one per layer kind)."""

    n_rot: int  # rotated dims per head (the rest pass through)
    neox: bool  # rotate halves (x[i], x[i + n_rot/2]) instead of adjacent pairs (x[2i], x[2i+1])
    base: float = 10000.0
    freq_scale: float = 1.0  # 1 / rope.scaling.factor (linear, yarn)
    ext_factor: float = 0.0  # YaRN's extrapolation mix (1 under YaRN)
    attn_factor: float = 1.0  # multiplies cos/sin (llama.cpp's cparams.yarn_attn_factor)
    beta_fast: float = YARN_BETA_FAST
    beta_slow: float = YARN_BETA_SLOW
    n_ctx_orig: int = 0  # YaRN's original context (its correction dims)
    freq_factors: tuple[float, ...] = field(default=())  # [n_rot/2] divisors of the frequency, or ()

    @property
    def mscale(self) -> float:
        """The factor on cos and sin (rope_yarn's mscale)."""
        if self.ext_factor == 0.0:
            return self.attn_factor
        f32 = np.float32
        return float(f32(self.attn_factor) * (f32(1) + f32(0.1) * np.log(f32(1) / f32(self.freq_scale))))

    def inv_freq(self) -> np.ndarray:
        """float64 [n_rot/2]: theta_i / p, every scaling folded in."""
        theta = base_inv_freq(self.n_rot, float(self.base))
        if self.freq_factors:
            theta = theta / np.asarray(self.freq_factors, np.float64)
        if self.freq_scale == 1.0 and self.ext_factor == 0.0:
            return theta
        interp = self.freq_scale * theta
        if self.ext_factor == 0.0:
            return interp
        mix = self.ext_factor * yarn_ramp(self.corr_dims(), self.n_rot // 2)
        return interp * (1.0 - mix) + theta * mix

    def table_args(self) -> tuple[np.ndarray, float, float, np.ndarray]:
        """What the CPU rope table needs to follow ggml-cpu's rope cache in float32 (ops.rope_table_cpu):
        (freq_factors f32 [n_rot/2], ones without them; freq_scale; ext_factor; YaRN's ramp per pair f32
        [n_rot/2], zeros without YaRN). The base and n_rot give theta_scale there, mscale the factor."""
        half = self.n_rot // 2
        ff = np.asarray(self.freq_factors, np.float32) if self.freq_factors else np.ones(half, np.float32)
        ramp = (
            yarn_ramp(self.corr_dims(), half).astype(np.float32)
            if self.ext_factor != 0.0
            else np.zeros(half, np.float32)
        )
        return ff, float(np.float32(self.freq_scale)), float(np.float32(self.ext_factor)), ramp

    def corr_dims(self) -> tuple[float, float]:
        """YaRN's low and high correction dims (ggml_rope_yarn_corr_dims, in float32 as ggml)."""
        n, ctx, base = np.float32(self.n_rot), np.float32(self.n_ctx_orig), np.float32(self.base)

        def corr_dim(beta: float) -> np.float32:
            two_pi = np.float32(beta) * np.float32(2) * np.float32(math.pi)
            return n * np.log(ctx / two_pi) / (np.float32(2) * np.log(base))

        start = math.floor(corr_dim(self.beta_fast))
        end = math.ceil(corr_dim(self.beta_slow))
        return float(max(0, start)), float(min(self.n_rot - 1, end))


def _base_inv_freq(n_rot: int, base: float) -> np.ndarray:
    half = n_rot // 2
    out = np.empty(half, np.float64)
    for i in range(half):
        out[i] = base ** (-2.0 * i / n_rot)
    return out


_base_inv_freq_compiled = None


def base_inv_freq(n_rot: int, base: float) -> np.ndarray:
    """base^(-2i/n_rot) for each pair i, in float64, compiled by Numba: the bits the rope tables always had
    (numpy's vectorized pow may differ in the last bit). Compiled on first use, so that the front-ends,
    which read the config but never rotate, load no Numba."""
    global _base_inv_freq_compiled
    if _base_inv_freq_compiled is None:
        from numba import njit

        _base_inv_freq_compiled = njit(cache=True, nogil=True)(_base_inv_freq)
    return _base_inv_freq_compiled(n_rot, base)


def yarn_ramp(corr: tuple[float, float], half: int) -> np.ndarray:
    """rope_yarn_ramp for pairs 0..half-1: 1 - clamp((i - low) / max(0.001, high - low), 0, 1) (float32)."""
    low, high = np.float32(corr[0]), np.float32(corr[1])
    y = (np.arange(half, dtype=np.float32) - low) / max(np.float32(0.001), high - low)
    return (np.float32(1) - np.clip(y, 0, 1)).astype(np.float64)


def _factor_tensor(g: GGUFFile, name: str, n_rot: int) -> tuple[float, ...]:
    """The frequency factors of tensor `name` [n_rot/2], () when the file has none."""
    t = g.tensors.get(name)
    if t is None:
        return ()
    if t.qtype != GGMLQuantizationType.F32 or tuple(t.shape) != (n_rot // 2,):
        raise GGUFError(
            f"{g.path}: tensor {name!r} is {t.qtype.name} of shape {t.shape}: must be F32 of "
            f"shape ({n_rot // 2},) (one factor per rotated pair, as llama.cpp's rope requires)"
        )
    factors = np.frombuffer(t.data.tobytes(), np.float32)
    if not (np.isfinite(factors).all() and (factors > 0).all()):
        bad = factors[~(np.isfinite(factors) & (factors > 0))][:4].tolist()
        raise GGUFError(
            f"{g.path}: tensor {name!r} holds {bad}: every frequency factor must be a finite "
            "number > 0 (each divides a rotary frequency)"
        )
    return tuple(float(f) for f in factors)


@dataclass(frozen=True, eq=False)
class LongRope:
    """LongRoPE (Phi-3): the rope with the short factor set and with the long one, and the context past
    which llama.cpp uses the long set (llama_model::get_rope_factors: n_ctx per sequence >
    {arch}.rope.scaling.original_context_length, the training context without the key). The choice is made
    once per context, not per position: every position of a long context rotates with the long factors."""

    short: RopeParams
    long: RopeParams
    n_ctx_orig: int

    def for_context(self, n_ctx: int) -> RopeParams:
        """llama.cpp compares its context per sequence, n_ctx padded up to a multiple of CONTEXT_PAD."""
        padded = -(-n_ctx // CONTEXT_PAD) * CONTEXT_PAD
        return self.long if padded > self.n_ctx_orig else self.short


def longrope_from_gguf(g: GGUFFile, arch: str, rope: RopeParams, n_ctx_train: int) -> LongRope:
    """`rope` with rope_factors_short.weight and with rope_factors_long.weight (each optional in llama.cpp:
    a missing set is no factors)."""
    short, long = (_factor_tensor(g, name, rope.n_rot) for name in LONGROPE_TENSORS[::-1])
    # llama.cpp compares with the key's own value here (0 included), not the YaRN context's fallback
    n_ctx_orig = get_int(g, f"{arch}.rope.scaling.original_context_length", n_ctx_train, hi=INT32_MAX)
    return LongRope(replace(rope, freq_factors=short), replace(rope, freq_factors=long), n_ctx_orig)


# The rope.scaling.yarn_* keys an architecture's llama.cpp loader may read (ArchSpec.yarn_keys: Mistral 3
# all three, DeepSeek 2 the log multiplier)
YARN_READ_KEYS = ("yarn_beta_fast", "yarn_beta_slow", "yarn_log_multiplier")


def _check_unread_yarn_keys(g: GGUFFile, p: str, ext_factor: float, read: tuple[str, ...] = ()) -> None:
    """rope.scaling.yarn_* keys: llama.cpp ignores them for these architectures and uses its own values,
    so a file is accepted only where they agree (otherwise it would mean two different models); `read`:
    those the architecture reads (rope_from_gguf's yarn_keys)."""
    used = {
        "yarn_beta_fast": YARN_BETA_FAST,
        "yarn_beta_slow": YARN_BETA_SLOW,
        "yarn_ext_factor": ext_factor,
        "yarn_attn_factor": 1.0,
        "yarn_log_multiplier": 0.0,
    }
    for name, value in used.items():
        if name in read:
            continue
        key = f"{p}rope.scaling.{name}"
        if key in g.metadata and get_float(g, key) != value:
            raise GGUFError(
                f"{g.path}: metadata {key} = {g.metadata[key]} is not supported: llama.cpp uses {value} for "
                f"this architecture whatever the file says, and edgellm follows it"
            )


def _yarn_attn_factor(freq_scale: float, log_mul: float = 0.0) -> float:
    """llama-context.cpp's yarn_attn_factor under YaRN (before rope.scaling.attn_factor): get_mscale(factor)
    (with rope.scaling.yarn_log_multiplier m != 0: get_mscale(factor, 1) / get_mscale(factor, m), HF's
    mscale / mscale_all_dim) divided by the 1 + 0.1 ln(factor) that ggml's rope_yarn multiplies back in,
    in float32."""
    f = np.float32(1.0) / np.float32(freq_scale)

    def get_mscale(mscale: float) -> np.float32:
        if f <= 1:
            return np.float32(1.0)
        return np.float32(0.1) * np.float32(mscale) * np.log(f) + np.float32(1.0)

    ratio = get_mscale(1.0) / get_mscale(log_mul) if log_mul != 0.0 else get_mscale(1.0)
    return float(np.float32(ratio) * (np.float32(1.0) / (np.float32(1.0) + np.float32(0.1) * np.log(f))))


def rope_from_gguf(
    g: GGUFFile,
    arch: str,
    n_rot: int,
    neox: bool,
    n_ctx_train: int,
    swa: bool,
    freq_factors: bool = False,
    swa_rope: tuple[float | None, bool] | None = None,
    yarn_keys: tuple[str, ...] = (),
) -> tuple[RopeParams, RopeParams]:
    """(the global layers' rope, the sliding-window layers' rope), each key type- and range-checked.
    freq_factors: the architecture reads rope_freqs.weight (understood.py refuses it elsewhere). swa_rope:
    the sliding-window layers' rope where it differs from the global layers', as llama.cpp sets
    rope_freq_base_train_swa / rope_freq_scale_train_swa: (the base when rope.freq_base_swa is missing, None
    for rope.freq_base; whether the frequency scaling applies), as the architecture's spec gives it (Gemma
    3's local layers are never scaled, Gemma 2's are); None: the local layers rotate as the global ones
    (OLMo 2). yarn_keys: which of YARN_READ_KEYS (rope.scaling.yarn_beta_fast / yarn_beta_slow /
    yarn_log_multiplier) the architecture reads; the others are accepted only at llama.cpp's own values."""
    p = f"{arch}."
    scaling_key = p + "rope.scaling.type"
    scaling = get_str(g, scaling_key, "linear")
    if scaling not in SCALING_TYPES:
        longrope = " (LongRoPE as a scaling type: only Phi-3's factor tensors are implemented)"
        what = longrope if scaling == "longrope" else ""
        raise GGUFError(
            f"{g.path}: metadata {scaling_key} = {scaling!r}{what} is not supported "
            f"(supported: {', '.join(SCALING_TYPES)})"
        )
    factor_key = p + "rope.scaling.factor"
    if factor_key not in g.metadata and p + "rope.scale_linear" in g.metadata:
        factor_key = p + "rope.scale_linear"  # the older key name, as llama.cpp falls back to it
    factor = get_float(g, factor_key, 0.0, lo=0.0)  # 0: not set
    freq_scale = 1.0 if scaling == "none" or factor == 0.0 else float(np.float32(1.0) / np.float32(factor))
    ext_factor = 1.0 if scaling == "yarn" else 0.0
    rope_attn = get_float(g, p + "rope.scaling.attn_factor", 1.0, lo=0.0, lo_open=True)
    _check_unread_yarn_keys(g, p, ext_factor, yarn_keys)
    read = {
        name: get_float(g, f"{p}rope.scaling.{name}", default)
        for name, default in zip(YARN_READ_KEYS, (YARN_BETA_FAST, YARN_BETA_SLOW, 0.0), strict=True)
        if name in yarn_keys
    }
    beta_fast = read.get("yarn_beta_fast", YARN_BETA_FAST)
    beta_slow = read.get("yarn_beta_slow", YARN_BETA_SLOW)
    log_mul = read.get("yarn_log_multiplier", 0.0)
    alpha_key = p + "rope.scaling.alpha"
    if alpha_key in g.metadata and get_float(g, alpha_key) != 0.0:
        raise GGUFError(
            f"{g.path}: metadata {alpha_key} = {g.metadata[alpha_key]} (NTK-aware alpha) is not supported"
        )
    attn_factor = float(
        np.float32(_yarn_attn_factor(freq_scale, log_mul) if ext_factor else 1.0) * np.float32(rope_attn)
    )
    # 0, as a missing key, means the training context (llama-context.cpp)
    n_ctx_orig = get_int(g, p + "rope.scaling.original_context_length", 0, hi=INT32_MAX) or n_ctx_train
    base = get_float(g, p + "rope.freq_base", 10000.0, lo=0.0, lo_open=True)
    common = dict(
        n_rot=n_rot,
        neox=neox,
        ext_factor=ext_factor,
        attn_factor=attn_factor,
        n_ctx_orig=n_ctx_orig,
        beta_fast=beta_fast,
        beta_slow=beta_slow,
    )
    factors = _factor_tensor(g, FREQ_FACTORS_TENSOR, n_rot) if freq_factors else ()
    rope = RopeParams(base=base, freq_scale=freq_scale, freq_factors=factors, **common)
    base_swa_key = p + "rope.freq_base_swa"
    if not swa or swa_rope is None:
        if swa and base_swa_key in g.metadata:  # read by llama.cpp, unused by its graph (OLMo 2): checked
            get_float(g, base_swa_key, lo=0.0, lo_open=True)
        return rope, rope
    # Sliding-window layers: their own base and maybe no frequency scaling, the context-wide YaRN values
    # as the rest.
    default_base, scaled = swa_rope
    default_base = base if default_base is None else default_base
    base_swa = get_float(g, base_swa_key, default_base, lo=0.0, lo_open=True)
    # the frequency factors too: llama.cpp's get_rope_factors gives every layer its rope_freqs (Llama 4's
    # chunked layers; no other architecture with local layers reads them)
    swa_scale = freq_scale if scaled else 1.0
    return rope, RopeParams(base=base_swa, freq_scale=swa_scale, freq_factors=factors, **common)
