"""A whole decoder layer in one Numba call (CpuBackend.decoder_layer).

At batch 1 a layer is ~20 small kernel calls; from Python each costs a method call, argument checks and
the dispatcher's unboxing (1-2 us), 0.7-0.9 ms of a SmolLM2 decode step in all. Here the layer's
kernels are called from compiled code in the order of arch/common.py's attention_block and
feed_forward_block, with the same inputs, so the results are bit for bit the unfused ones
(tests/kernels/test_fused_layer.py). A kernel whose rounding is left to fast-math contraction can come out
differently when compiled into this module (rope did, so its FMAs are explicit): the tests compare
every architecture, prefill and decode, and the real models' llama.cpp fixtures run through this path.

Only the tile tiers (tiers.CpuTier.fused_layer: tile primitives and F16C) with an f16 KV cache have this
form; everything else (and every check that
fails) leaves the layer to the model's blocks. A layer's data are packed once at load (FusedLayer).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numba import njit

from edgellm.backends.cpu import ops
from edgellm.backends.cpu.attention import attention_paged_cpu
from edgellm.backends.cpu.matmul import ORDERED_MATH, matmul_tiles_fused_at_cpu
from edgellm.backends.cpu.numba_cache import follow_sources
from edgellm.backends.cpu.silu_ir import swiglu_vec_cpu, swiglu_vec_par_cpu
from edgellm.backends.cpu.tile_layouts import TILE, TILE_LAYOUTS
from edgellm.gguf.rope import RopeParams

PARTS = 3  # stacked parts per matrix (Q|K|V of three types at most); unused parts have 0 rows
META = 7  # per part: layout_id, group, act_mode, n_units, rows, first output column, tiles
# the matrices, PARTS rows each of planes / meta: Q|K|V [0:3], Wo [3:6], gate|up [6:9], down [9:12]
# norms tuple order
ATTN_NORM, Q_NORM, K_NORM, ATTN_POST, FFN_NORM, FFN_POST = range(6)
# biases tuple order: one per matrix (a stacked matrix's parts in one vector)
QKV_B, O_B, GATE_UP_B, DOWN_B = range(4)
# dims array order
H_, HKV_, D_, DV_, FF_, NEOX_, WINDOW_, GELU_ = range(8)


@dataclass
class FusedLayer:
    """Everything decoder_layer_cpu reads of one layer, in the argument form it takes."""

    norms: tuple  # 6 f32 vectors (ATTN_NORM ..), absent ones empty
    biases: tuple  # 4 f32 vectors (QKV_B ..), absent ones empty
    planes: np.ndarray  # int64 [4 * PARTS, 6, 2]: each part's plane addresses (vnni.plane_addresses)
    meta: np.ndarray  # int64 [4 * PARTS, META]
    dims: np.ndarray  # int64 [8] (H_ ..)
    eps: float
    scale: float  # attention scale
    rope: RopeParams  # the layer kind's rotary embedding (its cos/sin table is the backend's)
    softcap: float  # attention logit soft-capping (0: none)
    residual: float  # each block's output times this before the residual add (Granite)
    n_embd: int
    weights: list  # the parts' Tiles, kept alive for the addresses in `planes`
    sinks: np.ndarray  # f32 [H] each head's extra softmax logit (gpt-oss), or empty


@njit(cache=True, nogil=True, fastmath=ORDERED_MATH)
def _matmul_parts(x, planes, meta, out, n_threads, tier) -> None:
    """out[:, part columns] = x @ part.T for each part of one matrix (as CpuBackend.matmul does).
    planes: int64 [PARTS, 6, 2] plane addresses; meta: int64 [PARTS, META]."""
    for p in range(PARTS):
        rows = meta[p, 4]
        if rows == 0:
            continue
        c0 = meta[p, 5]
        matmul_tiles_fused_at_cpu(
            x, planes[p], meta[p, 6], meta[p, 0], meta[p, 1], meta[p, 2], meta[p, 3], rows, n_threads, tier,
            out[:, c0 : c0 + rows],
        )  # fmt: skip


@njit(cache=True, nogil=True)
def _split_heads(qkv, q, k, v) -> None:
    """qkv [T, H*d | Hkv*d | Hkv*dv] -> contiguous q [T, H, d], k [T, Hkv, d], v [T, Hkv, dv]."""
    T, H, d = q.shape
    hkv, dv = v.shape[1], v.shape[2]
    for t in range(T):
        for h in range(H):
            for i in range(d):
                q[t, h, i] = qkv[t, h * d + i]
        for h in range(hkv):
            for i in range(d):
                k[t, h, i] = qkv[t, (H + h) * d + i]
            for i in range(dv):
                v[t, h, i] = qkv[t, (H + hkv) * d + h * dv + i]


@njit(cache=True, nogil=True)
def decoder_layer_cpu(
    x, norms, biases, planes, meta, dims, eps, scale, softcap, residual, sinks, cos_t, sin_t,
    k_cache, v_cache, block_tables, seq_index, positions, slots, n_threads, tier,
) -> None:  # fmt: skip
    """x [T, n_embd] += Attention(...) then += FFN(...), writing the tokens' K/V: attention_block then
    feed_forward_block of arch/common.py, kernel for kernel; without an FFN (dims[FF_] == 0: a
    mixture-of-experts layer, whose experts arch/moe.py runs) the attention only. sinks: f32 [H] the
    heads' attention sinks, or empty. The caller has checked every shape and that tier (a CpuTier.index)
    is compiled."""
    _attention_part(
        x, norms, biases, planes, meta, dims, eps, scale, softcap, residual, sinks, cos_t, sin_t,
        k_cache, v_cache, block_tables, seq_index, positions, slots, n_threads, tier,
    )  # fmt: skip
    if dims[FF_]:
        _ffn_part(x, norms, biases, planes, meta, dims, eps, residual, n_threads, tier)


@njit(cache=True, nogil=True, inline="always")
def _attention_part(
    x, norms, biases, planes, meta, dims, eps, scale, softcap, residual, sinks, cos_t, sin_t,
    k_cache, v_cache, block_tables, seq_index, positions, slots, n_threads, tier,
) -> None:  # fmt: skip
    """x += attention_block(x)."""
    T, E = x.shape
    H, hkv, d, dv = dims[H_], dims[HKV_], dims[D_], dims[DV_]
    h = np.empty((T, E), np.float32)
    ops.rmsnorm_cpu(x, norms[ATTN_NORM], eps, h)
    qkv = np.empty((T, (H + hkv) * d + hkv * dv), np.float32)
    _matmul_parts(h, planes[0:3], meta[0:3], qkv, n_threads, tier)
    if biases[QKV_B].shape[0]:
        qkv += biases[QKV_B]
    q = np.empty((T, H, d), np.float32)
    k = np.empty((T, hkv, d), np.float32)
    v = np.empty((T, hkv, dv), np.float32)
    _split_heads(qkv, q, k, v)
    if norms[Q_NORM].shape[0]:
        ops.rmsnorm_heads_cpu(q, norms[Q_NORM], eps)
        ops.rmsnorm_heads_cpu(k, norms[K_NORM], eps)
    neox = dims[NEOX_] != 0
    ops.rope_cached_cpu(q, positions, cos_t, sin_t, neox)
    ops.rope_cached_cpu(k, positions, cos_t, sin_t, neox)
    ops.write_kv_slots_cpu(k, v, k_cache, v_cache, slots)
    attn = np.empty((T, H, dv), np.float32)
    attention_paged_cpu(
        q, k_cache, v_cache, block_tables, seq_index, positions, dims[WINDOW_], scale, softcap, sinks,
        n_threads, attn,
    )  # fmt: skip
    o = np.empty((T, E), np.float32)
    _matmul_parts(attn.reshape(T, H * dv), planes[3:6], meta[3:6], o, n_threads, tier)
    if biases[O_B].shape[0]:
        o += biases[O_B]
    if norms[ATTN_POST].shape[0]:
        ops.rmsnorm_cpu(o, norms[ATTN_POST], eps, o)
    if residual != 1.0:
        o *= np.float32(residual)
    ops.add_cpu(x, o)


@njit(cache=True, nogil=True, inline="always")
def _ffn_part(x, norms, biases, planes, meta, dims, eps, residual, n_threads, tier) -> None:
    """x += feed_forward_block(x)."""
    T, E = x.shape
    ff = dims[FF_]
    h = np.empty((T, E), np.float32)
    ops.rmsnorm_cpu(x, norms[FFN_NORM], eps, h)
    gate_up = np.empty((T, 2 * ff), np.float32)
    _matmul_parts(h, planes[6:9], meta[6:9], gate_up, n_threads, tier)
    if biases[GATE_UP_B].shape[0]:
        gate_up += biases[GATE_UP_B]
    act = np.empty((T, ff), np.float32)
    if dims[GELU_]:
        ops.geglu_par_cpu(gate_up, act)
    elif T >= 8:  # the thresholds of CpuBackend.gated_act
        swiglu_vec_par_cpu(gate_up, act, tier)
    else:
        swiglu_vec_cpu(gate_up, act, tier)
    o = np.empty((T, E), np.float32)
    _matmul_parts(act, planes[9:12], meta[9:12], o, n_threads, tier)
    if biases[DOWN_B].shape[0]:
        o += biases[DOWN_B]
    if norms[FFN_POST].shape[0]:
        ops.rmsnorm_cpu(o, norms[FFN_POST], eps, o)
    if residual != 1.0:
        o *= np.float32(residual)
    ops.add_cpu(x, o)


follow_sources(decoder_layer_cpu, _attention_part, _ffn_part, _matmul_parts)


def _parts(w: Any) -> list | None:
    """The tiled parts of a loaded matrix (a PackedWeight or StackedWeights), or None if any is untiled."""
    parts = getattr(w, "parts", None) or [w]
    if len(parts) > PARTS or any(getattr(p, "tiles", None) is None for p in parts):
        return None
    return parts


def pack_matrix(w: Any, rows: int, cols: int, what: str) -> tuple[np.ndarray, np.ndarray, list] | None:
    """A loaded matrix as _matmul_parts' arguments: (planes int64 [PARTS, 6, 2], meta int64 [PARTS, META],
    the parts' Tiles to keep alive), or None when a part is untiled. Checks every shape the kernel assumes:
    `rows` rows in all, `cols` columns, whole tiles; `what` names the matrix in the error."""
    parts = _parts(w)
    if parts is None:
        return None
    planes, meta = np.zeros((PARTS, 6, 2), np.int64), np.zeros((PARTS, META), np.int64)
    c0 = 0
    for j, p in enumerate(parts):
        if p.cols != cols:
            raise ValueError(f"{what} has {p.cols} columns, expected {cols}")
        unit = TILE_LAYOUTS[p.qtype].unit
        n_tiles = p.tiles.lo.shape[0]
        if n_tiles != -(-p.rows // TILE) or any(a.shape[0] != n_tiles for a in p.tiles.planes):
            raise ValueError(f"{what} has {n_tiles} tiles for {p.rows} rows")
        meta[j] = (p.tiles.layout_id, p.group, p.act_mode, cols // unit, p.rows, c0, n_tiles)
        planes[j] = [(a.ctypes.data, a.strides[0]) for a in p.tiles.planes]
        c0 += p.rows
    if c0 != rows:
        raise ValueError(f"{what} has {c0} rows, expected {rows}")
    return planes, meta, [p.tiles for p in parts]


def pack_layer(cfg: Any, attn: Any, ffn: Any, il: int) -> FusedLayer | None:
    """A layer's FusedLayer, or None when one of its pieces has no fused form; ffn None: the attention
    block alone (a mixture-of-experts layer). Checks every shape the kernel assumes of the weights (each
    matrix's rows and columns)."""
    H, hkv, d, dv, e = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.head_dim_v, cfg.n_embd
    ff = cfg.n_ff if ffn is not None else 0
    if not cfg.pre_norms or cfg.qk_norm_full or cfg.layer_norm:
        return None  # OLMo 2's norm placement, LayerNorm: the blocks' kernel calls
    sinks = np.empty(0, np.float32)
    if attn.sinks is not None:  # gpt-oss: the kernel reads sinks[h] for every head unchecked
        sinks = np.ascontiguousarray(attn.sinks, np.float32)
        if sinks.shape != (H,):
            raise ValueError(f"layer {il}: attention sinks of shape {sinks.shape} for {H} heads")
    if ffn is not None and (cfg.activation not in ("silu", "gelu") or not cfg.gated_ffn):
        return None  # the ungated MLP (StarCoder 2, GPT-2): the blocks' kernel calls
    if cfg.rope_of_layer(il) is None:
        return None  # a layer without rope (SmolLM3's NoPE layers, one in four): the blocks' kernel calls
    mats = [(attn.wqkv, (H + hkv) * d + hkv * dv, e), (attn.wo, e, H * dv)]
    if ffn is not None:
        mats += [(ffn.w_gate_up, 2 * ff, e), (ffn.w_down, e, ff)]
    planes, meta = np.zeros((4 * PARTS, 6, 2), np.int64), np.zeros((4 * PARTS, META), np.int64)
    weights = []
    for m, (w, rows, cols) in enumerate(mats):
        packed = pack_matrix(w, rows, cols, f"layer {il}: matrix {m}")
        if packed is None:
            return None
        planes[m * PARTS : (m + 1) * PARTS], meta[m * PARTS : (m + 1) * PARTS] = packed[0], packed[1]
        weights += packed[2]
    empty = np.empty(0, np.float32)
    ffn_norms = (ffn.norm, ffn.post_norm) if ffn is not None else (None, None)
    ffn_biases = (ffn.b_gate_up, ffn.b_down) if ffn is not None else (None, None)
    norms = (attn.norm, attn.q_norm, attn.k_norm, attn.post_norm, *ffn_norms)
    biases = (attn.bqkv, attn.bo, *ffn_biases)
    swa = bool(cfg.swa_layers[il])
    dims = np.array(
        [
            H,
            hkv,
            d,
            dv,
            ff,
            cfg.rope_of_layer(il).neox,
            cfg.sliding_window if swa else 0,
            cfg.activation == "gelu",
        ],
        np.int64,
    )
    return FusedLayer(
        norms=tuple(empty if n is None else n for n in norms),
        biases=tuple(empty if b is None else b for b in biases),
        planes=planes,
        meta=meta,
        dims=dims,
        eps=float(cfg.rms_eps),
        scale=float(cfg.attn_scale),
        rope=cfg.rope_of_layer(il),
        softcap=float(cfg.attn_softcap),
        residual=float(cfg.residual_scale),
        n_embd=e,
        weights=weights,
        sinks=sinks,
    )
