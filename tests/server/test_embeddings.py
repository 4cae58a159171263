"""Embedding requests in the engine (an in-process EngineCoreProc on tiny synthetic models): chunked, batched
with generation and preempted like prompts, pooled per the GGUF's pooling_type, KV freed at the end.

The reference for every vector is the same model's final hidden states of the whole input computed in one
forward pass by itself, pooled here in float64. Batched, chunked or preempted runs must match it to float32
rounding of the pooled sum (1e-6): the CPU kernels compute each token's row independently of the rest of
the batch, so chunking and batching change the order of nothing but the pool's own sum.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edgellm.engine.checks import PromptTooLongError
from edgellm.engine.config import EngineConfig
from edgellm.engine.core_process import EngineCoreProc
from edgellm.engine.model_runner import RunItem
from edgellm.engine.protocol import EngineCoreOutput
from edgellm.engine.sequence import Sequence
from edgellm.sampling.sampler import SamplingParams
from edgellm.testing.synthetic.models import write_tiny_model

CTX = 64
TOL = 1e-6


def _core(path: Path, **kw: object) -> EngineCoreProc:
    spec = dict(n_ctx=CTX, kv_cache_memory=1 << 20, max_num_seqs=4, max_num_batched_tokens=8, threads=1)
    return EngineCoreProc(EngineConfig(str(path), **{**spec, **kw}))  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("embed")
    kw = dict(n_layers=2, n_embd=32, n_ff=64, head_dim=8, context_length=CTX)
    out = {"default": write_tiny_model(d / "mean.gguf", "llama", **kw)}  # no pooling_type: mean
    for name, value in (("cls", 2), ("last", 3), ("rank", 4)):
        out[name] = write_tiny_model(
            d / f"{name}.gguf", "llama", metadata_overrides={"llama.pooling_type": value}, **kw
        )
    return out


def reference(core: EngineCoreProc, ids: list[int]) -> np.ndarray:
    """The input's final hidden states [n, n_embd] from one forward pass of its own (blocks borrowed)."""
    bm = core.engine_core.scheduler.block_manager
    seq = Sequence(-1, ids)
    bm.allocate(seq, len(ids))
    try:
        core.runner.run(
            [RunItem(seq.block_table, ids, 0, need_logits=False, hidden_rows=np.arange(len(ids)))]
        )
        return core.runner.last_hidden[0].astype(np.float64)
    finally:
        bm.free(seq)


def pooled(h: np.ndarray, how: str) -> np.ndarray:
    v = {"mean": h.mean(axis=0), "cls": h[0], "last": h[-1]}[how]
    return v / np.linalg.norm(v)


def run_all(
    core: EngineCoreProc, embed: list[list[int]], generate: list[list[int]] = ()
) -> list[EngineCoreOutput]:
    """Embedding requests and generation requests together, stepped to the end; the embeddings' final
    outputs in order."""
    eng = core.engine_core
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    for g in generate:
        eng.add_request(g, params)
    rids = [eng.add_embedding_request(ids) for ids in embed]
    got: dict[str, EngineCoreOutput] = {}
    while eng.has_unfinished():
        for out in eng.step():
            if out.embedding is not None:
                assert out.request_finished and not out.new_token_ids
                got[out.request_id] = out
    return [got[r] for r in rids]


def vectors(core: EngineCoreProc, embed: list[list[int]], generate: list[list[int]] = ()) -> list[np.ndarray]:
    return [out.embedding for out in run_all(core, embed, generate)]


def inputs(n_vocab: int) -> list[list[int]]:
    rng = np.random.default_rng(7)
    return [rng.integers(0, n_vocab, size=n).tolist() for n in (1, 5, 23, CTX)]  # CTX: fills the context


def test_mean_vectors_batched_chunked_and_with_generation_equal_each_alone(models) -> None:
    core = _core(models["default"])
    xs = inputs(core.config.n_vocab)
    refs = [pooled(reference(core, x), "mean") for x in xs]
    alone = [vectors(core, [x])[0] for x in xs]
    together = vectors(core, xs, generate=[xs[2][:10], xs[1]])
    for ref, a, t in zip(refs, alone, together, strict=True):
        assert a.shape == (32,) and a.dtype == np.float32
        assert abs(np.linalg.norm(a) - 1) < TOL
        assert np.abs(a - ref).max() < TOL and np.abs(t - a).max() < TOL
    assert float(together[1] @ together[1]) == pytest.approx(1.0, abs=TOL)
    bm = core.engine_core.scheduler.block_manager
    assert bm.num_free_blocks == bm.num_blocks  # every block back (the cached ones are evictable)
    assert core.stats()["num_running"] == 0


def test_preempted_embedding_recomputes_to_the_same_vector(models) -> None:
    # 5 blocks of 16 tokens (one context + 1): three generations outgrow them while the input computes
    core = _core(models["default"], kv_cache_memory=0, max_num_seqs=4)
    xs = inputs(core.config.n_vocab)
    ref = pooled(reference(core, xs[3]), "mean")
    gens = [xs[2][:20], xs[2][3:23], xs[1] * 4]
    [out] = run_all(core, [xs[3]], generate=gens)
    assert out.num_preemptions >= 1  # how often depends on how the steps share the budget
    assert np.abs(out.embedding - ref).max() < TOL


@pytest.mark.parametrize("how", ["cls", "last"])
def test_pooling_type_from_the_gguf(models, how: str) -> None:
    core = _core(models[how])
    assert core.config.pooling == how
    xs = inputs(core.config.n_vocab)
    got = vectors(core, xs)
    for x, v in zip(xs, got, strict=True):
        assert np.abs(v - pooled(reference(core, x), how)).max() < TOL
    if how == "cls":  # causal attention: the first token's state does not depend on the rest
        assert np.abs(got[2] - vectors(core, [xs[2][:1]])[0]).max() < TOL


def test_bad_inputs_and_unsupported_pooling_are_clear_errors(models) -> None:
    core = _core(models["default"])
    eng = core.engine_core
    with pytest.raises(PromptTooLongError, match=f"context window is {CTX}"):
        eng.add_embedding_request([1] * (CTX + 1))
    with pytest.raises(ValueError, match="empty input"):
        eng.add_embedding_request([])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        eng.add_embedding_request([core.config.n_vocab])
    assert not eng.has_unfinished()
    with pytest.raises(ValueError, match="'rank'"):
        _core(models["rank"]).engine_core.add_embedding_request([1, 2])
