"""Fuzzing the HTTP request parser: any JSON value as a body, and bodies made of the known fields with any
JSON values, give a request or an ApiError with status 400 - never another exception. And what comes
before it: any Authorization headers pass only as one `Bearer KEY`, and any path, method and Host header
without the key is a 401, 404 or 405, never a redirect."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.requests import Request

from edgellm.config import ServerConfig
from edgellm.engine.config import EngineConfig
from edgellm.sampling.sampler import Sampler
from edgellm.server.app import build_app
from edgellm.server.http.auth import check_api_key, has_api_key
from edgellm.server.http.errors import ApiError
from edgellm.server.protocol import check_unicode, parse_chat, parse_completion
from edgellm.server.state import ServerState
from edgellm.testing.http_attacks import AsgiClient

FIELDS = [
    "model", "messages", "prompt", "max_tokens", "max_completion_tokens", "stop", "logit_bias", "stream",
    "stream_options", "top_k", "temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty",
    "frequency_penalty", "seed", "n", "user", "logprobs", "top_logprobs", "echo", "suffix",
]  # fmt: skip
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(10**400), max_value=10**400)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(st.characters(codec=None), max_size=20)  # includes lone surrogates, as JSON \ud800 gives
    | st.sampled_from(["user", "system", "assistant", "tool", "developer", "text", "0", "1", "-1", ""])
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5),
    max_leaves=30,
)
messages = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "system", "assistant", "tool", "developer"]) | json_values},
        optional={"content": st.text(max_size=20) | json_values},
    ),
    max_size=4,
)
bodies = st.fixed_dictionaries(
    {}, optional={**{f: json_values for f in FIELDS}, "messages": messages | json_values}
)


def _parse(body: object) -> None:
    for parse in (lambda b: parse_chat(b, 64), lambda b: parse_completion(b)):
        try:
            check_unicode(body)
            req = parse(body)
        except ApiError as e:
            assert e.status == 400 and e.message
            json.dumps(e.body()).encode("ascii")  # the error body always renders
        else:
            assert req.params.max_tokens >= 1 and 1 <= req.params.n <= 16
            # what the engine builds per completion accepts it too: nothing is left to fail mid-stream
            Sampler(req.params, rng_offset=req.params.n - 1)


@SETTINGS
@given(bodies)
def test_request_bodies_parse_or_are_400s(body: dict) -> None:
    _parse(body)


@SETTINGS
@given(json_values)
def test_any_json_value_parses_or_is_a_400(body: object) -> None:
    _parse(body)


# ---- the HTTP surface in front of the parser: Authorization values and paths (no model, no socket) ----

KEY = b"k"
GUARDED_CONFIG = ServerConfig(EngineConfig("unused.gguf"), api_key=KEY.decode())
GUARDED = AsgiClient(build_app(ServerState(GUARDED_CONFIG)))
SCHEMES = st.sampled_from([b"Bearer", b"bearer", b"BEARER", b"bEaReR", b"Basic", b"Bearer:", b"Bear", b""])
# separators and ends: what a lax parser (str.strip, split()) takes for spaces, and what it does not
WHITE = [b" ", b"  ", b"\t", b" \t", b"\t ", b"\xa0", b" \xa0", b"\x85", b" \x0b", b"\x0c", b""]
KEYS = st.sampled_from([KEY, KEY, b"K", b"kk", b"", b'"k"', b"k=", b"k k", b"k,"])
composed = st.builds(
    lambda *parts: b"".join(parts), SCHEMES, st.sampled_from(WHITE), KEYS, st.sampled_from(WHITE + [b"x"])
)
auth_values = st.one_of(composed, composed, st.binary(max_size=24))


def _accepted(values: list[bytes]) -> bool:
    """The README's rule, written another way than auth.py: one header, the Bearer scheme, spaces, the key."""
    if len(values) != 1:
        return False
    scheme, space, rest = values[0].partition(b" ")
    return scheme.lower() == b"bearer" and space == b" " and rest.lstrip(b" ") == KEY


@SETTINGS
@given(st.lists(auth_values, max_size=3))
def test_authorization_headers_pass_only_as_one_bearer_key(values: list[bytes]) -> None:
    request = Request({"type": "http", "headers": [(b"authorization", v) for v in values]})
    assert has_api_key(request, KEY.decode()) == _accepted(values)
    try:
        check_api_key(request, KEY.decode())
    except ApiError as e:
        assert e.status == 401 and not _accepted(values)
    else:
        assert _accepted(values)


