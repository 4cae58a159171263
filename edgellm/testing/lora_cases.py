"""The LoRA oracle cases: tiny random-weight bases with random adapters, scored with each adapter, with
both and with none, by llama.cpp (scripts/fixtures/make_lora_fixtures.py writes its logits to
tests/fixtures/lora/<case>.npz) and by edgellm (tests/lora/).

"llama": two adapters that between them cover every tensor type adapter.py reads: A is F16 (lora_a) / F32
(lora_b), rank 4, on every attention and FFN matrix; B is Q8_0 / BF16, rank 8 (Q8_0 rows need n_in a
multiple of 32), on Q, V, the output projection, gate and down. "phi3": the fused attn_qkv and gate|up
ffn_up tensors and the vocabulary projection (output.weight). "qwen2": Q/K/V with their biases (the update
goes before the bias, as llama.cpp's build_lora_mm). "gemma2", "gemma2_q8_0", "starcoder2", "qwen3moe":
adapter A alone on other architectures' blocks (see CASES).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgellm.testing.oracle.case import OracleCase
from edgellm.testing.oracle.cases import CASES as ORACLE_CASES
from edgellm.testing.synthetic.lora import write_tiny_lora

# configuration -> the scale of each adapter (in the case's adapter order); 0: not applied
TWO_ADAPTERS: dict[str, tuple[float, ...]] = {
    "none": (0.0, 0.0),
    "A": (1.0, 0.0),
    "B": (0.0, 0.5),
    "AB": (1.0, 0.5),
}
ONE_ADAPTER: dict[str, tuple[float, ...]] = {"none": (0.0,), "A": (1.0,), "A_neg": (-0.75,)}
ONE_A: dict[str, tuple[float, ...]] = {"none": (0.0,), "A": (1.0,)}
NMSE_LIMIT = 1e-4  # the float bound; a quantized base: its case's bound (OracleCase.nmse_limit)


@dataclass(frozen=True)
class LoraCase:
    base: OracleCase
    adapters: dict[str, dict[str, Any]]  # name -> write_tiny_lora's keywords
    configs: dict[str, tuple[float, ...]] = field(default_factory=lambda: dict(TWO_ADAPTERS))

    def write(self, directory: str | Path) -> tuple[Path, list[Path]]:
        """(the base GGUF, [each adapter]) written into `directory`."""
        d = Path(directory)
        base = self.base.write(d / "lora_base.gguf")
        return base, [write_tiny_lora(d / f"lora_{k}.gguf", base, **kw) for k, kw in self.adapters.items()]

    def choice(self, config: str) -> dict[int, float]:
        """A configuration as a request's choice ({adapter id: scale}; an id left out is at 0)."""
        return {k: s for k, s in enumerate(self.configs[config]) if s}

    def tokens_and_positions(self, n_vocab: int) -> tuple[np.ndarray, np.ndarray]:
        return self.base.tokens(n_vocab), self.base.fixture_positions()


def _small(case: OracleCase, seed: int) -> OracleCase:
    return dataclasses.replace(case, n_ctx=512, n_tokens=300, seed=seed)


