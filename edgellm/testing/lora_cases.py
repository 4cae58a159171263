"""The LoRA oracle case: a tiny random-weight llama base and two random adapters, scored with each adapter,
with both and with none, by llama.cpp (scripts/fixtures/make_lora_fixtures.py writes its logits to
tests/fixtures/lora/) and by edgellm (tests/lora/). Between them the adapters cover every tensor type
adapter.py reads: A is F16 (lora_a) / F32 (lora_b), rank 4, on every attention and FFN matrix; B is
Q8_0 / BF16, rank 8 (Q8_0 rows need n_in a multiple of 32), on Q, V, the output projection, gate and down.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edgellm.testing.oracle_case import OracleCase
from edgellm.testing.synthetic_lora import write_tiny_lora

BASE = OracleCase("llama", "F32", n_ctx=512, n_tokens=300, seed=3, note="LoRA base")
ADAPTERS = {
    "A": dict(rank=4, alpha=8.0, seed=11, qtype_a="F16", qtype_b="F32"),
    "B": dict(
        rank=8, alpha=4.0, seed=12, qtype_a="Q8_0", qtype_b="BF16",
        roles=("attn_q", "attn_v", "attn_output", "ffn_gate", "ffn_down"),
    ),
}  # fmt: skip
# configuration -> the scale of each adapter (in ADAPTERS' order); 0: not applied
CONFIGS: dict[str, tuple[float, float]] = {
    "none": (0.0, 0.0),
    "A": (1.0, 0.0),
    "B": (0.0, 0.5),
    "AB": (1.0, 0.5),
}
NMSE_LIMIT = 1e-4  # the float bound (the base is F32; the adapters' own types are their values exactly)


def write_lora_files(directory: str | Path) -> tuple[Path, list[Path]]:
    """(the base GGUF, [adapter A, adapter B]) written into `directory`."""
    d = Path(directory)
    base = BASE.write(d / "lora_base.gguf")
    return base, [write_tiny_lora(d / f"lora_{k}.gguf", base, **kw) for k, kw in ADAPTERS.items()]


def config_choice(name: str) -> dict[int, float]:
    """A configuration as a request's choice ({adapter id: scale}; an id left out is at 0)."""
    return {k: s for k, s in enumerate(CONFIGS[name]) if s}


def tokens_and_positions(n_vocab: int) -> tuple[np.ndarray, np.ndarray]:
    return BASE.tokens(n_vocab), BASE.fixture_positions()


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
    from edgellm.sampling import SamplingParams

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
