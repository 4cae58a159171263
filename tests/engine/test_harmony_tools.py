"""gpt-oss's harmony tool calls (a message to `functions.NAME` on the commentary channel, either header
order, ended by the end-of-generation `<|call|>`) come out as structured calls, never answer text: read
from the reply (chat_tools.parse_tool_calls), and streamed through the front-end (TextStream's harmony
split, then the server's ToolOutput) token by token with finish_reason "tool_calls". Earlier turns'
reasoning sent back by clients reaches the template as `thinking` (gpt-oss) and `reasoning_content`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgellm import SamplingParams
from edgellm.chat.reasoning_harmony import HarmonySplitter
from edgellm.chat.template import ChatTemplate
from edgellm.chat.tools import ToolCall, parse_tool_calls
from edgellm.engine.outputs import TextStream
from edgellm.gguf.load import load_gguf
from edgellm.server.anthropic.routes import _messages as anthropic_messages
from edgellm.server.ollama.options import chat_messages
from edgellm.server.protocol import _messages as openai_messages
from edgellm.server.tools import ToolOutput, parse_tools
from edgellm.testing.synthetic.models import write_tiny_model
from edgellm.tokenizer import Tokenizer

A, F, NEXT = "<|channel|>analysis<|message|>", "<|channel|>final<|message|>", "<|end|><|start|>assistant"
CHANNEL_FIRST = '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}'
RECIPIENT_FIRST = ' to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}'
TOOLS = [{"type": "function", "function": {"name": n}} for n in ("get_weather", "add")]
WEATHER = ToolCall("get_weather", '{"city": "Paris"}')
# (completion text after the prompt's "<|start|>assistant", reasoning, content, calls)
REPLIES = [
    (f"{A}Need the weather.{NEXT}{CHANNEL_FIRST}", "Need the weather.", None, [WEATHER]),
    (f"{A}Need it.{NEXT}{RECIPIENT_FIRST}", "Need it.", None, [WEATHER]),
    (CHANNEL_FIRST, "", None, [WEATHER]),
    (RECIPIENT_FIRST, "", None, [WEATHER]),
    (f"<|channel|>commentary<|message|>Let me check.{NEXT}{CHANNEL_FIRST}", "", "Let me check.", [WEATHER]),
    (  # two calls, and the final message after them
        f'{CHANNEL_FIRST}<|start|>assistant<|channel|>analysis to=functions.add<|message|>{{"a": 1}}'
        f"<|start|>assistant{F}Done",
        "",
        "Done",
        [WEATHER, ToolCall("add", '{"a": 1}')],
    ),
]


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    path = write_tiny_model(tmp_path_factory.mktemp("harmony-tools") / "gpt-oss.gguf", "gpt-oss", "Q8_0")
    return Tokenizer.from_metadata(load_gguf(Path(path)).metadata)


def _answer(text: str) -> tuple[str, str]:
    return HarmonySplitter().feed(text, final=True)


@pytest.mark.parametrize(("text", "reasoning", "content", "calls"), REPLIES)
def test_parse_reads_harmony_calls(text: str, reasoning: str, content: str | None, calls: list) -> None:
    got_reasoning, answer = _answer(text)
    assert got_reasoning == reasoning
    assert parse_tool_calls(answer, ["get_weather", "add"]) == (content or "", calls)


def test_unknown_names_and_bad_arguments_stay_text() -> None:
    """As for the other formats: an unknown function, arguments that are not a JSON object, leave the
    text as it was, no calls; a reply cut inside its second call keeps the first."""
    for answer in (
        CHANNEL_FIRST,  # get_weather is not among the names below
        CHANNEL_FIRST.replace('{"city": "Paris"}', '["Paris"]'),
        CHANNEL_FIRST.replace('{"city": "Paris"}', '{"city": Paris}<|start|>assistant' + F + "x"),
    ):
        names = ["add"] if answer == CHANNEL_FIRST else ["get_weather"]
        assert parse_tool_calls(answer, names) == (answer, [])
    cut = CHANNEL_FIRST + '<|start|>assistant<|channel|>commentary to=functions.add json<|message|>{"a": '
    assert parse_tool_calls(cut, ["get_weather", "add"]) == ("", [WEATHER])
    assert parse_tool_calls(CHANNEL_FIRST.replace('{"city": "Paris"}', '{"ci'), ["get_weather"])[1] == []


def _stream(tok: Tokenizer, text: str, ending: str) -> tuple[str, list[dict], str | None]:
    """`text`'s tokens then `ending`'s through a harmony TextStream and a ToolOutput, one token at a
    time; the end-of-generation token the core reports as "stop" (its text is not shown)."""
    params = SamplingParams()
    params.reasoning_split = "harmony"
    ts, out = TextStream(tok, params), ToolOutput(parse_tools({"tools": TOOLS}))
    reasoning, deltas = "", []
    for tid in tok.encode(text, add_special=False, parse_special=True):
        deltas += out.feed(ts.push_step([tid], None)[1])
        reasoning += ts.take_reasoning()
    (end_id,) = tok.encode(ending, add_special=False, parse_special=True)
    deltas += out.feed(ts.push_step([end_id], "stop")[1])
    more, reason = out.finish(ts.finish_reason)
    return reasoning + ts.take_reasoning(), deltas + more, reason


@pytest.mark.parametrize(("text", "reasoning", "content", "calls"), REPLIES)
def test_streamed_calls_through_the_front_end(
    tok: Tokenizer, text: str, reasoning: str, content: str | None, calls: list
) -> None:
    """Streamed: no header or argument text ever goes out as content; <|call|> ends the turn."""
    call_id = tok.encode("<|call|>", add_special=False, parse_special=True)
    assert len(call_id) == 1 and call_id[0] in tok.eog_ids
    got_reasoning, deltas, reason = _stream(tok, text, "<|call|>")
    assert got_reasoning == reasoning and reason == "tool_calls"
    assert "".join(d.get("content", "") for d in deltas).strip() == (content or "")
    streamed = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in streamed] == [
        tuple(c) for c in calls
    ]
    assert all(c["id"].startswith("call_") and c["type"] == "function" for c in streamed)
    whole = ToolOutput(parse_tools({"tools": TOOLS}))
    whole.feed(_answer(text)[1])
    message, final = whole.message("stop")
    assert final == "tool_calls" and message["content"] == content
    assert [json.loads(c["function"]["arguments"]) for c in message["tool_calls"]] == [
        json.loads(c.arguments) for c in calls
    ]


def test_a_plain_harmony_answer_streams_as_content(tok: Tokenizer) -> None:
    reasoning, deltas, reason = _stream(tok, f"{A}think{NEXT}{F}Hello <|channel|> there", "<|return|>")
    assert reasoning == "think" and reason == "stop"
    assert [d["content"] for d in deltas] and "".join(
        d["content"] for d in deltas
    ) == "Hello <|channel|> there"


# A gpt-oss-like template: the reasoning of a tool-calling turn as its analysis message (as gpt-oss's
# template renders `message.thinking`), the call addressed to the function, the result from the tool.
GPT_OSS_LIKE = """\
{%- for tool in tools or [] %}<|start|>developer<|message|>tool {{ tool.function.name }}<|end|>{% endfor -%}
{%- for message in messages -%}
  {%- if message.role == "user" -%}<|start|>user<|message|>{{ message.content }}<|end|>
  {%- elif message.role == "tool" -%}<|start|>functions.x to=assistant<|message|>{{ message.content }}<|end|>
  {%- elif message.tool_calls -%}
    {%- if message.content and message.thinking -%}{{ raise_exception("both content and thinking") }}{%- endif -%}
    {%- if message.thinking -%}<|start|>assistant<|channel|>analysis<|message|>{{ message.thinking }}<|end|>{%- endif -%}
    {%- for c in message.tool_calls -%}<|start|>assistant to=functions.{{ c.function.name }}<|channel|>commentary json<|message|>
      {{- c.function.arguments | tojson }}<|call|>{%- endfor -%}
  {%- else -%}<|start|>assistant<|channel|>final<|message|>{{ message.content }}<|end|>
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}<|start|>assistant{%- endif -%}
"""  # noqa: E501
CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}
RENDERED_CALL = (
    "<|start|>assistant<|channel|>analysis<|message|>I need the weather.<|end|>"
    "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>"
    '{"city": "Paris"}<|call|>'
)


@pytest.mark.parametrize("api", ["openai", "openai-reasoning", "anthropic", "ollama"])
def test_sent_back_reasoning_reaches_the_template(api: str) -> None:
    """Each API's way of sending an earlier tool-calling turn's reasoning back: the template renders it
    as that turn's analysis message (the preamble content dropped, as llama.cpp does for gpt-oss)."""
    user, result = {"role": "user", "content": "Weather?"}, "18 C"
    if api.startswith("openai"):
        key = "reasoning" if api == "openai-reasoning" else "reasoning_content"
        turn = {"role": "assistant", "content": "Checking.", "tool_calls": [CALL], key: "I need the weather."}
        msgs = openai_messages(
            {"messages": [user, turn, {"role": "tool", "tool_call_id": "call_1", "content": result}]}
        )
    elif api == "anthropic":
        blocks = [
            {"type": "thinking", "thinking": "I need the weather.", "signature": "x"},
            {"type": "redacted_thinking", "data": "opaque"},
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}},
        ]
        tool_result = {"type": "tool_result", "tool_use_id": "call_1", "content": result}
        body = {
            "messages": [
                user,
                {"role": "assistant", "content": blocks},
                {"role": "user", "content": [tool_result]},
            ]
        }
        msgs = openai_messages({"messages": anthropic_messages(body)})
    else:
        call = {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
        turn = {
            "role": "assistant",
            "content": "Checking.",
            "thinking": "I need the weather.",
            "tool_calls": [call],
        }
        msgs = openai_messages({"messages": chat_messages([user, turn, {"role": "tool", "content": result}])})
    assert msgs[1]["reasoning_content"] == "I need the weather."
    text = ChatTemplate(GPT_OSS_LIKE).render(msgs, tools=TOOLS[:1])
    assert RENDERED_CALL in text and "Checking." not in text
    assert text.endswith(f"<|start|>functions.x to=assistant<|message|>{result}<|end|><|start|>assistant")


def test_reasoning_content_without_harmony_keeps_the_content() -> None:
    """A template that is not harmony's gets both keys and keeps the turn's content (Qwen3's template
    reads `reasoning_content`)."""
    source = "{% for m in messages %}[{{ m.reasoning_content }}|{{ m.thinking }}|{{ m.content }}]{% endfor %}"
    msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "reasoning_content": "r"}]
    assert ChatTemplate(source).render(msgs, add_generation_prompt=False) == "[||q][r|r|a]"
