"""The request fields llama-server's and vLLM's clients send, honoured with their real effect on both
OpenAI routes (issue 59): output constraints (json_schema, grammar, guided_*, structured_outputs),
min_tokens, repeat_penalty and n_probs; two constraints at once, or a window the penalty cannot honour,
are 400s naming the field."""

from __future__ import annotations

import json
import re

import jsonschema
import openai
import pytest

from edgellm.testing.servers import httpx

MODEL = "smollm2-135m"
SCHEMA = {
    "type": "object",
    "properties": {"colour": {"enum": ["red", "green", "blue"]}, "count": {"type": "integer"}},
    "required": ["colour", "count"],
    "additionalProperties": False,
}
ASK = [{"role": "user", "content": "Describe a colour and a number as JSON."}]


@pytest.fixture(scope="module")
def oai(apis_server: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{apis_server}/v1", api_key="unused", max_retries=0, timeout=120)


def _chat(url: str, **fields: object) -> httpx.Response:
    body = {"model": MODEL, "messages": ASK, "max_tokens": 60, "temperature": 0, **fields}
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)


def _complete(url: str, **fields: object) -> httpx.Response:
    body = {"model": MODEL, "prompt": "The answer is", "max_tokens": 40, "temperature": 0, **fields}
    return httpx.post(f"{url}/v1/completions", json=body, timeout=120)


def _text(r: httpx.Response) -> str:
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    return choice["message"]["content"] if "message" in choice else choice["text"]


@pytest.mark.parametrize(
    "fields",
    [
        {"json_schema": SCHEMA},  # llama-server
        {"guided_json": SCHEMA},  # vLLM
        {"guided_json": json.dumps(SCHEMA)},  # vLLM takes the schema's text too
        {"structured_outputs": {"json": SCHEMA}},  # vLLM 0.10+
        {"response_format": {"type": "json_object", "schema": SCHEMA}},  # llama-server's json_object
    ],
    ids=["json_schema", "guided_json", "guided_json_text", "structured_outputs.json", "json_object.schema"],
)
def test_json_schema_spellings_constrain_the_output_to_the_schema(apis_server: str, fields: dict) -> None:
    for ask in (_chat, _complete):
        jsonschema.validate(json.loads(_text(ask(apis_server, max_tokens=80, **fields))), SCHEMA)


def test_json_object_spellings(apis_server: str) -> None:
    for fields in (
        {"structured_outputs": {"json_object": True}},
        {"response_format": {"type": "json_object"}},
    ):
        assert isinstance(json.loads(_text(_chat(apis_server, max_tokens=80, **fields))), dict)


CHOICES = ["yes", "no", "maybe (later)", "a.b*c"]  # metacharacters are literal


@pytest.mark.parametrize(
    "fields",
    [{"guided_choice": CHOICES}, {"structured_outputs": {"choice": CHOICES}}],
    ids=["guided_choice", "structured_outputs.choice"],
)
def test_choices_give_exactly_one_of_them(apis_server: str, fields: dict) -> None:
    for ask in (_chat, _complete):
        assert _text(ask(apis_server, **fields)) in CHOICES


def test_regex_and_grammar_spellings(apis_server: str) -> None:
    for fields in (
        {"guided_regex": "[a-z]{3}-[0-9]{2}"},
        {"structured_outputs": {"regex": "[a-z]{3}-[0-9]{2}"}},
    ):
        for ask in (_chat, _complete):
            assert re.fullmatch(r"[a-z]{3}-[0-9]{2}", _text(ask(apis_server, **fields))), fields
    gbnf = 'root ::= "cat" | "dog" | "bird"'  # llama-server's GBNF
    lark = 'start: "cat" | "dog" | "bird"'  # vLLM's guided_grammar (Lark)
    for fields in ({"grammar": gbnf}, {"guided_grammar": lark}, {"structured_outputs": {"grammar": gbnf}}):
        for ask in (_chat, _complete):
            assert _text(ask(apis_server, **fields)) in {"cat", "dog", "bird"}, fields


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"json_schema": SCHEMA, "grammar": 'root ::= "x"'}, "'grammar'"),
        ({"response_format": {"type": "json_object"}, "guided_regex": "x"}, "'guided_regex'"),
        ({"guided_choice": []}, "'guided_choice'"),
        ({"guided_choice": ["a", 1]}, "'guided_choice'"),
        ({"guided_json": "{not json"}, "'guided_json'"),
        ({"structured_outputs": {"json": SCHEMA, "regex": "x"}}, "'structured_outputs'"),
        ({"structured_outputs": {"structural_tag": "x"}}, "'structured_outputs.structural_tag'"),
        ({"grammar": "root ::= undefined_rule"}, "'grammar'"),
        ({"min_tokens": 5, "guided_regex": "x"}, "'guided_regex'"),
        ({"min_tokens": 100, "max_tokens": 10}, "min_tokens"),
        ({"repeat_penalty": 1.3, "repeat_last_n": 64}, "'repeat_last_n'"),
        ({"repeat_penalty": 1.3, "repetition_penalty": 1.3}, "'repeat_penalty'"),
        ({"n_probs": 2, "logprobs": True, "top_logprobs": 2}, "'n_probs'"),
        ({"n_probs": 99}, "'n_probs'"),
    ],
)
def test_what_cannot_be_honoured_is_a_400_naming_it(apis_server: str, fields: dict, named: str) -> None:
    r = _chat(apis_server, **fields)
    assert r.status_code == 400 and named in r.json()["error"]["message"], r.text


