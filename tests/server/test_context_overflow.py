"""A chat longer than the context (server/context_overflow.py) on the tiny synthetic Qwen3 model: a 400 by
default; `truncate-middle` answers with the system message, the first user turn (marked) and the latest
turns whole, the prompt the server rendered being exactly that conversation's; `rolling-window` generates
every requested token past the context."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import ollama
import openai
import pytest

from edgellm.server.context_overflow import MARKER, cut_middle, reply_room, tail_starts
from edgellm.testing.servers import serve
from edgellm.testing.synthetic.models import write_tiny_model

CTX = 256
NO_SPECIALS = {"0": -100, "1": -100, "2": -100}  # the tiny vocabulary's end-of-generation tokens


def _conversation(turns: int) -> list[dict[str, str]]:
    msgs = [{"role": "system", "content": "be brief"}]
    for i in range(turns):
        msgs += [{"role": "user", "content": f"question {i}: where is the cat"},
                 {"role": "assistant", "content": f"answer {i}: on the mat"}]  # fmt: skip
    return msgs + [{"role": "user", "content": "and the dog?"}]


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    path: Path = write_tiny_model(tmp_path_factory.mktemp("overflow") / "tiny.gguf", "qwen3")
    yield from serve(path, ctx=CTX)


@pytest.fixture(scope="module")
def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)


def _count(url: str, messages: list[dict]) -> int:
    return httpx.post(f"{url}/tokenize", json={"messages": messages}, timeout=60).json()["count"]


@pytest.fixture(scope="module")
def long_chat(url: str) -> list[dict[str, str]]:
    """A conversation of about 1.5 contexts."""
    turns = 1
    while _count(url, _conversation(turns)) < 3 * CTX // 2:
        turns += 1
    return _conversation(turns)


def test_the_default_is_the_context_length_400(client: openai.OpenAI, long_chat: list) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=long_chat, max_tokens=8)
    assert "context" in str(e.value)


def test_truncate_middle_keeps_the_head_and_the_latest_turns(
    url: str, client: openai.OpenAI, long_chat: list
) -> None:
    max_tokens = 8
    r = client.chat.completions.create(model="tiny", messages=long_chat, max_tokens=max_tokens, temperature=0,
                                       extra_body={"context_overflow": "truncate-middle"})  # fmt: skip
    usage = r.usage.model_dump()
    report = usage["context_overflow"]
    assert report["policy"] == "truncate-middle" and report["dropped_messages"] > 0
    assert usage["prompt_tokens"] <= CTX - reply_room(CTX, max_tokens)
    assert report["dropped_tokens"] == _count(url, long_chat) - usage["prompt_tokens"]
    first, starts = tail_starts(long_chat)
    start = first + 1 + report["dropped_messages"]
    assert start in starts and long_chat[start]["role"] == "assistant"  # the turns still alternate
    kept = cut_middle(long_chat, first, start)
    assert kept[0] == long_chat[0] and kept[-1] == long_chat[-1]  # system and last user message whole
    assert kept[first]["content"] == long_chat[first]["content"] + MARKER.format(n=report["dropped_messages"])
    assert _count(url, kept) == usage["prompt_tokens"]  # the prompt the server rendered is that one
    # dropping one message fewer would not have fit
    assert _count(url, cut_middle(long_chat, first, starts[starts.index(start) - 1])) > usage["prompt_tokens"]
    short = client.chat.completions.create(model="tiny", messages=long_chat[-3:], max_tokens=4,
                                           extra_body={"context_overflow": "truncate-middle"})  # fmt: skip
    assert short.usage.model_dump()["context_overflow"]["dropped_messages"] == 0


def test_a_huge_middle_message_is_dropped_without_tokenizing_it(
    client: openai.OpenAI, long_chat: list
) -> None:
    huge = [*long_chat[:3], {"role": "user", "content": "cat " * 50_000}, *long_chat[4:]]
    r = client.chat.completions.create(model="tiny", messages=huge, max_tokens=8,
                                       extra_body={"context_overflow": "truncate-middle"})  # fmt: skip
    report = r.usage.model_dump()["context_overflow"]
    assert report["dropped_messages"] > 0 and report["dropped_tokens_at_least"] > 8 * CTX
    assert r.usage.prompt_tokens <= CTX


def test_rolling_window_generates_every_requested_token(client: openai.OpenAI, long_chat: list) -> None:
    want = 2 * CTX
    r = client.chat.completions.create(model="tiny", messages=long_chat, max_tokens=want, temperature=0,
                                       logit_bias=NO_SPECIALS,
                                       extra_body={"context_overflow": "rolling-window"})  # fmt: skip
    assert r.usage.completion_tokens == want and r.choices[0].finish_reason == "length"
    report = r.usage.model_dump()["context_overflow"]
    assert r.usage.prompt_tokens < CTX and report["dropped_tokens"] > 0
    # the context filled (prompt + generated past CTX) at least twice: each shift drops half the window
    assert report["shifted_tokens"] >= r.usage.prompt_tokens + want - CTX
    stream = client.chat.completions.create(model="tiny", messages=long_chat, max_tokens=want, temperature=0,
                                            logit_bias=NO_SPECIALS, stream=True,
                                            stream_options={"include_usage": True},
                                            extra_body={"context_overflow": "rolling-window"})  # fmt: skip
    chunks = list(stream)
    assert (
        "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == r.choices[0].message.content
    )
    assert chunks[-1].usage.completion_tokens == want


def test_rolling_window_completions(client: openai.OpenAI) -> None:
    want = 2 * CTX
    r = client.completions.create(model="tiny", prompt="the cat sat on the mat", max_tokens=want,
                                  temperature=0, logit_bias=NO_SPECIALS,
                                  extra_body={"context_overflow": "rolling-window"})  # fmt: skip
    assert r.usage.completion_tokens == want and r.choices[0].finish_reason == "length"
    assert r.usage.model_dump()["context_overflow"]["shifted_tokens"] > 0
    capped = client.completions.create(model="tiny", prompt="the cat sat on the mat", max_tokens=want,
                                       temperature=0, logit_bias=NO_SPECIALS)  # fmt: skip
    assert capped.usage.completion_tokens == CTX - capped.usage.prompt_tokens  # the context ends it


def test_a_bad_policy_is_a_400_naming_the_field(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=_conversation(0), max_tokens=4,
                                       extra_body={"context_overflow": "shift"})  # fmt: skip
    assert e.value.body["param"] == "context_overflow"


@pytest.fixture(scope="module")
def truncating_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    path: Path = write_tiny_model(tmp_path_factory.mktemp("overflow-server") / "tiny.gguf", "qwen3")
    yield from serve(path, "--context-overflow", "truncate-middle", ctx=CTX)


def test_the_servers_policy_serves_the_other_apis(truncating_url: str, url: str, long_chat: list) -> None:
    """--context-overflow truncate-middle: the Anthropic and Ollama routes answer the 1.5-context chat
    with the same truncated prompt; and their requests' own context_overflow field is honoured."""
    want = _count(url, cut_middle(long_chat, *_fitting(url, long_chat, 8)))
    system, rest = long_chat[0]["content"], long_chat[1:]
    claude = anthropic.Anthropic(base_url=truncating_url, api_key="unused", max_retries=0, timeout=120)
    m = claude.messages.create(model="tiny", max_tokens=8, system=system, messages=rest)
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens == want
    o = ollama.Client(host=truncating_url, timeout=120).chat(model="tiny", messages=long_chat,
                                                              options={"num_predict": 8})  # fmt: skip
    assert o.prompt_eval_count == want
    claude_default = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0, timeout=120)
    with pytest.raises(anthropic.BadRequestError):
        claude_default.messages.create(model="tiny", max_tokens=8, system=system, messages=rest)
    m = claude_default.messages.create(model="tiny", max_tokens=8, system=system, messages=rest,
                                       extra_body={"context_overflow": "truncate-middle"})  # fmt: skip
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens == want
    body = {
        "model": "tiny",
        "messages": long_chat,
        "options": {"num_predict": 8},
        "stream": False,
        "context_overflow": "truncate-middle",
    }  # fmt: skip (the ollama client sends no extra fields)
    assert httpx.post(f"{url}/api/chat", json=body, timeout=120).json()["prompt_eval_count"] == want


