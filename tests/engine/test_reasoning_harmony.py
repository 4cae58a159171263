"""gpt-oss's harmony format: its chat template renders through the sandbox (a tiny synthetic gpt-oss file
carries a harmony-like template and harmony's special tokens: edgellm/testing/harmony.py), the
completion's "analysis" channel is reasoning and its "final" channel the answer (HarmonySplitter, as
llama.cpp's gpt-oss parser reads them), in one piece or streamed token by token through TextStream."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from edgellm import LLM, SamplingParams
from edgellm.chat.reasoning import configure, forced_token, split_mode, thinking_plan
from edgellm.chat.reasoning_harmony import HARMONY_REASONING_END, HarmonySplitter
from edgellm.chat.template import ChatTemplate, ChatTemplateError
from edgellm.engine.outputs import TextStream
from edgellm.testing.harmony import HARMONY_TEMPLATE
from edgellm.testing.synthetic.models import write_tiny_model
from edgellm.tokenizer import Tokenizer

A, F = "<|channel|>analysis<|message|>", "<|channel|>final<|message|>"
NEXT = "<|end|><|start|>assistant"
# (completion text after the prompt's "<|start|>assistant", reasoning, answer)
REPLIES = [
    (f"{A}The user greets. Say hello.{NEXT}{F}Hello world", "The user greets. Say hello.", "Hello world"),
    (f"{F}Just the answer", "", "Just the answer"),
    (f"<|start|>assistant{A}think{NEXT}{F}ok", "think", "ok"),  # the header repeated
    (f"<|channel|>commentary{A}stray{NEXT}{F}fine", "stray", "fine"),  # llama.cpp drops the stray channel
    (f"<|channel|>commentary to=assistant{A}x{NEXT}{F}y", "x", "y"),
    (f"{A}a{NEXT}<|channel|>commentary<|message|>Let me check.{NEXT}{F}done", "a", "Let me check.done"),
    (f"{A}multi\nline <|end> not a marker{NEXT}{F}a < b", "multi\nline <|end> not a marker", "a < b"),
    ("plain text, no channels", "", "plain text, no channels"),
    (f"{A}cut short", "cut short", ""),  # the budget or max_tokens ended it inside the analysis
]
TOOL_CALL = f"{A}need a tool{NEXT} to=functions.get<|channel|>commentary json<|message|>{{\"a\": 1}}"


@pytest.mark.parametrize(("text", "reasoning", "answer"), REPLIES)
def test_splitter_reads_the_channels(text: str, reasoning: str, answer: str) -> None:
    """The same split whether the text comes at once or a character at a time (markers cut anywhere)."""
    whole = HarmonySplitter().feed(text, final=True)
    assert whole == (reasoning, answer)
    s, parts = HarmonySplitter(), [("", "")]
    for i, ch in enumerate(text):
        parts.append(s.feed(ch, final=i == len(text) - 1))
    assert ("".join(p[0] for p in parts), "".join(p[1] for p in parts)) == (reasoning, answer)


def test_a_tool_call_message_stays_in_the_answer_as_written() -> None:
    reasoning, answer = HarmonySplitter().feed(TOOL_CALL, final=True)
    assert reasoning == "need a tool"
    assert answer == TOOL_CALL[TOOL_CALL.index(" to=") - len("<|start|>assistant") :]


def test_split_mode_picks_harmony_for_its_template() -> None:
    assert split_mode("auto", HARMONY_TEMPLATE, "<|start|>assistant") == "harmony"
    assert split_mode("deepseek", HARMONY_TEMPLATE, "<|start|>assistant") == "harmony"
    assert split_mode("none", HARMONY_TEMPLATE, "<|start|>assistant") is None
    assert thinking_plan("auto", -1, HARMONY_TEMPLATE, None) == ({}, None)  # no enable_thinking switch


@pytest.fixture(scope="module")
def llm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LLM]:
    path = write_tiny_model(tmp_path_factory.mktemp("harmony") / "gpt-oss.gguf", "gpt-oss", "Q8_0")
    with LLM(path, n_ctx=256, kv_cache_memory=1 << 22) as llm:
        yield llm


def test_template_renders_through_the_sandbox(llm: LLM) -> None:
    tmpl = ChatTemplate.from_metadata(llm.metadata, llm.tokenizer)
    assert tmpl.name == "gguf"
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello", "thinking": "dropped in later turns"},
        {"role": "user", "content": "Bye"},
    ]
    prompt = tmpl.render_prompt(messages, llm.tokenizer)
    assert prompt.text.startswith("<|start|>system<|message|>You are a tiny model.\nCurrent date: ")
    assert prompt.text.endswith(
        "<|start|>developer<|message|># Instructions\n\nBe brief.<|end|><|start|>user<|message|>Hi<|end|>"
        f"<|start|>assistant{F}Hello<|end|><|start|>user<|message|>Bye<|end|><|start|>assistant"
    )
    assert "dropped" not in prompt.text
    ids = llm.tokenizer.encode("<|start|>assistant", add_special=False, parse_special=True)
    assert prompt.token_ids[-len(ids) :] == ids and len(ids) == 1 + len(llm.tokenizer.encode("assistant"))
    with pytest.raises(ChatTemplateError, match="analysis text in 'thinking'"):
        tmpl.render([{"role": "user", "content": "a"}, {"role": "assistant", "content": f"{A}x"}])
    ask = [{"role": "user", "content": "a"}]
    high = tmpl.render_prompt(ask, llm.tokenizer, template_kwargs={"reasoning_effort": "high"})
    assert "Reasoning: high" in high.text and "Reasoning: medium" in tmpl.render(ask)


def _stream(tok: Tokenizer, text: str) -> tuple[str, str]:
    """`text` (its markers as special tokens) through a TextStream one token at a time."""
    params = SamplingParams()
    params.reasoning_split = "harmony"
    ts = TextStream(tok, params)
    answer = reasoning = ""
    for tid in tok.encode(text, add_special=False, parse_special=True):
        answer += ts.push_step([tid], None)[1]
        reasoning += ts.take_reasoning()
    answer += ts.finish("stop")
    return reasoning + ts.take_reasoning(), answer


@pytest.mark.parametrize(("text", "reasoning", "answer"), REPLIES[:3])
def test_text_stream_splits_harmony_tokens(llm: LLM, text: str, reasoning: str, answer: str) -> None:
    """The markers are special tokens of the vocabulary that decode to their text (llama.cpp makes
    <|channel|>, <|message|>, <|start|> user-defined, and <|end|> too where <|return|> ends generation)."""
    tok = llm.tokenizer
    assert tok.encode("<|end|>", add_special=False, parse_special=True) == [3]
    assert 2 in tok.eog_ids and 3 not in tok.eog_ids  # <|return|> ends the reply, <|end|> does not
    assert _stream(tok, text) == (reasoning, answer)


def test_reasoning_budget_closes_the_analysis_with_the_final_header(llm: LLM) -> None:
    """With a budget, the completion opens the analysis itself; past the budget the engine forces
    <|end|><|start|>assistant<|channel|>final<|message|>, and the rest is answer."""
    tok, params = llm.tokenizer, SamplingParams()
    configure(params, tok, "harmony", 2)
    opener = tok.encode(A, add_special=False, parse_special=True)
    end = tok.encode(HARMONY_REASONING_END, add_special=False, parse_special=True)
    assert params.reasoning_open_ids == opener and params.reasoning_end_ids == end
    thought = tok.encode("hm ok", add_special=False)[:2]
    out = opener + thought
    for i in range(len(end)):
        assert forced_token(params, out) == end[i]
        out.append(end[i])
    assert forced_token(params, out) is None
    reasoning, answer = HarmonySplitter().feed(tok.decode(out + tok.encode("yes")), final=True)
    assert (reasoning, answer) == (tok.decode(thought), "yes")
