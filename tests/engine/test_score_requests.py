"""Scoring requests through the engine (an in-process EngineCoreProc on a tiny synthetic model, and once
through LLM and its core process): the scheduler computes the sequence in prefill chunks over the paged KV
cache as it does a prompt's, and the logits of every position come back in the request's output, bit for
bit those of the runner's own forward passes over the same chunks with no scheduler around them, whether
the scoring runs alone, beside generation, or is preempted and recomputed.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edgellm.engine.checks import PromptTooLongError
from edgellm.engine.config import EngineConfig
from edgellm.engine.core_process import EngineCoreProc
from edgellm.engine.model_runner import RunItem
from edgellm.engine.sequence import Sequence
from edgellm.sampling.sampler import SamplingParams
from edgellm.testing.synthetic.models import write_tiny_model

CTX = 64
CHUNK = 16  # the step's token budget: a scoring of CTX tokens takes four chunks


def _core(path: Path, **kw: object) -> EngineCoreProc:
    spec = dict(n_ctx=CTX, kv_cache_memory=1 << 20, max_num_seqs=4, max_num_batched_tokens=CHUNK, threads=1)
    return EngineCoreProc(EngineConfig(str(path), **{**spec, **kw}))  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("score")
    return write_tiny_model(
        d / "m.gguf", "llama", n_layers=2, n_embd=32, n_ff=64, head_dim=8, context_length=CTX
    )


def direct(core: EngineCoreProc, ids: list[int], chunk: int = CHUNK) -> np.ndarray:
    """The runner's forward passes alone, `chunk` tokens each, on blocks borrowed from the pool:
    [n, n_vocab]."""
    bm = core.engine_core.scheduler.block_manager
    seq = Sequence(-1, ids)
    bm.allocate(seq, len(ids))
    try:
        rows = [
            core.runner.run([RunItem(seq.block_table, ids[s : s + chunk], s, all_logits=True)])[0]
            for s in range(0, len(ids), chunk)
        ]
        return np.concatenate(rows)
    finally:
        bm.free(seq)


def token_ids(n_vocab: int, n: int, seed: int = 3) -> list[int]:
    return np.random.default_rng(seed).integers(0, n_vocab, size=n).tolist()


def test_a_scoring_is_chunked_by_the_scheduler_and_matches_the_runner_bit_for_bit(model: Path) -> None:
    core = _core(model)
    eng = core.engine_core
    chunks: list[list[tuple[int, int]]] = []
    schedule = eng.scheduler.schedule

    def recording():  # noqa: ANN202
        plan = schedule()
        chunks.append([(seq.num_computed_tokens, n) for seq, n in plan.scheduled])
        return plan

    eng.scheduler.schedule = recording  # type: ignore[method-assign]
    for n in (1, 17, CTX):
        ids = token_ids(core.config.n_vocab, n)
        chunks.clear()
        got = core.score(ids)
        assert got.shape == (n, core.config.n_vocab) and got.dtype == np.float32
        assert np.array_equal(got, direct(core, ids)), n
        # one sequence catching up CHUNK tokens a step from position 0, then an empty step
        assert [c for c in chunks if c] == [[(s, min(CHUNK, n - s))] for s in range(0, n, CHUNK)], n
        bm = eng.scheduler.block_manager
        assert not eng.has_unfinished() and bm.num_free_blocks == bm.num_blocks  # its blocks are freed


def test_scoring_beside_generation_and_after_preemption_gives_the_same_logits(model: Path) -> None:
    """Batched with a generation, and in a pool too small for both (kv_cache_memory=0: 5 blocks of 16), so
    that the scoring (priority 1) is preempted and recomputed from position 0: each gives the logits it gives
    alone, and the generation the tokens it generates alone."""
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    for kv in (1 << 20, 0):
        core = _core(model, kv_cache_memory=kv)
        eng = core.engine_core
        ids, prompt = token_ids(core.config.n_vocab, CTX), token_ids(core.config.n_vocab, 30, seed=4)
        alone = core.score(ids)
        gen = eng.add_request(prompt, params)
        tokens_alone = []
        while eng.has_unfinished():
            tokens_alone += [t for out in eng.step() for t in out.new_token_ids]
        assert len(tokens_alone) == 30
        gen = eng.add_request(prompt, params)
        rid = eng.add_score_request(ids, priority=1)
        outs = []
        while eng.has_unfinished():
            outs += eng.step()
        [scored] = [o for o in outs if o.request_id == rid]
        assert scored.request_finished and not scored.new_token_ids and scored.embedding is None
        assert np.array_equal(scored.logits, alone)
        assert [t for o in outs if o.request_id == gen for t in o.new_token_ids] == tokens_alone
        assert (scored.num_preemptions > 0) == (kv == 0), kv


def test_bad_scorings_are_the_clear_errors_they_were(model: Path) -> None:
    core = _core(model)
    eng = core.engine_core
    with pytest.raises(PromptTooLongError, match=f"{CTX + 1} tokens exceed the context window of {CTX}"):
        core.score([1] * (CTX + 1))
    with pytest.raises(ValueError, match=r"score\(\) needs at least one token"):
        core.score([])
    with pytest.raises(ValueError, match=f"token ids must be in 0..{core.config.n_vocab - 1}"):
        eng.add_score_request([1, core.config.n_vocab])
    with pytest.raises(ValueError, match="token ids must be in"):
        eng.add_score_request([True])
    assert not eng.has_unfinished()
    assert core.score([1] * CTX).shape == (CTX, core.config.n_vocab)  # the whole window: nothing is generated


def test_llm_score_goes_through_the_core_process_bit_for_bit(model: Path) -> None:
    from edgellm.llm import LLM

    core = _core(model)
    ids = token_ids(core.config.n_vocab, 50)
    with LLM(model, n_ctx=CTX, kv_cache_memory=1 << 20, max_num_batched_tokens=CHUNK, threads=1) as llm:
        assert np.array_equal(llm.score(ids), direct(core, ids))
        with pytest.raises(PromptTooLongError, match=f"{CTX + 1} tokens exceed the context window of {CTX}"):
            llm.score([1] * (CTX + 1))
        with pytest.raises(ValueError, match=r"score\(\) needs at least one token"):
            llm.score([])
        with pytest.raises(ValueError, match=f"token ids must be in 0..{core.config.n_vocab - 1}"):
            llm.score([core.config.n_vocab])
        assert llm.healthy and llm.stats().num_running == 0


def test_smollm2_scoring_matches_the_runner_bit_for_bit() -> None:
    """The real model (Q4_1 weights, 49,152-token vocabulary): 300 tokens in chunks of 128."""
    from edgellm.models.catalog import resolve_model

    core = EngineCoreProc(
        EngineConfig(str(resolve_model("smollm2-135m")), n_ctx=1024, max_num_batched_tokens=128)
    )
    ids = token_ids(core.config.n_vocab, 300, seed=0)
    got = core.score(ids)
    assert got.shape == (300, 49152) and np.array_equal(got, direct(core, ids, chunk=128))