def _fitting(url: str, messages: list[dict], max_tokens: int) -> tuple[int, int]:
    """(first user index, the tail start) truncate-middle picks: the fewest dropped messages that fit."""
    first, starts = tail_starts(messages)
    limit = CTX - reply_room(CTX, max_tokens)
    return first, next(s for s in starts if _count(url, cut_middle(messages, first, s)) <= limit)


def test_where_the_middle_may_be_cut() -> None:
    sys_, u, a = {"role": "system", "content": "s"}, {"role": "user", "content": "u"}, {"role": "assistant"}
    tool = {"role": "tool", "content": "42"}
    msgs = [sys_, u, {**a, "content": "a1"}, {**u, "content": "u2"}, {**a, "tool_calls": []}, tool,
            {**a, "content": "a3"}, {**u, "content": "u4"}]  # fmt: skip
    first, starts = tail_starts(msgs)
    assert first == 1 and starts == [4, 6, 7]  # assistants after the first user turn, then the last message
    cut = cut_middle(msgs, first, 6)
    assert cut[:1] == [sys_] and cut[2:] == msgs[6:]
    assert cut[1]["content"] == "u" + MARKER.format(n=4)
    parts = cut_middle([{"role": "user", "content": [{"type": "text", "text": "x"}]}, *msgs[2:]], 0, 3)
    assert parts[0]["content"][-1] == {"type": "text", "text": MARKER.format(n=2)}
    assert tail_starts([sys_, u]) == (-1, [])  # nothing after the first user turn: nothing to drop
    assert tail_starts([sys_]) == (-1, [])
    assert tail_starts([sys_, u, {**a, "tool_calls": []}, tool])[1] == []  # a tool result never starts it
