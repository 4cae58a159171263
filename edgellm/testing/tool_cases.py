"""Tool lists, a bounded pydantic model and the stream reassembly shared by the tool-calling and
structured-output server tests (tests/server/test_server_tools*.py, tests/server/test_tool_output.py)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

WEATHER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 20},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
        },
    },
}
ADD: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}
TOOLS = [WEATHER, ADD]


class Person(BaseModel):
    """Bounded fields: a small model given an unbounded int writes digits until max_tokens."""

    name: str = Field(max_length=12)
    age: int = Field(ge=0, le=120)


def streamed_calls(chunks: list) -> tuple[list, str | None]:
    """OpenAI's streamed tool calls put back together (the id and name come first, arguments in pieces)."""
    import openai

    calls: dict[int, dict] = {}
    reason = None
    for chunk in chunks:
        for tc in chunk.choices[0].delta.tool_calls or []:
            c = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
            c["id"] += tc.id or ""
            c["name"] += (tc.function.name or "") if tc.function else ""
            c["arguments"] += (tc.function.arguments or "") if tc.function else ""
        reason = chunk.choices[0].finish_reason or reason
    out = [
        openai.types.chat.ChatCompletionMessageFunctionToolCall(
            id=c["id"], type="function", function={"name": c["name"], "arguments": c["arguments"]}
        )
        for _, c in sorted(calls.items())
    ]
    return out, reason
