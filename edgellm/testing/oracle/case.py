"""An oracle case (testing/oracle/cases.py holds the table of them): how to write its tiny random-weight GGUF,
which tokens to score, edgellm's logits for it, and how they are compared with llama.cpp's (the
tolerances)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType

from edgellm.testing.synthetic.models import write_tiny_model

T = GGMLQuantizationType
FLOAT_TYPES = frozenset({T.F32, T.F16, T.BF16})
NMSE_FLOAT = 1e-4
NMSE_QUANT = 1e-3
TOP1_MIN_GAP = 0.05
N_FIXTURE_POSITIONS = 24

# Shape of the default case: 2 layers, 64 wide (a few hundred KiB; llama.cpp and edgellm score 1,100
# tokens in about a second). k-quant matrices need 256-value rows: every matrix's row width
# (n_embd, n_heads * head_dim, n_ff) a multiple of 256.
SMALL: dict[str, int] = dict(n_layers=2, n_embd=64, n_heads=4, n_kv_heads=2, head_dim=16, n_ff=128)
WIDE: dict[str, int] = dict(n_layers=2, n_embd=256, n_heads=4, n_kv_heads=2, head_dim=64, n_ff=256)
# Gemma 3's pattern (five sliding-window layers, then a global one) needs 7 layers to hold both kinds twice
# over the first block; the window is far shorter than the sequence so that it matters.
GEMMA3: dict[str, int] = dict(SMALL, n_layers=7)
# Gemma 2 alternates local and global layers: 3 layers hold both kinds and a second local one.
GEMMA2: dict[str, int] = dict(SMALL, n_layers=3)
# OLMo 3's pattern (three local layers, then a global one) over 5 layers: both kinds, and local after global
OLMO3: dict[str, int] = dict(SMALL, n_layers=5)
GPT2: dict[str, int] = dict(SMALL, n_kv_heads=4)  # GPT-2 has as many K/V heads as Q heads


@dataclass(frozen=True)
class OracleCase:
    arch: str
    qtypes: Mapping[str, Any] | str = "F32"  # write_tiny_model's qtypes
    model: Mapping[str, int] = field(default_factory=lambda: SMALL)  # write_tiny_model's shape arguments
    metadata: Mapping[str, Any] = field(default_factory=dict)  # metadata_overrides (Typed for new keys)
    extra_tensors: Mapping[str, Any] = field(default_factory=dict)  # name -> shape (random) or array
    writer: Mapping[str, Any] = field(default_factory=dict)  # any other write_tiny_model keyword
    n_ctx: int = 1200
    n_tokens: int = 1100
    seed: int = 0
    note: str = ""  # what the case covers, for the report

    def write(self, path: str | Path) -> Path:
        return write_tiny_model(
            path,
            self.arch,
            self.qtypes,
            seed=self.seed,
            context_length=max(self.n_ctx, 2048),
            metadata_overrides=dict(self.metadata),
            extra_tensors=dict(self.extra_tensors),
            **self.model,
            **self.writer,
        )

    @property
    def quantized(self) -> bool:
        """Whether any matrix of the file is block-quantized (the looser NMSE bound applies)."""
        types = [self.qtypes] if isinstance(self.qtypes, str) else list(self.qtypes.values())
        return any(T[t.upper()] not in FLOAT_TYPES if isinstance(t, str) else T(t) not in FLOAT_TYPES
                   for t in types)  # fmt: skip

    @property
    def nmse_limit(self) -> float:
        return NMSE_QUANT if self.quantized else NMSE_FLOAT

    def tokens(self, n_vocab: int) -> np.ndarray:
        """[n_tokens] int32: the scored sequence, random ids over the whole vocabulary (seeded)."""
        rng = np.random.default_rng(10_000 + self.seed)
        return rng.integers(0, n_vocab, self.n_tokens).astype(np.int32)

    def fixture_positions(self) -> np.ndarray:
        """[N_FIXTURE_POSITIONS] int32, ascending: the first 4 tokens, 8 spread over the sequence, and 12
        over its last 100 positions (past 1,000 for the default length), the last 4 included."""
        n = self.n_tokens
        tail = min(100, n // 2)
        spread = np.linspace(4, n - tail - 1, 8)
        last = np.concatenate([np.linspace(n - tail, n - 5, 8), np.arange(n - 4, n)])
        pos = np.unique(np.concatenate([np.arange(4), spread, last]).round().astype(np.int64))
        return pos.astype(np.int32)


def score_edgellm(
    path: str | Path,
    tokens: np.ndarray,
    positions: np.ndarray,
    n_ctx: int,
    chunk: int = 512,
    edit: Callable[[Any], None] | None = None,
    adapters: tuple[str | Path, ...] = (),
    lora: dict[int, float] | None = None,
) -> np.ndarray:
    """edgellm's logits [len(positions), n_vocab] float32 for the teacher-forced `tokens`, on the CPU
    backend, in process: the file goes through the same checks as LLM() (config, then validate_model), the
    context window is llama.cpp's n_ctx (LongRoPE chooses its factors by it), and the tokens go through the
    engine core as LLM.score sends them: a scoring request that the scheduler computes in prefill chunks of
    `chunk` tokens. edit(model): changes the loaded model before it runs (the tests that take a feature out,
    to show that the match depends on it). adapters: LoRA files loaded at scale 1 (edgellm/lora/); lora:
    the request's choice of them (SamplingParams.lora; None: all of them)."""
    from edgellm.arch import ARCHITECTURES
    from edgellm.backends.cpu.backend import CpuBackend
    from edgellm.engine.engine_core import EngineCore
    from edgellm.engine.model_runner import ModelRunner
    from edgellm.engine.scheduler import SchedulerConfig
    from edgellm.gguf.config import config_from_gguf
    from edgellm.gguf.load import load_gguf
    from edgellm.gguf.validation import validate_model

    g = load_gguf(str(path))
    cfg = config_from_gguf(g)
    validate_model(g, cfg)
    cfg.set_context(n_ctx)
    be = CpuBackend()
    block_size = 16
    n_blocks = -(-len(tokens) // block_size)
    model = ARCHITECTURES[cfg.arch](cfg, g, be)
    if edit is not None:
        edit(model)
    runner = ModelRunner(model, cfg, be, n_blocks, block_size)
    sched = SchedulerConfig(1, chunk, block_size, n_blocks, enable_prefix_caching=False)
    engine = EngineCore(runner, frozenset(), max(n_ctx, len(tokens)), sched)
    if adapters:
        from edgellm.lora.adapter import load_adapter

        engine.set_lora_adapters([load_adapter(p, g, cfg, model) for p in adapters], [1.0] * len(adapters))
    rid, logits = engine.add_score_request([int(t) for t in tokens], lora=lora), None
    while engine.has_unfinished():
        logits = next((out.logits for out in engine.step() if out.request_id == rid), logits)
    assert logits is not None
    return logits[positions].astype(np.float32)


def nmse(x: np.ndarray, ref: np.ndarray) -> float:
    """sum((x - ref)^2) / sum(ref^2), in float64."""
    x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    return float(((x - ref) ** 2).sum() / (ref**2).sum())


def top1_agreement(x: np.ndarray, ref: np.ndarray, min_gap: float = TOP1_MIN_GAP) -> tuple[int, int]:
    """(agreeing rows, rows where ref's top-1/top-2 gap exceeds min_gap): x, ref [P, n_vocab]."""
    top2 = np.sort(ref, axis=-1)[:, -2:]
    decided = (top2[:, 1] - top2[:, 0]) > min_gap
    agree = x.argmax(-1) == ref.argmax(-1)
    return int((agree & decided).sum()), int(decided.sum())

