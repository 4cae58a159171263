"""The Gated DeltaNet linear-attention layer (Qwen 3.5 / 3.6, Qwen3-Next), as llama.cpp's
llama_model_qwen35::build_layer_attn_linear and ggml's gated_delta_net op compute it (recurrent form):

h = rmsnorm(x) * attn_norm                                           # [T, n_embd]
mixed | z | b | a = [W_qkv; W_gate; W_beta; W_alpha] h               # [T, C], [T, Hv*S], [T, Hv], [T, Hv]
u_t = silu(sum_i conv[:, i] * mixed_{t - (K-1) + i}),  i = 0..K-1    # causal depthwise conv, C channels
q | k | v = u                                                        # [Hk, S], [Hk, S], [Hv, S] per token
q, k = q / sqrt(|q|^2 + eps), k / sqrt(|k|^2 + eps)                  # per head (build_gdn_l2_norm)
beta = sigmoid(b), g = softplus(a + ssm_dt.bias) * ssm_a             # [T, Hv]; ssm_a = -exp(A_log) < 0
per value head h (its key head h % Hk: ggml repeats the key heads; Qwen3-Next's h // (Hv / Hk)):
    M = exp(g_t) M                                                    # M [S (value), S (key)]
    M += beta_t (v_t - M k_t) k_t^T                                   # the delta rule
    o_t = M q_t / sqrt(S)
y = rmsnorm_heads(o) * ssm_norm * silu(z)                            # [T, Hv, S]
x += W_out y                                                          # [T, n_embd]

C = 2 * Hk * S + Hv * S. A sequence's state per DeltaNet layer is its last K-1 rows of `mixed` (the conv
window) and the Hv matrices M, kept flat as one float32 row (state_size): [(K-1) * C | Hv * S * S]. The
engine keeps one per sequence (engine/conv_state.py) and passes the batch's as batch.conv_state, which this
reads and advances in place. Sums in float32 in the order ggml's CPU ops take (ssm_conv: k order; the
delta rule: dot products over the key dim). CPU only: the recurrence runs on host arrays.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from gguf import GGMLQuantizationType

from edgellm.arch.common import ForwardBatch, TensorSource, pre_norm
from edgellm.gguf.metadata import get_int
from edgellm.gguf.model_config import ModelConfig
from edgellm.gguf.reader import GGUFError, GGUFFile

if TYPE_CHECKING:
    from edgellm.backends.base import Backend

# Per-layer tensors of a DeltaNet layer (after "blk.N."); ssm_a has no ".weight" (llama.cpp's SSM_A_NOSCAN)
DELTANET_TENSORS = frozenset(
    {
        "attn_qkv.weight",
        "attn_gate.weight",
        "ssm_conv1d.weight",
        "ssm_dt.bias",
        "ssm_a",
        "ssm_beta.weight",
        "ssm_alpha.weight",
        "ssm_norm.weight",
        "ssm_out.weight",
    }
)
# The keys llama.cpp's load_arch_hparams reads for them (after "{arch}.")
DELTANET_KEYS = frozenset(
    {"ssm.conv_kernel", "ssm.inner_size", "ssm.state_size", "ssm.time_step_rank", "ssm.group_count"}
)
CONV_TENSOR = "ssm_conv1d.weight"
BETA_ALPHA = "ssm_ba.weight"  # Qwen3-Next: beta and alpha in one matrix, grouped by key head
# ggml's ssm_conv reads an F32 kernel only (llama.cpp's quantizer leaves it F32)
CONV_TYPES = (GGMLQuantizationType.F32,)
MAX_CONV_KERNEL = 64  # real files have 4; a bound for the metadata check


def read_deltanet(g: GGUFFile, cfg: ModelConfig) -> None:
    """The ssm.* keys (all required, as llama.cpp reads them) and the shapes its graph assumes."""
    p, size = cfg.arch + ".", g.file_size
    cfg.ssm_conv_kernel = get_int(g, p + "ssm.conv_kernel", lo=2, hi=MAX_CONV_KERNEL)
    cfg.ssm_d_state = get_int(g, p + "ssm.state_size", lo=1, hi=size)
    cfg.ssm_n_group = get_int(g, p + "ssm.group_count", lo=1, hi=size)
    cfg.ssm_dt_rank = get_int(g, p + "ssm.time_step_rank", lo=1, hi=size)
    d_inner = get_int(g, p + "ssm.inner_size", lo=1, hi=size)
    if d_inner != cfg.ssm_d_state * cfg.ssm_dt_rank:
        raise GGUFError(
            f"{g.path}: {p}ssm.inner_size = {d_inner} must be ssm.state_size x ssm.time_step_rank = "
            f"{cfg.ssm_d_state} x {cfg.ssm_dt_rank} (llama.cpp's value heads are state_size wide)"
        )
    if cfg.ssm_dt_rank % cfg.ssm_n_group:
        raise GGUFError(
            f"{g.path}: {p}ssm.time_step_rank = {cfg.ssm_dt_rank} value heads must be a multiple of "
            f"{p}ssm.group_count = {cfg.ssm_n_group} key heads"
        )


def conv_channels(cfg: ModelConfig) -> int:
    """C: the conv's channels, q | k | v."""
    return 2 * cfg.ssm_n_group * cfg.ssm_d_state + cfg.ssm_dt_rank * cfg.ssm_d_state


