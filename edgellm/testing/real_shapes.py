"""Synthetic models with the real models' shapes and tensor types (random weights), for machines the real
files cannot be carried to (scripts/gpu/gpu_check.sh writes them on the GPU machine): the same matrices,
vocabulary and LM head, so the kernels launch as often and read as many bytes per token.

SHAPES holds the real shapes; SIM_SHAPES the same architectures and types at sizes the CUDA simulator
runs in seconds (every k-quant matrix still has 256-wide rows).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgellm.testing.synthetic.models import write_tiny_model

SMOLLM2_Q4_1 = {"*": "Q4_1", "token_embd": "Q8_0"}
GEMMA3_Q4_K_M = {  # the Q5_0 / Q8_0 / Q6_K / Q4_K mix of gemma-3-270m Q4_K_M
    "*": "Q5_0",
    "attn_v": "Q8_0",
    "attn_output": "Q4_K",
    "ffn_down": "Q6_K",
    "token_embd": "Q8_0",
}

SHAPES: dict[str, dict[str, Any]] = {
    "smollm2": dict(arch="llama", qtypes=SMOLLM2_Q4_1, n_layers=30, n_embd=576, n_heads=9, n_kv_heads=3,
                    head_dim=64, n_ff=1536, n_vocab=49152),
    "gemma3": dict(arch="gemma3", qtypes=GEMMA3_Q4_K_M, n_layers=18, n_embd=640, n_heads=4, n_kv_heads=1,
                   head_dim=256, n_ff=2048, n_vocab=262144, sliding_window=512),
}  # fmt: skip
SIM_SHAPES: dict[str, dict[str, Any]] = {  # the tokenizer's own ~300 tokens: the LM head dominates here
    "smollm2": dict(SHAPES["smollm2"], n_layers=1, n_embd=32, n_heads=2, n_kv_heads=1, head_dim=16, n_ff=64,
                    n_vocab=None),
    "gemma3": dict(SHAPES["gemma3"], n_layers=1, n_embd=32, n_heads=2, n_kv_heads=1, head_dim=128, n_ff=256,
                   n_vocab=None, sliding_window=4),
}  # fmt: skip


def write_real_shape_model(name: str, path: str | Path, sim: bool = False, seed: int = 0) -> Path:
    """Write the `name` model of SHAPES (SIM_SHAPES with sim) to path: tied embeddings, as both real models;
    Q4_K / Q6_K quantized from normal weights by the reference quantizers."""
    spec = dict((SIM_SHAPES if sim else SHAPES)[name])
    arch, qtypes = spec.pop("arch"), spec.pop("qtypes")
    return write_tiny_model(path, arch, qtypes, tied=True, quantize_kquants=True, seed=seed, **spec)
