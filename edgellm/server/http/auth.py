"""The `--api-key` rule: which keys may be configured and which `Authorization` headers carry one.

Accepted: exactly one `Authorization` header whose value is the scheme `Bearer` in any case (RFC 7235
makes the scheme case-insensitive), one or more spaces (RFC 7235's `1*SP`), then the key, byte for byte,
and nothing else. The HTTP parser has already trimmed spaces around the value and refused folded
(obs-fold) header lines (server/http/strict.py). Tabs, other whitespace, a second header, a raw key without
the scheme are refused. This accepts what llama.cpp (`Bearer ` + key) and vLLM (any case, one space) accept
with the Bearer scheme. Anthropic's routes also take the key as it sends it, one `x-api-key: KEY` header
(the key and nothing else); the OpenAI and Ollama routes do not.
"""

from __future__ import annotations

import hashlib
import hmac
import re

from starlette.requests import Request

from edgellm.server.http.errors import ApiError

_BEARER = re.compile(rb"[Bb][Ee][Aa][Rr][Ee][Rr] +(?P<key>.*)", re.DOTALL)
def _digest(raw: bytes) -> bytes:
    return hashlib.sha256(raw).digest()  # equal lengths: the comparison tells nothing of the key's length


def presented_key(request: Request) -> bytes | None:
    """The key of the request's one `Authorization: Bearer KEY` header, or None; a second header is a
    401 of its own (which one counts differs between proxies and servers: refuse to guess)."""
    values = [v for k, v in request.scope["headers"] if k == b"authorization"]
    if len(values) > 1:
        raise ApiError(
            401,
            "more than one Authorization header; send exactly one",
            type="authentication_error",
            code="invalid_api_key",
        )
    match = _BEARER.fullmatch(values[0]) if values else None
    return match["key"] if match else None


def _x_api_key(request: Request) -> bytes | None:
    values = [v for k, v in request.scope["headers"] if k == b"x-api-key"]
    if len(values) > 1:
        raise ApiError(
            401,
            "more than one x-api-key header; send exactly one",
            "authentication_error",
            code="invalid_api_key",
        )
    return values[0] if values else None


def _matches(given: bytes | None, api_key: str) -> bool:
    return given is not None and hmac.compare_digest(_digest(given), _digest(api_key.encode()))


def has_api_key(request: Request, api_key: str, x_api_key: bool = False) -> bool:
    """With `x_api_key`, either header may carry the key; every one present must carry it."""
    try:
        given = [presented_key(request)] + ([_x_api_key(request)] if x_api_key else [])
    except ApiError:
        return False
    present = [g for g in given if g is not None]
    if x_api_key and any(k == b"authorization" for k, _ in request.scope["headers"]) and given[0] is None:
        return False  # an Authorization header that is no Bearer key
    return bool(present) and all(_matches(g, api_key) for g in present)


def check_api_key(request: Request, api_key: str, x_api_key: bool = False) -> None:
    presented_key(request)  # the duplicate-header errors first: they say what is wrong
    if x_api_key:
        _x_api_key(request)
    if not has_api_key(request, api_key, x_api_key):
        how = "'x-api-key: <key>' or " if x_api_key else ""
        raise ApiError(
            401,
            f"missing or invalid API key (send {how}'Authorization: Bearer <key>')",
            type="authentication_error",
            code="invalid_api_key",
        )
