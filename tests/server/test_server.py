"""The OpenAI-compatible server as a real process on 127.0.0.1, driven by the official `openai` client
(and raw httpx where the client would hide the HTTP details)."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from edgellm.testing.servers import CTX, MODEL, MSGS, NO_EOS, httpx
from edgellm.testing.servers import metrics as _metrics
from edgellm.testing.servers import serve as _start

BODY_LIMIT = 65536


@pytest.fixture(scope="module")
def server(smollm2_path: Path) -> Iterator[str]:
    yield from _start(
        smollm2_path, "--max-num-seqs", "16", "--max-queue", "16", "--max-body-bytes", str(BODY_LIMIT)
    )


@pytest.fixture(scope="module")
def client(server: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0, timeout=60)


def test_models_health_tokenize(server: str, client: openai.OpenAI) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    # one model and no --served-model-name: any name is answered, under the served one
    r = client.completions.create(model="gpt-4", prompt="Hi", max_tokens=1)
    assert r.model == MODEL and client.models.retrieve("placeholder").id == MODEL
    # no --cors-origin: a page of another origin is refused, preflight or not; no CORS headers
    pre = {"Origin": "http://localhost:3000", "Access-Control-Request-Method": "POST"}
    r = httpx.options(f"{server}/v1/completions", headers=pre)
    assert r.status_code == 403 and "access-control-allow-origin" not in r.headers
    r = httpx.options(f"{server}/v1/completions")  # no Origin: no preflight to answer
    assert r.status_code == 405 and "access-control-allow-origin" not in r.headers
    assert httpx.get(f"{server}/health").json()["status"] == "ok"
    ids = httpx.post(f"{server}/tokenize", json={"content": "Hello world"}).json()["tokens"]
    assert httpx.post(f"{server}/detokenize", json={"tokens": ids}).json()["content"] == "Hello world"


def test_chat_equals_completion_of_rendered_prompt_and_streams_the_same(
    server: str, client: openai.OpenAI
) -> None:
    chat = client.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=12, temperature=0)
    text = chat.choices[0].message.content
    assert chat.object == "chat.completion" and chat.id.startswith("chatcmpl-") and chat.model == MODEL
    assert text and chat.choices[0].finish_reason == "length" and chat.usage.completion_tokens == 12
    tok = httpx.post(f"{server}/tokenize", json={"messages": MSGS}).json()
    assert chat.usage.prompt_tokens == tok["count"]
    # the chat endpoint is the completion of the template-rendered prompt, token for token
    comp = client.completions.create(model=MODEL, prompt=tok["tokens"], max_tokens=12, temperature=0)
    assert comp.id.startswith("cmpl-") and comp.choices[0].text == text
    chunks = list(
        client.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=12, temperature=0, stream=True)
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == text
    assert chunks[-1].choices[0].finish_reason == "length" and all(c.usage is None for c in chunks)
    with_usage = list(
        client.chat.completions.create(
            model=MODEL,
            messages=MSGS,
            max_tokens=12,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert with_usage[-1].choices == [] and with_usage[-1].usage.completion_tokens == 12
    assert with_usage[-1].usage.prompt_tokens == chat.usage.prompt_tokens
    # the same prompt again is served from the prefix cache
    assert with_usage[-1].usage.prompt_tokens_details.cached_tokens > 0
    stream = client.completions.create(
        model=MODEL, prompt=tok["tokens"], max_tokens=12, temperature=0, stream=True
    )
    assert "".join(c.choices[0].text for c in stream) == text


def test_n2_seed_and_stop(client: openai.OpenAI) -> None:
    def sample(seed: int) -> list[str]:
        r = client.chat.completions.create(
            model=MODEL, messages=MSGS, max_tokens=16, n=2, seed=seed, temperature=1.0
        )
        assert [c.index for c in r.choices] == [0, 1]
        return [c.message.content for c in r.choices]

    a = sample(1234)
    assert sample(1234) == a and a[0] != a[1]
    assert sample(99) != a
    prompt = "The quick brown fox jumps over the lazy dog. The quick brown"
    full = client.completions.create(model=MODEL, prompt=prompt, max_tokens=16, temperature=0).choices[0].text
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    assert len(stop.strip()) > 0
    cut = client.completions.create(model=MODEL, prompt=prompt, max_tokens=16, temperature=0, stop=[stop])
    assert cut.choices[0].text == full[: full.index(stop)] and cut.choices[0].finish_reason == "stop"


def test_logprobs(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model=MODEL, messages=MSGS, max_tokens=8, temperature=0, logprobs=True, top_logprobs=3
    )
    content = r.choices[0].logprobs.content
    assert len(content) == 8 and "".join(e.token for e in content) == r.choices[0].message.content
    for e in content:  # greedy: the chosen token is the most likely one
        assert len(e.top_logprobs) == 3 and e.top_logprobs[0].token == e.token
        assert e.logprob == pytest.approx(e.top_logprobs[0].logprob) and e.logprob <= 0
        assert bytes(e.bytes).decode() == e.token
    c = client.completions.create(
        model=MODEL, prompt="Once upon a time", max_tokens=6, temperature=0, logprobs=2
    )
    lp = c.choices[0].logprobs
    assert len(lp.tokens) == 6 and "".join(lp.tokens) == c.choices[0].text
    assert all(len(t) == 2 for t in lp.top_logprobs) and lp.text_offset[0] == 0


def test_16_concurrent_streams(client: openai.OpenAI, server: str) -> None:
    prompts = [f"Count from {k} to {k + 5}:" for k in range(4)]
    refs = [
        client.completions.create(model=MODEL, prompt=p, max_tokens=8, temperature=0).choices[0].text
        for p in prompts
    ]
    aclient = openai.AsyncOpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0, timeout=60)

    async def one(i: int) -> tuple[str, str | None]:
        stream = await aclient.completions.create(
            model=MODEL, prompt=prompts[i % 4], max_tokens=8, temperature=0, stream=True
        )
        text, reason = "", None
        async for chunk in stream:
            text += chunk.choices[0].text
            reason = chunk.choices[0].finish_reason or reason
        return text, reason

    async def run_all() -> list[tuple[str, str | None]]:
        try:
            return await asyncio.gather(*(one(i) for i in range(16)))
        finally:
            await aclient.close()

    results = asyncio.run(run_all())
    assert [t for t, _ in results] == [refs[i % 4] for i in range(16)]
    assert all(r == "length" for _, r in results)


KILLED_CLIENT = """
import sys, openai
c = openai.OpenAI(base_url=sys.argv[1] + "/v1", api_key="x", max_retries=0)
no_eos = {"0": -100, "2": -100, "4": -100}  # SmolLM2's end-of-generation ids: it must keep going
stream = c.completions.create(
    model=sys.argv[2], prompt="Once upon a time", max_tokens=200, stream=True, logit_bias=no_eos
)
for chunk in stream:
    if chunk.choices and chunk.choices[0].text:
        print("streaming", flush=True)