def test_min_tokens_holds_back_the_end_until_reached(apis_server: str) -> None:
    say_hi = [{"role": "user", "content": "Reply with just the word: Hi"}]
    free = _chat(apis_server, messages=say_hi, max_tokens=200).json()
    ended = free["usage"]["completion_tokens"]
    assert free["choices"][0]["finish_reason"] == "stop" and ended < 40, free  # the model ends early
    held = _chat(apis_server, messages=say_hi, max_tokens=200, min_tokens=ended + 20).json()
    assert held["usage"]["completion_tokens"] >= ended + 20, held
    assert held["choices"][0]["message"]["content"].startswith(free["choices"][0]["message"]["content"])


def test_repeat_penalty_is_repetition_penalty(apis_server: str) -> None:
    prompt = "one two three one two three one two three"
    plain = _text(_complete(apis_server, prompt=prompt))
    ours = _text(_complete(apis_server, prompt=prompt, repetition_penalty=1.8))
    theirs = _text(_complete(apis_server, prompt=prompt, repeat_penalty=1.8, repeat_last_n=-1))
    assert theirs == ours != plain


def test_n_probs_are_the_logprobs_fields(apis_server: str, oai: openai.OpenAI) -> None:
    r = _complete(apis_server, n_probs=3, max_tokens=4).json()
    want = oai.completions.create(
        model=MODEL, prompt="The answer is", max_tokens=4, temperature=0, logprobs=3
    )
    assert r["choices"][0]["logprobs"]["tokens"] == want.choices[0].logprobs.tokens
    assert [len(t) for t in r["choices"][0]["logprobs"]["top_logprobs"]] == [3] * 4
    chat = _chat(apis_server, n_probs=2, max_tokens=3).json()
    content = chat["choices"][0]["logprobs"]["content"]
    assert len(content) == 3 and all(len(t["top_logprobs"]) == 2 for t in content)


def test_llama_servers_slot_hints_and_off_switches_are_taken_on_chat(apis_server: str) -> None:
    plain = _chat(apis_server, max_tokens=4).json()["choices"][0]["message"]["content"]
    quiet = {"id_slot": 0, "n_keep": -1, "n_cache_reuse": 0, "return_progress": False,
             "timings_per_token": False, "verbose": False, "continue_final_message": False,
             "add_generation_prompt": True}  # fmt: skip
    r = _chat(apis_server, max_tokens=4, **quiet)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == plain, r.text
    assert _complete(apis_server, max_tokens=2, return_progress=False, id_slot=1).status_code == 200


@pytest.mark.parametrize(
    "fields",
    [{"return_progress": True}, {"timings_per_token": True}, {"verbose": True},
     {"continue_final_message": True}, {"add_generation_prompt": False}],
)  # fmt: skip
def test_llama_servers_outputs_we_lack_are_a_400_naming_the_value(apis_server: str, fields: dict) -> None:
    [(name, value)] = fields.items()
    r = _chat(apis_server, max_tokens=2, **fields)
    msg = r.json()["error"]["message"]
    assert r.status_code == 400 and f"'{name}'" in msg and f"only {str(not value).lower()}" in msg, r.text


def test_a_json_object_schema_that_is_not_an_object_is_a_400(apis_server: str) -> None:
    r = _chat(apis_server, max_tokens=2, response_format={"type": "json_object", "schema": 123})
    assert r.status_code == 400 and "response_format.schema" in r.json()["error"]["message"], r.text


def test_chat_only_fields_are_unknown_on_completions(apis_server: str) -> None:
    r = _complete(apis_server, max_tokens=2, continue_final_message=False)
    assert r.status_code == 400 and "unrecognized" in r.json()["error"]["message"], r.text