def state_size(cfg: ModelConfig) -> int:
    """float32s of one sequence's state in one DeltaNet layer: the conv window, then the Hv matrices."""
    S = cfg.ssm_d_state
    return (cfg.ssm_conv_kernel - 1) * conv_channels(cfg) + cfg.ssm_dt_rank * S * S


def deltanet_shapes(cfg: ModelConfig, beta_alpha_fused: bool = False) -> dict[str, tuple[int, ...]]:
    """A DeltaNet layer's tensors (after "blk.N.", its pre-norm apart) -> numpy-order shape; with
    beta_alpha_fused Qwen3-Next's one ssm_ba in place of ssm_beta and ssm_alpha."""
    e, S, Hv = cfg.n_embd, cfg.ssm_d_state, cfg.ssm_dt_rank
    if beta_alpha_fused:
        shapes = deltanet_shapes(cfg)
        del shapes["ssm_beta.weight"], shapes["ssm_alpha.weight"]
        return shapes | {BETA_ALPHA: (2 * Hv, e)}
    return {
        "attn_qkv.weight": (conv_channels(cfg), e),
        "attn_gate.weight": (Hv * S, e),
        CONV_TENSOR: (conv_channels(cfg), cfg.ssm_conv_kernel),
        "ssm_dt.bias": (Hv,),
        "ssm_a": (Hv,),
        "ssm_beta.weight": (Hv, e),
        "ssm_alpha.weight": (Hv, e),
        "ssm_norm.weight": (S,),
        "ssm_out.weight": (e, Hv * S),
    }


def check_conv_types(g: GGUFFile) -> None:
    for name, t in g.tensors.items():
        if name.endswith(CONV_TENSOR) and t.qtype not in CONV_TYPES:
            raise GGUFError(
                f"{g.path}: tensor {name!r} is {GGMLQuantizationType(t.qtype).name}: the DeltaNet conv "
                "kernel is read as F32 only (as llama.cpp's ssm_conv)"
            )


@dataclass
class DeltaNetWeights:
    norm: Any  # [n_embd] the layer's pre-norm (attn_norm)
    in_proj: Any  # [C + Hv*S + 2*Hv, n_embd]: qkv | gate (z) | beta | alpha
    conv: np.ndarray  # [C, K] float32: channel c's taps, oldest first
    dt_bias: np.ndarray  # [Hv] float32
    a: np.ndarray  # [Hv] float32 (-exp(A_log))
    ssm_norm: np.ndarray  # [S] float32
    out_proj: Any  # [n_embd, Hv*S]
    # which key head value head h reads: h % Hk (False: ggml's repeat, Qwen 3.5's converter reorders the
    # value heads for it) or h // (Hv / Hk) (True: Qwen3-Next's repeat-interleave)
    grouped_heads: bool = False

    @property
    def matrices(self) -> list[Any]:
        return [self.in_proj, self.out_proj]


