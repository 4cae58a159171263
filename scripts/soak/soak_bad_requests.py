"""Bad requests for scripts/soak/soak.py: malformed bodies, over-long prompts, attacks on the HTTP layer
(near-miss paths with a foreign Host header, percent-encoded paths, folded headers, and with a key, wrong
Authorization values; edgellm/testing/http_attacks.py) and the grammar/tool attacks of
edgellm.testing.grammar_attacks (schemas that crashed the compiler, 10,000 tools, $ref loops). Each must get
a 4xx (the status listed with it), never a 5xx or a redirect; the server must go on serving everyone else."""

from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import urlparse

from soak_traffic import Failed, Traffic

from edgellm.testing.grammar_attacks import chat_body_attacks
from edgellm.testing.http_attacks import (
    EVIL_HOST,
    NEAR_MISS_PATHS,
    PERCENT_TARGETS,
    bad_auth,
    folded_requests,
    get_bytes,
    raw_request,
)

RAW = "<raw>"  # the path of a case whose body is a whole request, sent as bytes over its own connection


def _j(obj: Any) -> bytes:
    return json.dumps(obj).encode()


def _deep(depth: int) -> str:
    return "[" * depth + "]" * depth


def malformed_bodies(model: str) -> list[tuple[str, str, bytes, set[int]]]:
    """(name, path, raw body, accepted statuses)."""
    msg = [{"role": "user", "content": "hi"}]
    chat, cmpl = "chat/completions", "completions"
    return [
        ("bad_json", chat, b'{"messages": [{"role": "user", "content": "hi"}', {400}),
        ("not_json", cmpl, b"prompt=hello", {400}),
        ("empty_body", chat, b"", {400}),
        ("json_array_body", chat, b"[1, 2, 3]", {400}),
        ("json_string_body", cmpl, b'"hello"', {400}),
        ("invalid_utf8", cmpl, b'{"prompt": "caf\xc3\x28"}', {400}),
        ("utf8_encoded_surrogate", cmpl, b'{"prompt": "a\xed\xa0\x80b"}', {400}),
        ("messages_string", chat, _j({"model": model, "messages": "hello"}), {400}),
        ("content_number", chat, _j({"messages": [{"role": "user", "content": 5}]}), {400}),
        (
            "content_object",
            chat,
            _j({"messages": [{"role": "user", "content": {"text": {"a": [1]}}}]}),
            {400},
        ),
        ("role_unknown", chat, _j({"messages": [{"role": "wizard", "content": "hi"}]}), {400}),
        ("temperature_string", chat, _j({"messages": msg, "temperature": "hot"}), {400}),
        (
            "temperature_nan",
            chat,
            b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}',
            {400},
        ),
        ("max_tokens_negative", cmpl, _j({"prompt": "hi", "max_tokens": -3}), {400}),
        ("max_tokens_bool", cmpl, _j({"prompt": "hi", "max_tokens": True}), {400}),
        ("n_zero", chat, _j({"messages": msg, "n": 0}), {400}),
        ("n_too_many", cmpl, _j({"prompt": "hi", "n": 17}), {400}),
        ("stop_number", cmpl, _j({"prompt": "hi", "stop": 7}), {400}),
        ("stop_empty_string", cmpl, _j({"prompt": "hi", "stop": [""]}), {400}),
        ("prompt_number", cmpl, _j({"prompt": 12}), {400}),
        ("prompt_mixed_list", cmpl, _j({"prompt": [1, "a"]}), {400}),
        ("prompt_empty_id_list", cmpl, _j({"prompt": [[]]}), {400}),
        ("prompt_id_out_of_vocab", cmpl, _j({"prompt": [10**9]}), {400}),
        ("prompt_huge_int", cmpl, b'{"prompt": [' + b"9" * 5000 + b"]}", {400}),
        ("logit_bias_bad_key", cmpl, _j({"prompt": "hi", "logit_bias": {"x": 1}}), {400}),
        ("stream_string", chat, _j({"messages": msg, "stream": "yes"}), {400}),
        ("stream_options_without_stream", chat, _j({"messages": msg, "stream_options": {}}), {400}),
        ("top_logprobs_without_logprobs", chat, _j({"messages": msg, "top_logprobs": 2}), {400}),
        ("echo_unsupported", cmpl, _j({"prompt": "hi", "echo": True}), {400}),
        ("suffix_unsupported", cmpl, _j({"prompt": "hi", "suffix": "x"}), {400}),
        ("unknown_model", chat, _j({"model": "no-such-model", "messages": msg}), {404}),
        ("nested_json_3000", chat, ('{"messages": ' + _deep(3000) + "}").encode(), {400}),
        ("nested_json_100k", cmpl, _deep(100_000).encode(), {400}),
        (
            "nested_in_ignored_field",
            chat,
            ('{"messages": [], "metadata": ' + _deep(5000) + "}").encode(),
            {400},
        ),
        ("lone_surrogate_content", chat, b'{"messages": [{"role": "user", "content": "x\\ud800y"}]}', {400}),
        ("lone_surrogate_prompt", cmpl, b'{"prompt": "\\udfff"}', {400}),
        ("lone_surrogate_stop", cmpl, b'{"prompt": "hi", "max_tokens": 2, "stop": ["\\ud83d"]}', {400}),
        ("lone_surrogate_model", chat, b'{"model": "\\ud800", "messages": []}', {400, 404}),
        ("surrogate_pair_with_bad_n", cmpl, b'{"prompt": "\\ud83d\\ude00", "n": 0}', {400}),
    ] + [
        (name, chat, _j({"model": model, "messages": msg, "max_tokens": 2, **extra}), {400})
        for name, extra, _, _ in chat_body_attacks()
    ]


