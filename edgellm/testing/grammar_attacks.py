"""Hostile schemas, grammars and tool lists (issue 23) for the tests, the fuzzer and scripts/soak/soak.py:
each crashed, stalled or silently emptied an older server. `chat_body_attacks()` pairs each chat body with the
limit or problem its 400 must name."""

from __future__ import annotations

from typing import Any


def ref_chain(n: int) -> dict[str, Any]:
    """`d0` -> `d1` -> ... -> `dn` through anyOf (about 70 bytes a link): 2,000 links crashed llguidance."""
    defs: dict[str, Any] = {
        f"d{i}": {"anyOf": [{"$ref": f"#/$defs/d{i + 1}"}, {"type": "integer"}]} for i in range(n)
    }
    defs[f"d{n}"] = {"type": "string"}
    return {"$defs": defs, "$ref": "#/$defs/d0"}


def lark_chain(n: int) -> str:
    """`r0: r1`, `r1: r2`, ... `rn: "x"`: 3,000 rules crashed llguidance."""
    return "start: r0\n" + "".join(f"r{i}: r{i + 1}\n" for i in range(n)) + f'r{n}: "x"\n'


SELF_REF: dict[str, Any] = {"$ref": "#"}
REF_LOOP: dict[str, Any] = {
    "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
    "$ref": "#/$defs/a",
}

# What pydantic writes for a model with a nested enum/model: the nested types under the schema's own $defs.
PYDANTIC_WEATHER: dict[str, Any] = {
    "$defs": {
        "Unit": {"enum": ["celsius", "fahrenheit"], "title": "Unit", "type": "string"},
        "Place": {
            "properties": {"city": {"maxLength": 12, "title": "City", "type": "string"}},
            "required": ["city"],
            "title": "Place",
            "type": "object",
            "additionalProperties": False,
        },
    },
    "properties": {"place": {"$ref": "#/$defs/Place"}, "unit": {"$ref": "#/$defs/Unit"}},
    "required": ["place", "unit"],
    "title": "Weather",
    "type": "object",
}


def tool(name: str, parameters: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {"name": name, "description": f"Call {name}", "parameters": parameters},
    }


def many_tools(n: int) -> list[dict[str, Any]]:
    """`n` small distinct tools (10,000 of them took 44.6 s on the event loop to a 400)."""
    return [tool(f"f{i}", {"type": "object", "properties": {"a": {"type": "string"}}}) for i in range(n)]


def _response_format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "attack", "schema": schema}}


def chat_body_attacks() -> list[tuple[str, dict[str, Any], str, str]]:
    """(name, extra chat-body fields, the 400's param, text its message must hold)."""
    loop_tools = [tool("loop", REF_LOOP)]
    named_loop = {"type": "function", "function": {"name": "loop"}}
    huge_tools = [tool(f"f{i}", {"description": "x" * 4000}) for i in range(300)]
    rf, t = "response_format", "tools"
    return [
        ("ref_chain_2000", {rf: _response_format(ref_chain(2000))}, rf, "MAX_SCHEMA_DEPTH"),
        ("self_ref", {rf: _response_format(SELF_REF)}, rf, "# -> #"),
        ("ref_loop", {rf: _response_format(REF_LOOP)}, rf, "#/$defs/a -> #/$defs/b -> #/$defs/a"),
        ("tools_10000_required", {t: many_tools(10_000), "tool_choice": "required"}, t, "MAX_TOOLS"),
        ("tools_10000_auto", {t: many_tools(10_000)}, t, "MAX_TOOLS"),
        ("tools_huge", {t: huge_tools}, t, "MAX_TOOLS_CHARS"),
        (
            "tool_ref_chain",
            {t: [tool("chain", ref_chain(2000))], "tool_choice": "required"},
            t,
            "MAX_SCHEMA_DEPTH",
        ),
        ("tool_ref_loop_required", {t: loop_tools, "tool_choice": "required"}, t, "never reaches"),
        ("tool_ref_loop_named", {t: loop_tools, "tool_choice": named_loop}, t, "never reaches"),
        ("tool_ref_loop_auto", {t: loop_tools}, t, "never reaches"),
        ("tool_self_ref_auto", {t: [tool("me", SELF_REF)]}, t, "never reaches"),
    ]
