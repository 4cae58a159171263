"""BERT-family encoders against llama.cpp (tests/fixtures/encoders/<case>.json, written by
scripts/fixtures/make_encoder_fixtures.py): WordPiece ids equal to llama.cpp's, pooled vectors with cosine
>= 0.999 for every input (2 to ~120 tokens, all inputs batched through the engine as one request), per-token
vectors for pooling none, rerank scores within 1e-3 and in the same order. Figures: `pytest -s` prints them.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from edgellm.arch.registry import supported_architectures
from edgellm.gguf.load import load_gguf
from edgellm.testing.encoder_oracle import (
    CASES,
    cosine,
    embed_edgellm,
    sha256,
    token_states_edgellm,
)
from edgellm.testing.synthetic.encoder import ENCODER_ARCHS
from edgellm.tokenizer import Tokenizer

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "encoders"
MIN_COSINE = 0.999
# What the cases reach (1 - cosine <= 2e-8 measured: both sides compute in float32 from the same weights),
# checked too: leaving ALiBi or rope out moves a mean-pooled vector by only ~1e-4 of cosine
STRICT = 1e-6
MAX_SCORE_DIFF = 1e-3


def _fixture(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def _write(name: str, tmp_path: Path) -> Path:
    path = CASES[name].write(tmp_path / f"{name}.gguf")
    assert sha256(path) == _fixture(name)["sha256"], f"{name}: the writer changed; regenerate the fixture"
    return path


def test_every_encoder_has_cases_and_fixtures() -> None:
    encoders = {a for a in supported_architectures() if a in ENCODER_ARCHS}
    assert encoders == set(ENCODER_ARCHS)
    assert {c.arch for c in CASES.values()} == encoders
    missing = [n for n in CASES if not (FIXTURES / f"{n}.json").exists()]
    assert not missing, f"no fixture for {missing}: run scripts/fixtures/make_encoder_fixtures.py"


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if c.pooling != 4])
def test_wordpiece_ids_match_llamacpp(name: str, tmp_path: Path) -> None:
    fx = _fixture(name)
    tok = Tokenizer.from_metadata(load_gguf(str(_write(name, tmp_path))).metadata)
    for text, ids in zip(fx["texts"], fx["ids"], strict=True):
        assert tok.encode(text, add_special=True) == ids, text


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if c.pooling in (1, 2, 3)])
def test_pooled_vectors_match_llamacpp(name: str, tmp_path: Path) -> None:
    fx = _fixture(name)
    path = _write(name, tmp_path)
    got = embed_edgellm(path, fx["ids"])  # every input at once: batched in the engine's steps
    cos = [cosine(g, r) for g, r in zip(got, fx["vectors"], strict=True)]
    print(f"{name}: lengths {[len(x) for x in fx['ids']]} 1 - cosine {[f'{1 - c:.1e}' for c in cos]}")
    assert min(cos) >= MIN_COSINE, cos
    assert 1 - min(cos) <= STRICT, cos
    for v in got:  # llama-server's default normalisation (L2)
        assert abs(float(np.linalg.norm(v)) - 1.0) < 1e-5
    alone = embed_edgellm(path, [fx["ids"][2]])[0]  # batching changes nothing
    assert cosine(alone, got[2]) > 0.99999


def test_token_vectors_match_llamacpp_with_pooling_none(tmp_path: Path) -> None:
    fx = _fixture("bert_none")
    path = _write("bert_none", tmp_path)
    worst = 1.0
    for ids, ref in zip(fx["ids"], fx["vectors"], strict=True):
        got = token_states_edgellm(path, ids)
        assert got.shape == np.asarray(ref).shape
        worst = min(worst, *(cosine(g, r) for g, r in zip(got, ref, strict=True)))
    print(f"bert_none: worst per-token 1 - cosine {1 - worst:.1e}")
    assert worst >= MIN_COSINE and 1 - worst <= STRICT


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if c.pooling == 4])
def test_rerank_scores_match_llamacpp(name: str, tmp_path: Path) -> None:
    fx = _fixture(name)
    path = _write(name, tmp_path)
    got = np.array([v[0] for v in embed_edgellm(path, fx["ids"])])
    ref = np.array(fx["scores"])
    print(f"{name}: scores {np.round(got, 5).tolist()} llama.cpp {np.round(ref, 5).tolist()}")
    print(f"{name}: max |diff| {np.abs(got - ref).max():.2e}")
    assert np.abs(got - ref).max() <= MAX_SCORE_DIFF
    assert np.argsort(-got).tolist() == np.argsort(-ref).tolist()


def test_rerank_prompt_is_llama_servers(tmp_path: Path) -> None:
    """LLM.rerank_ids builds the ids the fixture's scores were computed for ([CLS] query [SEP] doc)."""
    from edgellm.llm_inputs import InputRequestsMixin

    fx = _fixture("bert_rerank")
    g = load_gguf(str(_write("bert_rerank", tmp_path)))
    front = InputRequestsMixin()
    front.tokenizer, front.metadata, front.n_ctx = Tokenizer.from_metadata(g.metadata), g.metadata, 128
    front.config = None  # type: ignore[assignment]
    for doc, ids in zip(fx["documents"], fx["ids"], strict=True):
        assert front.rerank_ids(fx["query"], doc) == ids


