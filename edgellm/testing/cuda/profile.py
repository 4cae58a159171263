"""Batch-1 greedy decode on the CUDA backend with its launch counters and timers read per step: the
measurement of scripts/profile/cuda_profile.py and of the profile step of scripts/gpu/gpu_check.py."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from edgellm.arch import ARCHITECTURES
from edgellm.backends.cuda import get_cuda_backend
from edgellm.backends.cuda.config import STATS
from edgellm.engine.model_runner import ModelRunner, RunItem
from edgellm.gguf.config import config_from_gguf
from edgellm.gguf.load import load_gguf

BLOCK = 16


class Decoder:
    """One model on the CUDA backend decoding one sequence greedily, the argmax on the device."""

    def __init__(self, path: Path, prompt: int, steps: int) -> None:
        g = load_gguf(path)
        self.cfg = cfg = config_from_gguf(g)
        self.be = get_cuda_backend()
        self.model = ARCHITECTURES[cfg.arch](cfg, g, self.be)
        n_blocks = -(-(prompt + 4 * steps + 8) // BLOCK)
        self.runner = ModelRunner(self.model, cfg, self.be, n_blocks, BLOCK)
        self.table = list(range(n_blocks))
        self.prompt = [int(t) for t in np.random.default_rng(0).integers(0, cfg.n_vocab, prompt)]
        self.pos, self.tok = 0, 0

    def step(self, tokens: list[int]) -> None:
        [ids] = self.runner.run_argmax([RunItem(self.table, tokens, self.pos)])
        self.pos += len(tokens)
        self.tok = int(ids[-1])

    def restart(self) -> None:
        self.pos = 0
        self.step(self.prompt)

    def decode(self, n: int) -> float:
        """Seconds per decode step over n steps (each ends with the id's copy to the host: synchronous)."""
        t0 = time.perf_counter()
        for _ in range(n):
            self.step([self.tok])
        return (time.perf_counter() - t0) / max(n, 1)


def profile(dec: Decoder, fuse: bool, steps: int, warmup: int = 2) -> dict:
    """Per decode step, fused or not: launches (in all, by kernel, outside the layers, per layer), host
    copies (count, bytes), wall ms, and each kernel's microseconds synchronized ("sync") and by CUDA events
    ("events"; none in the simulator)."""
    dec.be.fuse = fuse
    dec.restart()
    dec.decode(warmup)  # compiles every kernel on first use
    STATS.timing = None
    STATS.reset()
    wall = dec.decode(steps)
    r = {
        "launches": STATS.total_launches / steps,
        "by_kernel": {k: v / steps for k, v in sorted(STATS.launches.items())},
        "to_host": (STATS.to_host_copies / steps, STATS.to_host_bytes / steps),
        "from_host": (STATS.from_host_copies / steps, STATS.from_host_bytes / steps),
        "wall_ms": wall * 1e3,
    }
    layers, dec.model.layers = dec.model.layers, []  # what a step launches outside the layers
    STATS.reset()
    dec.step([dec.tok])
    dec.pos -= 1
    dec.model.layers = layers
    r["outside"] = STATS.total_launches
    r["per_layer"] = (r["launches"] - r["outside"]) / dec.cfg.n_layers
    for mode, key in (("sync", "seconds"), ("events", "gpu_seconds")):
        STATS.timing = mode
        STATS.reset()
        for _ in range(steps):
            dec.step([dec.tok])
            STATS.collect_events()
        r[mode] = {k: v / steps * 1e6 for k, v in getattr(STATS, key).items()}  # us per token
    STATS.timing = None
    return r
