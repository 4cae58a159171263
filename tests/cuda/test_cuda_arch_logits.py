"""Architectures through the CUDA backend's kernels and fused chains (Gemma 2, Granite, OLMo 2, StarCoder
2, GPT-2, Phi-3, SmolLM3, a mixture of experts, gpt-oss): the CPU backend's logits.

Runs where test_cuda_backend.py's cases run: in its simulator subprocess (NUMBA_ENABLE_CUDASIM=1) or on a
GPU with EDGELLM_CUDA_TESTS=gpu. The models have one layer (SmolLM3 four): every forward pass in the
simulator costs seconds.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

if not (os.environ.get("NUMBA_ENABLE_CUDASIM") == "1" or os.environ.get("EDGELLM_CUDA_TESTS") == "gpu"):
    pytest.skip("run by tests/cuda/test_cuda_backend.py in a simulator subprocess", allow_module_level=True)

from edgellm.testing.cuda.forward import forward_twice
from edgellm.testing.kernel_refs import nmse
from edgellm.testing.synthetic.models import write_tiny_model

FULL = os.environ.get("EDGELLM_CUDA_TESTS") == "gpu" or os.environ.get("EDGELLM_CUDA_SIM_FULL") == "1"
# Each ~12 s in the simulator: one case per architecture and path runs by default, the rest on a GPU or
# with EDGELLM_CUDA_SIM_FULL=1.
DEFAULT_ARCH_CASES = {("gemma2", "f16", False), ("gemma2", "q8_0", True), ("granite", "f16", True),
                      ("olmo2", "f16", False), ("starcoder2", "f16", True),
                      ("gpt2", "f16", True)}  # fmt: skip


@pytest.mark.parametrize(
    "arch, kv_dtype, fuse",
    [
        pytest.param(
            arch, kv, fuse, id=f"{'fused' if fuse else 'plain'}-{arch}-{kv}",
            marks=pytest.mark.skipif(
                not FULL and (arch, kv, fuse) not in DEFAULT_ARCH_CASES, reason="slow in the simulator"
            ),
        )
        for arch, kv in [("gemma2", "f16"), ("gemma2", "q8_0"), ("granite", "f16"), ("olmo2", "f16"),
                         ("starcoder2", "f16"), ("gpt2", "f16")]
        for fuse in (False, True)
    ],
)  # fmt: skip
def test_gemma2_granite_olmo2_logits_match_the_cpu(
    arch: str, kv_dtype: str, fuse: bool, tmp_path: Path
) -> None:
    """Gemma 2's attention soft-capping (caps small enough to bind), Granite's multipliers (Backend.scale)
    and OLMo 2's norm placement through the CUDA backend's kernels and its fused chains (which must not
    drop the cap, the extra scale or the missing pre-norms), StarCoder 2's and GPT-2's LayerNorm, GELU MLP
    and (GPT-2) learned positions: the CPU backend's logits."""
    from edgellm.arch import ARCHITECTURES
    from edgellm.backends.cpu.backend import CpuBackend
    from edgellm.engine.model_runner import ModelRunner, RunItem
    from edgellm.gguf.config import config_from_gguf
    from edgellm.gguf.load import load_gguf
    from edgellm.testing.oracle.cases import GEMMA2_CAPS

    caps = GEMMA2_CAPS if arch == "gemma2" else {}
    path = write_tiny_model(
        tmp_path / f"{arch}.gguf",
        arch,
        "F32",
        n_layers=1,
        n_embd=32,
        n_ff=64,
        head_dim=32 if kv_dtype == "q8_0" else 8,  # q8_0 blocks of 32 along the head
        metadata_overrides=caps,
    )
    cuda_logits, *_ = forward_twice(path, fuse=fuse, kv_dtype=kv_dtype)
    g = load_gguf(path)
    cfg = config_from_gguf(g)
    be = CpuBackend()
    runner = ModelRunner(
        ARCHITECTURES[arch](cfg, g, be), cfg, be, num_blocks=4, block_size=4, kv_dtype=kv_dtype
    )
    cpu_logits = runner.run([RunItem([2, 3], [1, 17, 42], 0)]) + runner.run([RunItem([2, 3], [5], 3)])
    for got, want in zip(cuda_logits, cpu_logits, strict=True):
        assert nmse(got, want) < 1e-6