@pytest.mark.parametrize(
    ("name", "feature", "off"),
    [("jina_bert_v2_mean", "alibi_max_bias", 0.0), ("nomic_bert_mean", "rope", False)],
)
def test_the_match_depends_on_the_feature(
    name: str, feature: str, off: object, tmp_path: Path, monkeypatch
) -> None:
    """Without ALiBi (jina-bert-v2) or rope (nomic-bert) the vectors leave llama.cpp's."""
    from edgellm.arch.registry import model_classes

    fx = _fixture(name)
    path = _write(name, tmp_path)
    monkeypatch.setattr(model_classes()[CASES[name].arch], feature, off)
    got = embed_edgellm(path, fx["ids"])
    assert max(1 - cosine(g, r) for g, r in zip(got, fx["vectors"], strict=True)) > 10 * STRICT


def test_rerank_prompt_from_the_gguf_template(tmp_path: Path) -> None:
    """tokenizer.chat_template.rerank, where the GGUF has one: {query} and {document} put in, special-token
    text in it parsed, no [CLS]/[SEP] added (llama-server's format_prompt_rerank)."""
    from edgellm.llm_inputs import InputRequestsMixin

    g = load_gguf(str(_write("bert_rerank", tmp_path)))
    front = InputRequestsMixin()
    front.tokenizer, front.n_ctx = Tokenizer.from_metadata(g.metadata), 128
    front.metadata = {**g.metadata, "tokenizer.chat_template.rerank": "[CLS]{query}[SEP]{document}[SEP]"}
    tok = front.tokenizer
    q, d = tok.encode("the cat", add_special=True)[1:-1], tok.encode("a dog", add_special=True)[1:-1]
    assert front.rerank_ids("the cat", "a dog") == [101, *q, 102, *d, 102]


