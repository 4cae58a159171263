"""One model runner over a tiny synthetic model and the logits of a fixed schedule of prefills and decodes,
shared by the fused-layer tests and the architectures whose layers they compare fused and unfused."""

from __future__ import annotations

import numpy as np

from edgellm.arch import ARCHITECTURES
from edgellm.backends.cpu.backend import CpuBackend
from edgellm.engine.model_runner import ModelRunner, RunItem
from edgellm.gguf.config import config_from_gguf
from edgellm.gguf.load import load_gguf
from edgellm.testing.synthetic.models import DEFAULT_QTYPES

BS = 16


# Q|K|V of three types (three stacked parts), and every matrix tiled
QTYPES = {**DEFAULT_QTYPES, "ffn_down": "Q8_0"}


def load_runner(path, fuse: bool, kv_dtype: str = "f16", tier: str | None = None):  # noqa: ANN001, ANN202
    gguf = load_gguf(str(path))
    cfg = config_from_gguf(gguf)
    be = CpuBackend(tier)
    be.fuse_layers = fuse
    model = ARCHITECTURES[cfg.arch](cfg, gguf, be)
    return model, ModelRunner(model, cfg, be, num_blocks=12, block_size=BS, kv_dtype=kv_dtype)


def run_logits(runner: ModelRunner, rng: np.random.Generator) -> list[np.ndarray]:
    """Prefill two sequences (all logits), three decode steps of both, then one of the first alone."""
    v = runner.cfg.n_vocab
    a, b = rng.integers(0, v, 21).tolist(), rng.integers(0, v, 9).tolist()
    tables = [[0, 1, 2], [3, 4]]
    # sequence ids 0 and 1: LFM2's conv state is kept per sequence (the others ignore them)
    out = runner.run([RunItem(tables[0], a, 0, all_logits=True, seq_id=0),
                      RunItem(tables[1], b, 0, all_logits=True, seq_id=1)])  # fmt: skip
    for step in range(3):
        t = rng.integers(0, v, 2).tolist()
        out += runner.run([RunItem(tables[0], [t[0]], 21 + step, seq_id=0),
                           RunItem(tables[1], [t[1]], 9 + step, seq_id=1)])  # fmt: skip
    out += runner.run([RunItem(tables[0], [int(rng.integers(0, v))], 24, seq_id=0)])
    return out
