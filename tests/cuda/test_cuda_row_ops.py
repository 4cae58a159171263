"""CUDA row kernels (RMSNorm, per-head RMSNorm, RoPE plain / neox / scaled, SwiGLU, GeGLU, gpt-oss's
clamped SwiGLU, add, bias,
argmax, LayerNorm, GELU) against a float64 numpy reference, on views of a NaN-guarded fused-QKV-like buffer
whose guards must stay NaN (out-of-bounds writes).

Runs where test_cuda_backend.py's cases run: in its simulator subprocess (NUMBA_ENABLE_CUDASIM=1) or on a
GPU with EDGELLM_CUDA_TESTS=gpu.
"""

from __future__ import annotations

import os
import zlib

import numpy as np
import pytest

if not (os.environ.get("NUMBA_ENABLE_CUDASIM") == "1" or os.environ.get("EDGELLM_CUDA_TESTS") == "gpu"):
    pytest.skip("run by tests/cuda/test_cuda_backend.py in a simulator subprocess", allow_module_level=True)

from edgellm.backends.cpu import ops as cpu_ops
from edgellm.gguf.rope import RopeParams
from edgellm.testing.cuda.guards import BE, guarded, guards_intact
from edgellm.testing.kernel_refs import GELU_SPECIAL, gelu_ref, layernorm_ref, nmse
from edgellm.testing.rope_ref import rope_exact, scaled_rope