def load_deltanet(
    be: Backend, src: TensorSource, cfg: ModelConfig, il: int, qwen3next: bool = False
) -> DeltaNetWeights:
    """Layer il's DeltaNet weights; qwen3next: ssm_ba (its rows regrouped into betas, then alphas) and the
    value heads grouped by key head."""
    p, e = f"blk.{il}.", cfg.n_embd
    shapes = deltanet_shapes(cfg, qwen3next)

    def host(name: str) -> np.ndarray:
        v = be.to_host(be.load_vector(src.get(p + name, shapes[name])))
        return np.ascontiguousarray(v, np.float32).reshape(shapes[name])

    parts = [src.get(p + n, shapes[n]) for n in ("attn_qkv.weight", "attn_gate.weight")]
    if qwen3next:  # ssm_ba rows: per key head g, its r betas then its r alphas (r = Hv / Hk)
        ba, Hk, r = (
            src.get(p + BETA_ALPHA, shapes[BETA_ALPHA]),
            cfg.ssm_n_group,
            cfg.ssm_dt_rank // cfg.ssm_n_group,
        )
        betas = [g * 2 * r + j for g in range(Hk) for j in range(r)]
        rows = np.asarray(betas + [b + r for b in betas])
        parts.append(
            dataclasses.replace(ba, name=ba.name + "[regrouped]", data=np.ascontiguousarray(ba.data[rows]))
        )
    else:
        parts += [src.get(p + n, shapes[n]) for n in ("ssm_beta.weight", "ssm_alpha.weight")]
    return DeltaNetWeights(
        norm=be.load_vector(src.get(p + "attn_norm.weight", (e,))),
        in_proj=be.load_matrix(parts),
        conv=host(CONV_TENSOR),
        dt_bias=host("ssm_dt.bias"),
        a=host("ssm_a"),
        ssm_norm=host("ssm_norm.weight"),
        out_proj=be.load_matrix([src.get(p + "ssm_out.weight", shapes["ssm_out.weight"])]),
        grouped_heads=qwen3next,
    )


def _delta_net_run(mixed, conv_w, state, beta, g, n_k_heads, n_v_heads, head, eps, grouped, out):  # noqa: ANN001
    """One sequence's tokens through the conv and the delta rule (module doc), in float32.
    mixed [n, C]; conv_w [C, K]; state [(K-1)*C + Hv*S*S] advanced in place; beta, g [n, Hv];
    out [n, Hv, S]. The conv and norms run over the tokens first, then the value heads (independent of
    each other) in parallel, each over the tokens in order."""
    n, C = mixed.shape
    K = conv_w.shape[1]
    S = head
    nw = (K - 1) * C
    window = np.empty((K - 1 + n, C), np.float32)  # the past K-1 inputs, then these
    for r in range(K - 1):
        for c in range(C):
            window[r, c] = state[r * C + c]
    for r in range(n):
        for c in range(C):
            window[K - 1 + r, c] = mixed[r, c]
    u = np.empty((n, C), np.float32)  # silu(conv), then q and k l2-normalised in place
    one = np.float32(1.0)
    for t in range(n):
        for c in range(C):
            acc = np.float32(0.0)
            for i in range(K):
                acc += window[t + i, c] * conv_w[c, i]
            u[t, c] = acc / (one + np.exp(-acc))  # silu
        for hq in range(2 * n_k_heads):  # q heads, then k heads
            ss = 0.0
            for i in range(S):
                ss += np.float64(u[t, hq * S + i]) ** 2
            f = one / np.sqrt(np.float32(ss / S) + np.float32(eps / S)) / np.sqrt(np.float32(S))
            for i in range(S):
                u[t, hq * S + i] *= f
    for r in range(K - 1):
        for c in range(C):
            state[r * C + c] = window[n + r, c]
    scale = np.float32(1.0) / np.sqrt(np.float32(S))
    v0 = 2 * n_k_heads * S
    for h in prange(n_v_heads):
        hk = h // (n_v_heads // n_k_heads) if grouped else h % n_k_heads
        q0, k0 = hk * S, (n_k_heads + hk) * S
        m0 = nw + h * S * S  # M[h][value j][key i] at state[m0 + j * S + i]
        delta = np.empty(S, np.float32)
        for t in range(n):
            decay = np.exp(g[t, h])
            b = beta[t, h]
            for j in range(S):
                acc = np.float32(0.0)
                for i in range(S):
                    state[m0 + j * S + i] *= decay
                    acc += state[m0 + j * S + i] * u[t, k0 + i]
                delta[j] = (u[t, v0 + h * S + j] - acc) * b
            for j in range(S):
                dj = delta[j]
                acc = np.float32(0.0)
                for i in range(S):
                    state[m0 + j * S + i] += dj * u[t, k0 + i]
                    acc += state[m0 + j * S + i] * u[t, q0 + i]
                out[t, h, j] = acc * scale


