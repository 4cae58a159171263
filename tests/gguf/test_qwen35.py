"""Qwen 3.5's per-sequence Gated DeltaNet state (conv window + matrices) through the runner and the engine:
decode steps and prefill chunks continue each sequence's state (llama.cpp's logits token by token; the
same logits in any chunking), sequences batched together keep their own, the state is required where it
matters, and the engine turns off what would need a state it does not keep (prefix-cache hits,
speculative decoding); preempted sequences recompute from a fresh state. The logits over 1,100 tokens:
tests/gguf/test_oracle_cases.py, cases qwen35_* and qwen35moe_*."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from edgellm.engine.conv_state import ConvStates
from edgellm.engine.model_runner import RunItem
from edgellm.testing.oracle.cases import CASES, nmse
from tests.gguf.test_lfm2 import BLOCK, FIXTURES, make_runner, score

VOCAB = 288


@pytest.fixture(scope="module")
def qwen35_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return CASES["qwen35_f32"].write(tmp_path_factory.mktemp("qwen35") / "qwen35_f32.gguf")


@pytest.mark.parametrize("case", ["qwen35_f32", "qwen35moe_f32"])
def test_token_by_token_matches_llamacpp_and_needs_the_state(tmp_path: Path, case: str, monkeypatch) -> None:
    """Every token its own step (the decode path: the state carries each DeltaNet layer's conv window and
    matrices from step to step) gives llama.cpp's logits; starting each step from a zero state does not."""
    ref = np.load(FIXTURES / f"{case}.npz")
    n = 200
    keep = ref["positions"] < n
    ids, pos, want = ref["tokens"][:n].tolist(), ref["positions"][keep], ref["logits"][keep]
    runner = make_runner(CASES[case].write(tmp_path / f"{case}.gguf"))
    table = list(range(-(-n // BLOCK)))
    got = score(runner, ids, [], table)[pos]
    assert nmse(got, want) < 1e-5
    real_gather = ConvStates.gather
    monkeypatch.setattr(ConvStates, "gather", lambda self, k, s: np.zeros_like(real_gather(self, k, s)))
    dropped = score(runner, ids, [], table)[pos]
    assert nmse(dropped[:1], want[:1]) < 1e-5  # the first token has no past either way
    assert nmse(dropped, want) > 1e-2


def test_prefill_chunks_then_decode_equal_one_pass(qwen35_path: Path) -> None:
    runner = make_runner(qwen35_path)
    ids = np.random.default_rng(3).integers(0, VOCAB, 120).tolist()
    table = list(range(8))
    whole = score(runner, ids, [len(ids)], table)
    pieces = score(runner, ids, [5, 1, 2, 64, 17], table)  # then token by token from 89 on
    np.testing.assert_allclose(pieces, whole, rtol=0, atol=2e-5)


def test_batched_sequences_keep_their_own_state(qwen35_path: Path) -> None:
    """Two prompts prefilled in one batch and decoded together give each one's logits alone."""
    runner = make_runner(qwen35_path)
    rng = np.random.default_rng(5)
    a, b = rng.integers(0, VOCAB, 40).tolist(), rng.integers(0, VOCAB, 23).tolist()
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


def _engine(path: Path, kv_cache_memory: int, prefix_caching: bool = True):  # noqa: ANN202 - EngineCoreProc
    from edgellm.engine.config import EngineConfig
    from edgellm.engine.core_process import EngineCoreProc

    spec = EngineConfig(str(path), n_ctx=128, kv_cache_memory=kv_cache_memory, threads=2,
                        enable_prefix_caching=prefix_caching)  # fmt: skip
    return EngineCoreProc(spec)


def _generate(eng, batch: list[list[int]], params, cached: list | None = None) -> list[list[int]]:  # noqa: ANN001
    rids = [eng.add_request(p, params) for p in batch]
    toks: dict[tuple[str, int], list[int]] = {}
    hits: dict[str, int] = {}
    while eng.has_unfinished():
        for out in eng.step():
            toks.setdefault((out.request_id, out.index), []).extend(out.new_token_ids)
            hits[out.request_id] = out.num_cached_tokens
    if cached is not None:
        cached.extend(hits[r] for r in rids)
    return [toks[(r, i)] for r in rids for i in range(params.n)]


def test_engine_batches_forks_frees_and_refuses_speculation(qwen35_path: Path) -> None:
    """Through the engine: concurrent requests (and the n=2 completions of one, forked from its state)
    generate exactly what each does alone, finished and aborted sequences leave no state, and speculative
    decoding is refused naming why."""
    from edgellm import SamplingParams
    from edgellm.engine.config import EngineConfig
    from edgellm.engine.core_process import EngineCoreProc
    from edgellm.engine.spec.config import SpeculativeConfig

    core = _engine(qwen35_path, 1 << 20, prefix_caching=False)
    eng = core.engine_core
    greedy = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    shared = [5, 17, 42, 99, 7, 5, 17, 42] * 3
    prompts = [shared, [1, 2, 3, 4, 5], shared + [8]]
    alone = [_generate(eng, [p], greedy)[0] for p in prompts]
    assert len({tuple(t) for t in alone}) == 3
    assert _generate(eng, prompts, greedy) == alone
    two = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, n=2)
    assert _generate(eng, [prompts[0]], two) == [alone[0], alone[0]]
    eng.step()  # an empty step frees the states of the sequences that finished
    assert len(core.runner.conv_states) <= 1  # the anonymous one (warm-up) at most
    before = len(core.runner.conv_states)
    rid = eng.add_request(prompts[1], SamplingParams(temperature=0.0, max_tokens=50, ignore_eos=True))
    eng.step()
    eng.step()
    assert len(core.runner.conv_states) == before + 1  # the running sequence's state
    eng.abort(rid)
    eng.step()  # an aborted sequence's state is freed too
    assert len(core.runner.conv_states) == before
    spec = SpeculativeConfig("ngram", num_tokens=3, ngram_min=1)
    with pytest.raises(ValueError, match=r"speculative decoding is not supported for qwen35"):
        EngineCoreProc(EngineConfig(str(qwen35_path), n_ctx=128, kv_cache_memory=1 << 20, speculative=spec))


@pytest.mark.parametrize("case", ["qwen35_f32", "lfm2_f32"])
def test_prefix_hits_resume_from_state_checkpoints(tmp_path: Path, case: str) -> None:
    """A prefix-cache hit on a hybrid model goes only as far as a checkpointed state (a whole number of
    blocks its state consumed, engine/conv_state.py): a prompt extending a 70-token one hits 64 tokens (its
    prefill stopped at that block boundary first: Scheduler.align_prefill_ends), a follow-up turn
    extending prompt + 20-token reply hits 80 (a decode step ended there), and each generates exactly what
    an engine without prefix caching does (Qwen 3.5's DeltaNet state, LFM2's conv state)."""
    from edgellm import SamplingParams

    path = CASES[case].write(tmp_path / f"{case}.gguf")

    greedy = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    rng = np.random.default_rng(11)
    first = rng.integers(0, VOCAB, 70).tolist()
    fresh = _engine(path, 1 << 20, prefix_caching=False).engine_core
    reply = _generate(fresh, [first], greedy)[0]
    second = first + rng.integers(0, VOCAB, 10).tolist()
    turn = first + reply + rng.integers(0, VOCAB, 7).tolist()
    want = [reply] + [_generate(fresh, [p], greedy)[0] for p in (second, turn)]
    eng = _engine(path, 1 << 20).engine_core
    cached: list[int] = []
    got = [_generate(eng, [p], greedy, cached)[0] for p in (first, second, turn)]
    assert cached == [0, 64, 80]
    assert got == want
    # the same 64-token prompt twice: its prefill stops at 48 first (the last boundary before its last
    # token, which a hit always leaves to compute), so the second one resumes there
    cached = []
    again = [_generate(eng, [first[:64]], greedy, cached)[0] for _ in range(2)]
    assert cached == [0, 48] and again[0] == again[1] == _generate(fresh, [first[:64]], greedy)[0]
    # without its checkpoints the same blocks are cached, but the hit cannot resume: none is taken
    eng2 = _engine(path, 1 << 20).engine_core
    _generate(eng2, [first], greedy)
    eng2.runner.conv_states._checkpoints.clear()
    cached = []
    assert _generate(eng2, [second], greedy, cached) == [want[1]] and cached == [0]
    # a prefill not stopped at its last block boundary leaves no checkpoint there: no hit either
    eng3 = _engine(path, 1 << 20).engine_core
    eng3.scheduler.align_prefill_ends = False
    cached = []
    assert [_generate(eng3, [p], greedy, cached)[0] for p in (first, second)] == want[:2]
    assert cached == [0, 0]


def test_preempted_sequences_recompute_from_a_fresh_state(qwen35_path: Path) -> None:
    """A KV pool too small for both sequences at once: one is preempted and recomputes from position 0
    (its DeltaNet state restarts from zeros), and both generate what each does alone."""
    from edgellm import SamplingParams

    eng = _engine(qwen35_path, 0).engine_core  # the smallest pool: 9 blocks of 16
    greedy = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    rng = np.random.default_rng(9)
    prompts = [rng.integers(0, VOCAB, 50).tolist(), rng.integers(0, VOCAB, 55).tolist()]
    alone = [_generate(eng, [p], greedy)[0] for p in prompts]
    before = eng.stats().num_preemptions
    assert _generate(eng, prompts, greedy) == alone
    assert eng.stats().num_preemptions > before


def test_other_backends_refuse_qwen35_at_load(qwen35_path: Path) -> None:
    """The recurrence runs on host arrays: a device backend refuses the architecture by name."""
    from edgellm.arch.qwen35 import Qwen35Model
    from edgellm.gguf.config import UnsupportedArchitectureError, config_from_gguf
    from edgellm.gguf.load import load_gguf

    g = load_gguf(str(qwen35_path))
    with pytest.raises(UnsupportedArchitectureError, match=r"'qwen35' .* not implemented on the cuda"):
        Qwen35Model(config_from_gguf(g), g, SimpleNamespace(name="cuda"))


def test_layer_kinds_and_state_shape_follow_the_metadata(qwen35_path: Path) -> None:
    """full_attention_interval 4 over 6 layers: layer 3 attention (the KV cache's one layer), the rest
    DeltaNet; a sequence's state is each DeltaNet layer's conv window (3 x 128 channels) and 4 matrices of
    16 x 16."""
    from edgellm.engine.conv_state import state_shape
    from edgellm.gguf.config import config_from_gguf
    from edgellm.gguf.load import load_gguf

    cfg = config_from_gguf(load_gguf(str(qwen35_path)))
    assert cfg.conv_layers == [True, True, True, False, True, True] and cfg.n_kv_layers == 1
    assert cfg.recurrent and state_shape(cfg) == (5, 3 * 128 + 4 * 16 * 16)


def test_qwen35_pre_tokenizer_keeps_combining_marks_in_words() -> None:
    """tokenizer.ggml.pre 'qwen35' is llama.cpp's LLAMA_VOCAB_PRE_TYPE_QWEN35 regex: Qwen 2's, with
    combining marks (\\p{M}) part of a word rather than of a punctuation run (its ids on a real vocabulary:
    tests/gguf/test_tokenizer.py's pre-variant fixture)."""
    from edgellm.tokenizer.bpe import BpeModel

    def spans(pre: str, text: str) -> list[tuple[int, int]]:
        model = BpeModel(["a"], [], pre)
        return [span for _, span in model._hf.pre_tokenizer.pre_tokenize_str(text)]

    text = "cafe\u0301! nai\u0308ve"
    assert spans("qwen35", text) == [(0, 5), (5, 6), (6, 13)]  # "café", "!", " naïve"
    # "cafe", "\u0301!", " nai", "\u0308ve"
    assert spans("qwen2", text) == [(0, 4), (4, 6), (6, 10), (10, 13)]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"qwen35.rope.dimension_sections": None}, r"missing metadata qwen35\.rope\.dimension_sections"),
        ({"qwen35.ssm.inner_size": 65}, r"qwen35\.ssm\.inner_size = 65 must be ssm\.state_size x"),
        ({"qwen35.ssm.time_step_rank": 3, "qwen35.ssm.inner_size": 48}, r"3 value heads must be a multiple"),
        ({"qwen35.nextn_predict_layers": 6}, r"qwen35\.nextn_predict_layers"),
    ],
)
def test_bad_metadata_is_refused_naming_the_key(tmp_path: Path, overrides: dict, message: str) -> None:
    from edgellm.gguf.config import config_from_gguf
    from edgellm.gguf.load import load_gguf
    from edgellm.gguf.reader import GGUFError
    from edgellm.testing.synthetic.models import write_tiny_model

    model = CASES["qwen35_f32"].model
    path = write_tiny_model(tmp_path / "bad.gguf", "qwen35", "F32", metadata_overrides=overrides, **model)
    with pytest.raises(GGUFError, match=message):
        config_from_gguf(load_gguf(str(path)))


