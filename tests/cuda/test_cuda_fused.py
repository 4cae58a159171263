"""The CUDA backend's fused kernels: the same bits as the plain kernels, with fewer launches, through a
1-layer model's prefill and decode step and through a layer's chains issued as the model does.

Runs where test_cuda_backend.py's cases run: in its simulator subprocess (NUMBA_ENABLE_CUDASIM=1) or on a
GPU with EDGELLM_CUDA_TESTS=gpu. Shapes are tiny and the models have one layer: every forward pass in the
simulator costs seconds.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

if not (os.environ.get("NUMBA_ENABLE_CUDASIM") == "1" or os.environ.get("EDGELLM_CUDA_TESTS") == "gpu"):
    pytest.skip("run by tests/cuda/test_cuda_backend.py in a simulator subprocess", allow_module_level=True)

from edgellm.gguf.rope import RopeParams
from edgellm.testing.cuda.forward import forward_twice
from edgellm.testing.cuda.guards import BE
from edgellm.testing.synthetic.models import write_tiny_model

FUSION_CASES = {  # name: (arch, matrix type, head_dim, launches unfused, launches fused, KV cache type)
    # mixed types: Q/K/V parts quantized three ways (the norm's quantization serves the first), F16 down;
    # head_dim 8 < the 32-wide activation block: the attention output is quantized on its own
    "llama-mixed": (
        "llama",
        None,
        8,
        24,
        {
            "gather_rows_cuda": 1,
            "add_rmsnorm_quant_cuda": 3,
            "quantize_act_cuda": 3,
            "matmul_grouped_cuda": 6,
            "heads_rope_kv_cuda": 1,
            "attention_paged_cuda": 1,
            "gated_act_quant_cuda": 1,
            "matmul_dense_cuda": 1,
        },
        "f16",
    ),
    # Gemma 3: post-norms folded into the residual kernel, Q/K norms into the RoPE + KV kernel, the attention
    # output quantized by the attention kernel; with a q8_0 KV cache the same kernels quantize K and V
    **{
        f"gemma3-q4_1-kv{kv}": (
            "gemma3",
            "Q4_1",
            32,
            25,
            {
                "gather_rows_cuda": 1,
                "add_rmsnorm_quant_cuda": 3,
                "matmul_grouped_cuda": 5,
                "heads_rope_kv_cuda": 1,
                "attention_paged_cuda": 1,
                "gated_act_quant_cuda": 1,
            },
            kv,
        )
        for kv in ("f16", "q8_0")
    },
}


# The q8_0 case costs ~15 s more in the simulator (its kernels: test_cuda_kv_cache.py): on a GPU, or with
# EDGELLM_CUDA_SIM_FULL=1.
FULL = os.environ.get("EDGELLM_CUDA_TESTS") == "gpu" or os.environ.get("EDGELLM_CUDA_SIM_FULL") == "1"


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(c, marks=pytest.mark.skipif(not FULL and "q8_0" in c, reason="slow in the simulator"))
        for c in FUSION_CASES
    ],
)
def test_fused_kernels_give_the_unfused_bits(case: str, tmp_path: Path) -> None:
    arch, qtype, head_dim, plain_total, fused_launches, kv_dtype = FUSION_CASES[case]
    qtypes = {"*": qtype, "output": "Q8_0"} if qtype else None
    path = write_tiny_model(
        tmp_path / f"{case}.gguf", arch, qtypes, n_layers=1, n_embd=32, n_ff=64, head_dim=head_dim
    )
    plain_logits, plain_kv, plain, _ = forward_twice(path, fuse=False, kv_dtype=kv_dtype)
    fused_logits, fused_kv, fused, copies = forward_twice(path, fuse=True, kv_dtype=kv_dtype)
    for a, b in zip(fused_logits, plain_logits, strict=True):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(fused_kv, plain_kv, strict=True):
        np.testing.assert_array_equal(a, b)
    # a 1-layer decode step, logits to the host: the kernels launched, and how many without fusion
    assert fused == fused_launches and sum(plain.values()) == plain_total
    # the step's index arrays go up in one copy (step_inputs.py), the logits row comes back in one
    assert copies == (1, 1)


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K"])  # q8_K activations (256-wide), groups of 32 and 16
def test_fused_chains_with_k_quant_weights(qtype: str) -> None:
    """The chains of a layer, issued as the model does, on rows as wide as one q8_K block: fused and plain
    give the same bits everywhere (x, the post-normed y, h, the K/V cache, every matmul output)."""
    from gguf import GGMLQuantizationType

    from edgellm.backends.cuda.matmul import upload_weight
    from edgellm.quants.packing import pack_weight
    from edgellm.testing.kernel_refs import random_raw

    qt = GGMLQuantizationType[qtype]
    n, rng = 256, np.random.default_rng(9)
    w = upload_weight(pack_weight(qt, random_raw(qt, 4, n, rng), 4, n))
    host = {
        k: rng.standard_normal(s).astype(np.float32)
        for k, s in {
            "x": (2, n),
            "y": (2, n),
            "gu": (2, 2 * n),
            "qkv": (2, 3 * n),
            "wn": (n,),
            "wy": (n,),
        }.items()
    }
    pos, slots = BE.from_host(np.array([0, 1], np.int32)), BE.from_host(np.array([0, 1], np.int64))
    tables, seq = BE.from_host(np.zeros((1, 1), np.int32)), BE.from_host(np.zeros(2, np.int32))

    def chains(fuse: bool) -> tuple[list[np.ndarray], int]:
        BE.fuse = fuse
        BE.stats.reset()
        d = {k: BE.from_host(v) for k, v in host.items()}
        x, y, h, outs = d["x"], d["y"], BE.empty((2, n)), [BE.empty((2, 4)) for _ in range(3)]
        BE.rmsnorm(y, d["wy"], 1e-6, y)  # post-norm, residual add, next norm, matmul
        BE.add(x, y)
        BE.rmsnorm(x, d["wn"], 1e-5, h)
        BE.matmul(h, w, outs[0])
        act = BE.empty((2, n))
        BE.gated_act(d["gu"], act, "gelu")
        BE.matmul(act, w, outs[1])
        qkv = d["qkv"].reshape(2, 3, 1, n)
        q, k, v = (BE.contiguous(qkv[:, i]) for i in range(3))
        kv = BE.alloc_kv(1, 1, 4, 1, n, n)
        BE.rmsnorm_heads(q, d["wn"], 1e-6)
        BE.rmsnorm_heads(k, d["wn"], 1e-6)
        rope = RopeParams(n_rot=n, neox=True)
        BE.rope(q, pos, rope)
        BE.rope(k, pos, rope)
        BE.write_kv(kv, 0, k, v, slots)
        attn = BE.empty((2, 1, n))
        BE.attention(q, kv, 0, tables, seq, pos, 0, 0.0625, attn)
        BE.matmul(attn.reshape(2, n), w, outs[2])
        got = [BE.to_host(t) for t in (x, y, h, act, q, attn, *outs)]
        got += [BE.to_host(c) for c in kv.layers[0].blocks]
        return got, BE.stats.total_launches

    try:
        plain, n_plain = chains(False)
        fused, n_fused = chains(True)
    finally:
        BE.fuse = True
    for a, b in zip(fused, plain, strict=True):
        np.testing.assert_array_equal(a, b)
    assert (n_plain, n_fused) == (19, 10)  # 3 of them the contiguous copies of Q, K, V