CASES: dict[str, LoraCase] = {
    "llama": LoraCase(
        OracleCase("llama", "F32", n_ctx=512, n_tokens=300, seed=3, note="LoRA base"),
        {
            "A": dict(rank=4, alpha=8.0, seed=11, qtype_a="F16", qtype_b="F32"),
            "B": dict(
                rank=8, alpha=4.0, seed=12, qtype_a="Q8_0", qtype_b="BF16",
                roles=("attn_q", "attn_v", "attn_output", "ffn_gate", "ffn_down"),
            ),
        },
    ),
    "phi3": LoraCase(
        _small(ORACLE_CASES["phi3_short"], 4),
        {"A": dict(rank=8, alpha=16.0, seed=21, roles=("attn_qkv", "ffn_up", "output"), b_std=0.3)},
        ONE_ADAPTER,
    ),
    "qwen2": LoraCase(
        _small(ORACLE_CASES["qwen2_f32"], 5),
        {"A": dict(rank=6, alpha=None, seed=31, roles=("attn_q", "attn_k", "attn_v"), qtype_b="F16",
                   b_std=0.3)},
        ONE_ADAPTER,
    ),
    # more architectures, adapter A alone: Gemma 2's post-norms and soft caps (and its Q8_0 file, whose
    # layers the CPU runs as one call when no adapter touches them), StarCoder 2's ungated FFN with
    # biases and LayerNorm, qwen3moe's attention (its experts take no adapter)
    "gemma2": LoraCase(_small(ORACLE_CASES["gemma2_f32"], 6), {"A": dict(rank=4, alpha=4.0, seed=41)}, ONE_A),
    "gemma2_q8_0": LoraCase(
        _small(ORACLE_CASES["gemma2_q8_0"], 7),
        {"A": dict(rank=8, alpha=8.0, seed=42, qtype_a="F16", qtype_b="F16")},
        ONE_A,
    ),
    "starcoder2": LoraCase(
        _small(ORACLE_CASES["starcoder2_f32"], 8),
        {"A": dict(rank=4, alpha=8.0, seed=43,
                   roles=("attn_q", "attn_v", "attn_output", "ffn_up", "ffn_down"))},
        ONE_A,
    ),
    "qwen3moe": LoraCase(
        _small(ORACLE_CASES["qwen3moe_f32"], 9),
        {"A": dict(rank=8, alpha=16.0, seed=44, roles=("attn_q", "attn_k", "attn_v", "attn_output"))},
        ONE_A,
    ),
}  # fmt: skip


def write_lora_files(directory: str | Path) -> tuple[Path, list[Path]]:
    """The llama case's base and its two adapters (A, B) written into `directory`."""
    return CASES["llama"].write(directory)


def config_choice(name: str) -> dict[int, float]:
    return CASES["llama"].choice(name)


def tiny_engine(
    base: str | Path, adapters: list[Path], scales: list[float] | None = None, max_num_seqs: int = 8
):  # noqa: ANN201
    """An in-process EngineCore on the CPU backend over `base` with `adapters` loaded (global scales
    `scales`, default 0: a request uses only the adapters it names), prefix caching on."""
    from edgellm.arch import ARCHITECTURES
    from edgellm.backends.cpu.backend import CpuBackend
    from edgellm.engine.engine_core import EngineCore
    from edgellm.engine.model_runner import ModelRunner
    from edgellm.engine.scheduler import SchedulerConfig
    from edgellm.gguf.config import config_from_gguf
    from edgellm.gguf.load import load_gguf
    from edgellm.lora.adapter import load_adapter

    g = load_gguf(str(base))
    cfg = config_from_gguf(g)
    cfg.set_context(256)
    be = CpuBackend()
    model = ARCHITECTURES[cfg.arch](cfg, g, be)
    runner = ModelRunner(model, cfg, be, 128, 16)
    engine = EngineCore(runner, frozenset(), 256, SchedulerConfig(max_num_seqs, 256, 16, 128))
    engine.set_lora_adapters(
        [load_adapter(p, g, cfg, model) for p in adapters], scales or [0.0] * len(adapters)
    )
    return engine


def run_greedy(
    engine, prompts: dict[str, list[int]], choices: dict[str, dict[int, float] | None], max_tokens: int = 8
) -> dict[str, list[int]]:  # noqa: ANN001
    """Every prompt submitted at once (all in flight together), greedy; each request id's tokens."""
    from edgellm.sampling.sampler import SamplingParams

    for rid, ids in prompts.items():
        engine.add_request(
            ids,
            SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, lora=choices[rid]),
            rid,
        )
    out: dict[str, list[int]] = {rid: [] for rid in prompts}
    while engine.has_unfinished():
        for o in engine.step():
            out[o.request_id].extend(o.new_token_ids)
    return out
