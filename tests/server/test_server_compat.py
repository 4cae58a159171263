"""What OpenAI clients and browser front-ends expect beyond the request bodies, on a real server process
driven by the `openai` client: /v1/embeddings, --served-model-name, routes without /v1, CORS, completions
logprobs=0, and the empty completion of "What is an LLM?"."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import openai
import pytest

from edgellm.testing.servers import CTX, MODEL, httpx
from edgellm.testing.servers import serve as _start

ORIGIN = "http://localhost:3000"
NAMES = ("edge", "gpt-4o-mini")  # the first is reported
EOG = {"0": -100, "2": -100, "4": -100}  # SmolLM2's end-of-generation ids
TEXTS = ["Hello world", "The quick brown fox jumps over the lazy dog.", "What is an LLM?"]
N_EMBD = 576  # SmolLM2-135M


@pytest.fixture(scope="module")
def server(smollm2_path: Path) -> Iterator[str]:
    names = [a for n in NAMES for a in ("--served-model-name", n)]
    yield from _start(smollm2_path, *names, "--cors-origin", ORIGIN)


@pytest.fixture(scope="module")
def client(server: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0, timeout=60)


def test_served_model_names_are_the_only_ones_and_the_first_is_reported(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list().data] == list(NAMES)
    for name in NAMES:
        r = client.completions.create(model=name, prompt="Hi", max_tokens=2)
        assert r.model == NAMES[0] and r.usage.completion_tokens == 2
        assert client.models.retrieve(name).id == name
    for unknown in (MODEL, "gpt-4"):
        with pytest.raises(openai.NotFoundError) as exc:
            client.chat.completions.create(model=unknown, messages=[{"role": "user", "content": "x"}])
        assert exc.value.body["code"] == "model_not_found" and unknown in exc.value.body["message"]
        with pytest.raises(openai.NotFoundError):
            client.embeddings.create(model=unknown, input="x")


def test_every_route_also_without_the_v1_prefix(server: str, client: openai.OpenAI) -> None:
    bare = openai.OpenAI(base_url=server, api_key="unused", max_retries=0, timeout=60)
    assert [m.id for m in bare.models.list().data] == list(NAMES)
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    for c in (client, bare):
        chat = c.chat.completions.create(model="edge", messages=msgs, max_tokens=4, temperature=0)
        comp = c.completions.create(model="edge", prompt="Once upon a time", max_tokens=4, temperature=0)
        emb = c.embeddings.create(model="edge", input="Hello")
        assert chat.usage.completion_tokens == 4 and comp.usage.completion_tokens == 4
        assert len(emb.data[0].embedding) == N_EMBD
    assert httpx.get(f"{server}/models/edge").json()["id"] == "edge"


def test_cors_preflight_and_headers_for_the_allowed_origin_only(server: str) -> None:
    pre = {
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type",
    }
    r = httpx.options(f"{server}/v1/chat/completions", headers={"Origin": ORIGIN, **pre})
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] == ORIGIN
    assert "POST" in r.headers["access-control-allow-methods"]
    assert {"authorization", "content-type"} <= {
        h.strip() for h in r.headers["access-control-allow-headers"].split(",")
    }
    other = httpx.options(f"{server}/v1/chat/completions", headers={"Origin": "http://evil.example", **pre})
    # refused by the local-only guard before CORS looks at it (server/http/stack.py), as any request from it
    # is
    assert other.status_code == 403 and "access-control-allow-origin" not in other.headers
    body = {"model": "edge", "prompt": "Hi", "max_tokens": 1}
    ok = httpx.post(f"{server}/v1/completions", json=body, headers={"Origin": ORIGIN})
    assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == ORIGIN
    err = httpx.post(f"{server}/v1/completions", json={**body, "model": "nope"}, headers={"Origin": ORIGIN})
    assert err.status_code == 404 and err.headers["access-control-allow-origin"] == ORIGIN


def test_completion_logprobs_0_and_k_carry_the_sampled_token(client: openai.OpenAI) -> None:
    r = client.completions.create(
        model="edge", prompt="Once upon a time", max_tokens=5, temperature=0, logprobs=0
    )
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == 5 and "".join(lp.tokens) == r.choices[0].text
    assert lp.top_logprobs == [{t: v} for t, v in zip(lp.tokens, lp.token_logprobs, strict=True)]
    # sampled (not greedy): the sampled token first, then the k most likely, up to k + 1 entries as vLLM
    r = client.completions.create(
        model="edge",
        prompt="Once upon a time",
        max_tokens=8,
        temperature=1.5,
        seed=3,
        logprobs=1,
        logit_bias=EOG,
    )
    lp = r.choices[0].logprobs
    for tok, v, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert next(iter(top.items())) == (tok, v) and 1 <= len(top) <= 2
        assert max(top.values()) >= v  # with the most likely token when it was not the one sampled
    assert any(len(top) == 2 for top in lp.top_logprobs), "temperature 1.5 never sampled a non-top token"


def test_what_is_an_llm_is_an_empty_answer_because_the_model_ends_its_turn(client: openai.OpenAI) -> None:
    """SmolLM2-Instruct's most likely first token after "What is an LLM?" is <|im_end|> (p = 0.40; llama.cpp
    picks it too): an end-of-generation token, so the completion is empty and ends as "stop", not "length".
    Its logprob is reported. With the end-of-generation ids banned the same request writes 5 tokens."""
    kw = {"model": "edge", "prompt": "What is an LLM?", "max_tokens": 5, "temperature": 0}
    r = client.completions.create(**kw, logprobs=0)
    c = r.choices[0]
    assert (c.text, c.finish_reason, r.usage.completion_tokens) == ("", "stop", 1)
    assert c.logprobs.tokens == ["<|im_end|>"] and -1.5 < c.logprobs.token_logprobs[0] < -0.5
    chunks = list(client.completions.create(**kw, stream=True))
    assert (
        "".join(ch.choices[0].text for ch in chunks) == "" and chunks[-1].choices[0].finish_reason == "stop"
    )
    banned = client.completions.create(**kw, logit_bias=EOG).choices[0]
    assert banned.finish_reason == "length" and banned.text.strip()


def _vectors(r) -> np.ndarray:  # noqa: ANN001 - an openai CreateEmbeddingResponse
    assert [d.index for d in r.data] == list(range(len(r.data)))
    return np.asarray([d.embedding for d in r.data])


def test_embeddings_through_the_openai_client(server: str, client: openai.OpenAI) -> None:
    # The client asks for base64 unless told otherwise and decodes it itself; "float" is JSON numbers.
    r = client.embeddings.create(model="edge", input=TEXTS)
    batched = _vectors(r)
    assert batched.shape == (3, N_EMBD) and r.model == NAMES[0]
    counts = [httpx.post(f"{server}/tokenize", json={"content": t}).json()["count"] for t in TEXTS]
    assert r.usage.prompt_tokens == r.usage.total_tokens == sum(counts)
    floats = _vectors(client.embeddings.create(model="edge", input=TEXTS, encoding_format="float"))
    np.testing.assert_array_equal(floats, batched)  # base64 and JSON carry the same float32 values
    # Alone or batched: the CPU kernels compute each token's row independently of the batch, so equal
    alone = np.concatenate([_vectors(client.embeddings.create(model="edge", input=t)) for t in TEXTS])
    assert np.abs(alone - batched).max() < 1e-6
    np.testing.assert_allclose(np.linalg.norm(batched, axis=1), 1.0, atol=1e-6)
    assert batched[0] @ batched[0] == pytest.approx(1.0, abs=1e-6)
    assert batched[0] @ batched[1] < 0.99  # different texts are different vectors
    ids = httpx.post(f"{server}/tokenize", json={"content": TEXTS[1]}).json()["tokens"]
    as_ids = _vectors(client.embeddings.create(model="edge", input=[ids, ids[:3]]))
    assert np.abs(as_ids[0] - batched[1]).max() < 1e-6 and as_ids[1] @ batched[1] < 0.99
    same = _vectors(client.embeddings.create(model="edge", input=TEXTS[:1], dimensions=N_EMBD))
    assert np.abs(same[0] - batched[0]).max() < 1e-6


def test_embeddings_base64_is_little_endian_float32_and_errors_name_the_problem(server: str) -> None:
    url = f"{server}/v1/embeddings"
    raw = httpx.post(url, json={"input": TEXTS[:2], "encoding_format": "base64"}).json()
    floats = httpx.post(url, json={"input": TEXTS[:2]}).json()  # the default format is float
    for b, f in zip(raw["data"], floats["data"], strict=True):
        v = np.frombuffer(base64.b64decode(b["embedding"]), dtype="<f4")
        assert v.shape == (N_EMBD,) and v.tolist() == f["embedding"]
    bad = [
        ({"input": "hello " * (CTX + 10)}, f"maximum context length is {CTX}"),
        ({"input": "x", "dimensions": 64}, "'dimensions'"),
        ({"input": "x", "encoding_format": "int8"}, "'encoding_format'"),
        ({"input": []}, "'input'"),
        ({"input": ["a", ""]}, "input 1 is empty"),
        ({"input": [[1, 2], "a"]}, "'input'"),
        ({"input": [10**9]}, "outside the vocabulary"),
    ]
    for body, message in bad:
        r = httpx.post(url, json=body)
        assert r.status_code == 400 and message in r.json()["error"]["message"], (body, r.text)
    assert httpx.post(url, json={"input": "ok"}).status_code == 200  # and it serves on


def test_bad_names_and_origins_are_refused_at_start() -> None:
    from edgellm.server.http.compat import ModelNames, cors_middleware

    for bad in ("", " edge"):
        with pytest.raises(ValueError, match="--served-model-name"):
            ModelNames("smollm2-135m", ["edge", bad])
    with pytest.raises(ValueError, match="--cors-origin 'localhost'"):
        cors_middleware(["localhost"])
    assert cors_middleware([]) == [] and len(cors_middleware(["*"])) == 1
    names = ModelNames("/models/SmolLM2.Q4_1.gguf", ["a", "b", "a"])
    assert (names.primary, names.listed, names.strict) == ("a", ["a", "b"], True)
    assert ModelNames("/models/SmolLM2.Q4_1.gguf").primary == "SmolLM2.Q4_1"
