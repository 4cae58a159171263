"""The request kinds of scripts/soak/soak.py: each sends one request to the server and checks the answer.

Every kind returns a Result whose outcome is one of OK_OUTCOMES (the request did what it should: a good
request finished correctly, a bad one got the 4xx it deserves, a client dropped its stream on purpose)
or anything else, which the soak counts as a failure. Greedy (temperature 0) requests are compared with
reference answers taken from the idle server at the start: the kernels are batch-invariant, so batching,
prefix caching and preemption must not change a single token.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

import openai

try:  # the openai client's HTTP library: httpx, or its successor httpx2 in recent openai releases
    import httpx
except ImportError:
    import httpx2 as httpx  # type: ignore[no-redef]

CHAT_PROMPTS = [
    "What is the capital of France?",
    "Name three primary colors.",
    "Write one sentence about the moon.",
    "Why is the sea salty?",
]
COMPLETION_PROMPTS = ["Once upon a time", "The quick brown fox", "In a distant galaxy,", "def fibonacci(n):"]
LONG_PROMPTS = ["The history of the old city begins", "Here is a long list of animals:"]
SHORT_TOKENS = 24  # generated tokens of the ordinary greedy requests
FINISH_REASONS = {"stop", "length"}
OK_OUTCOMES = {"ok", "rejected", "dropped"}  # finished right / expected 4xx / client left on purpose


@dataclass
class Result:
    kind: str
    outcome: str  # see OK_OUTCOMES; failures: "wrong", "5xx", "status", "error", "stuck"
    latency: float = 0.0
    status: int | None = None
    detail: str = ""


@dataclass
class Reference:
    text: str
    finish_reason: str
    tokens: int


@dataclass
class Traffic:
    """What the request kinds share: the server, its limits and the reference answers."""

    url: str
    model: str
    ctx: int
    http: httpx.AsyncClient
    api: openai.AsyncOpenAI
    rng: random.Random
    no_eos: dict[str, float] = field(default_factory=dict)  # logit_bias that keeps long requests going
    long_tokens: int = 160
    chat_refs: dict[str, Reference] = field(default_factory=dict)
    completion_refs: dict[str, Reference] = field(default_factory=dict)
    long_refs: dict[str, Reference] = field(default_factory=dict)
    one_token_id: int = 0  # a token id for prompts given as ids


class Failed(Exception):
    """A request whose answer is wrong; the message says how (and `status` which HTTP status came)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def _expect(cond: bool, msg: str) -> None:
    if not cond:
        raise Failed(msg)


def chat_body(t: Traffic, prompt: str, **kw: Any) -> dict[str, Any]:
    return {"model": t.model, "messages": [{"role": "user", "content": prompt}], **kw}


def completion_body(t: Traffic, prompt: Any, **kw: Any) -> dict[str, Any]:
    return {"model": t.model, "prompt": prompt, **kw}


def _check_choice(text: str, finish: str | None, ref: Reference | None, what: str) -> None:
    _expect(finish in FINISH_REASONS, f"{what}: finish_reason {finish!r}")
    if ref is not None:
        _expect(
            text == ref.text and finish == ref.finish_reason,
            f"{what}: greedy output differs from the reference: {text!r} ({finish}) != "
            f"{ref.text!r} ({ref.finish_reason})",
        )


def parse_sse(lines: list[str]) -> tuple[list[dict[str, Any]], bool]:
    """SSE lines -> (JSON chunks, whether [DONE] ended the stream). An error chunk raises Failed."""
    chunks, done = [], False
    for line in lines:
        if not line.startswith("data: "):
            _expect(line.strip() == "" or line.startswith(":"), f"stream: unexpected line {line[:80]!r}")
            continue
        data = line[len("data: ") :]
        _expect(not done, "stream: data after [DONE]")
        if data == "[DONE]":
            done = True
            continue
        chunk = json.loads(data)
        _expect("error" not in chunk, f"stream: in-band error {chunk}")
        chunks.append(chunk)
    return chunks, done


def join_stream(chunks: list[dict[str, Any]], chat: bool) -> dict[int, tuple[str, str | None]]:
    """choice index -> (text, finish_reason) from stream chunks."""
    out: dict[int, tuple[str, str | None]] = {}
    for c in chunks:
        for ch in c.get("choices", []):
            text, fin = out.get(ch["index"], ("", None))
            piece = (ch.get("delta") or {}).get("content") if chat else ch.get("text")
            _expect(fin is None, f"stream: choice {ch['index']} continues after finish_reason {fin}")
            out[ch["index"]] = (text + (piece or ""), ch.get("finish_reason"))
    return out


