"""Deferred ops: the CUDA backend holds an op back until it sees the next one, and launches the two as one
fused kernel (fused.py) when the next one consumes the held op's output; otherwise the held op launches
on its own, first, so effects keep the model's order.

Chains it recognises, as the model code issues them (arch/common.py):
- [rmsnorm(y, wy, y) (post-norm)], add(x, y), rmsnorm(x, w, h), matmul(h, W): one kernel, then the GEMV
  (h is quantized for W by the norm kernel; also plain rmsnorm(x, w, h), matmul(h, W)).
- gated_act(gate_up, a), matmul(a, W_down); attention(q, ..., o), matmul(o, W_o): the producer quantizes.
- [rmsnorm_heads(q), rmsnorm_heads(k)], rope(q), rope(k), write_kv(k, v): one kernel.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgellm.backends.cuda import attention as attn
from edgellm.backends.cuda import ops
from edgellm.backends.cuda.act_quant import act_block
from edgellm.backends.cuda.config import ROW_THREADS, elem_grid, launch
from edgellm.backends.cuda.devarray import DeviceTensor
from edgellm.backends.cuda.fused import add_rmsnorm_quant_cuda, gated_act_quant_cuda, heads_rope_kv_cuda
from edgellm.backends.cuda.kv_cache import DeviceKvLayer
from edgellm.backends.cuda.matmul import DeviceWeight, Scratch, act_scratch


def same_view(a: Any, b: Any) -> bool:
    return (
        a is b
        or isinstance(a, DeviceTensor)
        and isinstance(b, DeviceTensor)
        and a.buf is b.buf
        and (a.offset, a.shape, a.strides) == (b.offset, b.shape, b.strides)
    )


def _quant_args(quant_for: DeviceWeight | None, scratch: Scratch, rows: int, n: int) -> tuple:
    """(quant, group, mode, xq, xs, xsum) for a kernel that quantizes its output for weight quant_for."""
    if quant_for is None or quant_for.dense is not None:
        dq = scratch.get("dummy_xq", (1, 1), np.int32)
        df = scratch.get("dummy_xs", (1, 1), np.float32)
        return False, 1, 0, dq, df, df
    return (True, quant_for.group, quant_for.act_mode, *act_scratch(scratch, rows, n, quant_for.group))


@dataclass
class ResidualOp:
    """[y = rmsnorm(y) * wy], [x += y], [out = rmsnorm(x) * w]: a post-norm, a residual add, the next norm."""

    x: DeviceTensor
    y: DeviceTensor | None = None
    wy: DeviceTensor | None = None
    eps_y: float = 0.0
    w: DeviceTensor | None = None
    eps: float = 0.0
    out: DeviceTensor | None = None

    def produces(self, x: DeviceTensor) -> bool:
        return self.out is not None and same_view(self.out, x)

    def launch(self, scratch: Scratch, quant_for: DeviceWeight | None = None) -> tuple | None:
        """Launch it; returns the quantized `out` when quant_for is a quantized weight."""
        rows, n = self.x.shape
        if rows == 0:
            return None
        if self.w is None:  # no norm follows (yet): the plain kernels, as unfused
            if self.wy is not None:
                launch(
                    ops.rmsnorm_cuda,
                    rows,
                    ROW_THREADS,
                    *self.y.rows2d(),
                    self.wy.buf,
                    float(self.eps_y),
                    n,
                    *self.y.rows2d(),
                )
            if self.y is not None:
                grid, threads = elem_grid(rows * n)
                launch(ops.add_cuda, grid, threads, *self.x.rows2d(), *self.y.rows2d(), rows, n, False)
            return None
        q = _quant_args(quant_for, scratch, rows, n)
        y = self.y if self.y is not None else self.x
        wy = self.wy if self.wy is not None else self.w
        launch(
            add_rmsnorm_quant_cuda,
            rows,
            ROW_THREADS,
            *self.x.rows2d(),
            *y.rows2d(),
            self.y is not None,
            self.wy is not None,
            wy.buf,
            float(self.eps_y),
            self.w.buf,
            float(self.eps),
            n,
            *self.out.rows2d(),
            *q,
        )
        return q[3:] if q[0] else None


@dataclass
class ActOp:
    """out = act(gate) * up over gate_up = [gate | up]."""

    gate_up: DeviceTensor
    out: DeviceTensor
    act: int  # ops.GATED_ACTS

    def produces(self, x: DeviceTensor) -> bool:
        return same_view(self.out, x)

    def launch(self, scratch: Scratch, quant_for: DeviceWeight | None = None) -> tuple | None:
        rows, ff = self.out.shape
        if rows == 0:
            return None
        q = _quant_args(quant_for, scratch, rows, ff)
        launch(
            gated_act_quant_cuda,
            rows,
            ROW_THREADS,
            *self.gate_up.rows2d(),
            *self.out.rows2d(),
            ff,
            self.act,
            *q,
        )
        return q[3:] if q[0] else None


@dataclass
class AttnOp:
    """Paged attention of q into out [T, H, dv]; the output projection reads out as [T, H * dv]."""

    q: DeviceTensor
    kv: DeviceKvLayer
    q8: bool
    block_tables: Any
    seq_index: Any
    positions: Any
    window: int
    scale: float
    out: DeviceTensor
    split_keys: int  # split-K: a token with more keys is spread over several blocks (attention.py)
    softcap: float = 0.0  # attention logit soft-capping (Gemma 2); 0: none
    sinks: DeviceTensor | None = None  # [H] each head's extra softmax logit (gpt-oss); None: none

    def produces(self, x: DeviceTensor) -> bool:
        o = self.out
        return (
            isinstance(x, DeviceTensor)
            and (x.buf, x.offset, x.size) == (o.buf, o.offset, o.size)
            and x.is_contiguous()
            and o.is_contiguous()
        )

    def _sinks(self, scratch: Scratch, H: int) -> Any:
        """The kernel's sinks argument: the heads' [H] values, or a placeholder it does not read."""
        if self.sinks is None:
            return scratch.get("no_sinks", (1,), np.float32)
        return self.sinks.buf[self.sinks.offset : self.sinks.offset + H]

    def launch(self, scratch: Scratch, quant_for: DeviceWeight | None = None) -> tuple | None:
        T, H, dv = self.out.shape
        if T == 0:
            return None
        if quant_for is not None and (quant_for.dense is not None or dv % act_block(quant_for.act_mode)):
            quant_for = None  # a quantization block would span heads: the matmul quantizes for itself
        q = _quant_args(quant_for, scratch, T, H * dv)
        table_cols, bs = self.block_tables.shape[1], self.kv.k.shape[1]
        splits = attn.max_splits(table_cols, bs, int(self.window), self.split_keys)
        slots = T * H * splits if splits > 1 else 1  # one (m, l, acc[dv]) per (token, head, split)
        launch(
            attn.attention_paged_cuda,
            (T * H, splits),
            ROW_THREADS,
            *self.q.heads3d(),
            self.kv.k,
            self.kv.v,
            self.kv.k_scale,
            self.kv.v_scale,
            self.q8,
            self.block_tables,
            self.seq_index,
            self.positions,
            int(self.window),
            np.float32(self.scale),
            np.float32(self.softcap),
            self._sinks(scratch, H),
            self.sinks is not None,
            H,
            int(self.split_keys),
            scratch.at_least("attn_ml", 2 * slots, np.float64),
            scratch.at_least("attn_acc", slots * dv, np.float32),
            scratch.at_least("attn_done", T * H if splits > 1 else 1, np.int32, zeroed=True),
            *self.out.heads3d(),
            *q,
        )
        return q[3:] if q[0] else None


@dataclass
class HeadsOp:
    """The per-head steps between the QKV projection and attention: [rmsnorm_heads(q), rmsnorm_heads(k)],
    rope(q), rope(k), recorded in order until write_kv(k, v) completes them into one launch."""

    steps: list[tuple] = field(
        default_factory=list
    )  # ("norm", x, w, eps) | ("rope", x, pos, rope, inv_freq): RopeParams and its device inv_freq

    def accepts(self, step: tuple) -> bool:
        n = len(self.steps)
        if n == 0:
            return True
        first = self.steps[0]
        pattern = ("norm", "norm", "rope", "rope") if first[0] == "norm" else ("rope", "rope")
        if n >= len(pattern) or step[0] != pattern[n] or step[1].shape[0] != first[1].shape[0]:
            return False
        if pattern[n] == "norm":
            return step[3] == first[3]  # one eps for both heads
        if n == 2:
            return same_view(step[1], first[1])  # rope of Q, which was normalised first
        rope_q = self.steps[n - 1]
        same_rope = step[2] is rope_q[2] and step[3] is rope_q[3]  # positions, RopeParams
        return same_rope and (n == 1 or same_view(step[1], self.steps[1][1]))  # n == 3: K was normalised

    def completes(self, k: DeviceTensor) -> bool:
        n = len(self.steps)
        return n >= 2 and n == (4 if self.steps[0][0] == "norm" else 2) and same_view(self.steps[-1][1], k)

    def launch(self, scratch: Scratch) -> None:
        """The recorded steps with the plain kernels, in order."""
        for step in self.steps:
            x = step[1]
            T, H, d = x.shape
            if T == 0:
                continue
            if step[0] == "norm":
                launch(
                    ops.rmsnorm_heads_cuda,
                    T * H,
                    ROW_THREADS,
                    *x.heads3d(),
                    H,
                    step[2].buf,
                    float(step[3]),
                    d,
                )
                continue
            _, _, pos, rope, inv_freq = step
            grid, threads = elem_grid(T * H * (rope.n_rot // 2))
            launch(ops.rope_cuda, grid, threads, *x.heads3d(), T, H, pos, inv_freq, rope.mscale, rope.neox)

    def launch_with_kv(self, kv: DeviceKvLayer, q8: bool, v: DeviceTensor, slots: Any) -> None:
        """The recorded steps, and K and V stored at `slots`: one launch (completes() was checked)."""
        has_norm = self.steps[0][0] == "norm"
        q, k = self.steps[0][1], self.steps[1][1]
        qw, kw, eps = (self.steps[0][2], self.steps[1][2], self.steps[0][3]) if has_norm else (v, v, 0.0)
        _, _, pos, rope, inv_freq = self.steps[-1]
        T, n_kv, d = k.shape
        if T:
            launch(
                heads_rope_kv_cuda,
                T * (q.shape[1] + n_kv),
                ROW_THREADS,
                *q.heads3d(),
                q.shape[1],
                qw.buf,
                *k.heads3d(),
                kw.buf,
                has_norm,
                float(eps),
                *v.heads3d(),
                kv.k,
                kv.v,
                kv.k_scale,
                kv.v_scale,
                q8,
                slots,
                pos,
                n_kv,
                d,
                v.shape[2],
                inv_freq,
                rope.mscale,
                rope.neox,
            )
