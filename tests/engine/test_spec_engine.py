"""Speculative decoding through the engine: greedy output token-identical to non-speculative decoding (on
a tiny synthetic model in-process, and on both real models), the sampled output distribution unchanged
(chi-square, spec vs non-spec), and the draft-model proposer drafting for its own target."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from edgellm import LLM, SamplingParams
from edgellm.engine.config import EngineConfig
from edgellm.engine.core_process import EngineCoreProc
from edgellm.engine.spec.config import SpeculativeConfig
from edgellm.testing.engine_fakes import chi2_critical, chi2_two_sample
from edgellm.testing.paths import SCRIPTS
from edgellm.testing.synthetic.models import write_tiny_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("spec") / "tiny.gguf", "llama", n_layers=1, seed=4)


def core(path: Path, speculative: SpeculativeConfig | None = None, seqs: int = 16) -> EngineCoreProc:
    spec = EngineConfig(
        str(path), n_ctx=64, kv_cache_memory=1 << 20, max_num_seqs=seqs, speculative=speculative
    )
    return EngineCoreProc(spec)


def run(c: EngineCoreProc, prompts: list[list[int]], params: list[SamplingParams]) -> list[list[int]]:
    eng = c.engine_core
    rids = [eng.add_request(p, sp) for p, sp in zip(prompts, params, strict=True)]
    toks: dict[str, list[int]] = {r: [] for r in rids}
    while eng.has_unfinished():
        for out in eng.step():
            toks[out.request_id] += out.new_token_ids
    return [toks[r] for r in rids]


PROMPT = [5, 17, 42, 99, 7, 5, 17, 42]


def test_greedy_ngram_and_self_draft_equal_plain_decoding_on_a_tiny_model(tiny: Path) -> None:
    prompts = [PROMPT, [1, 2, 3, 1, 2, 3, 1, 2], [40, 41, 40, 41, 40]]
    greedy = [SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)] * 3
    want = run(core(tiny), prompts, greedy)
    ngram = core(tiny, SpeculativeConfig("ngram", num_tokens=3, ngram_min=1))
    assert run(ngram, prompts, greedy) == want
    assert ngram.engine_core.stats().spec_draft_tokens_total > 0
    draft = core(tiny, SpeculativeConfig("draft", num_tokens=4, model=str(tiny), adaptive=False))
    assert run(draft, prompts, greedy) == want
    s = draft.engine_core.stats()
    assert s.spec_accepted_tokens_total == s.spec_draft_tokens_total > 0  # the target drafting for itself
    bm = draft.engine_core.speculator.proposer.bm
    assert bm.num_free_blocks == bm.num_blocks  # finished sequences left no draft KV behind


def test_sampled_output_distribution_is_unchanged_by_speculation(tiny: Path) -> None:
    """300 seeded requests each, 4 tokens at temperature 0.5 among the top 4: the joint of tokens 2-3 and
    the marginals of tokens 2, 3 and 4 have the same distribution with drafts (accepted about half the
    time) as without."""
    n, max_tokens = 300, 4

    def sampled(seed: int) -> SamplingParams:
        return SamplingParams(temperature=0.5, top_k=4, max_tokens=max_tokens, ignore_eos=True, seed=seed)

    params = [sampled(s) for s in range(n)]
    plain = core(tiny, seqs=64)
    # The model drafting for itself: its argmax, which the sampler picks about half the time.
    spec = core(tiny, SpeculativeConfig("draft", num_tokens=3, model=str(tiny), adaptive=False), seqs=64)
    got = run(spec, [PROMPT] * n, params)
    params = [sampled(s + n) for s in range(n)]
    want = run(plain, [PROMPT] * n, params)
    s = spec.engine_core.stats()
    assert 0.2 < s.spec_acceptance_rate < 0.9, s.spec_acceptance_rate
    vocab = plain.config.n_vocab
    for pos in (1, 2, 3):
        a = np.bincount([t[pos] for t in got], minlength=vocab)
        b = np.bincount([t[pos] for t in want], minlength=vocab)
        stat, df = chi2_two_sample(a, b)
        assert df == 0 or stat < chi2_critical(df), (pos, stat, df)
    pairs = sorted(set(Counter((t[1], t[2]) for t in got)) | set(Counter((t[1], t[2]) for t in want)))
    a = np.array([sum(1 for t in got if (t[1], t[2]) == p) for p in pairs])
    b = np.array([sum(1 for t in want if (t[1], t[2]) == p) for p in pairs])
    stat, df = chi2_two_sample(a, b)
    assert df == 0 or stat < chi2_critical(df), (stat, df)


CODE = """def compute_total(items, tax_rate):
    subtotal = 0
    for item in items:
        subtotal += item.price * item.quantity
    return subtotal * (1 + tax_rate)
"""
REAL_PROMPTS = [
    "Repeat this function exactly, with `subtotal` renamed to `base`:\n\n" + CODE + "\nRenamed:\n",
    'Change "age" to 31 and print the JSON again: {"name": "Ann", "age": 30, "city": "Oslo"}\n',
    "The capital of France is",
]


@pytest.mark.parametrize("model", ["smollm2-135m", "gemma3-270m"])
def test_greedy_ngram_is_token_identical_on_real_models(model: str) -> None:
    """The batch-invariant kernels score a verified draft bit-identically to a decode of that token, so
    greedy speculation changes no token; the copy-heavy prompts get drafts accepted."""
    greedy = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    with LLM(model, n_ctx=512) as plain:
        want = [o.token_ids for o in plain.generate(REAL_PROMPTS, greedy)]
    with LLM(model, n_ctx=512, speculative="ngram") as spec:
        got = [o.token_ids for o in spec.generate(REAL_PROMPTS, greedy)]
        stats = spec.stats()
    assert got == want
    assert stats.spec_accepted_tokens_total > 0


def test_layer_draft_keeps_the_chosen_layers_renumbered(tmp_path: Path) -> None:
    """scripts/fixtures/make_layer_draft.py: "0,2" of a 3-layer model is a 2-layer model whose second layer is
    the target's third; all 3 layers, written to another file, draft for the target with every
    draft accepted."""
    import gguf

    sys.path.insert(0, str(SCRIPTS / "fixtures"))
    from make_layer_draft import parse_layers, write_layer_draft

    target = write_tiny_model(tmp_path / "t3.gguf", "llama", n_layers=3, seed=5)
    cut = gguf.GGUFReader(str(write_layer_draft(target, tmp_path / "cut.gguf", "0,2")))
    src = {t.name: t for t in gguf.GGUFReader(str(target)).tensors}
    got = {t.name: t for t in cut.tensors}
    assert cut.fields["llama.block_count"].contents() == 2
    assert not any(name.startswith("blk.2.") for name in got)
    for name, t in got.items():
        want = src[name.replace("blk.1.", "blk.2.", 1)]
        assert np.array_equal(np.asarray(t.data), np.asarray(want.data)), name
    for bad in ("0", "4", "2,1", "0-1,1", "a-b"):
        with pytest.raises(ValueError, match="--layers"):
            parse_layers(bad, 3)
    whole = write_layer_draft(target, tmp_path / "whole.gguf", "0-2")
    draft = core(target, SpeculativeConfig("draft", num_tokens=3, model=str(whole), adaptive=False))
    greedy = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    assert run(draft, [PROMPT], [greedy]) == run(core(target), [PROMPT], [greedy])
    s = draft.engine_core.stats()
    assert s.spec_accepted_tokens_total == s.spec_draft_tokens_total > 0