SEGMENTS = st.sampled_from([
    "", "v1", "metrics", "health", "models", "chat", "completions", "embeddings", "tokenize", "detokenize",
    ".", "..", "%2F", "%", "x", "smollm2-135m", "metrics/", "api", "version", "tags", "messages", "responses",
])  # fmt: skip
paths = st.builds(
    lambda parts, end: "/" + "/".join(parts) + end, st.lists(SEGMENTS, max_size=4), st.sampled_from(["", "/"])
)
hosts = st.sampled_from(["127.0.0.1", "evil.example", "", "a/b", "localhost:1", "[::1]:9"])
methods = st.sampled_from(["GET", "POST", "HEAD", "PUT", "DELETE", "OPTIONS"])


@SETTINGS
@given(methods, paths, hosts, st.sampled_from([[], [("Authorization", "Bearer wrong")]]))
def test_without_the_key_any_path_is_a_401_403_404_or_405_never_a_redirect(
    method: str, path: str, host: str, headers: list
) -> None:
    a = GUARDED.request(method, path, headers, host=host)
    assert not 300 <= a.status < 400 and "location" not in a.headers, (a.status, a.headers)
    if path == "/health":
        assert a.status == 405 if method not in ("GET", "HEAD") else a.status == 503
        if method == "GET" and a.status == 503:
            assert a.json() == {"status": "loading"}  # no details without the key
        return
    foreign = host in ("evil.example", "", "a/b")  # not a name of the server: refused first (http/stack.py)
    assert a.status == 403 if foreign else a.status in (401, 404, 405), (method, path, host, a.status)
    if method != "HEAD":
        err = a.json()["error"]  # OpenAI's and Anthropic's {"message", ...}, Ollama's a string
        assert err["message"] if isinstance(err, dict) else err
# ---- hostile schemas and tools (issue 23) ------------------------------------------------------
GRAMMAR_EXAMPLES = int(os.environ.get("EDGELLM_FUZZ_EXAMPLES", "0")) or 60


@st.composite
def ref_graphs(draw: st.DrawFn) -> dict:
    """Schemas whose $defs refer to one another: chains of any length (past the depth limit too), loops,
    self references, through anyOf/allOf/items/properties, with some dangling pointers."""
    n = draw(st.integers(1, 400))
    wraps = [
        lambda r: r,
        lambda r: {"anyOf": [r, {"type": "integer"}]},
        lambda r: {"allOf": [r]},
        lambda r: {"type": "array", "items": r, "maxItems": 2},
        lambda r: {"type": "object", "properties": {"k": r}},
    ]
    defs = {}
    for i in range(n):
        target = draw(st.sampled_from(["next", "self", "root", "back", "missing", "leaf"]))
        ref = {
            "next": f"#/$defs/d{i + 1}",
            "self": f"#/$defs/d{i}",
            "root": "#",
            "back": f"#/$defs/d{draw(st.integers(0, i))}",
            "missing": "#/$defs/nope",
            "leaf": f"#/$defs/d{n}",
        }[target]
        defs[f"d{i}"] = draw(st.sampled_from(wraps))({"$ref": ref})
    defs[f"d{n}"] = draw(st.sampled_from([{"type": "string"}, {"$ref": "#/$defs/d0"}, {"enum": [1, 2]}]))
    return {"$defs": defs, "$ref": "#/$defs/d0"}


def _check_attack(body: dict, pool) -> None:
    from edgellm.grammar.compile import GrammarError, grammar_job
    from edgellm.server.tools import checked_tool_schema

    try:
        req = parse_chat(body, 64)
    except ApiError as e:
        assert e.status == 400 and e.message
        return
    try:
        c = req.constraint
        if req.tools is not None:
            job = grammar_job(checked_tool_schema(req.tools), None, None)
        else:
            job = None if c is None else grammar_job(c.json_schema, c.grammar, c.regex)
        if job is not None:
            pool.run(job)  # past the checks: compiles or is an error, never a crash
    except GrammarError as e:
        assert "crashed" not in str(e), e
        assert str(e)


@pytest.fixture(scope="module")
def fuzz_pool():
    from edgellm.grammar.worker import GrammarPool

    pool = GrammarPool(size=1)
    yield pool
    pool.close()


@settings(max_examples=GRAMMAR_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(ref_graphs(), st.sampled_from(["response_format", "required", "named", "auto"]))
def test_hostile_ref_graphs_are_400s_or_compile_without_crashing(fuzz_pool, schema: dict, where: str) -> None:
    msgs = [{"role": "user", "content": "hi"}]
    if where == "response_format":
        body = {
            "messages": msgs,
            "response_format": {"type": "json_schema", "json_schema": {"schema": schema}},
        }
    else:
        tools = [{"type": "function", "function": {"name": "f", "parameters": schema}}]
        choice = {"type": "function", "function": {"name": "f"}} if where == "named" else where
        body = {"messages": msgs, "tools": tools, "tool_choice": choice}
    _check_attack(body, fuzz_pool)
    assert fuzz_pool.crashes == 0
