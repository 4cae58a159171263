"""A model's prefill and one decode step on the CUDA backend, fused or not, for the CUDA fused-kernel and
architecture tests (tests/cuda/test_cuda_fused.py, tests/cuda/test_cuda_arch_logits.py). The backend is
made on the first call (a GPU, or the simulator when NUMBA_ENABLE_CUDASIM=1 was set before numba was first
imported)."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def forward_twice(
    path: Path, fuse: bool, kv_dtype: str = "f16"
) -> tuple[list[np.ndarray], list[np.ndarray], dict[str, int], tuple]:
    """Prefill 3 tokens then decode 1 on a fresh CUDA model: (host logits, KV caches, decode launches,
    decode copies (to the device, to the host))."""
    from edgellm.arch import ARCHITECTURES
    from edgellm.backends.cuda import get_cuda_backend
    from edgellm.engine.model_runner import ModelRunner, RunItem
    from edgellm.gguf.config import config_from_gguf
    from edgellm.gguf.load import load_gguf

    g = load_gguf(path)
    cfg = config_from_gguf(g)
    be = get_cuda_backend()
    be.fuse = fuse
    model = ARCHITECTURES[cfg.arch](cfg, g, be)
    runner = ModelRunner(model, cfg, be, num_blocks=4, block_size=4, kv_dtype=kv_dtype)
    logits = runner.run([RunItem([2, 3], [1, 17, 42], 0)])
    be.stats.reset()
    logits += runner.run([RunItem([2, 3], [5], 3)])
    launches = dict(be.stats.launches)
    copies = (be.stats.from_host_copies, be.stats.to_host_copies)
    return logits, [be.to_host(c) for lay in runner.kv.layers for c in lay.blocks], launches, copies
