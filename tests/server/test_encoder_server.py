"""`edgellm serve` on encoder models (tiny bert files): /v1/embeddings through the official openai client,
Ollama's /api/embed, llama-server's /v1/rerank and /rerank over plain HTTP, and the 400s that name the
problem (generation on an embedding-only model, rerank on a non-reranker, embeddings on a reranker)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest

from edgellm.testing.encoder_oracle import cosine, embed_edgellm
from edgellm.testing.servers import start_server, stop_server
from edgellm.testing.synthetic.encoder import write_tiny_encoder
from edgellm.tokenizer import Tokenizer

TEXTS = ["Hello world!", "The quick brown fox sat on the mat.", "Café: the capital of France?"]
QUERY = "what is the capital of france?"
DOCS = ["the cat sat on the mat.", "paris is the capital of france.", "hello", "a quick brown fox"]


def _serve(model: Path) -> Iterator[str]:
    proc, url = start_server(str(model), "--ctx", "128", "--threads", "1")
    try:
        yield url
    finally:
        stop_server(proc)


@pytest.fixture(scope="module")
def bert_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_encoder(tmp_path_factory.mktemp("enc") / "bert.gguf", "bert", pooling=1)


@pytest.fixture(scope="module")
def rerank_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_encoder(tmp_path_factory.mktemp("enc") / "rerank.gguf", "bert", reranker=True, seed=4)


@pytest.fixture(scope="module")
def bert_server(bert_model: Path) -> Iterator[str]:
    yield from _serve(bert_model)


@pytest.fixture(scope="module")
def rerank_server(rerank_model: Path) -> Iterator[str]:
    yield from _serve(rerank_model)


def _ids(model: Path, texts: list[str]) -> list[list[int]]:
    from edgellm.gguf.load import load_gguf

    tok = Tokenizer.from_metadata(load_gguf(str(model)).metadata)
    return [tok.encode(t, add_special=True) for t in texts]


def test_openai_client_embeddings(bert_server: str, bert_model: Path) -> None:
    client = openai.OpenAI(base_url=f"{bert_server}/v1", api_key="unused", max_retries=0, timeout=120)
    resp = client.embeddings.create(model="bert", input=TEXTS)  # base64 on the wire, as the client asks
    got = [np.array(d.embedding) for d in resp.data]
    ref = embed_edgellm(bert_model, _ids(bert_model, TEXTS))
    assert [d.index for d in resp.data] == [0, 1, 2]
    assert min(cosine(g, r) for g, r in zip(got, ref, strict=True)) > 0.99999
    assert all(abs(np.linalg.norm(g) - 1) < 1e-5 for g in got)
    assert resp.usage.prompt_tokens == sum(len(x) for x in _ids(bert_model, TEXTS))


def test_ollama_show_says_embedding(bert_server: str) -> None:
    r = httpx.post(f"{bert_server}/api/show", json={"model": "bert"}, timeout=60)
    assert r.status_code == 200 and r.json()["capabilities"] == ["embedding"], r.text


def test_ollama_embed(bert_server: str, bert_model: Path) -> None:
    r = httpx.post(f"{bert_server}/api/embed", json={"model": "bert", "input": TEXTS[:2]}, timeout=120)
    assert r.status_code == 200, r.text
    ref = embed_edgellm(bert_model, _ids(bert_model, TEXTS[:2]))
    got = r.json()["embeddings"]
    assert min(cosine(g, x) for g, x in zip(got, ref, strict=True)) > 0.99999


def test_langchain_ollama_embeddings(bert_server: str, bert_model: Path) -> None:
    from langchain_ollama import OllamaEmbeddings

    emb = OllamaEmbeddings(model="bert", base_url=bert_server)
    docs = emb.embed_documents(TEXTS)
    query = emb.embed_query(TEXTS[0])
    ref = embed_edgellm(bert_model, _ids(bert_model, TEXTS))
    assert min(cosine(g, r) for g, r in zip(docs, ref, strict=True)) > 0.99999
    assert cosine(query, ref[0]) > 0.99999


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
        ("/v1/completions", {"prompt": "hi", "max_tokens": 2}),
        ("/api/generate", {"model": "bert", "prompt": "hi", "stream": False}),
    ],
)
def test_generation_on_an_encoder_is_a_400(bert_server: str, path: str, body: dict) -> None:
    r = httpx.post(bert_server + path, json=body, timeout=120)
    assert r.status_code == 400, r.text
    assert "embedding-only" in r.text


def test_rerank_on_an_embedding_model_is_a_400(bert_server: str) -> None:
    r = httpx.post(f"{bert_server}/v1/rerank", json={"query": QUERY, "documents": DOCS}, timeout=120)
    assert r.status_code == 400, r.text
    assert "not a reranker" in r.text


def test_rerank(rerank_server: str, rerank_model: Path) -> None:
    body = {"model": "rerank", "query": QUERY, "documents": DOCS, "top_n": 3, "return_documents": True}
    r = httpx.post(f"{rerank_server}/v1/rerank", json=body, timeout=120)
    assert r.status_code == 200, r.text
    out = r.json()
    from edgellm.gguf.load import load_gguf

    tok = Tokenizer.from_metadata(load_gguf(str(rerank_model)).metadata)
    q = tok.encode(QUERY, parse_special=False)
    ids = [[101, *q, 102, *tok.encode(d, parse_special=False)] for d in DOCS]
    ref = np.array([v[0] for v in embed_edgellm(rerank_model, ids)])
    order = np.argsort(-ref)[:3].tolist()
    assert [x["index"] for x in out["results"]] == order
    assert np.allclose([x["relevance_score"] for x in out["results"]], ref[order], atol=1e-5)
    assert [x["document"]["text"] for x in out["results"]] == [DOCS[i] for i in order]
    assert out["usage"]["prompt_tokens"] == sum(len(x) for x in ids)
    assert out["model"] == "rerank"
    # llama-server's other path, every document, none returned
    r = httpx.post(f"{rerank_server}/rerank", json={"query": QUERY, "documents": DOCS}, timeout=120)
    plain = r.json()["results"]
    assert len(plain) == len(DOCS) and "document" not in plain[0]
    assert [x["relevance_score"] for x in plain] == sorted(
        (x["relevance_score"] for x in plain), reverse=True
    )


def test_rerank_tei_and_cohere_shapes(rerank_server: str) -> None:
    """TEI's body ("texts") gets TEI's answer, a bare list of {index, score, text}; Cohere's documents as
    {"text": ...} objects score as the strings do."""
    tei = httpx.post(
        f"{rerank_server}/rerank", json={"query": QUERY, "texts": DOCS, "return_text": True}, timeout=120
    )
    assert tei.status_code == 200, tei.text
    rows = tei.json()
    assert isinstance(rows, list) and [r["text"] for r in rows] == [DOCS[r["index"]] for r in rows]
    objs = [{"text": d} for d in DOCS]
    cohere = httpx.post(f"{rerank_server}/v1/rerank", json={"query": QUERY, "documents": objs}, timeout=120)
    assert [(r["index"], r["relevance_score"]) for r in cohere.json()["results"]] == [
        (r["index"], r["score"]) for r in rows
    ]


@pytest.mark.parametrize(
    ("body", "needle"),
    [({"documents": DOCS}, '\\"query\\" must be provided'), ({"query": QUERY, "documents": []}, "non-empty")],
)
def test_rerank_bad_requests(rerank_server: str, body: dict, needle: str) -> None:
    r = httpx.post(f"{rerank_server}/v1/rerank", json=body, timeout=120)
    assert r.status_code == 400 and needle in r.text, r.text


def test_embeddings_on_a_reranker_is_a_400(rerank_server: str) -> None:
    r = httpx.post(f"{rerank_server}/v1/embeddings", json={"input": "hello"}, timeout=120)
    assert r.status_code == 400 and "reranker" in r.text, r.text


def test_encoders_beside_a_chat_model_in_a_multi_model_server(
    tmp_path: Path, bert_model: Path, rerank_model: Path
) -> None:
    from edgellm.testing.synthetic.models import write_tiny_model

    chat = str(write_tiny_model(tmp_path / "chat.gguf", "llama", seed=1))
    emb, rr = str(bert_model), str(rerank_model)
    router, url = start_server(
        None, "--models", f"{chat},{emb},{rr}", "--ctx", "128", "--kv-cache-memory", "1M"
    )
    try:
        e = httpx.post(f"{url}/v1/embeddings", json={"model": emb, "input": TEXTS}, timeout=300)
        assert e.status_code == 200, e.text
        assert len(e.json()["data"]) == len(TEXTS)
        r = httpx.post(f"{url}/rerank", json={"model": rr, "query": QUERY, "documents": DOCS}, timeout=300)
        assert r.status_code == 200 and len(r.json()["results"]) == len(DOCS), r.text
        c = httpx.post(
            f"{url}/v1/completions", json={"model": chat, "prompt": "hi", "max_tokens": 2}, timeout=300
        )
        assert c.status_code == 200, c.text
        bad = httpx.post(
            f"{url}/v1/completions", json={"model": emb, "prompt": "hi", "max_tokens": 2}, timeout=300
        )
        assert bad.status_code == 400 and "embedding-only" in bad.text, bad.text
        bad = httpx.post(
            f"{url}/v1/rerank", json={"model": chat, "query": QUERY, "documents": DOCS}, timeout=300
        )
        assert bad.status_code == 400 and "not a reranker" in bad.text, bad.text
    finally:
        stop_server(router)
