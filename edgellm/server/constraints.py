"""What a request constrains its output to, in each spelling the clients of the well-known servers send,
as one `Constraint` the grammar engine compiles (edgellm/grammar/compile.py: a JSON Schema, a Lark/GBNF
grammar or a regular expression the whole output matches):

| field | server | becomes |
|---|---|---|
| `response_format` (`json_object`, `json_schema`) | OpenAI | a JSON Schema (any object for json_object) |
| `json_schema` (a schema object) | llama-server | the schema |
| `grammar` (GBNF) | llama-server | the grammar (llguidance reads GBNF and Lark) |
| `guided_json` (a schema, or its JSON text) | vLLM | the schema |
| `guided_regex`, `guided_grammar` | vLLM | the regex, the grammar |
| `guided_choice` (a list of strings) | vLLM | a regex matching exactly one of them |
| `structured_outputs` (`json`, `regex`, `choice`, `grammar`, `json_object`) | vLLM 0.10+ | as the above |

At most one may be given: two are a 400 naming both (which one wins differs between servers).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from edgellm.server.http.errors import bad_value
from edgellm.server.tools import parse_response_format

# The fields of the table above, each request route takes them all.
CONSTRAINT_FIELDS = (
    "response_format", "json_schema", "grammar", "guided_json", "guided_regex", "guided_choice",
    "guided_grammar", "structured_outputs",
)  # fmt: skip
_STRUCTURED_KEYS = {"json": "guided_json", "regex": "guided_regex", "choice": "guided_choice",
                    "grammar": "guided_grammar", "json_object": None}  # fmt: skip
_REGEX_META = set("\\.+*?()|[]{}^$")


@dataclass(frozen=True)
class Constraint:
    param: str  # the field that asked for it: errors name it
    json_schema: dict[str, Any] | bool | None = None  # True: any JSON object
    grammar: str | None = None
    regex: str | None = None


def _text(value: Any, param: str) -> str:
    if not isinstance(value, str) or not value:
        raise bad_value(param, "expected a non-empty string")
    return value


def _schema(value: Any, param: str) -> dict[str, Any]:
    if isinstance(value, str):  # vLLM takes the schema's JSON text too
        try:
            value = json.loads(value)
        except (ValueError, RecursionError) as e:
            raise bad_value(param, f"not a JSON Schema: {e}") from None
    if not isinstance(value, dict):
        raise bad_value(param, "expected a JSON Schema object")
    return value


def choice_regex(choices: Any, param: str) -> str:
    """A regex matching exactly one of `choices` (each literal: its metacharacters escaped)."""
    if not isinstance(choices, list) or not choices or not all(isinstance(c, str) and c for c in choices):
        raise bad_value(param, "expected a non-empty list of non-empty strings")
    literal = ("".join("\\" + ch if ch in _REGEX_META else ch for ch in c) for c in choices)
    return "(" + "|".join(literal) + ")"


def _one(field: str, value: Any) -> Constraint:
    if field == "json_schema" or field == "guided_json":
        return Constraint(field, json_schema=_schema(value, field))
    if field == "grammar" or field == "guided_grammar":
        return Constraint(field, grammar=_text(value, field))
    if field == "guided_regex":
        return Constraint(field, regex=_text(value, field))
    if field == "guided_choice":
        return Constraint(field, regex=choice_regex(value, field))
    assert field == "structured_outputs"
    if not isinstance(value, dict):
        raise bad_value(field, "expected an object")
    given = [k for k, v in value.items() if v is not None and v is not False]
    unknown = sorted(set(given) - set(_STRUCTURED_KEYS))
    if unknown:
        raise bad_value(f"{field}.{unknown[0]}", f"not supported (supported: {', '.join(_STRUCTURED_KEYS)})")
    if len(given) != 1:
        raise bad_value(field, f"expected exactly one of {', '.join(_STRUCTURED_KEYS)}")
    key = given[0]
    if key == "json_object":
        if value[key] is not True:
            raise bad_value(f"{field}.json_object", "expected true")
        return Constraint(f"{field}.json_object", json_schema=True)
    inner = _one(_STRUCTURED_KEYS[key] or key, value[key])
    return Constraint(f"{field}.{key}", inner.json_schema, inner.grammar, inner.regex)


def parse_constraint(body: dict[str, Any]) -> Constraint | None:
    """The one constraint `body` asks for, or None (text as the model writes it)."""
    given = [f for f in CONSTRAINT_FIELDS if body.get(f) is not None]
    if "response_format" in given and parse_response_format(body) is None:
        given.remove("response_format")  # {"type": "text"} asks for nothing
    if len(given) > 1:
        raise bad_value(given[1], f"cannot be combined with '{given[0]}': give one output constraint")
    if not given:
        return None
    if given[0] == "response_format":
        return Constraint("response_format", json_schema=parse_response_format(body))
    return _one(given[0], body[given[0]])
