"""Structured output and tool calling through the real `openai` client (and LangChain when installed)
against a SmolLM2 server on 127.0.0.1: every json_schema reply parses and validates, required and named tool
choices always yield a valid call, and a call -> tool result -> answer round trip works. Gemma 3's sampled
calls: test_server_tools_gemma3.py; a call list cut by max_tokens, without a server: test_tool_output.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import openai
import pytest

from edgellm.testing.grammar_attacks import PYDANTIC_WEATHER, tool
from edgellm.testing.servers import serve as _start
from edgellm.testing.tool_cases import ADD, TOOLS, WEATHER, Person, streamed_calls

MODEL = "SmolLM2-135M-Instruct.Q4_1"
# Nested objects, arrays, enums and required fields; short strings so that a small budget closes the JSON.
ORDER = {
    "type": "object",
    "properties": {
        "customer": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 10},
                "tier": {"enum": ["free", "pro", "team"]},
            },
            "required": ["name", "tier"],
            "additionalProperties": False,
        },
        "items": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"sku": {"type": "string", "maxLength": 6}, "qty": {"type": "integer"}},
                "required": ["sku", "qty"],
                "additionalProperties": False,
            },
            "minItems": 1,
            "maxItems": 2,
        },
        "paid": {"type": "boolean"},
    },
    "required": ["customer", "items", "paid"],
    "additionalProperties": False,
}
ASK_ORDER = [{"role": "user", "content": "Write a small shop order as JSON."}]
ASK_WEATHER = [{"role": "user", "content": "What is the weather in Paris right now?"}]


@pytest.fixture(scope="module")
def server(smollm2_path: Path) -> Iterator[str]:
    yield from _start(smollm2_path, "--max-num-seqs", "16", "--ctx", "1024")  # room for the tool list


@pytest.fixture(scope="module")
def client(server: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0, timeout=120)


def test_parse_returns_a_pydantic_object(client: openai.OpenAI) -> None:
    r = client.chat.completions.parse(
        model=MODEL,
        messages=[{"role": "user", "content": "Give me a person as JSON."}],
        response_format=Person,
        max_tokens=40,
        temperature=0,
    )
    person = r.choices[0].message.parsed
    assert isinstance(person, Person) and r.choices[0].finish_reason == "stop"


def test_20_json_schema_requests_validate_streaming_or_not_at_two_temperatures(server: str) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "order", "schema": ORDER, "strict": True}}
    aclient = openai.AsyncOpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0, timeout=300)

    async def one(i: int) -> tuple[str, str | None]:
        kw = dict(model=MODEL, messages=ASK_ORDER, response_format=fmt, max_tokens=120)
        kw["temperature"] = 0.0 if i % 4 < 2 else 0.8
        if i % 2 == 0:
            r = await aclient.chat.completions.create(**kw, seed=i)
            return r.choices[0].message.content, r.choices[0].finish_reason
        text, reason = "", None
        async for chunk in await aclient.chat.completions.create(**kw, seed=i, stream=True):
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
                reason = chunk.choices[0].finish_reason or reason
        return text, reason

    async def all_of_them() -> list[tuple[str, str | None]]:
        try:
            return await asyncio.gather(*[one(i) for i in range(20)])
        finally:
            await aclient.close()

    for text, reason in asyncio.run(all_of_them()):
        assert reason == "stop", text
        jsonschema.validate(json.loads(text), ORDER)


def test_json_object_on_completions_and_a_cut_grammar_ends_as_length(client: openai.OpenAI) -> None:
    r = client.completions.create(
        model=MODEL,
        prompt="A JSON object:",
        max_tokens=60,
        temperature=0,
        extra_body={"response_format": {"type": "json_object"}},
    )
    assert r.choices[0].finish_reason == "stop" and isinstance(json.loads(r.choices[0].text), dict)
    fmt = {"type": "json_schema", "json_schema": {"name": "order", "schema": ORDER}}
    cut = client.chat.completions.create(model=MODEL, messages=ASK_ORDER, response_format=fmt, max_tokens=3)
    assert cut.choices[0].finish_reason == "length" and cut.usage.completion_tokens == 3


def _check_calls(calls: list, names: set[str]) -> None:
    assert calls
    for c in calls:
        assert c.id.startswith("call_") and c.type == "function" and c.function.name in names
        schema = next(t["function"]["parameters"] for t in TOOLS if t["function"]["name"] == c.function.name)
        jsonschema.validate(json.loads(c.function.arguments), schema)


@pytest.mark.parametrize("stream", [False, True])
def test_required_and_named_tool_choices_always_yield_a_valid_call(
    client: openai.OpenAI, stream: bool
) -> None:
    named = {"type": "function", "function": {"name": "add"}}
    for choice, names, seed in [
        ("required", {"get_weather", "add"}, 1),
        ("required", {"get_weather", "add"}, 2),
    ] + [
        (named, {"add"}, 3),
        (named, {"add"}, 4),
    ]:
        kw = dict(model=MODEL, messages=ASK_WEATHER, tools=TOOLS, tool_choice=choice, max_tokens=80)
        kw |= dict(temperature=0.8, seed=seed, parallel_tool_calls=False)
        if stream:
            calls, reason = streamed_calls(list(client.chat.completions.create(**kw, stream=True)))
        else:
            r = client.chat.completions.create(**kw)
            calls, reason = r.choices[0].message.tool_calls, r.choices[0].finish_reason
            assert r.choices[0].message.content is None
        assert reason == "tool_calls" and len(calls) == 1
        _check_calls(calls, names)


@pytest.mark.parametrize(
    "choice", ["required", {"type": "function", "function": {"name": "get_weather"}}, "auto"]
)
def test_pydantic_style_defs_in_tool_parameters_work_for_every_tool_choice(
    client: openai.OpenAI, choice: str | dict
) -> None:
    """Parameters with their own $defs/$ref (what pydantic writes for nested models): "required" used to
    be a 400 `Pointer '/$defs/Unit' does not exist` (the per-tool schemas were nested without their
    $defs). SmolLM2-135M does not call tools on its own, so "auto" shows only that the request is served
    and any call it parses validates."""
    tools = [tool("get_weather", PYDANTIC_WEATHER), ADD]
    ask = [{"role": "user", "content": "What is the weather in Oslo, in celsius?"}]
    for seed in (1, 2):
        r = client.chat.completions.create(
            model=MODEL, messages=ask, tools=tools, tool_choice=choice, max_tokens=60, temperature=0.7,
            seed=seed, parallel_tool_calls=False,
        )  # fmt: skip
        calls = r.choices[0].message.tool_calls or []
        if choice == "auto":
            assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
        else:
            assert r.choices[0].finish_reason == "tool_calls" and len(calls) == 1
        for c in calls:
            schema = PYDANTIC_WEATHER if c.function.name == "get_weather" else ADD["function"]["parameters"]
            jsonschema.validate(json.loads(c.function.arguments), schema)
            assert c.function.name == "get_weather" or not isinstance(choice, dict)  # named: that one


def test_call_tool_result_answer_round_trip(client: openai.OpenAI) -> None:
    first = client.chat.completions.create(
        model=MODEL, messages=ASK_WEATHER, tools=TOOLS, tool_choice="required", max_tokens=60, temperature=0
    )
    msg = first.choices[0].message
    _check_calls(msg.tool_calls, {"get_weather", "add"})
    history = ASK_WEATHER + [
        msg.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": "18 degrees celsius, sunny"},
    ]
    final = client.chat.completions.create(
        model=MODEL, messages=history, tools=TOOLS, max_tokens=24, temperature=0
    )
    assert final.usage.prompt_tokens > first.usage.prompt_tokens  # the call and its result were rendered
    assert final.choices[0].message.content and final.choices[0].finish_reason in (
        "stop",
        "length",
        "tool_calls",
    )


def test_langchain_bind_tools_round_trip(server: str) -> None:
    lc = pytest.importorskip("langchain_openai")
    from langchain_core.messages import HumanMessage, ToolMessage

    llm = lc.ChatOpenAI(model=MODEL, base_url=f"{server}/v1", api_key="unused", temperature=0, max_tokens=60)
    bound = llm.bind_tools([WEATHER], tool_choice="get_weather")
    history = [HumanMessage("What is the weather in Paris right now?")]
    ai = bound.invoke(history)
    assert ai.tool_calls and ai.tool_calls[0]["name"] == "get_weather"
    jsonschema.validate(ai.tool_calls[0]["args"], WEATHER["function"]["parameters"])
    history += [ai, ToolMessage("18 degrees celsius, sunny", tool_call_id=ai.tool_calls[0]["id"])]
    answer = llm.bind_tools([WEATHER]).invoke(history)
    assert isinstance(answer.content, str)


@pytest.mark.parametrize(
    ("extra", "param", "message"),
    [
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "nope"}},
                }
            },
            "response_format",
            "Invalid type: nope",
        ),
        ({"response_format": {"type": "xml"}}, "response_format", "not supported"),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
            "not among the tools",
        ),
        ({"tool_choice": "required"}, "tool_choice", "only allowed when 'tools' are given"),
        ({"functions": [WEATHER["function"]]}, "functions", "use 'tools'"),
        ({"tools": [{"type": "code_interpreter"}]}, "tools[0]", "only function tools"),
        (
            {"tools": TOOLS, "response_format": {"type": "json_object"}},
            "response_format",
            "cannot be combined",
        ),
    ],
)
def test_bad_structured_requests_are_400s_naming_the_problem(
    client: openai.OpenAI, extra: dict, param: str, message: str
) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=ASK_WEATHER, max_tokens=4, extra_body=extra)
    assert e.value.body["param"] == param and message in e.value.body["message"]
