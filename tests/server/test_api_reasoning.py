"""The reasoning split on the other APIs, with tests/engine/test_reasoning.py's tiny synthetic Qwen3 model
(its template opens `<think>`, the reasoning budget closes it): `message.thinking` on /api/chat, `thinking`
blocks on /v1/messages, a reasoning item on /v1/responses, whole and streamed through the real clients, each
the same reasoning and answer as the OpenAI chat route's `reasoning_content` and `content`; thinking off
(`think: false`, `reasoning.effort: "none"`) goes to the template's switch. A per-request budget
(`reasoning_effort` levels, `thinking_budget_tokens`, Anthropic's `budget_tokens`, Ollama's `think` levels)
replaces the server's: the reasoning stops at it (the engine forces the close) and the answer follows, on
all four APIs."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace

import anthropic
import ollama
import openai
import pytest

from edgellm.chat.reasoning import REASONING_END
from edgellm.server.http.errors import ApiError
from edgellm.server.thinking import thinking_options
from edgellm.server.thinking_fields import EFFORT_BUDGETS, ThinkingAsk, effort_budget, parse_thinking
from edgellm.testing.harmony import HARMONY_TEMPLATE
from edgellm.testing.reasoning import ASK, BUDGET, THINKING_TEMPLATE
from edgellm.testing.servers import serve as _start
from edgellm.testing.synthetic.models import write_tiny_model

MAX_TOKENS = 32


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    path = tmp_path_factory.mktemp("api-reasoning") / "qwen3-thinking.gguf"
    write_tiny_model(path, "qwen3", metadata_overrides={"tokenizer.chat_template": THINKING_TEMPLATE})
    yield from _start(path, "--reasoning-budget", str(BUDGET))


@pytest.fixture(scope="module")
def want(url: str) -> dict[str, tuple[str, str]]:
    """The OpenAI chat route's (reasoning, answer), thinking on and off."""
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
    out = {}
    for name, extra in (("on", {"chat_template_kwargs": {"enable_thinking": True}}),
                        ("none", {"reasoning_effort": "none"})):  # fmt: skip
        r = client.chat.completions.create(model="tiny", messages=ASK, max_tokens=MAX_TOKENS, temperature=0,
                                           extra_body=extra)  # fmt: skip
        m = r.choices[0].message
        out[name] = ((m.model_extra or {}).get("reasoning_content") or "", m.content or "")
    assert out["on"][0] and out["on"][1] and not out["none"][0]  # thinks, answers, stops when told
    return out


def test_ollama_message_thinking(url: str, want: dict) -> None:
    client = ollama.Client(host=url, timeout=120)
    opts = {"temperature": 0, "num_predict": MAX_TOKENS}
    r = client.chat(model="tiny", messages=ASK, options=opts, think=True)
    assert (r.message.thinking, r.message.content) == want["on"]
    parts = list(client.chat(model="tiny", messages=ASK, options=opts, think=True, stream=True))
    streamed = ("".join(p.message.thinking or "" for p in parts), "".join(p.message.content for p in parts))
    assert streamed == want["on"]
    off = client.chat(model="tiny", messages=ASK, options=opts, think=False)
    assert (off.message.thinking or "", off.message.content) == want["none"]
    g = client.generate(model="tiny", prompt=ASK[0]["content"], options=opts)
    assert (g.thinking, g.response) == want["on"]


def test_anthropic_thinking_blocks(url: str, want: dict) -> None:
    client = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0, timeout=120)
    kw = {"model": "tiny", "max_tokens": MAX_TOKENS, "messages": ASK, "extra_body": {"temperature": 0}}
    m = client.messages.create(**kw)
    assert [b.type for b in m.content] == ["thinking", "text"][: len(m.content)]
    got = (m.content[0].thinking, "".join(b.text for b in m.content if b.type == "text"))
    assert got == want["on"]
    with client.messages.stream(**kw) as s:
        final = s.get_final_message()
    assert [b.model_dump() for b in final.content] == [b.model_dump() for b in m.content]
    off = client.messages.create(**kw, thinking={"type": "disabled"})
    assert [b.type for b in off.content] == ["text"] and off.content[0].text == want["none"][1]


def test_responses_reasoning_item(url: str, want: dict) -> None:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
    kw = {"model": "tiny", "input": ASK[0]["content"], "max_output_tokens": MAX_TOKENS, "temperature": 0}
    r = client.responses.create(**kw)
    (item,) = [o for o in r.output if o.type == "reasoning"]
    assert (item.content[0].text, r.output_text) == want["on"]
    events = list(client.responses.create(**kw, stream=True))
    deltas = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert deltas == want["on"][0] and events[-1].response.output_text == want["on"][1]
    off = client.responses.create(**kw, reasoning={"effort": "none"})
    assert not [o for o in off.output if o.type == "reasoning"] and off.output_text == want["none"][1]


def _openai_budgeted(url: str, budget: int, **extra: object) -> tuple[str, str]:
    """The OpenAI chat route's (reasoning, answer) for a request asking `extra`, checked token by token:
    `budget` sampled tokens are the reasoning, then the forced close, then the answer."""
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
    r = client.chat.completions.create(model="tiny", messages=ASK, max_tokens=MAX_TOKENS, temperature=0,
                                       logprobs=True, extra_body=extra)  # fmt: skip
    m = r.choices[0].message
    reasoning = (m.model_extra or {}).get("reasoning_content") or ""
    pieces = [bytes(t.bytes) for t in r.choices[0].logprobs.content]
    assert b"".join(pieces[budget:]).startswith(REASONING_END.encode())
    assert b"".join(pieces[:budget]).decode("utf-8", errors="replace").rstrip("\n") == reasoning
    assert reasoning and m.content  # it thought, and the answer followed
    return reasoning, m.content


