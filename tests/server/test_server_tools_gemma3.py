"""Structured output and tool calling on a Gemma 3 server through the real `openai` client: `parse` gives
the pydantic object, and sampled required calls (parallel calls allowed) always come back as tool calls."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import openai
import pytest

from edgellm.server.tools import DEFAULT_MAX_PARALLEL_CALLS
from edgellm.testing.servers import serve as _start
from edgellm.testing.tool_cases import Person, streamed_calls


@pytest.fixture(scope="module")
def gemma3_server(gemma3_path: Path) -> Iterator[str]:
    yield from _start(gemma3_path, "--max-num-seqs", "20", "--ctx", "1024")  # room for the tool list


def test_parse_on_gemma3(gemma3_server: str) -> None:
    client = openai.OpenAI(base_url=f"{gemma3_server}/v1", api_key="unused", max_retries=0, timeout=120)
    r = client.chat.completions.parse(
        model=client.models.list().data[0].id,
        messages=[{"role": "user", "content": "Give me a person as JSON."}],
        response_format=Person,
        max_tokens=40,
        temperature=0,
    )
    assert isinstance(r.choices[0].message.parsed, Person) and r.choices[0].finish_reason == "stop"


CITY = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def test_20_sampled_required_calls_on_gemma3_all_come_back_as_tool_calls(gemma3_server: str) -> None:
    """Gemma 3 at T=1 with parallel calls allowed often keeps adding calls until max_tokens: the complete
    ones come back as `tool_calls` (the cut one dropped, finish_reason "length"), never as content, and
    the list stops at DEFAULT_MAX_PARALLEL_CALLS."""
    aclient = openai.AsyncOpenAI(base_url=f"{gemma3_server}/v1", api_key="unused", max_retries=0, timeout=600)
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]

    async def one(i: int) -> tuple[list, str | None, str]:
        kw = dict(model="gemma", messages=ask, tools=[CITY], tool_choice="required", max_tokens=100)
        kw |= dict(temperature=1.0, seed=i)
        if i % 2 == 0:
            r = await aclient.chat.completions.create(**kw)
            m = r.choices[0].message
            return m.tool_calls or [], r.choices[0].finish_reason, m.content or ""
        chunks = [c async for c in await aclient.chat.completions.create(**kw, stream=True)]
        content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        return (*streamed_calls([c for c in chunks if c.choices]), content)

    async def all_of_them() -> list[tuple[list, str | None, str]]:
        try:
            return await asyncio.gather(*[one(i) for i in range(20)])
        finally:
            await aclient.close()

    for calls, reason, content in asyncio.run(all_of_them()):
        assert content == "" and reason in ("tool_calls", "length"), (reason, content)
        assert 1 <= len(calls) <= DEFAULT_MAX_PARALLEL_CALLS
        for c in calls:
            assert c.function.name == "get_weather" and c.id.startswith("call_")
            jsonschema.validate(json.loads(c.function.arguments), CITY["function"]["parameters"])
