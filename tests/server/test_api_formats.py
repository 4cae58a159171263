"""The API formatters and the Responses store on their own (no model): Ollama's tool calls as the ollama
client reads them (arguments as objects, a call cut short dropped), and ResponseStore's bounds."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import ollama
import pytest

from edgellm.server.events import Call, CallArgs, CallStart, End, Event, Reply, Text
from edgellm.server.http.errors import ApiError
from edgellm.server.ollama.routes import ReplyShape
from edgellm.server.responses.input import ResponseStore

END = End("tool_calls", None, prompt_tokens=10, completion_tokens=7, cached_tokens=0)


async def _lines(events: list[Event]) -> list[str]:
    async def gen() -> AsyncIterator[Event]:
        for e in events:
            yield e

    return [line async for line in ReplyShape("m", chat=True).stream(gen())]


def test_ollama_streams_each_complete_call_with_arguments_as_an_object() -> None:
    events = [
        Text("ok"),
        CallStart(0, "call_a", "get_weather"),
        CallArgs(0, '{"city": '),
        CallArgs(0, '"Paris"}'),
        CallStart(1, "call_b", "get_time"),
        CallArgs(1, '{"zone": "CE'),
        END,
    ]
    lines = asyncio.run(_lines(events))
    assert all(line.endswith("\n") and line.count("\n") == 1 for line in lines)  # NDJSON
    parsed = [ollama.ChatResponse(**json.loads(line)) for line in lines]
    assert parsed[0].message.content == "ok" and not parsed[0].done
    (call,) = parsed[1].message.tool_calls  # the second call was cut short: not a call
    assert (call.function.name, call.function.arguments) == ("get_weather", {"city": "Paris"})
    assert parsed[-1].done and parsed[-1].done_reason == "stop" and parsed[-1].eval_count == 7


def test_ollama_whole_reply_carries_the_calls() -> None:
    reply = Reply("", [Call("call_a", "get_weather", '{"city": "Oslo"}')], END)
    body = ollama.ChatResponse(**json.loads(ReplyShape("m", chat=True).whole(reply).body))
    assert body.message.tool_calls[0].function.arguments == {"city": "Oslo"} and body.done


def test_the_response_store_keeps_the_newest_within_its_bounds() -> None:
    store = ResponseStore(max_items=2, max_chars=200)
    for rid in ("a", "b", "c"):
        store.put(rid, [{"role": "user", "content": rid}])
    assert store.get("c") == [{"role": "user", "content": "c"}] and store.get("b")
    with pytest.raises(ApiError) as e:
        store.get("a")  # the oldest went first
    assert e.value.status == 400 and e.value.param == "previous_response_id"
    store.put("big", [{"role": "user", "content": "x" * 150}])  # fits alone: the others make room
    assert store.get("big") and store.chars <= 200
    with pytest.raises(ApiError):
        store.get("b")
    store.put("huge", [{"role": "user", "content": "x" * 300}])  # larger than the whole store: not kept
    with pytest.raises(ApiError):
        store.get("huge")
