"""The `--api-key` rule: which keys may be configured and which `Authorization` headers carry one.

Accepted: exactly one `Authorization` header whose value is the scheme `Bearer` in any case (RFC 7235
makes the scheme case-insensitive), one or more spaces (RFC 7235's `1*SP`), then the key, byte for byte,
and nothing else. The HTTP parser has already trimmed spaces around the value and refused folded
(obs-fold) header lines (http_strict.py). Tabs, other whitespace, a second header, a raw key without the
scheme and `x-api-key` are refused. This accepts what llama.cpp (`Bearer ` + key) and vLLM (any case,
one space) accept with the Bearer scheme.
"""

from __future__ import annotations

import hashlib
import hmac
import re

from starlette.requests import Request

from edgellm.server.protocol import ApiError

_BEARER = re.compile(rb"[Bb][Ee][Aa][Rr][Ee][Rr] +(?P<key>.*)", re.DOTALL)
_KEY_CHARS = re.compile(r"[\x21-\x7e]+")  # what an Authorization header carries without encoding


def check_api_key_option(key: str | None) -> None:
    """A key no client can send is an error at start-up, not a server that refuses everyone (or, for an
    empty key, one that lets everyone in)."""
    if key is not None and not _KEY_CHARS.fullmatch(key):
        raise ValueError(
            "--api-key: expected a non-empty key of printable ASCII characters without spaces "
            f"(what an Authorization header carries), got {len(key)} characters"
        )


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


def has_api_key(request: Request, api_key: str) -> bool:
    try:
        given = presented_key(request)
    except ApiError:
        return False
    return given is not None and hmac.compare_digest(_digest(given), _digest(api_key.encode()))


def check_api_key(request: Request, api_key: str) -> None:
    presented_key(request)  # the duplicate-header error first: it says what is wrong
    if not has_api_key(request, api_key):
        raise ApiError(
            401,
            "missing or invalid API key (send 'Authorization: Bearer <key>')",
            type="authentication_error",
            code="invalid_api_key",
        )
