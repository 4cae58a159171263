"""The reasoning split: a tiny synthetic Qwen3 model whose GGUF template opens `<think>` in the generation
prompt (as Qwen3-2507-Thinking and DeepSeek-R1 templates do) and has Qwen3's `enable_thinking` switch.
Its random weights never close the block themselves; the reasoning budget closes it, so the reply has a
reasoning part and an answer part: `reasoning_content`/`reasoning` apart from `content`, streamed and
not, through the official `openai` client. The front-end's split (TextStream) is checked on its own
with texts the test writes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import jinja2.sandbox
import openai
import pytest

from edgellm import LLM, SamplingParams
from edgellm.chat.reasoning import (
    REASONING_END,
    THINK_CLOSE,
    THINK_OPEN,
    configure,
    split_mode,
    thinking_plan,
)
from edgellm.chat.template import ChatTemplate
from edgellm.engine.outputs import TextStream
from edgellm.testing.limits import HANG_S
from edgellm.testing.reasoning import ASK, BUDGET, THINKING_TEMPLATE
from edgellm.testing.servers import serve as _start
from edgellm.testing.synthetic.models import write_tiny_model
from edgellm.tokenizer import Tokenizer

# The tiny vocabulary's specials (<|endoftext|>, <|im_start|>, <|im_end|>) kept out: the reply runs to
# max_tokens, so there is always an answer after the forced close.
NO_SPECIALS = {"0": -100, "1": -100, "2": -100}


@pytest.fixture(scope="module")
def thinking_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("reasoning") / "qwen3-thinking.gguf"
    return write_tiny_model(path, "qwen3", metadata_overrides={"tokenizer.chat_template": THINKING_TEMPLATE})


@pytest.fixture(scope="module")
def client(thinking_model: Path) -> Iterator[openai.OpenAI]:
    for url in _start(thinking_model, "--reasoning-budget", str(BUDGET)):
        yield openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)


def _chat(client: openai.OpenAI, **kw: object) -> openai.types.chat.ChatCompletion:
    body = dict(model="tiny", messages=ASK, max_tokens=24, temperature=0, logit_bias=NO_SPECIALS)
    return client.chat.completions.create(**(body | kw))  # type: ignore[call-overload]


def test_reasoning_comes_apart_from_the_answer_streamed_and_not(client: openai.OpenAI) -> None:
    r = _chat(client, logprobs=True)
    m = r.choices[0].message
    extra = m.model_extra or {}
    reasoning = extra["reasoning_content"]
    assert reasoning and extra["reasoning"] == reasoning and m.content
    for tag in (THINK_OPEN, THINK_CLOSE):
        assert tag not in reasoning and tag not in m.content
    # the budget: BUDGET sampled tokens are the reasoning, then the forced close, then the answer
    pieces = [bytes(t.bytes) for t in r.choices[0].logprobs.content]
    assert b"".join(pieces[BUDGET:]).startswith(REASONING_END.encode())
    assert b"".join(pieces[:BUDGET]).decode("utf-8", errors="replace").rstrip("\n") == reasoning
    assert r.usage.completion_tokens == 24 and r.choices[0].finish_reason == "length"

    stream = client.chat.completions.create(
        model="tiny", messages=ASK, max_tokens=24, temperature=0, logit_bias=NO_SPECIALS, stream=True
    )
    streamed_reasoning, streamed_content, reasoning_chunks = "", "", 0
    for chunk in stream:
        delta = chunk.choices[0].delta
        part = (delta.model_extra or {}).get("reasoning_content")
        if part:
            reasoning_chunks += 1
            assert (delta.model_extra or {})["reasoning"] == part and not delta.content
        streamed_reasoning += part or ""
        streamed_content += delta.content or ""
    assert (streamed_reasoning, streamed_content) == (reasoning, m.content)
    assert reasoning_chunks >= 2  # streamed as it came, not at the end


def test_thinking_off_goes_to_the_template_switch(client: openai.OpenAI) -> None:
    on = _chat(client)
    for kw in (
        {"reasoning_effort": "none"},
        {"extra_body": {"chat_template_kwargs": {"enable_thinking": False}}},
    ):
        off = _chat(client, **kw)
        assert off.usage.prompt_tokens > on.usage.prompt_tokens  # the closed <think></think> was rendered
        m = off.choices[0].message
        assert not (m.model_extra or {}).get("reasoning_content") and m.content
    high = _chat(client, reasoning_effort="high")
    assert high.usage.prompt_tokens == on.usage.prompt_tokens
    assert (high.choices[0].message.model_extra or {})["reasoning_content"]


def test_a_constrained_reply_is_all_answer(client: openai.OpenAI) -> None:
    """A grammar covers the whole reply: with the think block open in the prompt, it is still the answer."""
    r = _chat(client, response_format={"type": "json_object"}, max_tokens=8)
    m = r.choices[0].message
    assert m.content.startswith("{") and "reasoning_content" not in (m.model_extra or {})


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"reasoning_effort": "max"}, "reasoning_effort"),
        ({"reasoning_effort": 3}, "reasoning_effort"),
        ({"chat_template_kwargs": {"thinking": True}}, "chat_template_kwargs"),
        ({"chat_template_kwargs": {"enable_thinking": "no"}}, "chat_template_kwargs.enable_thinking"),
        ({"chat_template_kwargs": []}, "chat_template_kwargs"),
        (
            {"reasoning_effort": "high", "chat_template_kwargs": {"enable_thinking": False}},
            "chat_template_kwargs.enable_thinking",
        ),
    ],
)
def test_bad_thinking_fields_are_400s_naming_the_field(
    client: openai.OpenAI, extra: dict, param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        _chat(client, extra_body=extra)
    assert e.value.body["param"] == param


def test_a_model_that_does_not_think_refuses_reasoning_effort(tmp_path: Path) -> None:
    plain = write_tiny_model(tmp_path / "plain.gguf", "qwen3")  # the built-in ChatML template
    server = _start(plain)
    url = next(server)
    try:
        c = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
        with pytest.raises(openai.BadRequestError) as e:
            _chat(c, reasoning_effort="low")
        assert e.value.body["param"] == "reasoning_effort"
        m = _chat(c).choices[0].message  # and no split without a thinking template
        assert "reasoning_content" not in (m.model_extra or {})
    finally:
        server.close()


@pytest.fixture(scope="module")
def llm(thinking_model: Path) -> Iterator[LLM]:
    with LLM(thinking_model, n_ctx=256, kv_cache_memory=1 << 22) as llm:
        yield llm


def test_llm_generate_splits_with_a_budget_of_zero(llm: LLM) -> None:
    """The same split for LLM users: CompletionOutput.reasoning; budget 0 closes the block at once."""
    prompt = ChatTemplate.from_metadata(llm.metadata, llm.tokenizer).render_prompt(ASK, llm.tokenizer)
    mode = split_mode("auto", THINKING_TEMPLATE, prompt.text)
    assert mode == "open"
    results = {}
    for budget in (0, 4):
        params = SamplingParams(max_tokens=16, temperature=0, logit_bias={0: -100, 1: -100, 2: -100})
        configure(params, llm.tokenizer, mode, budget)
        out = llm.generate([prompt.token_ids], params)[0].outputs[0]
        end = params.reasoning_end_ids
        assert out.token_ids[budget : budget + len(end)] == end
        results[budget] = out
    assert results[0].reasoning == "" and results[0].text
    assert results[4].reasoning and THINK_CLOSE not in results[4].text


def _split(
    tok: Tokenizer, mode: str, text: str, stop: list[str] | None = None
) -> tuple[str, str, str | None]:
    """`text` through a TextStream one token at a time: (reasoning, answer, finish reason)."""
    params = SamplingParams(stop=stop or [])
    params.reasoning_split = mode
    ts = TextStream(tok, params)
    answer = reasoning = ""
    for tid in tok.encode(text, add_special=False, parse_special=False):
        answer += ts.push_step([tid], None)[1]
        reasoning += ts.take_reasoning()
        if ts.finish_reason is not None:
            break
    if ts.finish_reason is None:
        answer += ts.finish("length")
        reasoning += ts.take_reasoning()
    return reasoning, answer, ts.finish_reason


def test_text_stream_splits_think_blocks(llm: LLM) -> None:
    tok = llm.tokenizer
    assert _split(tok, "open", "the cat\n</think>\n\nhello world") == ("the cat", "hello world", "length")
    assert _split(tok, "tag", "\n<think>\nhmm</think>\n\nyes") == ("hmm", "yes", "length")
    assert _split(tok, "tag", "no tags <think> here") == ("", "no tags <think> here", "length")
    assert _split(tok, "open", "cut in the middle\n</thi") == ("cut in the middle\n</thi", "", "length")
    assert _split(tok, "open", "a</think>b STOP c", stop=["STOP"]) == ("a", "b ", "stop")


def test_split_mode_and_thinking_plan() -> None:
    chatml = "{% for m in messages %}{{ m.content }}{% endfor %}"
    assert (
        split_mode("auto", chatml, "x") is None and split_mode("none", THINKING_TEMPLATE, "<think>\n") is None
    )
    assert split_mode("deepseek", chatml, "assistant") == "tag"
    assert split_mode("auto", THINKING_TEMPLATE, "<think>\n\n</think>\n\n") == "tag"
    assert thinking_plan("auto", -1, THINKING_TEMPLATE, None) == ({"enable_thinking": True}, None)
    assert thinking_plan("auto", 0, THINKING_TEMPLATE, True) == ({"enable_thinking": False}, 0)
    assert thinking_plan("auto", 9, THINKING_TEMPLATE, False) == ({"enable_thinking": False}, 0)
    assert thinking_plan("auto", -1, chatml, True) is None and thinking_plan(
        "deepseek", -1, chatml, False
    ) == ({}, 0)
    # llama.cpp's own templates (models/templates) test `not enable_thinking`: undefined would mean off
    llama_cpp_style = "{{ '<think>\n' }}{% if not enable_thinking %}{{ '</think>' }}{% endif %}"
    [(kwargs, _), (off, _)] = [thinking_plan("auto", b, llama_cpp_style, None) for b in (-1, 0)]
    env = jinja2.sandbox.ImmutableSandboxedEnvironment()
    assert env.from_string(llama_cpp_style).render(**kwargs) == "<think>\n"
    assert env.from_string(llama_cpp_style).render(**off) == "<think>\n</think>"


def test_tui_shows_the_reasoning_folded_above_the_answer(tmp_path: Path, thinking_model: Path) -> None:
    """The chat app on the thinking model: the reply's reasoning lands in a collapsed, dimmed fold, not in
    the answer's Markdown, is saved with the conversation and drawn again when it is reopened."""
    import asyncio

    from textual.widgets import Collapsible, Static

    from tests.tui.pilot import SIZE, wait_for
    from tui.app import ChatApp
    from tui.local_backend import LocalBackend
    from tui.messages import GenerationSettings
    from tui.storage import ConversationStore
    from tui.widgets import MessageBody, MessageView

    def factory(model: str) -> LocalBackend:
        return LocalBackend(model, stream_interval=0.0)

    def make() -> ChatApp:
        app = ChatApp(factory, str(thinking_model), store=ConversationStore(tmp_path), model_options=[])
        app.settings = GenerationSettings(temperature=0.0, max_tokens=12)
        return app

    async def drive() -> None:
        app = make()
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: app.state != "loading", timeout=HANG_S)
            await pilot.press(*"hello", "enter")
            replied = lambda: not app.replying and app.conversation.messages[-1].role != "user"  # noqa: E731
            await wait_for(pilot, replied, timeout=HANG_S)
            reply = app.conversation.messages[-1]
            assert reply.reasoning and THINK_OPEN not in reply.content + reply.reasoning
            _check_fold(app.query(MessageView).last(), reply)
        again = make()
        async with again.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: again.state != "loading", timeout=HANG_S)
            [conv] = again.store.list()
            assert conv.messages[-1].reasoning == reply.reasoning
            await again.chat.show(conv)
            _check_fold(again.query(MessageView).last(), reply)

    def _check_fold(view: MessageView, reply: object) -> None:
        fold = view.query_one(Collapsible)
        assert fold.collapsed
        assert fold.query_one(".reasoning-text", Static).content == reply.reasoning  # type: ignore[attr-defined]
        assert view.query_one(MessageBody).source == reply.content  # type: ignore[attr-defined]

    asyncio.run(drive())