def test_qwen3_reranker_matches_llamacpp(tmp_path: Path) -> None:
    """A Qwen3-Reranker-shaped decoder (cls.output, pooling rank): the prompt from the GGUF's rerank
    template as llama.cpp tokenizes it, P(yes) at the last token within 1e-3 of llama.cpp's and in the same
    order, each input computed in chunks of 64 tokens."""
    from edgellm.llm_inputs import InputRequestsMixin
    from edgellm.testing.encoder_oracle import QWEN3_RERANK_CTX, write_qwen3_reranker

    fx = _fixture("qwen3_rerank")
    path = write_qwen3_reranker(tmp_path / "qwen3_rerank.gguf")
    assert sha256(path) == fx["sha256"], "the writer changed; regenerate the fixture"
    g = load_gguf(str(path))
    front = InputRequestsMixin()
    front.tokenizer, front.metadata, front.n_ctx = Tokenizer.from_metadata(g.metadata), g.metadata, 512
    for doc, ids in zip(fx["documents"], fx["ids"], strict=True):
        assert front.rerank_ids(fx["query"], doc) == ids
    got = np.array([v[0] for v in embed_edgellm(path, fx["ids"], QWEN3_RERANK_CTX)])
    ref = np.array(fx["scores"])
    print(f"qwen3_rerank: scores {np.round(got, 5).tolist()} llama.cpp {np.round(ref, 5).tolist()}")
    print(f"qwen3_rerank: max |diff| {np.abs(got - ref).max():.2e}")
    assert np.abs(got - ref).max() <= MAX_SCORE_DIFF
    assert np.argsort(-got).tolist() == np.argsort(-ref).tolist()


def test_wordpiece_on_llamacpps_bge_vocabulary() -> None:
    """llama.cpp's own WordPiece test (test-tokenizer-0 on models/ggml-vocab-bert-bge.gguf: bge-small's
    30,522-token vocabulary): every one of its texts gives the ids it expects."""
    import gzip

    with gzip.open(FIXTURES / "bge_vocab.json.gz", "rt", encoding="utf-8") as f:
        data = json.load(f)
    tok = Tokenizer.from_metadata(data["metadata"])
    assert len(data["texts"]) > 40
    for text, ids in zip(data["texts"], data["ids"], strict=True):
        assert tok.encode(text, add_special=False, parse_special=True) == ids, text


def test_an_input_of_the_whole_context_runs_in_one_step(tmp_path: Path) -> None:
    """128 tokens on a 128-token encoder (its last position embedding): one step, with other inputs."""
    path = _write("bert_mean", tmp_path)
    long = [101] + [104] * 126 + [102]
    got = embed_edgellm(path, [long, [101, 104, 102], long[:64]])
    alone = embed_edgellm(path, [long])[0]
    assert cosine(got[0], alone) > 0.99999 and cosine(got[0], got[2]) < 0.9999


def test_the_engine_refuses_what_an_encoder_cannot_do(tmp_path: Path) -> None:
    from edgellm.engine.checks import EmbeddingOnlyError
    from edgellm.sampling.sampler import SamplingParams
    from edgellm.testing.encoder_oracle import engine_core

    engine = engine_core(_write("bert_mean", tmp_path))
    with pytest.raises(EmbeddingOnlyError, match="embedding-only encoder"):
        engine.add_request([101, 104, 102], SamplingParams(max_tokens=2))
    with pytest.raises(EmbeddingOnlyError):
        engine.add_score_request([101, 104, 102])
    with pytest.raises(ValueError, match="input has 129 tokens"):
        engine.add_embedding_request([101] * 129)
    none = engine_core(_write("bert_none", tmp_path))
    with pytest.raises(ValueError, match="pooling type is 'none'"):
        none.add_embedding_request([101, 104, 102])
    assert not engine.has_unfinished() and not none.has_unfinished()


def test_encoders_are_refused_on_other_backends(tmp_path: Path) -> None:
    """Not yet checked on a device: refused at load naming the backend, never run unchecked."""
    from edgellm.arch.registry import model_classes
    from edgellm.backends.cpu.backend import CpuBackend
    from edgellm.gguf.config import config_from_gguf
    from edgellm.gguf.model_config import UnsupportedArchitectureError

    g = load_gguf(str(_write("bert_mean", tmp_path)))
    be = CpuBackend()
    be.name = "cuda"  # what the model sees of a device backend here
    with pytest.raises(UnsupportedArchitectureError, match="CPU backend only"):
        model_classes()["bert"](config_from_gguf(g), g, be)