def test_a_request_budget_replaces_the_servers_on_all_four_apis(url: str, want: dict) -> None:
    low = effort_budget("low", MAX_TOKENS)  # half of max_tokens: the answer has room
    assert BUDGET < low < MAX_TOKENS
    by_effort = _openai_budgeted(url, low, reasoning_effort="low")
    assert by_effort != want["on"] and by_effort[0].startswith(want["on"][0])  # thought on past the server's
    budget = 9
    exact = _openai_budgeted(url, budget, thinking_budget_tokens=budget)
    assert exact == _openai_budgeted(url, budget, reasoning_budget_tokens=budget)  # llama-server's spellings

    ollama_client = ollama.Client(host=url, timeout=120)
    opts = {"temperature": 0, "num_predict": MAX_TOKENS}
    r = ollama_client.chat(model="tiny", messages=ASK, options=opts, think="low")
    assert (r.message.thinking, r.message.content) == by_effort
    parts = list(ollama_client.chat(model="tiny", messages=ASK, options=opts, think="low", stream=True))
    streamed = ("".join(p.message.thinking or "" for p in parts), "".join(p.message.content for p in parts))
    assert streamed == by_effort

    anthropic_client = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0, timeout=120)
    kw = {"model": "tiny", "max_tokens": MAX_TOKENS, "messages": ASK, "extra_body": {"temperature": 0},
          "thinking": {"type": "enabled", "budget_tokens": budget}}  # fmt: skip
    m = anthropic_client.messages.create(**kw)
    assert [b.type for b in m.content] == ["thinking", "text"]
    assert (m.content[0].thinking, m.content[1].text) == exact
    with anthropic_client.messages.stream(**kw) as s:
        final = s.get_final_message()
    assert [b.model_dump() for b in final.content] == [b.model_dump() for b in m.content]

    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
    rkw = {"model": "tiny", "input": ASK[0]["content"], "max_output_tokens": MAX_TOKENS, "temperature": 0,
           "reasoning": {"effort": "low"}}  # fmt: skip
    resp = client.responses.create(**rkw)
    (item,) = [o for o in resp.output if o.type == "reasoning"]
    assert (item.content[0].text, resp.output_text) == by_effort
    events = list(client.responses.create(**rkw, stream=True))
    deltas = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert (deltas, events[-1].response.output_text) == by_effort


@pytest.mark.parametrize(
    ("thinking", "param"),
    [
        ({"type": "enabled", "budget_tokens": MAX_TOKENS}, "thinking.budget_tokens"),  # not below max_tokens
        ({"type": "enabled", "budget_tokens": 0}, "thinking.budget_tokens"),
        ({"type": "enabled"}, "thinking.budget_tokens"),
        ({"type": "sometimes"}, "thinking"),
    ],
)
def test_bad_anthropic_thinking_is_a_400_naming_the_field(url: str, thinking: dict, param: str) -> None:
    client = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0, timeout=120)
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model="tiny", max_tokens=MAX_TOKENS, messages=ASK, thinking=thinking)
    assert f"'{param}'" in str(e.value)


def test_efforts_and_budget_fields_map_to_documented_budgets() -> None:
    assert {e: effort_budget(e, 1 << 20) for e in EFFORT_BUDGETS} == EFFORT_BUDGETS  # docs/reasoning.md's
    assert effort_budget("high", 300) == 150 and effort_budget("low", 1) == 1  # half of max_tokens at most
    assert parse_thinking({"reasoning_effort": "none"}, 100) == ThinkingAsk(False, "reasoning_effort")
    assert parse_thinking({"reasoning_effort": "medium"}, 1 << 20) == ThinkingAsk(
        True, "reasoning_effort", 4096, "medium"
    )
    assert parse_thinking({"reasoning_effort": "low", "thinking_budget_tokens": 7}, 100).budget == 7
    assert parse_thinking({"reasoning_effort": "low", "thinking_budget_tokens": -1}, 100).budget == 50
    assert parse_thinking({"reasoning_budget_tokens": 0}, 100) == ThinkingAsk(
        None, "reasoning_budget_tokens", 0
    )
    assert parse_thinking({}, 100) == ThinkingAsk()  # the server's --reasoning-budget
    for body, param in (
        ({"reasoning_effort": "none", "thinking_budget_tokens": 5}, "thinking_budget_tokens"),
        (
            {"chat_template_kwargs": {"enable_thinking": False}, "reasoning_budget_tokens": 5},
            "reasoning_budget_tokens",
        ),
        ({"thinking_budget_tokens": True}, "thinking_budget_tokens"),
        ({"thinking_budget_tokens": -2}, "thinking_budget_tokens"),
    ):
        with pytest.raises(ApiError) as e:
            parse_thinking(body, 100)
        assert e.value.param == param


def test_gpt_oss_template_reads_the_effort_level() -> None:
    state = SimpleNamespace(
        template=SimpleNamespace(source=HARMONY_TEMPLATE),
        config=SimpleNamespace(reasoning_format="auto", reasoning_budget=-1),
    )
    req = SimpleNamespace(thinking=parse_thinking({"reasoning_effort": "high"}, 1 << 20))
    assert thinking_options(state, req) == ({"reasoning_effort": "high"}, 16384)  # type: ignore[arg-type]
    req = SimpleNamespace(thinking=parse_thinking({}, 1 << 20))
    assert thinking_options(state, req) == ({}, None)  # type: ignore[arg-type]
