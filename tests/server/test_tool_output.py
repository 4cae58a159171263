"""A required tool-call list cut by max_tokens keeps its complete calls (as a message and as stream deltas),
and max_parallel_calls caps the list: the server's tool output parser on its own, no server."""

from __future__ import annotations

import json

import pytest

from edgellm.server.http.errors import ApiError
from edgellm.server.tools import DEFAULT_MAX_PARALLEL_CALLS, ToolOutput, parse_tools
from edgellm.testing.tool_cases import TOOLS

CUT = '[{"name": "add", "arguments": {"a": 1, "b": 2}}, {"name": "add", "arguments": {"a": 3, "b": 4}}, '


@pytest.mark.parametrize("tail", ['{"name": "add", "argum', '{"name": "add", "arguments": {"a": 5, "b": 6}}'])
def test_a_required_list_cut_by_max_tokens_keeps_its_complete_calls(tail: str) -> None:
    """A reply max_tokens cut inside its third call (or after it, before the list closed): the complete
    calls, as a message and as stream deltas, finish_reason "length", and no content."""
    req = parse_tools({"tools": TOOLS, "tool_choice": "required"})
    assert req is not None and req.calls_schema()["maxItems"] == DEFAULT_MAX_PARALLEL_CALLS
    complete = 3 if tail.endswith("}}") else 2
    out = ToolOutput(req)
    out.text = CUT + tail
    message, reason = out.message("length")
    assert reason == "length" and message["content"] is None
    args = [json.loads(c["function"]["arguments"]) for c in message["tool_calls"]]
    assert args == [{"a": 1, "b": 2}, {"a": 3, "b": 4}, {"a": 5, "b": 6}][:complete]
    streamed = ToolOutput(req)
    deltas = streamed.feed(CUT) + streamed.feed(tail)
    more, reason = streamed.finish("length")
    deltas += more
    assert reason == "length" and all("content" not in d for d in deltas)
    assert [d["tool_calls"][0]["index"] for d in deltas] == list(range(complete))
    empty = ToolOutput(req)
    empty.feed('[{"name": "get_')
    assert empty.finish("length") == ([], "length")
    assert empty.message("length") == ({"content": None}, "length")


def test_max_parallel_calls_caps_the_required_list() -> None:
    req = parse_tools({"tools": TOOLS, "tool_choice": "required", "max_parallel_calls": 2})
    assert req is not None and req.calls_schema()["maxItems"] == 2
    one = parse_tools({"tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False})
    assert one is not None and one.calls_schema()["maxItems"] == 1
    for bad in (0, True, "3", 10**6):
        with pytest.raises(ApiError) as e:
            parse_tools({"tools": TOOLS, "tool_choice": "required", "max_parallel_calls": bad})
        assert e.value.param == "max_parallel_calls"
