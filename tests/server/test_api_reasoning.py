"""The reasoning split on the other APIs, with tests/engine/test_reasoning.py's tiny synthetic Qwen3 model
(its template opens `<think>`, the reasoning budget closes it): `message.thinking` on /api/chat, `thinking`
blocks on /v1/messages, a reasoning item on /v1/responses, whole and streamed through the real clients, each
the same reasoning and answer as the OpenAI chat route's `reasoning_content` and `content`; thinking off
(`think: false`, `reasoning.effort: "none"`) goes to the template's switch."""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import ollama
import openai
import pytest

from edgellm.testing.reasoning import ASK, BUDGET, THINKING_TEMPLATE
from edgellm.testing.servers import serve as _start
from edgellm.testing.synthetic import write_tiny_model

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
    for effort in ("medium", "none"):
        r = client.chat.completions.create(model="tiny", messages=ASK, max_tokens=MAX_TOKENS, temperature=0,
                                           reasoning_effort=effort)  # fmt: skip
        m = r.choices[0].message
        out[effort] = ((m.model_extra or {}).get("reasoning_content") or "", m.content or "")
    assert out["medium"][0] and out["medium"][1] and not out["none"][0]  # thinks, answers, stops when told
    return out


def test_ollama_message_thinking(url: str, want: dict) -> None:
    client = ollama.Client(host=url, timeout=120)
    opts = {"temperature": 0, "num_predict": MAX_TOKENS}
    r = client.chat(model="tiny", messages=ASK, options=opts, think=True)
    assert (r.message.thinking, r.message.content) == want["medium"]
    parts = list(client.chat(model="tiny", messages=ASK, options=opts, think=True, stream=True))
    streamed = ("".join(p.message.thinking or "" for p in parts), "".join(p.message.content for p in parts))
    assert streamed == want["medium"]
    off = client.chat(model="tiny", messages=ASK, options=opts, think=False)
    assert (off.message.thinking or "", off.message.content) == want["none"]
    g = client.generate(model="tiny", prompt=ASK[0]["content"], options=opts)
    assert (g.thinking, g.response) == want["medium"]


def test_anthropic_thinking_blocks(url: str, want: dict) -> None:
    client = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0, timeout=120)
    kw = {"model": "tiny", "max_tokens": MAX_TOKENS, "messages": ASK, "extra_body": {"temperature": 0}}
    m = client.messages.create(**kw)
    assert [b.type for b in m.content] == ["thinking", "text"][: len(m.content)]
    got = (m.content[0].thinking, "".join(b.text for b in m.content if b.type == "text"))
    assert got == want["medium"]
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
    assert (item.content[0].text, r.output_text) == want["medium"]
    events = list(client.responses.create(**kw, stream=True))
    deltas = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert deltas == want["medium"][0] and events[-1].response.output_text == want["medium"][1]
    off = client.responses.create(**kw, reasoning={"effort": "none"})
    assert not [o for o in off.output if o.type == "reasoning"] and off.output_text == want["none"][1]
