"""What the engine core process is built from (CoreSpec: plain values, it crosses to the new process), and
the KV budget rule. Imports nothing of the core: the front-end fills it in without loading the model."""

from __future__ import annotations

import os
from dataclasses import dataclass

from edgellm.engine.spec.config import SpeculativeConfig

DEFAULT_CTX = 4096
DEFAULT_KV_MEMORY = 512 * 2**20  # bytes of KV cache when not given (at least one full context is kept)


@dataclass
class CoreSpec:
    """What the core process needs to build the engine (plain values: it crosses to the new process)."""

    path: str
    backend: str = "cpu"
    n_ctx: int | None = None
    threads: int | None = None
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 512
    block_size: int = 16
    kv_cache_memory: int | float | None = None
    kv_cache_dtype: str = "f16"  # a row of quants/kv_cache.py's table: "f16" or "q8_0"
    enable_prefix_caching: bool = True
    log_path: str | None = None  # where the core process's stdout/stderr go (None: inherited)
    speculative: SpeculativeConfig | None = None  # speculative decoding (None: off)
    # Seconds between output messages while requests are under way (0: one per step). A request's first
    # and last outputs are never held back; only the tokens in between are sent in batches.
    stream_interval: float = 0.0


def kv_budget_bytes(kv_cache_memory: int | float | None) -> int:
    """KV cache budget: bytes (an int), or a fraction of physical RAM (a float in (0, 1))."""
    if kv_cache_memory is None:
        return DEFAULT_KV_MEMORY
    if isinstance(kv_cache_memory, float) and 0 < kv_cache_memory < 1:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") * kv_cache_memory)
    if kv_cache_memory < 0:
        raise ValueError(f"kv_cache_memory must be bytes >= 0 or a fraction in (0, 1), got {kv_cache_memory}")
    return int(kv_cache_memory)
