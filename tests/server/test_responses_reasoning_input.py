"""Reasoning sent back to /v1/responses: a `reasoning` input item becomes the `reasoning_content` of the
assistant turn after it (the chat route's field, which templates read), a stored response keeps its
reasoning for `previous_response_id`, and encrypted reasoning is a 400 naming the item. End to end through
the openai client with a tiny Qwen3 model whose template renders earlier reasoning: the prompt is the chat
route's with `reasoning_content`, token for token."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from edgellm.server.http.errors import ApiError
from edgellm.server.responses.input import input_messages
from edgellm.testing.reasoning import ASK, BUDGET, THINKING_TEMPLATE
from edgellm.testing.servers import serve
from edgellm.testing.synthetic.models import write_tiny_model

LOOP = "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
RENDERS_REASONING = THINKING_TEMPLATE.replace(
    LOOP,
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.reasoning_content %}<think>{{ m.reasoning_content }}</think>{% endif %}"
    "{{ m.content }}<|im_end|>\n{% endfor %}",
)


def _reasoning(text: str, field: str = "content") -> dict:
    part = "reasoning_text" if field == "content" else "summary_text"
    return {"type": "reasoning", "id": "rs_1", field: [{"type": part, "text": text}]}


def test_reasoning_items_join_the_assistant_turn_after_them() -> None:
    call = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
    got = input_messages([
        {"role": "user", "content": "q"},
        _reasoning("look it up"),
        call,
        {"type": "function_call_output", "call_id": "c1", "output": "42"},
        _reasoning("it says 42", field="summary"),  # a summary when there is no text
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "42"}]},
    ])  # fmt: skip
    assert got == [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "", "reasoning_content": "look it up",
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "42", "name": "f"},
        {"role": "assistant", "content": "42", "reasoning_content": "it says 42"},
    ]  # fmt: skip


def test_reasoning_with_no_answer_after_it_is_an_assistant_turn_of_its_own() -> None:
    q = {"role": "user", "content": "q"}
    got = input_messages([q, _reasoning("hm"), {"role": "user", "content": "?"}])
    assert got[1] == {"role": "assistant", "content": "", "reasoning_content": "hm"}
    assert input_messages([{"role": "user", "content": "q"}, _reasoning("hm")])[-1] == got[1]
    empty = {"type": "reasoning", "id": "rs_2", "summary": []}  # nothing to carry: no turn
    assert input_messages([{"role": "user", "content": "q"}, empty]) == [{"role": "user", "content": "q"}]


@pytest.mark.parametrize(
    ("item", "param"),
    [
        ({"type": "reasoning", "summary": [], "encrypted_content": "gAAA"}, "input[1].encrypted_content"),
        ({"type": "reasoning", "content": [{"type": "input_text", "text": "x"}]}, "input[1].content[0]"),
        ({"type": "reasoning", "summary": "x"}, "input[1].summary"),
    ],
)
def test_reasoning_nothing_can_read_is_a_400_naming_it(item: dict, param: str) -> None:
    with pytest.raises(ApiError) as e:
        input_messages([{"role": "user", "content": "q"}, item])
    assert e.value.status == 400 and e.value.param == param


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[openai.OpenAI]:
    path = tmp_path_factory.mktemp("responses-reasoning") / "qwen3-thinking.gguf"
    write_tiny_model(path, "qwen3", metadata_overrides={"tokenizer.chat_template": RENDERS_REASONING})
    for url in serve(path, "--reasoning-budget", str(BUDGET)):
        yield openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)


def _chat_prompt_tokens(client: openai.OpenAI, messages: list[dict]) -> int:
    r = client.chat.completions.create(model="tiny", messages=messages, max_tokens=1, temperature=0)
    return r.usage.prompt_tokens


def test_reasoning_sent_back_reaches_the_prompt_as_on_the_chat_route(client: openai.OpenAI) -> None:
    kw = {"model": "tiny", "temperature": 0}
    first = client.responses.create(input=ASK[0]["content"], max_output_tokens=32, **kw)
    (item,) = [o for o in first.output if o.type == "reasoning"]
    thought, answer = item.content[0].text, first.output_text
    assert thought and answer
    turn = [{"role": "user", "content": ASK[0]["content"]},
            {"role": "assistant", "content": answer, "reasoning_content": thought},
            {"role": "user", "content": "And the dog?"}]  # fmt: skip
    with_reasoning = _chat_prompt_tokens(client, turn)
    without = _chat_prompt_tokens(client, [turn[0], {"role": "assistant", "content": answer}, turn[2]])
    assert with_reasoning > without  # the template renders it
    sent_back = [
        {"role": "user", "content": ASK[0]["content"]},
        item.model_dump(exclude_none=True),
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": answer}]},
        {"role": "user", "content": "And the dog?"},
    ]
    r = client.responses.create(model="tiny", input=sent_back, max_output_tokens=1, temperature=0)
    assert r.usage.input_tokens == with_reasoning
    chained = client.responses.create(
        model="tiny", previous_response_id=first.id, input="And the dog?", max_output_tokens=1, temperature=0
    )
    assert chained.usage.input_tokens == with_reasoning  # the stored turn kept its reasoning