def test_checkpoints_at_block_boundaries_lru() -> None:
    """ConvStates keeps a state copy whenever a sequence's state has consumed whole blocks, under the hash
    of those tokens; resume_point finds the longest such prefix; a sequence without a state resumes from
    it; the oldest checkpoints go first past the budget."""
    tokens = list(range(100, 164))
    one_state = 2 * 4 * 4  # bytes of a (2, 4) float32 state
    st = ConvStates((2, 4), block_size=16, checkpoint_bytes=2 * one_state)  # room for 2
    for end in (10, 16, 32, 48):  # 10: not a block boundary, no checkpoint
        st.store([1], [end], np.full((1, 2, 4), end, np.float32))
        st.checkpoint([1], [end], [tokens])
    assert st.resume_point(tokens, 64) == 48 and st.resume_point(tokens, 47) == 32
    assert st.resume_point(tokens, 31) == 0  # 16's was evicted (least recently used)
    assert st.resume_point([7] + tokens[1:], 64) == 0  # other tokens, other states
    st.resume(2, 32, tokens)
    assert (st.gather([2], [32]) == 32).all()
    st.resume(3, 40, tokens)  # no checkpoint after 40 tokens: gather refuses
    with pytest.raises(ValueError, match=r"sequence 3: computing from position 40, but its conv state is no"):
        st.gather([3], [40])
