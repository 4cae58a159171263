"""The CPU backend's one-call MoE experts (backends/cpu/moe/experts.py) and one-call MoE block
(backends/cpu/moe/block.py) against running the experts one by one through CpuBackend.matmul: the same bits,
in prefill and batched decode, for every layout mix, and for gpt-oss's biased, clamped-SwiGLU experts (MXFP4
as the released files, and the block-32 mix)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edgellm.arch import ARCHITECTURES
from edgellm.arch.moe import prepare_experts
from edgellm.backends.base import Backend
from edgellm.backends.cpu.backend import CpuBackend
from edgellm.backends.cpu.moe.experts import NO_BIAS, check_moe_args, check_moe_biases, check_moe_runs
from edgellm.engine.model_runner import ModelRunner, RunItem
from edgellm.gguf.config import config_from_gguf
from edgellm.gguf.load import load_gguf
from edgellm.gguf.validation import validate_model
from edgellm.testing.oracle.cases import (
    GPT_OSS_MODEL,
    GPT_OSS_QTYPES,
    GPT_OSS_WRITER,
    GPT_OSS_YARN,
    MOE,
    MOE_QTYPES,
    QWEN2MOE,
    QWEN3MOE,
)
from edgellm.testing.synthetic.models import write_tiny_model

BS = 16
GPT_OSS = {**GPT_OSS_MODEL, **GPT_OSS_WRITER, "metadata_overrides": GPT_OSS_YARN}


class PerExpertBackend(CpuBackend):
    """The CPU backend with the experts run one by one (the generic path of arch/moe.py)."""

    moe_experts = Backend.moe_experts
    moe_block = Backend.moe_block


class BlockCountingBackend(CpuBackend):
    """The CPU backend, counting the MoE blocks it ran in one call."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = 0

    def moe_block(self, x, w, cfg) -> bool:  # noqa: ANN001
        ran = super().moe_block(x, w, cfg)
        self.blocks += ran
        return ran


def _runner(path: Path, be: CpuBackend) -> ModelRunner:
    g = load_gguf(str(path))
    cfg = config_from_gguf(g)
    validate_model(g, cfg)
    return ModelRunner(ARCHITECTURES[cfg.arch](cfg, g, be), cfg, be, num_blocks=16, block_size=BS)


def _steps(runner: ModelRunner, seqs: list[list[int]], decode: list[list[int]]) -> list[np.ndarray]:
    """Every logits row of a batched prefill of seqs, then of batched decode steps."""
    tables = [[2 * i, 2 * i + 1] for i in range(len(seqs))]
    prefill = [RunItem(t, s, 0, all_logits=True) for t, s in zip(tables, seqs, strict=True)]
    rows = [row for r in runner.run(prefill) for row in np.atleast_2d(r)]
    for i, step in enumerate(decode):
        items = [RunItem(t, [tok], len(s) + i) for t, s, tok in zip(tables, seqs, step, strict=True)]
        rows += [row for r in runner.run(items) for row in np.atleast_2d(r)]
    return rows


@pytest.mark.parametrize(
    ("arch", "qtypes", "writer"),
    [("qwen3moe", MOE_QTYPES, QWEN3MOE), ("qwen3moe", "Q8_0", {**QWEN3MOE, "n_expert": 16}),
     ("qwen2moe", "Q8_0", QWEN2MOE), ("olmoe", MOE_QTYPES, MOE), ("llama", "Q4_0", MOE),
     ("gpt-oss", GPT_OSS_QTYPES, GPT_OSS), ("gpt-oss", MOE_QTYPES, GPT_OSS)],
    ids=["qwen3moe_mix", "qwen3moe_q8_0", "qwen2moe_shared", "olmoe_mix", "llama_moe_q4_0", "gpt_oss_mxfp4",
         "gpt_oss_mix"],
)
def test_one_call_experts_give_the_per_expert_bits(tmp_path: Path, arch: str, qtypes, writer) -> None:
    path = write_tiny_model(tmp_path / "m.gguf", arch, qtypes, **writer)
    rng = np.random.default_rng(11)
    v = load_gguf(str(path)).tensors["token_embd.weight"].shape[0]
    seqs = [rng.integers(0, v, n).tolist() for n in (21, 3, 9)]  # runs of 1 to many rows per expert
    decode = rng.integers(0, v, (3, 3)).tolist()

    fused = _runner(path, CpuBackend())
    got = _steps(fused, seqs, decode)
    states = [ffn.experts.backend_state for _, ffn in fused.model.layers]
    assert all(s is not None and s.ready.any() and not s.untiled for s in states)  # the one-call path ran

    want = _steps(_runner(path, PerExpertBackend()), seqs, decode)
    assert len(got) == len(want) == 21 + 3 + 9 + 3 * 3
    for g_row, w_row in zip(got, want, strict=True):
        np.testing.assert_array_equal(g_row, w_row)