OVERLONG_NAMES = (
    "overlong_chat",
    "overlong_completion_text",
    "overlong_completion_ids",
    "overlong_second_prompt",
)


def overlong_bodies(t: Traffic) -> list[tuple[str, str, bytes, set[int]]]:
    words = " ".join(["word"] * (t.ctx + 50))  # at least one token per word
    return [
        ("overlong_chat", "chat/completions", _j({"messages": [{"role": "user", "content": words}]}), {400}),
        ("overlong_completion_text", "completions", _j({"prompt": words, "max_tokens": 4}), {400}),
        ("overlong_completion_ids", "completions", _j({"prompt": [t.one_token_id] * t.ctx}), {400}),
        ("overlong_second_prompt", "completions", _j({"prompt": ["hi", words], "max_tokens": 4}), {400}),
    ]


async def send_bad(t: Traffic, path: str, raw: bytes, accepted: set[int]) -> int:
    """Post a raw body and return the status; raises Failed (with the status) if it is not one of
    `accepted` or the error body is not OpenAI's."""
    r = await t.http.post(f"{t.url}/v1/{path}", content=raw, headers={"content-type": "application/json"})
    if r.status_code not in accepted:
        raise Failed(f"status {r.status_code} (expected {sorted(accepted)}): {r.text[:300]}", r.status_code)
    try:
        err = r.json().get("error")
    except (ValueError, AttributeError):
        err = None
    if not (isinstance(err, dict) and err.get("message")):
        raise Failed(f"a {r.status_code} without an OpenAI error body: {r.text[:300]}", r.status_code)
    return r.status_code


def http_attacks(key: str | None) -> list[tuple[str, str, bytes, set[int]]]:
    """(name, RAW, request bytes, accepted statuses). With the key where a route needs one, so that
    only the path, the encoding or the header is wrong."""
    auth = (f"Authorization: Bearer {key}".encode(),) if key else ()
    host = EVIL_HOST.encode()
    cases = [(f"near_miss_path:{p}", RAW, get_bytes(p, *auth, host=host), {404}) for p in NEAR_MISS_PATHS]
    cases += [
        (f"percent_path:{target}", RAW, get_bytes(target, *auth, host=host), {404})
        for target, decoded in PERCENT_TARGETS
        if decoded not in ("/metrics", "/v1/models", "/v1/models/")  # routes, answered as such
    ]
    cases += [(f"folded:{name}", RAW, raw, {400}) for name, raw in folded_requests().items()]
    if key:
        cases += [
            (f"bad_auth:{i}", RAW, get_bytes("/v1/models", b"Authorization: " + v), {401})
            for i, v in enumerate(bad_auth(key.encode()))
        ]
    return cases


async def send_raw(t: Traffic, path: str, raw: bytes, accepted: set[int]) -> int:
    """Send one raw request and return its status; raises Failed if it is not one of `accepted` or
    the answer redirects."""
    answers = await asyncio.to_thread(raw_request, urlparse(t.url).port or 80, raw)
    if len(answers) != 1:
        raise Failed(f"{len(answers)} answers to one request", answers[0].status if answers else None)
    a = answers[0]
    if a.status not in accepted or "location" in a.headers:
        raise Failed(f"status {a.status} (expected {sorted(accepted)}), headers {a.headers}", a.status)
    return a.status
