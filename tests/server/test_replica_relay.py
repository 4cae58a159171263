"""The pieces of `serve --replicas` that need no Ray: HTTP relayed as ASGI messages (asgi_relay.py), the
merged /metrics page (replica_metrics.py) and the command line's checks."""

from __future__ import annotations

import asyncio
import json
import pickle
from collections.abc import AsyncIterator

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from edgellm.cli.commands import build_parser, main
from edgellm.server.http.errors import ApiError
from edgellm.server.replicas.asgi_relay import Relay, app_messages, portable_scope, read_body
from edgellm.server.replicas.replica_metrics import label_replicas

SCOPE = {
    "type": "http",
    "method": "POST",
    "path": "/v1/echo",
    "raw_path": b"/v1/echo",
    "root_path": "",
    "query_string": b"",
    "headers": [(b"content-type", b"application/json")],
    "http_version": "1.1",
    "scheme": "http",
    "client": ("127.0.0.1", 5000),
    "server": ("127.0.0.1", 8080),
}


def make_app(closed: list[str]) -> Starlette:
    async def echo(request: Request) -> JSONResponse:
        return JSONResponse({"got": await request.json()}, status_code=201)

    async def stream(request: Request) -> StreamingResponse:
        async def events() -> AsyncIterator[str]:
            try:
                for i in range(1000):
                    yield f"data: {i}\n\n"
                    await asyncio.sleep(0.001)
            finally:
                closed.append("stream")

        return StreamingResponse(events(), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/echo", echo, methods=["POST"]), Route("/v1/stream", stream)])


def test_app_messages_runs_the_app_and_tags_the_response_head() -> None:
    async def main() -> list[dict]:
        return [
            m async for m in app_messages(make_app([]), SCOPE, b'{"a": 1}', [(b"x-edgellm-replica", b"r7")])
        ]

    start, *body = asyncio.run(main())
    assert start["type"] == "http.response.start" and start["status"] == 201
    assert (b"x-edgellm-replica", b"r7") in start["headers"]
    assert json.loads(b"".join(m.get("body", b"") for m in body)) == {"got": {"a": 1}}


def test_closing_the_message_stream_cancels_the_app() -> None:
    """The ingress cancels the replica call when its client goes away: the app's stream must end too
    (in the server that is what aborts the engine requests)."""
    closed: list[str] = []

    async def main() -> int:
        scope = {**SCOPE, "method": "GET", "path": "/v1/stream", "raw_path": b"/v1/stream"}
        gen = app_messages(make_app(closed), scope, b"", [])
        n = 0
        async for msg in gen:
            n += msg["type"] == "http.response.body"
            if n == 3:
                break
        await gen.aclose()
        await asyncio.sleep(0.05)
        return n

    assert asyncio.run(main()) == 3
    assert closed == ["stream"]


def test_portable_scope_pickles_and_keeps_what_the_app_reads() -> None:
    scope = {**SCOPE, "app": object(), "state": {"x": object()}, "headers": [[b"a", b"b"]]}
    out = pickle.loads(pickle.dumps(portable_scope(scope)))
    assert "app" not in out and "state" not in out
    assert (
        out["headers"] == [(b"a", b"b")]
        and out["path"] == "/v1/echo"
        and out["client"] == ("127.0.0.1", 5000)
    )


def receiver(chunks: list[bytes], disconnect: bool = False):
    msgs = [
        {"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)
    ]
    if disconnect:
        msgs[-1] = {"type": "http.disconnect"}

    async def receive() -> dict:
        return msgs.pop(0)

    return receive


def test_read_body_keeps_one_byte_past_the_limit_and_notices_a_disconnect() -> None:
    assert asyncio.run(read_body(receiver([b"abc", b"def"]), 10)) == b"abcdef"
    assert asyncio.run(read_body(receiver([b"abcdef", b"ghijkl", b"mn"]), 10)) == b"abcdefghijk"
    assert asyncio.run(read_body(receiver([b"abc", b"def"], disconnect=True), 10)) is None


class Gone(Exception):
    pass


def fake_stream(msgs: list[dict], fail: Exception | None, closed: list[int], n: int):
    async def gen() -> AsyncIterator[dict]:
        for m in msgs:
            yield m
        if fail is not None:
            raise fail

    return gen(), lambda: closed.append(n)


OK_JSON = [
    {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]},
    {"type": "http.response.body", "body": b'{"ok":true}', "more_body": False},
]
SSE_HEAD = {
    "type": "http.response.start",
    "status": 200,
    "headers": [(b"content-type", b"text/event-stream")],
}


def relay(
    streams: list[tuple[list[dict], Exception | None]], **kw
) -> tuple[list[dict], str | None, list[int]]:
    sent, closed, opened = [], [], []

    async def send(msg: dict) -> None:
        sent.append(msg)

    def open_stream():
        opened.append(len(opened))
        msgs, fail = streams[len(opened) - 1]
        return fake_stream(msgs, fail, closed, len(opened) - 1)

    async def receive() -> dict:
        return {"type": "http.disconnect"}

    r = Relay(lambda e: isinstance(e, Gone), **kw)
    reason = asyncio.run(r(SCOPE, receive, send, open_stream))
    assert closed == opened  # every replica call is closed, whatever happened
    return sent, reason, opened


def body_of(sent: list[dict]) -> bytes:
    return b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


def test_a_replica_gone_before_answering_is_retried_on_another() -> None:
    sent, reason, opened = relay([([], Gone("actor died")), (OK_JSON, None)])
    assert reason is None and len(opened) == 2
    assert sent == OK_JSON


def test_retries_stop_and_the_client_gets_a_503_naming_the_failure() -> None:
    sent, reason, opened = relay([([], Gone("actor died"))] * 3, max_attempts=3)
    assert len(opened) == 3 and "actor died" in reason
    assert sent[0]["status"] == 503
    err = json.loads(body_of(sent))["error"]
    assert err["code"] == "replica_failed" and "Gone: actor died" in err["message"]


def test_a_failure_that_is_not_a_lost_replica_is_not_retried() -> None:
    sent, reason, opened = relay([([], RuntimeError("bug")), (OK_JSON, None)])
    assert len(opened) == 1 and sent[0]["status"] == 503 and "RuntimeError: bug" in reason
    full = ApiError(
        429, "queue full", type="rate_limit_error", code="queue_full", headers={"Retry-After": "1"}
    )
    sent, _, _ = relay([([], RuntimeError("backpressure"))], error_for=lambda e: full)
    assert sent[0]["status"] == 429 and (b"retry-after", b"1") in sent[0]["headers"]
    assert json.loads(body_of(sent))["error"]["code"] == "queue_full"


ROLE = {"type": "http.response.body", "more_body": True}
ROLE["body"] = b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
TOKEN = {"type": "http.response.body", "more_body": True}
TOKEN["body"] = b'data: {"choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":null}]}\n\n'


def test_a_stream_lost_before_its_first_token_is_retried_unseen() -> None:
    """The head and the role chunk are held back: the client sees only the retry's stream."""
    done = {"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False}
    sent, reason, opened = relay(
        [([SSE_HEAD, ROLE], Gone("actor died")), ([SSE_HEAD, ROLE, TOKEN, done], None)]
    )
    assert reason is None and len(opened) == 2
    assert sent == [SSE_HEAD, ROLE, TOKEN, done]


def test_a_stream_cut_after_a_token_ends_with_an_in_band_error_not_a_retry() -> None:
    sent, reason, opened = relay([([SSE_HEAD, ROLE, TOKEN], Gone("actor died")), (OK_JSON, None)])
    assert len(opened) == 1 and reason is not None
    assert sent[:3] == [SSE_HEAD, ROLE, TOKEN] and sent[-1]["more_body"] is False
    last = body_of(sent[3:]).decode()
    assert last.startswith("data: ") and json.loads(last[6:])["error"]["code"] == "replica_failed"
    # A plain (non-SSE) body cut after its head just ends: the client sees a short body.
    head = {**OK_JSON[0]}
    part = {"type": "http.response.body", "body": b'{"ok"', "more_body": True}
    sent, _, _ = relay([([head, part], Gone("x"))])
    assert sent == [head, part, {"type": "http.response.body", "body": b"", "more_body": False}]


def test_metrics_pages_merge_under_one_header_per_family_with_a_replica_label() -> None:
    page = (
        "# HELP edgellm_x_total Things.\n# TYPE edgellm_x_total counter\n"
        'edgellm_x_total{model_name="m"} {n}\n'
        "# HELP edgellm_h Lat.\n# TYPE edgellm_h histogram\n"
        'edgellm_h_bucket{model_name="m",le="0.1"} 1\nedgellm_h_sum{model_name="m"} 0.05\n'
        "edgellm_bare 3\n"
    )
    text = label_replicas({"a": page.replace("{n}", "1"), "b": page.replace("{n}", "2")})
    lines = text.splitlines()
    assert lines.count("# TYPE edgellm_x_total counter") == 1 and lines.count("# HELP edgellm_h Lat.") == 1
    assert (
        'edgellm_x_total{model_name="m",replica="a"} 1.0' in lines
        and 'edgellm_x_total{model_name="m",replica="b"} 2.0' in lines
    )
    assert 'edgellm_h_bucket{le="0.1",model_name="m",replica="b"} 1.0' in lines
    assert 'edgellm_bare{replica="a"} 3.0' in lines
    x = [i for i, line in enumerate(lines) if "edgellm_x" in line]
    assert x == list(range(x[0], x[0] + len(x)))  # a family's lines stay together
    assert label_replicas({}) == ""


def test_label_values_with_quotes_braces_and_spaces_survive_the_merge() -> None:
    """A model named with a quote, a brace or a space (a file's stem can be anything) keeps valid text."""
    from prometheus_client.parser import text_string_to_metric_families

    from edgellm.server.metrics import ServerMetrics

    odd = 'my "best" {model} \\ v2'
    page = ServerMetrics(odd)
    page.count_error(400)
    text = label_replicas({"r 1": page.render(_idle_stats())})
    errors = {f.name: f for f in text_string_to_metric_families(text)}["edgellm_http_errors"]
    [sample] = [s for s in errors.samples if s.name == "edgellm_http_errors_total"]
    assert sample.labels == {"model_name": odd, "status": "400", "replica": "r 1"} and sample.value == 1


def _idle_stats():  # noqa: ANN202
    import dataclasses

    from edgellm.engine.protocol import EngineStats

    return EngineStats(**{f.name: 0 for f in dataclasses.fields(EngineStats)})


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["--replicas", "0"], "neither a replica count"),
        (["--replicas", "two"], "neither a replica count"),
    ],
)
def test_replicas_flag_refuses_what_is_not_a_count_or_auto(argv: list[str], error: str, capsys) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "m", *argv])
    assert error in capsys.readouterr().err


def test_replicas_flag_parses_counts_and_auto() -> None:
    assert build_parser().parse_args(["serve", "m", "--replicas", "3"]).replicas == 3
    assert build_parser().parse_args(["serve", "m", "--replicas", "auto"]).replicas == "auto"


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["--ray-address", "auto"], "go with --replicas"),
        (["--threads-per-replica", "2"], "go with --replicas"),
        (["--replicas", "2", "--threads", "2"], "say --threads-per-replica"),
    ],
)
def test_ray_flags_out_of_place_are_clear_errors(argv: list[str], error: str, capsys) -> None:
    assert main(["serve", "smollm2-135m", *argv]) == 2
    assert error in capsys.readouterr().err


def test_a_call_refused_at_once_is_answered_too() -> None:
    sent: list[dict] = []

    async def send(msg: dict) -> None:
        sent.append(msg)

    def open_stream():
        raise Gone("no replica")

    async def receive() -> dict:
        return {"type": "http.disconnect"}

    reason = asyncio.run(
        Relay(lambda e: isinstance(e, Gone), max_attempts=2)(SCOPE, receive, send, open_stream)
    )
    assert "no replica" in reason and sent[0]["status"] == 503
