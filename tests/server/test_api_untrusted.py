"""Untrusted input on the Ollama, Anthropic and Responses routes: every malformed body of
edgellm/testing/api_attacks.py is a 400 in the API's error shape naming the field (streamed or not), never
a 500, while the server keeps serving; fuzzed bodies through each translation and parse_chat give a
request or a 400, never another exception; and the `x-api-key` rule of the Anthropic routes."""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgellm.config import ServerConfig
from edgellm.engine.config import EngineConfig
from edgellm.server.anthropic import routes as anthropic_api
from edgellm.server.app import build_app
from edgellm.server.http.errors import ApiError
from edgellm.server.ollama import options as ollama_options
from edgellm.server.protocol import check_unicode, parse_chat
from edgellm.server.responses import input as responses_input
from edgellm.server.state import ServerState
from edgellm.testing.api_attacks import ANTHROPIC, NEW_POST_ROUTES, OLLAMA, RAW, RESPONSES, error_message
from edgellm.testing.http_attacks import AsgiClient

ATTACKS = OLLAMA + ANTHROPIC + RESPONSES


def _ids(cases: list) -> list[str]:
    return [f"{p}:{json.dumps(b)[:60]}" for p, b, _ in cases]


def _alive(url: str) -> None:
    r = httpx.post(f"{url}/api/chat", json={"messages": [{"role": "user", "content": "hi"}], "stream": False,
                                            "options": {"num_predict": 1}}, timeout=60)  # fmt: skip
    assert r.status_code == 200 and r.json()["done"], r.text


@pytest.mark.parametrize(("path", "body", "named"), ATTACKS, ids=_ids(ATTACKS))
def test_malformed_bodies_are_400s_naming_the_field(
    apis_server: str, path: str, body: dict, named: str
) -> None:
    for stream in (False, True):  # a streamed request is checked before its first byte too
        if "stream" in body and stream:
            continue
        sent = {**body, "stream": True} if stream else body
        if path.startswith("/v1/messages") and stream and "count_tokens" in path:
            continue  # count_tokens does not stream
        r = httpx.post(f"{apis_server}{path}", json=sent, timeout=60)
        assert r.status_code == 400, (stream, r.text)
        message = error_message(path, r.json())
        assert message is not None and named in message, r.text


def test_the_server_still_serves_after_the_attacks(apis_server: str) -> None:
    _alive(apis_server)


@pytest.mark.parametrize("path", NEW_POST_ROUTES)
@pytest.mark.parametrize(("raw", "message"), RAW, ids=[m for _, m in RAW])
def test_bodies_that_are_no_request_are_400s(apis_server: str, path: str, raw: bytes, message: str) -> None:
    r = httpx.post(f"{apis_server}{path}", content=raw, timeout=60)
    assert r.status_code == 400, r.text
    got = error_message(path, r.json())
    assert got is not None and message in got, r.text


# ---- fuzzing the translations (in process, no model) ---------------------------------------------------
scalars = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8)
    | st.sampled_from(["user", "assistant", "system", "tool", "text", "tool_use", "tool_result", "function",
                       "function_call", "function_call_output", "json_schema", "json", "any", "auto",
                       "message"])
)  # fmt: skip
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["type", "role", "content", "text", "name", "id", "input", "tool_use_id", "call_id",
                         "arguments", "output", "function", "parameters", "input_schema", "schema", "format",
                         "tool_calls", "tool_name", "images", "is_error"]) | st.text(max_size=6),
        inner, max_size=5),
    max_leaves=25,
)  # fmt: skip
FIELDS = sorted(anthropic_api.FIELDS | responses_input.FIELDS | {"options", "format", "keep_alive", "think"})
bodies = st.dictionaries(st.sampled_from(FIELDS), values, max_size=8)
SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _ollama(body: dict) -> dict:
    ollama_options.check_common(body, 64)
    out = ollama_options.openai_fields(body, 64)
    out["messages"] = ollama_options.chat_messages(body.get("messages"))
    return out


TRANSLATIONS = {
    "ollama": _ollama,
    "anthropic": lambda b: anthropic_api.openai_body(b, anthropic_api.FIELDS),
    "responses": lambda b: responses_input.openai_body(b, responses_input.ResponseStore())[0],
}


@pytest.mark.parametrize("api", sorted(TRANSLATIONS))
@SETTINGS
@given(body=bodies)
def test_fuzzed_bodies_are_requests_or_400s(api: str, body: dict) -> None:
    try:
        check_unicode(body)
        parse_chat(TRANSLATIONS[api](body), 64)
    except ApiError as e:
        assert e.status == 400 and e.param, e.message


# ---- the key ----------------------------------------------------------------------------------------------
KEY = "sk-test-key"


@pytest.fixture(scope="module")
def guarded() -> AsgiClient:
    return AsgiClient(
        build_app(ServerState(ServerConfig(EngineConfig("x"), api_key=KEY)))
    )  # never loads: 503 past auth


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/count_tokens"])
def test_anthropic_routes_take_x_api_key_or_bearer(guarded: AsgiClient, path: str) -> None:
    post = lambda *h: guarded.request("POST", path, list(h), b"{}")  # noqa: E731
    assert post(("x-api-key", KEY)).status == 503  # past the key check: the model is still loading
    assert post(("Authorization", f"Bearer {KEY}")).status == 503
    refused = [
        [("x-api-key", "wrong")], [], [("x-api-key", KEY), ("x-api-key", KEY)],
        [("x-api-key", KEY), ("Authorization", "Bearer wrong")],
        [("x-api-key", KEY), ("Authorization", "Basic abc")], [("x-api-key", f" {KEY}")],
    ]  # fmt: skip
    for headers in refused:
        r = post(*headers)
        assert r.status == 401, headers
        assert r.json()["type"] == "error" and r.json()["error"]["type"] == "authentication_error"


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/responses", "/api/chat"])
def test_other_routes_do_not_take_x_api_key(guarded: AsgiClient, path: str) -> None:
    assert guarded.request("POST", path, [("x-api-key", KEY)], b"{}").status == 401
    assert guarded.request("POST", path, [("Authorization", f"Bearer {KEY}")], b"{}").status == 503