prange = range  # Numba's parallel range where compiled (delta_net_run); the plain one in Python
_delta_net_compiled = None


def delta_net_run(*args: Any) -> None:
    """_delta_net_run compiled by Numba on first use (a front-end that reads specs loads no Numba), its
    value heads in parallel."""
    global _delta_net_compiled
    if _delta_net_compiled is None:
        import numba

        globals()["prange"] = numba.prange
        _delta_net_compiled = numba.njit(cache=True, nogil=True, parallel=True)(_delta_net_run)
    _delta_net_compiled(*args)


def deltanet_block(
    be: Backend, cfg: ModelConfig, w: DeltaNetWeights, x: Any, batch: ForwardBatch, state: np.ndarray
) -> None:
    """x += DeltaNet(norm(x)) for every token (in place). x: [T, n_embd]; state: [S_seqs, state_size],
    row s batch sequence s's state, advanced here past its tokens."""
    T = batch.n_tokens
    S, Hk, Hv, C = cfg.ssm_d_state, cfg.ssm_n_group, cfg.ssm_dt_rank, conv_channels(cfg)
    want = (batch.block_tables.shape[0], state_size(cfg))
    if state.shape != want or state.dtype != np.float32 or not state.flags.c_contiguous:
        raise GGUFError(
            f"{cfg.arch}: a DeltaNet layer's state is {state.shape} {state.dtype}, expected {want}"
        )
    h = pre_norm(be, cfg, w.norm, x, T)
    proj = be.empty((T, C + Hv * S + 2 * Hv))
    be.matmul(h, w.in_proj, proj)  # [T, qkv | z | beta | alpha]
    proj = be.to_host(proj)
    mixed = np.ascontiguousarray(proj[:, :C])
    z = proj[:, C : C + Hv * S].reshape(T, Hv, S)
    f32 = np.float32
    beta = np.ascontiguousarray(f32(1) / (f32(1) + np.exp(-proj[:, C + Hv * S : C + Hv * S + Hv])))
    a = proj[:, C + Hv * S + Hv :] + w.dt_bias
    softplus = np.where(a > f32(20), a, np.log(f32(1) + np.exp(np.minimum(a, f32(20)))))
    g = np.ascontiguousarray((softplus * w.a).astype(f32))
    o = np.empty((T, Hv, S), f32)
    seq = batch.seq_index
    starts = np.flatnonzero(np.r_[True, seq[1:] != seq[:-1]])  # one run of rows per sequence, in order
    for r0, r1 in zip(starts, np.r_[starts[1:], T], strict=True):
        s = int(seq[r0])
        delta_net_run(mixed[r0:r1], w.conv, state[s], beta[r0:r1], g[r0:r1], Hk, Hv, S, cfg.rms_eps,
                      w.grouped_heads, o[r0:r1])  # fmt: skip
    # gated norm: rmsnorm over each head's S values, times ssm_norm and silu(z)
    ms = (o.astype(np.float64) ** 2).mean(axis=-1, keepdims=True)
    y = o * (f32(1) / np.sqrt(ms + cfg.rms_eps)).astype(f32) * w.ssm_norm
    y = (y * (z / (f32(1) + np.exp(-z)))).astype(f32).reshape(T, Hv * S)
    out = be.empty((T, cfg.n_embd))
    be.matmul(be.from_host(np.ascontiguousarray(y)), w.out_proj, out)
    be.add(x, out)
