"""LFM2's per-sequence conv state through the runner and the engine: decode steps and prefill chunks
continue each sequence's state (llama.cpp's logits token by token; the same logits in any chunking),
sequences batched together keep their own, the state is required where it matters (dropping it breaks the
match with llama.cpp), and the engine turns off what would need a state it does not keep (prefix-cache
hits, speculative decoding). The logits over 1,100 tokens: tests/gguf/test_oracle_cases.py, cases lfm2_*."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from edgellm.engine.conv_state import ConvStates
from edgellm.engine.model_runner import ModelRunner, RunItem
from edgellm.testing.oracle.cases import CASES, nmse

FIXTURES = Path(__file__).parent.parent / "fixtures" / "oracle"
BLOCK = 16


@pytest.fixture(scope="module")
def lfm2_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return CASES["lfm2_f32"].write(tmp_path_factory.mktemp("lfm2") / "lfm2_f32.gguf")


def make_runner(path: Path, n_blocks: int = 160) -> ModelRunner:
    from edgellm.arch import ARCHITECTURES
    from edgellm.backends.cpu.backend import CpuBackend
    from edgellm.gguf.config import config_from_gguf
    from edgellm.gguf.load import load_gguf
    from edgellm.gguf.validation import validate_model

    g = load_gguf(str(path))
    cfg = config_from_gguf(g)
    validate_model(g, cfg)
    be = CpuBackend()
    return ModelRunner(ARCHITECTURES[cfg.arch](cfg, g, be), cfg, be, n_blocks, BLOCK)


def score(runner: ModelRunner, ids: list[int], chunks: list[int], table: list[int], seq_id=None):  # noqa: ANN201
    """Logits [len(ids), n_vocab] of ids computed in chunks of the given sizes, then one token at a time."""
    rows, start = [], 0
    for n in chunks + [1] * len(ids):
        if start == len(ids):
            break
        part = ids[start : start + n]
        rows += runner.run([RunItem(table, part, start, all_logits=True, seq_id=seq_id)])
        start += len(part)
    return np.concatenate(rows)


def test_token_by_token_matches_llamacpp_and_needs_the_conv_state(lfm2_path: Path, monkeypatch) -> None:
    """Every token its own step (the decode path: the state carries each conv layer's last two inputs
    from step to step) gives llama.cpp's logits; starting each step from a zero state does not."""
    ref = np.load(FIXTURES / "lfm2_f32.npz")
    n = 300
    keep = ref["positions"] < n
    ids, pos, want = ref["tokens"][:n].tolist(), ref["positions"][keep], ref["logits"][keep]
    runner = make_runner(lfm2_path)
    table = list(range(-(-n // BLOCK)))
    got = score(runner, ids, [], table)[pos]
    assert nmse(got, want) < 1e-8
    real_gather = ConvStates.gather
    monkeypatch.setattr(ConvStates, "gather", lambda self, k, s: np.zeros_like(real_gather(self, k, s)))
    dropped = score(runner, ids, [], table)[pos]
    assert nmse(dropped[:1], want[:1]) < 1e-8  # the first token has no past either way
    assert nmse(dropped, want) > 1e-2


def test_prefill_chunks_then_decode_equal_one_pass(lfm2_path: Path) -> None:
    runner = make_runner(lfm2_path)
    ids = np.random.default_rng(3).integers(0, 288, 120).tolist()
    table = list(range(8))
    whole = score(runner, ids, [len(ids)], table)
    pieces = score(runner, ids, [5, 1, 2, 64, 17], table)  # then token by token from 89 on
    np.testing.assert_allclose(pieces, whole, rtol=0, atol=2e-5)


def test_batched_sequences_keep_their_own_state(lfm2_path: Path) -> None:
    """Two prompts prefilled in one batch and decoded together give each one's logits alone."""
    runner = make_runner(lfm2_path)
    rng = np.random.default_rng(5)
    a, b = rng.integers(0, 288, 40).tolist(), rng.integers(0, 288, 23).tolist()
    ta, tb = list(range(0, 4)), list(range(4, 8))
    alone = [score(runner, a, [30], ta, seq_id=1), score(runner, b, [18], tb, seq_id=2)]
    got: list[list[np.ndarray]] = [[], []]
    steps = [(30, 18)] + [(1, 1)] * 10  # a: 30 tokens, then 10 decodes; b: 18, then 5 decodes beside a
    ca = cb = 0
    for na, nb in steps:
        items, owners = [], []
        if ca < len(a):
            items.append(RunItem(ta, a[ca : ca + na], ca, all_logits=True, seq_id=11))
            owners.append(0)
        if cb < len(b):
            items.append(RunItem(tb, b[cb : cb + nb], cb, all_logits=True, seq_id=12))
            owners.append(1)
        for who, rows in zip(owners, runner.run(items), strict=True):
            got[who].append(rows)
        ca, cb = min(len(a), ca + na), min(len(b), cb + nb)
    for who, want in enumerate(alone):
        np.testing.assert_allclose(np.concatenate(got[who]), want, rtol=0, atol=2e-5)


def test_conv_states_continue_only_where_they_ended() -> None:
    st = ConvStates((2, 2, 4))
    st.store([7], [5], np.ones((1, 2, 2, 4), np.float32))
    assert (st.gather([7], [5]) == 1).all() and (st.gather([7], [0]) == 0).all()
    with pytest.raises(ValueError, match=r"sequence 7: computing from position 3, but its conv state is a "
                                         r"state after 5 tokens"):  # fmt: skip
        st.gather([7], [3])
    with pytest.raises(ValueError, match=r"sequence 8: computing from position 16, but its conv state is no"):
        st.gather([8], [16])  # a prefix-cache hit: blocks without a state
    with pytest.raises(ValueError, match=r"one sequence twice"):
        st.gather([None, None], [0, 0])
    st.fork(7, 9)
    assert (st.gather([9], [5]) == 1).all()
    st.retain({9})
    assert len(st) == 1
    with pytest.raises(ValueError, match=r"sequence 7"):
        st.gather([7], [5])


def test_engine_batches_forks_and_refuses_speculation(lfm2_path: Path) -> None:
    """Through the engine: prompts batched together (and the n=2 completions of one, forked from its
    state) generate what each does alone, finished sequences leave no state, and speculative decoding is
    refused naming why. Prefix-cache hits from state checkpoints: tests/gguf/test_qwen35.py, for both."""
    from edgellm import SamplingParams
    from edgellm.engine.config import EngineConfig
    from edgellm.engine.core_process import EngineCoreProc
    from edgellm.engine.spec.config import SpeculativeConfig

    core = EngineCoreProc(EngineConfig(str(lfm2_path), n_ctx=128, kv_cache_memory=1 << 20, threads=2))
    eng = core.engine_core
    greedy = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    prompts = [[5, 17, 42, 99, 7, 5, 17, 42] * 3, [1, 2, 3, 4, 5], [5, 17, 42, 99, 7, 5, 17, 42] * 3 + [8]]

    def run(batch: list[list[int]], params: SamplingParams = greedy) -> list[list[int]]:
        rids = [eng.add_request(p, params) for p in batch]
        toks: dict[tuple[str, int], list[int]] = {}
        while eng.has_unfinished():
            for out in eng.step():
                toks.setdefault((out.request_id, out.index), []).extend(out.new_token_ids)
        return [toks[(r, i)] for r in rids for i in range(params.n)]

    alone = [run([p])[0] for p in prompts]
    assert len({tuple(t) for t in alone}) == 3
    assert run(prompts) == alone
    two = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, n=2)
    assert run([prompts[0]], two) == [alone[0], alone[0]]
    eng.step()  # an empty step frees the states of the sequences that finished
    assert len(core.runner.conv_states) <= 1  # the anonymous one (warm-up) at most
    spec = SpeculativeConfig("ngram", num_tokens=3, ngram_min=1)
    with pytest.raises(ValueError, match=r"speculative decoding is not supported for lfm2"):
        EngineCoreProc(EngineConfig(str(lfm2_path), n_ctx=128, kv_cache_memory=1 << 20, speculative=spec))


def test_preempted_sequences_recompute_from_a_fresh_state(lfm2_path: Path) -> None:
    """A KV pool too small for both sequences at once: one is preempted and recomputes from position 0
    (its conv state restarts from zeros), and both generate what each does alone."""
    from edgellm import SamplingParams
    from edgellm.engine.config import EngineConfig
    from edgellm.engine.core_process import EngineCoreProc

    spec = EngineConfig(str(lfm2_path), n_ctx=128, kv_cache_memory=0, threads=2)  # 9 blocks of 16
    core = EngineCoreProc(spec)
    eng = core.engine_core
    greedy = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    rng = np.random.default_rng(9)
    prompts = [rng.integers(0, 288, 50).tolist(), rng.integers(0, 288, 55).tolist()]

    def run(batch: list[list[int]]) -> list[list[int]]:
        rids = [eng.add_request(p, greedy) for p in batch]
        toks: dict[str, list[int]] = {r: [] for r in rids}
        while eng.has_unfinished():
            for out in eng.step():
                toks[out.request_id] += out.new_token_ids
        return [toks[r] for r in rids]

    alone = [run([p])[0] for p in prompts]
    before = eng.stats().num_preemptions
    assert run(prompts) == alone
    assert eng.stats().num_preemptions > before


def test_other_backends_refuse_lfm2_at_load(lfm2_path: Path) -> None:
    """The conv runs on host arrays: a device backend refuses the architecture by name before loading."""
    from edgellm.arch.lfm2 import Lfm2Model
    from edgellm.gguf.config import UnsupportedArchitectureError, config_from_gguf
    from edgellm.gguf.load import load_gguf

    g = load_gguf(str(lfm2_path))
    with pytest.raises(UnsupportedArchitectureError, match=r"'lfm2' .* not implemented on the cuda backend"):
        Lfm2Model(config_from_gguf(g), g, SimpleNamespace(name="cuda"))
