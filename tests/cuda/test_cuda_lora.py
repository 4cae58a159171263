"""LoRA adapters on the CUDA backend (edgellm/lora/apply.py's device path): a batch mixing a sequence with an
adapter and one without gives the CPU backend's logits, fused chains on and off.

Runs where test_cuda_backend.py's cases run: in its simulator subprocess (NUMBA_ENABLE_CUDASIM=1) or on a
GPU with EDGELLM_CUDA_TESTS=gpu. One layer: every forward pass in the simulator costs seconds.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

if not (os.environ.get("NUMBA_ENABLE_CUDASIM") == "1" or os.environ.get("EDGELLM_CUDA_TESTS") == "gpu"):
    pytest.skip("run by tests/cuda/test_cuda_backend.py in a simulator subprocess", allow_module_level=True)

from edgellm.testing.kernel_refs import nmse
from edgellm.testing.synthetic.lora import write_tiny_lora
from edgellm.testing.synthetic.models import write_tiny_model


def _logits(be, base, adapter) -> list[np.ndarray]:  # noqa: ANN001
    from edgellm.arch import ARCHITECTURES
    from edgellm.engine.model_runner import ModelRunner, RunItem
    from edgellm.gguf.config import config_from_gguf
    from edgellm.gguf.load import load_gguf
    from edgellm.lora.adapter import load_adapter

    g = load_gguf(base)
    cfg = config_from_gguf(g)
    model = ARCHITECTURES[cfg.arch](cfg, g, be)
    runner = ModelRunner(model, cfg, be, num_blocks=4, block_size=4)
    runner.lora_adapters = [load_adapter(adapter, g, cfg, model)]
    # the same tokens with the adapter and without, in one batch
    items = [RunItem([0], [1, 17, 42], 0, lora=((0, 1.0),)), RunItem([1], [1, 17, 42], 0)]
    return runner.run(items) + runner.run([RunItem([0], [7], 3, lora=((0, 0.5),)), RunItem([1], [7], 3)])


@pytest.mark.parametrize("fuse", [False, True], ids=["plain", "fused"])
def test_lora_batch_gives_the_cpu_logits(tmp_path, fuse: bool) -> None:  # noqa: ANN001
    from edgellm.backends.cpu.backend import CpuBackend
    from edgellm.backends.cuda import get_cuda_backend

    base = write_tiny_model(tmp_path / "base.gguf", "llama", "F16", n_layers=1)
    adapter = write_tiny_lora(
        tmp_path / "a.gguf", base, rank=4, roles=("attn_q", "attn_v", "attn_output", "ffn_up", "ffn_down")
    )
    cpu = _logits(CpuBackend(), base, adapter)
    be = get_cuda_backend()
    be.fuse = fuse
    got = _logits(be, base, adapter)
    for i, (c, g) in enumerate(zip(cpu, got, strict=True)):
        assert nmse(be.to_host(g) if not isinstance(g, np.ndarray) else g, c) < 1e-4, i
    # the adapter matters: its rows differ from what the same tokens give without it
    assert np.abs(cpu[0] - cpu[1]).max() > 0.1 and np.abs(cpu[2] - cpu[3]).max() > 0.05