OPS = ["rmsnorm", "rmsnorm_heads", "rope_norm", "rope_neox", "rope_scaled", "swiglu", "geglu", "add"]
OPS.append("swiglu_oai")
OPS.append("add_bias")
OPS.append("argmax")
OPS += ["layernorm", "gelu"]  # StarCoder 2, GPT-2


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("shape", [(3, 2, 8), (1, 4, 16)], ids=lambda s: "x".join(map(str, s)))
def test_cuda_row_ops_match_reference(op: str, shape: tuple[int, int, int]) -> None:
    T_, H, d = shape
    rng = np.random.default_rng(zlib.crc32(f"{op}-{shape}".encode()))
    x = rng.standard_normal((T_, 3 * H * d)).astype(np.float32)  # a fused-QKV-like buffer
    w = (rng.standard_normal(H * d) * 0.5 + 1).astype(np.float32)
    whole, xv = guarded(x)
    ref = x.astype(np.float64).copy()
    n = H * d
    if op == "rmsnorm":  # into a column slice of another guarded buffer
        o_whole, out = guarded(np.full((T_, n), np.nan, np.float32))
        BE.rmsnorm(xv[:, :n], BE.from_host(w), 1e-5, out)
        r = ref[:, :n] / np.sqrt((ref[:, :n] ** 2).mean(1, keepdims=True) + 1e-5) * w
        assert guards_intact(o_whole, (T_, n))
        assert nmse(BE.to_host(out), r) < 1e-12
        return
    if op == "layernorm":  # into a column slice of another guarded buffer, and in place
        b = rng.standard_normal(n).astype(np.float32)
        o_whole, out = guarded(np.full((T_, n), np.nan, np.float32))
        BE.layernorm(xv[:, :n], BE.from_host(w), BE.from_host(b), 1e-5, out)
        BE.layernorm(xv[:, n : 2 * n], BE.from_host(w), BE.from_host(b), 1e-5, xv[:, n : 2 * n])
        assert guards_intact(o_whole, (T_, n)) and guards_intact(whole, x.shape)
        assert nmse(BE.to_host(out), layernorm_ref(x[:, :n], w, b, 1e-5)) < 1e-12
        assert nmse(BE.to_host(xv[:, n : 2 * n]), layernorm_ref(x[:, n : 2 * n], w, b, 1e-5)) < 1e-12
        return
    if op == "gelu":  # in place over the middle third: ggml's f16-table values, exactly
        mid = x[:, n : 2 * n] * 4
        mid.reshape(-1)[: len(GELU_SPECIAL)] = GELU_SPECIAL[: T_ * n]
        x[:, n : 2 * n] = mid
        whole, xv = guarded(x)
        BE.gelu(xv[:, n : 2 * n])
        ref[:, n : 2 * n] = gelu_ref(x[:, n : 2 * n])
        ref[:, :n], ref[:, 2 * n :] = x[:, :n], x[:, 2 * n :]
        assert guards_intact(whole, x.shape)
        np.testing.assert_array_equal(BE.to_host(xv), ref.astype(np.float32))
        return
    if op == "argmax":
        x[0, 7] = x[0, 3] = x[0].max() + 1  # a tie: the first index wins, as numpy
        np.testing.assert_array_equal(BE.argmax(BE.from_host(x)), x.argmax(axis=1))
        return
    k_view = xv[:, n : 2 * n].reshape(T_, H, d)  # the middle third, as the model slices K
    if op == "rmsnorm_heads":
        BE.rmsnorm_heads(k_view, BE.from_host(w[:d]), 1e-6)
        k = ref[:, n : 2 * n].reshape(T_, H, d)
        ref[:, n : 2 * n] = (k / np.sqrt((k**2).mean(-1, keepdims=True) + 1e-6) * w[:d]).reshape(T_, n)
    elif op.startswith("rope"):
        pos = np.array([0, 5, 17][:T_] if T_ == 3 else [1000], np.int32)
        rope = scaled_rope(d) if op == "rope_scaled" else RopeParams(n_rot=d, neox=op == "rope_neox")
        BE.rope(k_view, BE.from_host(pos), rope)
        k = x[:, n : 2 * n].reshape(T_, H, d)
        ref[:, n : 2 * n] = rope_exact(k, pos, rope).reshape(T_, n)
        # The CPU rope follows ggml-cpu's float32 cache (theta a running float32 product, which drifts
        # ~1e-4 rad from the exact angle by position 1,000); the CUDA kernel takes the exact angle, as
        # ggml-cuda nearly does (a powf per pair). Measured apart at position 1,000: NMSE 2.6e-12.
        cpu_k = k.copy()
        cpu_ops.rope_cpu(cpu_k, pos, rope)
        assert nmse(BE.to_host(k_view).reshape(T_, H, d), cpu_k) < 1e-10, op
    elif op in ("swiglu", "geglu", "swiglu_oai"):
        ff = n
        if op == "swiglu_oai":  # spread past gpt-oss's limits (7) so both clamps bind
            x[:, : 2 * ff] *= 6
            whole, xv = guarded(x)
            ref = x.astype(np.float64)
            assert (x[:, :ff] > 7).any() and (np.abs(x[:, ff : 2 * ff]) > 7).any()
        if op == "geglu":  # the table's edges in the gate: the +-10 cut-offs, f16 ties and overflow
            gate = x[:, :ff] * 4
            gate.reshape(-1)[: len(GELU_SPECIAL)] = GELU_SPECIAL[: T_ * ff]
            x[:, :ff] = gate
            whole, xv = guarded(x)
        o_whole, out = guarded(np.full((T_, ff), np.nan, np.float32))
        BE.gated_act(xv[:, : 2 * ff], out, {"geglu": "gelu", "swiglu": "silu"}.get(op, op))
        g, u = ref[:, :ff], ref[:, ff : 2 * ff]
        assert guards_intact(o_whole, (T_, ff))
        if op == "geglu":  # ggml_vec_geglu_f32: its f16 GELU table times up (0 at gate <= -10), exactly
            gate = x[:, :ff]
            with np.errstate(invalid="ignore"):
                want = np.where(gate <= -10, np.float32(0), gelu_ref(gate) * x[:, ff : 2 * ff])
            np.testing.assert_array_equal(BE.to_host(out), want.astype(np.float32))
        else:
            if op == "swiglu_oai":
                g, u = np.minimum(g, 7.0), np.clip(u, -7.0, 7.0) + 1
                act = g / (1 + np.exp(-1.702 * g))
            else:
                act = g / (1 + np.exp(-g))
            assert nmse(BE.to_host(out), act * u) < 1e-12
        with pytest.raises(ValueError, match="gated activation 'relu2' is not implemented on the CUDA"):
            BE.gated_act(xv[:, : 2 * ff], out, "relu2")
        return
    elif op == "add":
        y = rng.standard_normal((T_, n)).astype(np.float32)
        BE.add(xv[:, n : 2 * n], BE.from_host(y))
        ref[:, n : 2 * n] += y
    elif op == "add_bias":
        BE.add_bias(xv[:, n : 2 * n], BE.from_host(w))
        ref[:, n : 2 * n] += w
    assert guards_intact(whole, x.shape), f"{op} wrote outside its view"
    assert nmse(BE.to_host(xv), ref) < 1e-12, op
