"""Fuzzing the HTTP request parser: any JSON value as a body, and bodies made of the known fields with any
JSON values, give a request or an ApiError with status 400 - never another exception."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgellm.sampling import Sampler
from edgellm.server.protocol import ApiError, check_unicode, parse_chat, parse_completion

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
    for parse in (lambda b: parse_chat(b, 100, 64), lambda b: parse_completion(b, 100)):
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
