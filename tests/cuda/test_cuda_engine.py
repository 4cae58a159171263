"""CUDA backend under the engine: sampling on the device (only ids cross the bus), the logits-row gather,
the engine's choice between device sampling and whole rows on the host, embeddings; the fused kernels:
test_cuda_fused.py, other architectures: test_cuda_arch_logits.py.

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
    pytest.skip("run by tests/cuda/test_cuda_backend.py in a simulator subprocess", allow_module_level=True)

from edgellm import SamplingParams
from edgellm.backends.base import Backend
from edgellm.engine.config import EngineConfig
from edgellm.engine.core_process import EngineCoreProc
from edgellm.testing.cuda.guards import BE, guarded, guards_intact
from edgellm.testing.kernel_refs import nmse
from edgellm.testing.synthetic.models import write_tiny_model


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


def test_argmax_across_many_blocks() -> None:
    """Rows long enough for many blocks of the one-launch argmax: ties and NaNs in different blocks resolve
    as np.argmax does (first maximum, first NaN), and the completion counters reset between launches."""
    x = np.zeros((3, 203), np.float32)
    x[0, [7, 150, 202]] = 5.0  # a three-way tie at the top, in the first, a middle and the last block
    x[1, [190, 40]] = np.nan  # the first NaN wins wherever the larger values are
    x[1, 3] = 1e30
    x[2] = -np.arange(203, dtype=np.float32)
    x[2, 100] = np.float32(np.inf)
    _, view = guarded(x)
    for _ in range(2):  # the second launch reuses the counters the first one's last blocks reset
        np.testing.assert_array_equal(BE.argmax(view), np.argmax(x, axis=1))
    np.testing.assert_array_equal(BE.argmax(view[1:2]), [40])


@pytest.mark.skipif(os.environ.get("EDGELLM_CUDA_TESTS") == "gpu", reason="a GPU has graphs: gpu_check.py")
def test_cuda_graphs_are_refused_by_the_simulator() -> None:
    with pytest.raises(RuntimeError, match="the Numba CUDA simulator has none"):
        BE.argmax_graph(None, None)


def test_decode_steps_of_one_shape_launch_alike(tiny: Path) -> None:
    """What a CUDA graph replay relies on (graphs.py): two decode steps of the same shape at different
    positions, tokens and block tables launch the same kernels with the same scalar arguments and array
    shapes, so everything that changes per step reaches the kernels through device arrays."""
    from edgellm.arch import ARCHITECTURES
    from edgellm.backends.cuda import config
    from edgellm.engine.model_runner import ModelRunner, RunItem
    from edgellm.gguf.config import config_from_gguf
    from edgellm.gguf.load import load_gguf

    g = load_gguf(tiny)
    cfg = config_from_gguf(g)
    runner = ModelRunner(ARCHITECTURES[cfg.arch](cfg, g, BE), cfg, BE, num_blocks=6, block_size=4)

    def step(items: list) -> list:
        args: list = []
        config.CAPTURE_REFS.append(args)
        try:
            runner.run_argmax(items)
        finally:
            config.CAPTURE_REFS.remove(args)
        return [
            [(a.shape, a.dtype.str) if hasattr(a, "shape") else a for a in launch_args]
            for launch_args in args
        ]

    first = step([RunItem([0, 1], [7], 3)])  # (the cache holds zeros: its values do not matter here)
    second = step([RunItem([4, 5], [9], 6)])  # other blocks, position, token
    assert len(first) > 5 and first == second


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
def llms(tiny: Path) -> dict[str, EngineCoreProc]:
    """Engine cores built in this process, to drive their engines step by step."""
    return {
        be: EngineCoreProc(EngineConfig(str(tiny), backend=be, n_ctx=64, kv_cache_memory=1 << 20))
        for be in ("cpu", "cuda")
    }


def run_steps(
    llm: EngineCoreProc, prompts: list[list[int]], params: SamplingParams
) -> tuple[list[list[int]], list, list]:
    """Drive the engine step by step: (tokens per prompt, logprobs, per step (copies, bytes) to the host)."""
    eng = llm.engine_core
    rids = [eng.add_request(p, params) for p in prompts]
    toks: dict[str, list[int]] = {r: [] for r in rids}
    lps, moved = [], []
    stats = getattr(llm.backend, "stats", None)
    while eng.has_unfinished():
        if stats:
            stats.reset()
        for out in eng.step():
            toks[out.request_id] += out.new_token_ids
            lps += out.logprobs or []
        if stats:
            moved.append((stats.to_host_copies, stats.to_host_bytes))
    return [toks[r] for r in rids], lps, moved


def test_engine_greedy_on_device_moves_only_ids(llms: dict[str, EngineCoreProc]) -> None:
    prompts = [[1, 17, 42, 99], [5, 6, 7]]
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    cpu_tokens, _, _ = run_steps(llms["cpu"], prompts, params)
    cuda_tokens, _, moved = run_steps(llms["cuda"], prompts, params)
    assert cuda_tokens == cpu_tokens and all(len(t) == 3 for t in cuda_tokens)
    # prefill of both prompts, then two decode steps: one copy of two int32 ids each
    assert moved == [(1, 8)] * 3


def test_engine_speculative_greedy_verifies_on_device(llms: dict[str, EngineCoreProc], tiny: Path) -> None:
    """Drafts verified with the device argmax of every scored row: plain decoding's tokens, ids only to
    the host. The drafts are the plain tokens with one wrong, so one verify step accepts and one rejects."""
    from edgellm.engine.spec.config import SpeculativeConfig

    prompts = [[5, 6, 7, 5, 6]]
    params = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    [want], _, _ = run_steps(llms["cpu"], prompts, params)
    guesses = want[:2] + [(want[2] + 1) % 64] + want[3:]

    class Replay:
        def propose(self, requests):
            return [guesses[s.num_output_tokens : s.num_output_tokens + k] for s, k in requests]

        def drop(self, seq_id: int) -> None:
            pass

    spec = SpeculativeConfig("ngram", num_tokens=2, adaptive=False)
    core = EngineCoreProc(
        EngineConfig(str(tiny), backend="cuda", n_ctx=64, kv_cache_memory=1 << 20, speculative=spec)
    )
    core.engine_core.speculator.proposer = Replay()
    [got], _, moved = run_steps(core, prompts, params)
    stats = core.engine_core.stats()
    assert got == want
    # prefill -> t0; drafts [t1, wrong] -> t1 t2; one draft left within max_tokens: [t3] -> t3 t4
    assert (stats.spec_draft_tokens_total, stats.spec_accepted_tokens_total) == (3, 2)
    assert moved == [(1, 4), (1, 12), (1, 8)]  # one id per scored row


def test_engine_logprobs_take_the_host_path(llms: dict[str, EngineCoreProc]) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True, logprobs=2)
    cpu_tokens, cpu_lps, _ = run_steps(llms["cpu"], [[9, 8, 7]], params)
    cuda_tokens, cuda_lps, moved = run_steps(llms["cuda"], [[9, 8, 7]], params)
    n_vocab = llms["cuda"].config.n_vocab
    assert cuda_tokens == cpu_tokens
    assert moved == [(1, 4 * n_vocab)] * 2  # the whole logits row, as before device sampling
    for a, b in zip(cuda_lps, cpu_lps, strict=True):
        assert a.token_id == b.token_id and abs(a.logprob - b.logprob) < 1e-4
        assert [t for t, _ in a.top] == [t for t, _ in b.top]


def test_engine_embeddings_match_the_cpu(llms: dict[str, EngineCoreProc]) -> None:
    """The final hidden states come back from the device (forward_hidden) and pool as on the CPU."""
    vectors = {}
    for be, core in llms.items():
        eng = core.engine_core
        eng.add_embedding_request([3, 1, 4, 1, 5])
        while eng.has_unfinished():
            for out in eng.step():
                if out.embedding is not None:
                    vectors[be] = out.embedding
    assert vectors["cuda"].shape == (32,) and abs(np.linalg.norm(vectors["cuda"]) - 1) < 1e-5
    # 3e-8 apart in the simulator; 1e-4 as the logprobs above, for a GPU's other summation order
    np.testing.assert_allclose(vectors["cuda"], vectors["cpu"], atol=1e-4)