@pytest.mark.parametrize(
    ("arch", "qtypes", "writer", "one_call"),
    [("qwen3moe", MOE_QTYPES, QWEN3MOE, True), ("qwen3moe", "Q8_0", {**QWEN3MOE, "n_expert": 16}, True),
     ("olmoe", MOE_QTYPES, MOE, True), ("llama", "Q4_0", MOE, True),
     ("qwen2moe", "Q8_0", QWEN2MOE, False), ("gpt-oss", MOE_QTYPES, GPT_OSS, False)],
    ids=["qwen3moe_mix", "qwen3moe_q8_0", "olmoe_mix", "llama_moe_q4_0", "qwen2moe_shared", "gpt_oss_mix"],
)
def test_one_call_block_gives_the_per_expert_bits(
    tmp_path: Path, arch: str, qtypes, writer, one_call
) -> None:
    """With every expert prepared (the engine's default) the whole block runs as one call where each step
    has a compiled form (a shared expert or gpt-oss's router bias and expert biases do not), with the bits
    of the step-by-step path; while experts are prepared lazily (as tokens reach them) it steps."""
    path = write_tiny_model(tmp_path / "m.gguf", arch, qtypes, **writer)
    rng = np.random.default_rng(12)
    v = load_gguf(str(path)).tensors["token_embd.weight"].shape[0]
    seqs = [rng.integers(0, v, n).tolist() for n in (17, 1, 6)]
    decode = rng.integers(0, v, (3, 3)).tolist()

    lazy_be = BlockCountingBackend()
    _steps(_runner(path, lazy_be), seqs, [])
    assert lazy_be.blocks == 0  # no expert prepared before the step: the step-by-step path prepares them

    be = BlockCountingBackend()
    runner = _runner(path, be)
    prepare_experts(runner.model)
    got = _steps(runner, seqs, decode)
    n_layers = len(runner.model.layers)
    assert be.blocks == (n_layers * (1 + len(decode)) if one_call else 0)

    want = _steps(_runner(path, PerExpertBackend()), seqs, decode)
    assert len(got) == len(want) == 17 + 1 + 6 + 3 * 3
    for g_row, w_row in zip(got, want, strict=True):
        np.testing.assert_array_equal(g_row, w_row)


def test_moe_arguments_are_checked_before_the_kernel() -> None:
    h = np.zeros((3, 8), np.float32)
    outs = np.zeros((4, 8), np.float32)
    ok = np.array([0, 1, 2, 0]), np.array([0, 2, 4])
    check_moe_args(h, *ok, outs, 8)
    with pytest.raises(ValueError, match="token index"):
        check_moe_args(h, np.array([0, 1, 3, 0]), ok[1], outs, 8)
    with pytest.raises(ValueError, match="run bounds"):
        check_moe_args(h, ok[0], np.array([0, 3, 2]), outs, 8)
    with pytest.raises(ValueError, match="run bounds"):
        check_moe_args(h, ok[0], np.array([0, 2, 3]), outs, 8)
    with pytest.raises(ValueError, match="MoE outputs"):
        check_moe_args(h, *ok, np.zeros((4, 9), np.float32), 8)
    with pytest.raises(ValueError, match="MoE input"):
        check_moe_args(h[:, :4], *ok, outs, 8)


def test_moe_runs_are_checked_before_the_kernel() -> None:
    """Each run's expert inside the layer's, and a bound per run plus the end (an empty route included)."""
    check_moe_runs(np.array([0, 3]), np.array([0, 2, 4]), 4)
    check_moe_runs(np.zeros(0, np.int64), np.array([0]), 4)
    for ids, bounds in [([0, 4], [0, 2, 4]), ([-1, 3], [0, 2, 4]), ([0, 3], [0, 4]), ([], [0, 4])]:
        with pytest.raises(ValueError, match="MoE runs of experts"):
            check_moe_runs(np.array(ids, np.int64), np.array(bounds, np.int64), 4)


def test_moe_biases_are_checked_before_the_kernel() -> None:
    """One bias row per run, of the gate|up and the down widths, float32, C-contiguous; or none at all."""
    check_moe_biases(NO_BIAS, NO_BIAS, 3, 4, 8)
    gu, dn = np.zeros((3, 8), np.float32), np.zeros((3, 8), np.float32)
    check_moe_biases(gu, dn, 3, 4, 8)
    for bad in [(gu[:2], dn), (gu, dn[:, :7]), (gu, NO_BIAS), (np.zeros((3, 4), np.float32), dn)]:
        with pytest.raises(ValueError, match="MoE biases of shapes"):
            check_moe_biases(*bad, 3, 4, 8)
    with pytest.raises(ValueError, match="float32"):
        check_moe_biases(gu.astype(np.float64), dn, 3, 4, 8)
    with pytest.raises(ValueError, match="C-contiguous"):
        check_moe_biases(np.zeros((8, 3), np.float32).T, dn, 3, 4, 8)


def test_moe_combine_gives_the_generic_sums_bit_for_bit() -> None:
    """The CPU's compiled weighted sum against Backend.moe_combine's numpy (products rounded, then added
    in slot order), over weights and outputs whose FMA contraction or reordering would change bits."""
    rng = np.random.default_rng(2)
    outs = rng.standard_normal((7 * 4, 96)).astype(np.float32) * 1e3
    where = rng.permutation(7 * 4).reshape(7, 4).astype(np.int64)
    weights = rng.random((7, 4)).astype(np.float32)
    be = CpuBackend()
    got = be.moe_combine(outs, where, weights)
    np.testing.assert_array_equal(got, Backend.moe_combine(be, outs, where, weights))
    for bad in (where + 1, where - 1, where[:, :0]):  # a row past the end, a negative row, no slots
        with pytest.raises(ValueError, match="MoE combine"):
            be.moe_combine(outs, bad, weights[:, : bad.shape[1]])