"""


def test_killed_client_frees_its_request(server: str) -> None:
    idle = _metrics(server)
    assert idle["edgellm_num_requests_running"] == 0
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_CLIENT, server, MODEL],
        stdout=subprocess.PIPE,
        text=True,
        env=os.environ,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "streaming"
        busy = _metrics(server)
        assert busy["edgellm_num_requests_running"] == 1 and busy["edgellm_kv_cache_blocks_used"] > 0
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 5
    while True:
        now = _metrics(server)
        if (
            now["edgellm_num_requests_running"] == 0
            and now["edgellm_kv_cache_blocks_used"] == idle["edgellm_kv_cache_blocks_used"]
        ):
            break
        assert time.monotonic() < deadline, "the killed client's request was not freed"
        time.sleep(0.05)
    assert now["edgellm_kv_cache_usage_ratio"] == idle["edgellm_kv_cache_usage_ratio"]
    assert now["edgellm_num_requests_waiting"] == 0
    # it was aborted, not run to its 200 tokens
    assert now["edgellm_generation_tokens_total"] - busy["edgellm_generation_tokens_total"] < 150


def _wait_idle(url: str, idle: dict[str, float], what: str) -> dict[str, float]:
    deadline = time.monotonic() + 10
    while True:
        now = _metrics(url)
        if (
            now["edgellm_num_requests_running"] == 0
            and now["edgellm_num_requests_waiting"] == 0
            and now["edgellm_kv_cache_blocks_used"] == idle["edgellm_kv_cache_blocks_used"]
        ):
            return now
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_streams_dropped_after_the_role_chunk_keep_it_serving(server: str, client: openai.OpenAI) -> None:
    # A client that reads the first SSE chunk and hangs up cancels the handler while the engine may still be
    # taking its request: that cancellation must neither kill the engine nor leak the request.
    idle = _metrics(server)
    body = {"model": MODEL, "messages": MSGS, "max_tokens": 64, "stream": True, "logit_bias": NO_EOS}
    for _ in range(50):
        with httpx.Client(timeout=30) as c, c.stream("POST", f"{server}/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            first = next(r.iter_lines())
            assert first.startswith("data: ") and '"role"' in first
    ok = client.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=4)
    assert ok.usage.completion_tokens == 4
    assert httpx.get(f"{server}/health").status_code == 200
    _wait_idle(server, idle, "dropped streams left requests or KV blocks behind")


ERROR_CASES = [
    # (method, path, body or raw bytes, status, substring of the message)
    ("POST", "/v1/chat/completions", b"{not json", 400, "malformed JSON"),
    ("POST", "/v1/chat/completions", {"messages": MSGS, "max_tokens": "5"}, 400, "'max_tokens'"),
    ("POST", "/v1/chat/completions", {"messages": MSGS, "temperature": True}, 400, "'temperature'"),
    ("POST", "/v1/chat/completions", {"messages": "hi"}, 400, "'messages'"),
    ("POST", "/v1/completions", {"prompt": "hello " * (CTX + 10)}, 400, f"maximum context length is {CTX}"),
    ("POST", "/v1/embeddings", {"input": "hello " * (CTX + 10)}, 400, f"maximum context length is {CTX}"),
    ("GET", "/v1/nothing-here", None, 404, "Not Found"),
    ("POST", "/v1/completions", b'{"prompt": "' + b"a" * BODY_LIMIT + b'"}', 413, "exceeds"),
]


@pytest.mark.parametrize("method,path,body,status,message", ERROR_CASES)
def test_errors_then_next_request_succeeds(
    server: str, client: openai.OpenAI, method: str, path: str, body: object, status: int, message: str
) -> None:
    kw = {"content": body} if isinstance(body, bytes) else {"json": body} if body is not None else {}
    r = httpx.request(method, f"{server}{path}", timeout=30, **kw)
    assert r.status_code == status
    err = r.json()["error"]
    assert message in err["message"] and set(err) == {"message", "type", "param", "code"}
    if status == 400 and "context length" in message:
        assert re.search(r"resulted in \d+ tokens", err["message"])
    ok = client.completions.create(model=MODEL, prompt="Hi", max_tokens=2)
    assert ok.usage.completion_tokens == 2


FIELD_CASES = [
    ("/v1/chat/completions", {"bogus_option": 1}, "'bogus_option': unrecognized request argument"),
    ("/v1/completions", {"messages": MSGS}, "'messages': unrecognized request argument"),
    ("/v1/chat/completions", {"modalities": ["text", "audio"]}, "'modalities'"),
    ("/v1/chat/completions", {"audio": {"voice": "alloy", "format": "wav"}}, "'audio': audio output"),
    ("/v1/chat/completions", {"web_search_options": {}}, "'web_search_options': web search"),
    ("/v1/chat/completions", {"prediction": {"type": "content", "content": "x"}}, "'prediction'"),
    ("/v1/chat/completions", {"store": True}, "'store': stored completions"),
    ("/v1/completions", {"best_of": 3}, "'best_of'"),
]


@pytest.mark.parametrize("path,extra,message", FIELD_CASES)
def test_a_field_the_server_does_not_act_on_is_a_400_naming_it(
    server: str, path: str, extra: dict, message: str
) -> None:
    """As OpenAI answers an unknown field ("Unrecognized request argument supplied"), and an option we
    do not act on is never dropped; fields that change nothing in the output (identifiers, routing hints,
    store false, text-only modalities, null anything) are accepted."""
    base = {"messages": MSGS} if "chat" in path else {"prompt": "Hi"}
    r = httpx.post(f"{server}{path}", json={**base, "max_tokens": 2, **extra}, timeout=30)
    err = r.json()["error"]
    assert r.status_code == 400 and message in err["message"] and err["param"] == next(iter(extra))
    harmless = {"user": "u", "cache_prompt": True, "not_a_field": None}
    if "chat" in path:
        harmless |= {"store": False, "modalities": ["text"], "metadata": {"k": "v"}, "service_tier": "auto"}
        harmless |= {"safety_identifier": "s", "prompt_cache_key": "k"}
    ok = httpx.post(f"{server}{path}", json={**base, "max_tokens": 2, **harmless}, timeout=30)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2


def test_the_openai_client_gets_a_bad_request_for_an_unknown_field(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="mirostat"):  # llama-server's; not honoured here
        client.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=2, extra_body={"mirostat": 2})


@pytest.fixture(scope="module")
def guarded_server(smollm2_path: Path) -> Iterator[str]:
    # --kv-cache-memory 0: the smallest cache that holds one context (CTX / 16 + 1 blocks)
    limits = ("--max-num-seqs", "1", "--max-queue", "1", "--kv-cache-memory", "0")
    yield from _start(smollm2_path, "--api-key", "s3cret", *limits)


def test_api_key_and_queue_full(guarded_server: str) -> None:
    url = guarded_server
    for key in ("wrong", None):
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        r = httpx.get(f"{url}/v1/models", headers=headers)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    good = openai.OpenAI(base_url=f"{url}/v1", api_key="s3cret", max_retries=0)
    assert good.models.list().data[0].id == MODEL
    # one running + one queued fill it: the third gets 429 with a body, and the server carries on
    holders = [
        good.completions.create(
            model=MODEL, prompt="Once upon a time", max_tokens=150, stream=True, logit_bias=NO_EOS
        )
        for _ in range(2)
    ]
    try:
        next(iter(holders[0]))
        with pytest.raises(openai.RateLimitError) as exc:
            good.completions.create(model=MODEL, prompt="Hi", max_tokens=2)
        assert exc.value.status_code == 429 and exc.value.body["code"] == "queue_full"
    finally:
        for h in holders:
            h.close()
    deadline = time.monotonic() + 5
    busy = ("edgellm_num_requests_running", "edgellm_num_requests_waiting")
    while any(_metrics(url, "s3cret")[k] for k in busy):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert good.completions.create(model=MODEL, prompt="Hi", max_tokens=2).usage.completion_tokens == 2
    assert _metrics(url, "s3cret")["edgellm_kv_cache_blocks_total"] == CTX // 16 + 1


def test_loopback_detection_and_request_validation() -> None:
    from edgellm.engine.checks import TokenIdError, check_request
    from edgellm.server import _is_loopback
    from edgellm.server.generate import request_error
    from edgellm.server.http.errors import ApiError
    from edgellm.server.protocol import parse_chat, parse_completion

    assert _is_loopback("127.0.0.1") and _is_loopback("::1") and _is_loopback("localhost")
    assert not _is_loopback("0.0.0.0") and not _is_loopback("192.168.1.10")
    msgs = {"messages": MSGS}
    req = parse_chat({**msgs, "logprobs": True, "top_logprobs": 2, "top_k": -1, "stop": "x", "extra": 1}, 64)
    assert req.params.logprobs == 2 and req.params.top_k == 0 and req.params.stop == ["x"]
    assert req.params.max_tokens == 64  # no max_tokens: up to the context (the engine caps it further)
    assert parse_completion({"prompt": "a"}).params.max_tokens == 16  # OpenAI's completions default
    bad = [
        ({**msgs, "n": True}, "'n'"),
        ({**msgs, "top_logprobs": 2}, "'top_logprobs'"),
        ({**msgs, "logit_bias": {"x": 1}}, "'logit_bias'"),
        ({**msgs, "stream_options": {"include_usage": True}}, "'stream_options'"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "role"),
        ({**msgs, "top_p": 0}, "'top_p'"),
    ]
    for body, param in bad:
        with pytest.raises(ApiError) as exc:
            parse_chat(body, 64)
        assert exc.value.status == 400 and param in exc.value.message
    # Token ids outside the vocabulary are the front-end's one check (LLM.make_request), for every API:
    # start_generation answers them with the 400 the parser gave.
    biased = parse_chat({**msgs, "logit_bias": {"100": 1}}, 64)
    with pytest.raises(TokenIdError) as bias:
        check_request([1], biased.params, 64, 100)
    err = request_error(bias.value, 64, chat=True)
    assert err.status == 400 and "'logit_bias'" in err.message
    assert err.message == "'logit_bias': token id 100 is outside the vocabulary (0..99)"
    with pytest.raises(TokenIdError) as prompt:
        check_request([5, 100], parse_completion({"prompt": [5, 100]}).params, 64, 100)
    err = request_error(prompt.value, 64, chat=False)
    assert (err.status, err.param, err.message) == (400, "prompt", "'prompt': token ids must be in 0..99")


def test_server_sampling_defaults_fill_only_what_a_request_omits() -> None:
    from edgellm.cli.commands import build_parser
    from edgellm.config import ServerConfig
    from edgellm.engine.config import EngineConfig
    from edgellm.server.protocol import parse_chat, parse_completion

    args = build_parser().parse_args(
        ["serve", "m", "--temperature", "0.3", "--top-k", "-1", "--min-p", "0.05", "--seed", "7"]
    )
    defaults = ServerConfig.from_cli_args(args).sampling_defaults
    assert defaults == {"temperature": 0.3, "top_k": 0, "min_p": 0.05, "seed": 7}  # top_k -1: off
    random_seed = build_parser().parse_args(["serve", "m", "--seed", "-1"])
    assert ServerConfig.from_cli_args(random_seed).sampling_defaults == {}  # -1: a fresh seed per request
    msgs = {"messages": MSGS}
    p = parse_chat(msgs, 64, defaults).params
    assert (p.temperature, p.top_k, p.min_p, p.seed, p.top_p) == (0.3, 0, 0.05, 7, 1.0)
    p = parse_chat({**msgs, "temperature": 1.5, "seed": 1, "top_k": 5}, 64, defaults).params
    assert (p.temperature, p.seed, p.top_k, p.min_p) == (1.5, 1, 5, 0.05)  # the request's own win
    assert parse_completion({"prompt": "a"}, defaults).params.temperature == 0.3
    assert parse_chat(msgs, 64).params.temperature == 1.0  # no defaults: SamplingParams'
    for bad, flag in (({"temperature": 3.0}, "--temperature 3.0"), ({"seed": -5}, "--seed -5")):
        with pytest.raises(ValueError, match=flag):
            ServerConfig(EngineConfig("m"), sampling_defaults=bad)
    with pytest.raises(ValueError, match="unknown sampling default 'tempreature'"):
        ServerConfig(EngineConfig("m"), sampling_defaults={"tempreature": 0.1})