@pytest.mark.parametrize("arch", ["phi3", "smollm3"])
def test_phi3_smollm3_logits_match_the_cpu(arch: str, tmp_path: Path) -> None:
    """Phi-3's fused Q|K|V and gate|up with LongRoPE's factors and attention factor, SmolLM3's layer without
    rope (4 layers: the fused chain of the last has no rope step), through the CUDA backend's fused chains:
    the CPU backend's logits."""
    from edgellm.arch import ARCHITECTURES
    from edgellm.backends.cpu.backend import CpuBackend
    from edgellm.engine.model_runner import ModelRunner, RunItem
    from edgellm.gguf.config import config_from_gguf
    from edgellm.gguf.load import load_gguf

    n_rot = 8
    phi3 = {
        "metadata_overrides": {"phi3.rope.scaling.attn_factor": 1.19},
        "extra_tensors": {f"rope_factors_{s}.weight": np.geomspace(1.0, f, n_rot // 2).astype(np.float32)
                          for s, f in (("short", 2.0), ("long", 40.0))},
    }  # fmt: skip
    path = write_tiny_model(
        tmp_path / f"{arch}.gguf",
        arch,
        "F32",
        n_layers=4 if arch == "smollm3" else 1,
        n_embd=32,
        n_ff=64,
        head_dim=8,
        **(phi3 if arch == "phi3" else {}),
    )
    cuda_logits, *_ = forward_twice(path, fuse=True)
    g = load_gguf(path)
    cfg = config_from_gguf(g)
    assert cfg.rope.freq_factors and cfg.rope.attn_factor != 1.0 if arch == "phi3" else cfg.no_rope_layers[3]
    be = CpuBackend()
    runner = ModelRunner(ARCHITECTURES[arch](cfg, g, be), cfg, be, num_blocks=4, block_size=4)
    cpu_logits = runner.run([RunItem([2, 3], [1, 17, 42], 0)]) + runner.run([RunItem([2, 3], [5], 3)])
    for got, want in zip(cuda_logits, cpu_logits, strict=True):
        assert nmse(got, want) < 1e-6


def test_moe_logits_match_the_cpu(tmp_path: Path) -> None:
    """A mixture of experts (qwen3moe: 4 experts, top 2) through the CUDA backend's ops: the same
    expert-grouped matmuls, router and weighted sum (arch/moe.py) give the CPU backend's logits, in a
    3-token prefill (tokens sharing experts) and a decode step."""
    from edgellm.arch import ARCHITECTURES
    from edgellm.backends.cpu.backend import CpuBackend
    from edgellm.engine.model_runner import ModelRunner, RunItem
    from edgellm.gguf.config import config_from_gguf
    from edgellm.gguf.load import load_gguf

    path = write_tiny_model(
        tmp_path / "moe.gguf", "qwen3moe", "Q8_0", n_layers=1, n_embd=32, n_ff=64, head_dim=8,
        n_expert=4, n_expert_used=2, n_ff_exp=32,
    )  # fmt: skip
    cuda_logits, _, launches, _ = forward_twice(path, fuse=True)
    assert launches["moe_combine_cuda"] == 1  # the weighted sum on the device (one layer)
    g = load_gguf(path)
    cfg = config_from_gguf(g)
    be = CpuBackend()
    runner = ModelRunner(ARCHITECTURES[cfg.arch](cfg, g, be), cfg, be, num_blocks=4, block_size=4)
    cpu_logits = runner.run([RunItem([2, 3], [1, 17, 42], 0)]) + runner.run([RunItem([2, 3], [5], 3)])
    for got, want in zip(cuda_logits, cpu_logits, strict=True):
        assert nmse(got, want) < 1e-6


@pytest.mark.parametrize(
    "fuse", [True, pytest.param(False, marks=pytest.mark.skipif(not FULL, reason="slow in the simulator"))]
)
def test_gpt_oss_logits_match_the_cpu(fuse: bool, tmp_path: Path) -> None:
    """gpt-oss through the CUDA backend: attention sinks in the paged attention kernel, YaRN, the
    clamped SwiGLU (weights spread so its limits bind) in the gated kernels, biased MXFP4 experts with the
    softmax-over-the-chosen router: the CPU backend's logits, in a prefill and a decode step. (Measured on
    this file: the CUDA logits without the sinks are at NMSE 0.059 and 0.33 from the CPU's, with SiLU in
    place of swiglu_oai at 0.10 and 0.26.)"""
    from edgellm.arch import ARCHITECTURES
    from edgellm.backends.cpu.backend import CpuBackend
    from edgellm.engine.model_runner import ModelRunner, RunItem
    from edgellm.gguf.config import config_from_gguf
    from edgellm.gguf.load import load_gguf
    from edgellm.testing.oracle.families import GPT_OSS_QTYPES, GPT_OSS_YARN

    path = write_tiny_model(
        tmp_path / "oss.gguf", "gpt-oss", GPT_OSS_QTYPES, n_layers=1, n_embd=32, n_ff=64, head_dim=8,
        n_expert=4, n_expert_used=2, n_ff_exp=32, sliding_window=128, rope_base=150000.0,
        weight_scale={"ffn_gate_exps": 4.0, "ffn_up_exps": 4.0}, metadata_overrides=GPT_OSS_YARN,
    )  # fmt: skip
    cuda_logits, _, launches, _ = forward_twice(path, fuse=fuse)
    assert launches["attention_paged_cuda"] == 1 and launches["moe_combine_cuda"] == 1
    g = load_gguf(path)
    cfg = config_from_gguf(g)
    assert cfg.attn_sinks and cfg.activation == "swiglu_oai" and cfg.rope.ext_factor == 1.0  # YaRN
    be = CpuBackend()
    runner = ModelRunner(ARCHITECTURES[cfg.arch](cfg, g, be), cfg, be, num_blocks=4, block_size=4)
    cpu_logits = runner.run([RunItem([2, 3], [1, 17, 42], 0)]) + runner.run([RunItem([2, 3], [5], 3)])
    for got, want in zip(cuda_logits, cpu_logits, strict=True):
        assert nmse(got, want) < 1e-6