async def post(t: Traffic, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = await t.http.post(f"{t.url}/v1/{path}", json=body)
    if r.status_code != 200:
        raise httpx.HTTPStatusError(f"{r.status_code}: {r.text[:300]}", request=r.request, response=r)
    return r.json()


async def stream_raw(t: Traffic, path: str, body: dict[str, Any]) -> dict[int, tuple[str, str | None]]:
    async with t.http.stream("POST", f"{t.url}/v1/{path}", json={**body, "stream": True}) as r:
        if r.status_code != 200:
            await r.aread()
            raise httpx.HTTPStatusError(f"{r.status_code}: {r.text[:300]}", request=r.request, response=r)
        _expect(r.headers.get("content-type", "").startswith("text/event-stream"), "stream: content-type")
        lines = [line async for line in r.aiter_lines()]
    chunks, done = parse_sse(lines)
    _expect(done, "stream: no [DONE] at the end")
    return join_stream(chunks, path.startswith("chat"))


def _only_choice(choices: dict[int, tuple[str, str | None]], what: str) -> tuple[str, str | None]:
    _expect(set(choices) == {0}, f"{what}: choice indices {sorted(choices)}")
    return choices[0]


# ---- good requests ------------------------------------------------------------------------------
async def chat_greedy_openai(t: Traffic) -> None:
    prompt = t.rng.choice(CHAT_PROMPTS)
    r = await t.api.chat.completions.create(**chat_body(t, prompt, max_tokens=SHORT_TOKENS, temperature=0))
    _expect(len(r.choices) == 1, f"{len(r.choices)} choices")
    _expect(r.usage is not None and r.usage.completion_tokens == t.chat_refs[prompt].tokens, "usage")
    _check_choice(r.choices[0].message.content or "", r.choices[0].finish_reason, t.chat_refs[prompt], "chat")


async def chat_greedy_stream_raw(t: Traffic) -> None:
    prompt = t.rng.choice(CHAT_PROMPTS)
    body = chat_body(t, prompt, max_tokens=SHORT_TOKENS, temperature=0)
    text, fin = _only_choice(await stream_raw(t, "chat/completions", body), "chat stream")
    _check_choice(text, fin, t.chat_refs[prompt], "chat stream")


async def completion_greedy_stream_openai(t: Traffic) -> None:
    prompt = t.rng.choice(COMPLETION_PROMPTS)
    body = completion_body(t, prompt, max_tokens=SHORT_TOKENS, temperature=0)
    text, fin = "", None
    async for chunk in await t.api.completions.create(**body, stream=True):
        for ch in chunk.choices:
            _expect(ch.index == 0 and fin is None, "completion stream: extra choice or text after finish")
            text += ch.text or ""
            fin = ch.finish_reason
    _check_choice(text, fin, t.completion_refs[prompt], "completion stream")


async def completion_greedy_raw(t: Traffic) -> None:
    prompt = t.rng.choice(COMPLETION_PROMPTS)
    r = await post(t, "completions", completion_body(t, prompt, max_tokens=SHORT_TOKENS, temperature=0))
    _expect(len(r["choices"]) == 1, f"{len(r['choices'])} choices")
    _check_choice(
        r["choices"][0]["text"], r["choices"][0]["finish_reason"], t.completion_refs[prompt], "cmpl"
    )


async def chat_sampled_stream_openai(t: Traffic) -> None:
    body = chat_body(t, t.rng.choice(CHAT_PROMPTS), max_tokens=SHORT_TOKENS, temperature=0.9, top_p=0.95)
    body["seed"] = t.rng.randrange(2**31)
    text, fin, n_chunks = "", None, 0
    stream = await t.api.chat.completions.create(**body, stream=True, stream_options={"include_usage": True})
    usage = None
    async for chunk in stream:
        n_chunks += 1
        usage = chunk.usage or usage
        for ch in chunk.choices:
            _expect(fin is None, "chat stream: text after finish")
            text += ch.delta.content or ""
            fin = ch.finish_reason
    _check_choice(text, fin, None, "sampled chat stream")
    _expect(usage is not None and 1 <= usage.completion_tokens <= SHORT_TOKENS, f"usage {usage}")


async def completion_n_stop_greedy(t: Traffic) -> None:
    """n=2 greedy with a stop string taken from the reference: both choices must equal the reference cut
    at the first occurrence of the stop string."""
    prompt = t.rng.choice(COMPLETION_PROMPTS)
    ref = t.completion_refs[prompt]
    at = t.rng.randrange(1, max(2, len(ref.text) - 2))
    stop = ref.text[at : at + 3]
    if not stop.strip():
        stop = ref.text[-2:] or "\n"
    cut = ref.text.find(stop)
    want = Reference(ref.text[:cut], "stop", 0) if cut >= 0 else ref
    body = completion_body(t, prompt, max_tokens=SHORT_TOKENS, temperature=0, n=2, stop=[stop, "\x00never"])
    r = await post(t, "completions", body)
    _expect(sorted(c["index"] for c in r["choices"]) == [0, 1], f"choice indices of n=2: {r['choices']}")
    for c in r["choices"]:
        _check_choice(c["text"], c["finish_reason"], want, f"n=2 stop={stop!r}")


async def chat_n_stop_sampled_stream(t: Traffic) -> None:
    stops = [".", "\n"]
    body = chat_body(t, t.rng.choice(CHAT_PROMPTS), max_tokens=SHORT_TOKENS, temperature=1.0, n=3, stop=stops)
    choices = await stream_raw(t, "chat/completions", {**body, "seed": t.rng.randrange(2**31)})
    _expect(sorted(choices) == [0, 1, 2], f"choice indices of n=3: {sorted(choices)}")
    for text, fin in choices.values():
        _check_choice(text, fin, None, "n=3 stream")
        _expect(not any(s in text for s in stops), f"stop string in the text {text!r}")


async def long_greedy(t: Traffic) -> None:
    """A long greedy completion (EOS blocked): several at once overflow the KV cache and get preempted."""
    prompt = t.rng.choice(LONG_PROMPTS)
    body = completion_body(t, prompt, max_tokens=t.long_tokens, temperature=0, logit_bias=t.no_eos)
    if t.rng.random() < 0.5:
        text, fin = _only_choice(await stream_raw(t, "completions", body), "long stream")
    else:
        r = await post(t, "completions", body)
        text, fin = r["choices"][0]["text"], r["choices"][0]["finish_reason"]
    _check_choice(text, fin, t.long_refs[prompt], "long greedy")


async def fills_context_exactly(t: Traffic) -> None:
    """A prompt of ctx-1 token ids leaves room for exactly one generated token."""
    body = completion_body(t, [t.one_token_id] * (t.ctx - 1), max_tokens=50, temperature=0)
    r = await post(t, "completions", body)
    _expect(r["usage"]["completion_tokens"] <= 1, f"{r['usage']} at a full context")
    _expect(r["choices"][0]["finish_reason"] in FINISH_REASONS, f"finish {r['choices'][0]['finish_reason']}")


# ---- clients that leave ---------------------------------------------------------------------------
async def _drop_stream(t: Traffic, after_chunks: int) -> None:
    body = completion_body(t, t.rng.choice(LONG_PROMPTS), max_tokens=t.long_tokens, logit_bias=t.no_eos)
    async with t.http.stream("POST", f"{t.url}/v1/completions", json={**body, "stream": True}) as r:
        _expect(r.status_code == 200, f"status {r.status_code}")
        seen = 0
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                seen += 1
                if seen >= after_chunks:
                    break  # leaving the block closes the connection mid-stream
    _expect(seen >= after_chunks, f"the stream ended after {seen} chunks")


async def drop_after_first_chunk(t: Traffic) -> None:
    await _drop_stream(t, 1)


async def drop_mid_stream(t: Traffic) -> None:
    await _drop_stream(t, t.rng.randrange(2, 12))


async def drop_while_waiting(t: Traffic) -> None:
    """A non-streaming request whose client gives up before the answer."""
    body = chat_body(t, t.rng.choice(CHAT_PROMPTS), max_tokens=t.long_tokens, logit_bias=t.no_eos)
    try:
        r = await t.http.post(f"{t.url}/v1/chat/completions", json=body, timeout=t.rng.uniform(0.2, 1.5))
    except httpx.TimeoutException:
        return
    if r.status_code != 200:
        raise httpx.HTTPStatusError(f"{r.status_code}: {r.text[:300]}", request=r.request, response=r)
    # Answered in time (an end token came early: no_eos is empty when the soak does not know the model)
    _check_choice("", r.json()["choices"][0]["finish_reason"], None, "chat answered before the drop")


KINDS: dict[str, tuple[Any, float]] = {  # name -> (coroutine function, weight in the mix)
    "chat_greedy_openai": (chat_greedy_openai, 3),
    "chat_greedy_stream_raw": (chat_greedy_stream_raw, 3),
    "cmpl_greedy_stream_openai": (completion_greedy_stream_openai, 3),
    "cmpl_greedy_raw": (completion_greedy_raw, 2),
    "chat_sampled_stream_openai": (chat_sampled_stream_openai, 3),
    "cmpl_n2_stop_greedy": (completion_n_stop_greedy, 2),
    "chat_n3_stop_sampled_stream": (chat_n_stop_sampled_stream, 2),
    "long_greedy": (long_greedy, 1),
    "fills_context_exactly": (fills_context_exactly, 0.5),
    "drop_after_first_chunk": (drop_after_first_chunk, 1.5),
    "drop_mid_stream": (drop_mid_stream, 1.5),
    "drop_while_waiting": (drop_while_waiting, 1),
}
DROP_KINDS = {"drop_after_first_chunk", "drop_mid_stream", "drop_while_waiting"}
