"""CUDA backend under the engine: sampling on the device (only ids cross the bus), the logits-row gather,
and the engine's choice between device sampling and whole rows on the host.

Runs where test_cuda_backend.py's cases run: in its simulator subprocess (NUMBA_ENABLE_CUDASIM=1) or on a
GPU with EDGELLM_CUDA_TESTS=gpu. Shapes are tiny and the models have one layer: every forward pass in the
simulator costs seconds.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

if not (os.environ.get("NUMBA_ENABLE_CUDASIM") == "1" or os.environ.get("EDGELLM_CUDA_TESTS") == "gpu"):
    pytest.skip("run by tests/test_cuda_backend.py in a simulator subprocess", allow_module_level=True)

from edgellm import LLM, SamplingParams
from edgellm.backends.base import Backend
from edgellm.testing.synthetic import write_tiny_model
from tests.test_backend_ops import nmse
from tests.test_cuda_backend import BE, guarded, guards_intact


def logits_rows(rng: np.random.Generator, n: int) -> np.ndarray:
    x = (rng.standard_normal((4, n)) * 2).astype(np.float32)
    x[0] = np.round(x[0])  # many ties: equal values rank by lower id
    x[1, [3, n - 1]] = x[1].max() + 1  # a tie at the top, one of them in the last (partial) stride
    x[2, [5, 9]] = np.nan  # np.argmax: the first NaN; np.argsort(-x): NaN last
    x[3, :] = -np.inf
    x[3, n // 2] = -1.0
    return x


@pytest.mark.parametrize("k", [1, 3, 8])
def test_top_k_and_argmax_match_numpy(k: int) -> None:
    rng = np.random.default_rng(k)
    x = logits_rows(rng, 37)  # not a multiple of the block's threads
    _, view = guarded(x)  # a strided view inside a bigger buffer
    np.testing.assert_array_equal(BE.argmax(view), np.argmax(x, axis=1))
    vals, ids = BE.top_k(view, k)
    ref_vals, ref_ids = Backend.top_k(BE, view, k)  # the host definition: np.argsort(-x, kind="stable")
    np.testing.assert_array_equal(ids, ref_ids)
    np.testing.assert_array_equal(vals, ref_vals)
    assert ids.shape == (4, k) and vals.dtype == np.float32
    with pytest.raises(ValueError, match="top-k on the device"):
        BE.top_k(view, 38)


def test_take_rows_and_softcap() -> None:
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((5, 12)) * 40).astype(np.float32)
    whole, view = guarded(x)
    rows = np.array([4, 0, 2], np.int32)
    got = BE.take_rows(view, rows)
    np.testing.assert_array_equal(BE.to_host(got), x[rows])
    assert guards_intact(whole, x.shape)
    capped = BE.to_host(BE.softcap(got, 30.0))
    assert nmse(capped, np.tanh(x[rows].astype(np.float64) / 30.0) * 30.0) < 1e-12


# ---- the engine on the CUDA backend ------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(
        tmp_path_factory.mktemp("cuda") / "llama1.gguf", "llama", n_layers=1, n_embd=32, n_ff=64, head_dim=8
    )


@pytest.fixture(scope="module")
def llms(tiny: Path) -> dict[str, LLM]:
    return {be: LLM(tiny, backend=be, n_ctx=64, kv_cache_memory=1 << 20) for be in ("cpu", "cuda")}


def run_steps(
    llm: LLM, prompts: list[list[int]], params: SamplingParams
) -> tuple[list[list[int]], list, list]:
    """Drive the engine step by step: (tokens per prompt, logprobs, per step (copies, bytes) to the host)."""
    eng = llm.engine
    rids = [eng.add_request(p, params) for p in prompts]
    toks: dict[str, list[int]] = {r: [] for r in rids}
    lps, moved = [], []
    stats = getattr(llm.backend, "stats", None)
    while eng.has_unfinished():
        if stats:
            stats.reset()
        for out in eng.step():
            for d in out.deltas:
                toks[out.request_id] += d.token_ids
                lps += d.logprobs or []
        if stats:
            moved.append((stats.to_host_copies, stats.to_host_bytes))
    return [toks[r] for r in rids], lps, moved


def test_engine_greedy_on_device_moves_only_ids(llms: dict[str, LLM]) -> None:
    prompts = [[1, 17, 42, 99], [5, 6, 7]]
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    cpu_tokens, _, _ = run_steps(llms["cpu"], prompts, params)
    cuda_tokens, _, moved = run_steps(llms["cuda"], prompts, params)
    assert cuda_tokens == cpu_tokens and all(len(t) == 3 for t in cuda_tokens)
    # prefill of both prompts, then two decode steps: one copy of two int32 ids each
    assert moved == [(1, 8)] * 3


def test_engine_logprobs_take_the_host_path(llms: dict[str, LLM]) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True, logprobs=2)
    cpu_tokens, cpu_lps, _ = run_steps(llms["cpu"], [[9, 8, 7]], params)
    cuda_tokens, cuda_lps, moved = run_steps(llms["cuda"], [[9, 8, 7]], params)
    n_vocab = llms["cuda"].config.n_vocab
    assert cuda_tokens == cpu_tokens
    assert moved == [(1, 4 * n_vocab)] * 2  # the whole logits row, as before device sampling
    for a, b in zip(cuda_lps, cpu_lps, strict=True):
        assert a.token_id == b.token_id and abs(a.logprob - b.logprob) < 1e-4
        assert [t for t, _ in a.top] == [t for t, _ in b.top]
