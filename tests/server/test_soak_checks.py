"""scripts/soak/soak.py's checks and stream parsing on made-up figures: each leak or wrong answer the soak
is meant to catch fails its check, and a clean run passes them all."""

from __future__ import annotations

import json
import sys

import pytest

from edgellm.testing.paths import SCRIPTS  # noqa: E402

sys.path.insert(0, str(SCRIPTS / "soak"))

from soak_report import SoakReport, evaluate, format_summary, parse_metrics  # noqa: E402
from soak_traffic import Failed, Result, join_stream, parse_sse  # noqa: E402

IDLE = {
    "edgellm_num_requests_running": 0.0,
    "edgellm_num_requests_waiting": 0.0,
    "edgellm_kv_cache_blocks_used": 0.0,
    "edgellm_kv_cache_blocks_total": 33.0,
    "edgellm_num_preemptions_total": 0.0,
}


def _report(**changes) -> SoakReport:
    results = [Result("chat", "ok", 1.0, 200), Result("malformed", "rejected", 0.1, 400, "bad_json: ")]
    base = dict(
        results=results,
        sent=2,
        idle_metrics=IDLE,
        end_metrics={
            **IDLE,
            "edgellm_num_preemptions_total": 3.0,
            'edgellm_http_errors_total{status="400"}': 1,
        },
        health_status=200,
        server_alive=True,
        rss_series=[(0.0, 1000), (10.0, 1010)],
        rss_after_warmup_kb=1000,
        rss_end_kb=1040,
    )
    return SoakReport(**{**base, **changes})


def _failed(r: SoakReport) -> set[str]:
    return {name for name, ok, _ in evaluate(r) if not ok}


def test_a_clean_run_passes_every_check_and_prints_them() -> None:
    r = _report()
    assert _failed(r) == set()
    text = format_summary(r, evaluate(r), warmup_end=0.0)
    assert "PASS  RSS growth after warm-up < 5%" in text and "FAIL" not in text


@pytest.mark.parametrize(
    ("changes", "check"),
    [
        ({"results": [Result("chat", "wrong", 1.0, 200, "greedy output differs")]}, "every request"),
        ({"results": [Result("malformed", "5xx", 0.1, 500)], "sent": 1}, "no 5xx seen by the clients"),
        ({"sent": 3}, "no lost requests"),
        ({"health_status": 503}, "/health is 200"),
        ({"server_alive": False}, "server process alive"),
        ({"stopped_early": "/health answered 503"}, "load ran its full time"),
        ({"end_metrics": {**IDLE, "edgellm_num_requests_running": 1.0}}, "server idle at the end"),
        ({"end_metrics": {**IDLE, "edgellm_num_requests_waiting": 2.0}}, "server idle at the end"),
        ({"end_metrics": None}, "server idle at the end"),
        ({"end_metrics": {**IDLE, "edgellm_kv_cache_blocks_used": 2.0}}, "KV blocks back"),
        ({"end_metrics": {**IDLE, 'edgellm_http_errors_total{status="500"}': 1.0}}, "no 5xx in the server"),
        ({"end_metrics": IDLE}, "the KV cache ran out"),
        ({"rss_end_kb": 1060}, "RSS growth"),
    ],
)
def test_each_problem_fails_its_check(changes: dict, check: str) -> None:
    failed = _failed(_report(**changes))
    assert any(name.startswith(check) for name in failed), failed


def test_preemption_is_not_required_of_a_server_the_soak_did_not_size() -> None:
    assert _failed(_report(end_metrics=IDLE, expect_preemption=False)) == set()


def test_parse_metrics_drops_the_model_label() -> None:
    text = (
        '# HELP x y\nedgellm_num_requests_running{model_name="m"} 2\n'
        'edgellm_http_errors_total{model_name="m",status="500"} 4\n'
    )
    m = parse_metrics(text)
    assert m == {"edgellm_num_requests_running": 2.0, 'edgellm_http_errors_total{status="500"}': 4.0}


def _sse(*chunks: object) -> list[str]:
    return [line for c in chunks for line in (f"data: {c if isinstance(c, str) else json.dumps(c)}", "")]


def _chunk(index: int, text: str, finish: str | None = None) -> dict:
    return {"choices": [{"index": index, "delta": {"content": text}, "finish_reason": finish}]}


def test_stream_parsing_joins_choices_and_needs_done() -> None:
    lines = _sse(
        _chunk(0, "Hel"), _chunk(1, "A"), _chunk(0, "lo"), _chunk(0, "", "stop"), _chunk(1, "", "length")
    )
    chunks, done = parse_sse([*lines, "data: [DONE]", ""])
    assert done and join_stream(chunks, chat=True) == {0: ("Hello", "stop"), 1: ("A", "length")}
    assert parse_sse(lines)[1] is False


@pytest.mark.parametrize(
    "lines",
    [
        _sse({"error": {"message": "engine failed"}}, "[DONE]"),  # an in-band error
        _sse("[DONE]", _chunk(0, "late")),  # data after the end
        ["event: surprise"],  # not SSE data
    ],
)
def test_stream_parsing_rejects_broken_streams(lines: list[str]) -> None:
    with pytest.raises(Failed):
        parse_sse(lines)


def test_text_after_finish_is_a_failure() -> None:
    chunks, _ = parse_sse(_sse(_chunk(0, "a", "stop"), _chunk(0, "b")))
    with pytest.raises(Failed):
        join_stream(chunks, chat=True)
