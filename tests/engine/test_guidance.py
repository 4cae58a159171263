"""Constrained decoding (llguidance) in the engine, and the template side of tool calling: grammars that
cannot compile are clear errors, every constrained output matches its grammar (n > 1, prefix caching, stop
strings, max_tokens), unconstrained requests in the same batch are untouched, and tool conversations
render through templates with and without tool support."""

from __future__ import annotations

import json
import queue
import re

import jsonschema
import pytest

from edgellm import LLM, SamplingParams
from edgellm.chat.template import ChatTemplate
from edgellm.chat.tools import parse_tool_calls
from edgellm.grammar.compile import GrammarError, compile_grammar
from edgellm.testing.engine_fakes import PROMPTS
from edgellm.testing.limits import HANG_S

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "color": {"enum": ["red", "green", "blue"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 2},
    },
    "required": ["name", "age", "color", "tags"],
    "additionalProperties": False,
}
# More than one KV block of prompt (16 tokens), so a second request hits the prefix cache.
PERSON = "You answer in JSON only. Describe a person as JSON with a name, an age, a favourite color and tags:"


@pytest.fixture(scope="module")
def llm() -> LLM:
    llm = LLM("smollm2-135m", n_ctx=512, max_num_seqs=8)
    yield llm
    llm.shutdown()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"grammar": "start: foo"}, 'unknown name: "foo"'),
        ({"regex": "a(b"}, "unclosed group"),
        ({"json_schema": {"type": "nope"}}, "Invalid type: nope"),
        ({"json_schema": "{not json"}, "invalid json_schema"),
        ({"json_schema": {"type": "object"}, "regex": "a"}, "at most one of json_schema, grammar and regex"),
    ],
)
def test_a_grammar_that_cannot_compile_is_a_value_error_naming_the_problem(kwargs, message) -> None:
    with pytest.raises(GrammarError, match=re.escape(message)):
        SamplingParams(**kwargs)
    with pytest.raises(ValueError, match="ignore_eos cannot be combined"):
        SamplingParams(regex="a+", ignore_eos=True)
    assert compile_grammar() is None


def test_constrained_outputs_match_with_n_seeds_stop_strings_and_a_mixed_batch(llm: LLM) -> None:
    greedy = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    alone = [o.token_ids for o in llm.generate(PROMPTS[:3], greedy)]
    # n = 2 sampled completions forked from one prompt, each with its own matcher state
    params = SamplingParams(temperature=0.8, max_tokens=80, json_schema=SCHEMA, n=2, seed=7)
    [out] = llm.generate([PERSON], params)
    for c in out.outputs:
        assert c.finish_reason == "stop", c
        jsonschema.validate(json.loads(c.text), SCHEMA)
    again = llm.generate([PERSON], params)[0]  # a prefix-cache hit, the same seed: the same texts
    assert [c.text for c in again.outputs] == [c.text for c in out.outputs]
    assert again.metrics.num_cached_tokens > 0
    # constrained and unconstrained requests in one batch: the unconstrained ones are untouched
    year = SamplingParams(temperature=0.8, max_tokens=10, regex=r"(19|20)[0-9]{2}", seed=1)
    yes_no = SamplingParams(temperature=0.0, max_tokens=10, grammar='root ::= "yes" | "no"')  # GBNF
    results: dict[str, str | None] = {}
    q: queue.Queue = queue.Queue()
    jobs = [(PROMPTS[0], greedy), ("The year was", year), (PROMPTS[1], greedy), ("Yes or no?", yes_no)]
    jobs.append((PROMPTS[2], greedy))
    rids = [llm.submit(p, g, q.put)[0] for p, g in jobs]
    texts = {rid: ([], "") for rid in rids}
    left = len(rids)
    while left:
        o = q.get(timeout=HANG_S)
        assert not isinstance(o, BaseException), o
        ids, text = texts[o.request_id]
        for d in o.deltas:
            ids.extend(d.token_ids)
            text += d.text
            results[o.request_id] = d.finish_reason or results.get(o.request_id)
        texts[o.request_id] = (ids, text)
        left -= o.finished
    assert [texts[rids[i]][0] for i in (0, 2, 4)] == alone
    assert re.fullmatch(r"(19|20)[0-9]{2}", texts[rids[1]][1]) and results[rids[1]] == "stop"
    assert texts[rids[3]][1] in ("yes", "no") and results[rids[3]] == "stop"


def test_a_grammar_that_matches_nothing_is_refused_before_it_reaches_the_engine(llm: LLM) -> None:
    """The grammar compiles on its own; only built for the vocabulary (in a compile worker, as LLM.submit
    has it checked) does it show that no token can ever start it. Before, the engine ended the sequence at
    once: a "stop" with empty text."""
    params = SamplingParams(grammar='start: start "a"', max_tokens=4)
    with pytest.raises(GrammarError, match="matches no output at all"):
        llm.generate(["Hi"], params)
    [out] = llm.generate(["Hi"], SamplingParams(regex="(yes|no)", max_tokens=4))  # the engine serves on
    assert out.text in ("yes", "no")


def test_max_tokens_cuts_a_grammar_as_length_and_a_stop_string_still_stops(llm: LLM) -> None:
    [cut] = llm.generate([PERSON], SamplingParams(temperature=0.0, max_tokens=4, json_schema=SCHEMA))
    assert cut.finish_reason == "length" and len(cut.token_ids) == 4 and cut.text.startswith("{")
    stop = SamplingParams(temperature=0.0, max_tokens=80, json_schema=SCHEMA, stop=['"age"'])
    [stopped] = llm.generate([PERSON], stop)
    assert (
        stopped.finish_reason == "stop" and '"age"' not in stopped.text and stopped.text.startswith('{"name"')
    )


def test_parse_tool_calls_in_each_format() -> None:
    names = ["get_weather", "add"]
    paris = ("get_weather", '{"city": "Paris"}')
    assert parse_tool_calls(
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>', names
    ) == (
        "",
        [paris],
    )
    two = (
        'Sure. <tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>\n'
        '<tool_call>{"name": "add", "arguments": {"a": 1}}'
    )
    assert parse_tool_calls(two, names) == ("Sure.", [paris, ("add", '{"a": 1}')])
    assert parse_tool_calls(
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}', names
    ) == ("", [paris])
    assert parse_tool_calls('```tool_code\nget_weather(city="Paris")\n```', names) == ("", [paris])
    assert parse_tool_calls('[get_weather(city="Paris"), add(a=1)]', names)[1] == [paris, ("add", '{"a": 1}')]
    # cut short by max_tokens inside the last call: the complete calls stay calls, the cut one is dropped
    hermes = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>\n'
    assert parse_tool_calls(hermes + '<tool_call>{"name": "add", "argu', names) == ("", [paris])
    listed = '[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "add", "arguments": {"a"'
    assert parse_tool_calls(listed, names) == ("", [paris])
    for text in [
        '{"name": "rm", "arguments": {}}',
        "Paris is nice",
        '{"a": 1}',
        "get_weather(os.system('x'))",
    ]:
        assert parse_tool_calls(text, names) == (text, [])


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather of a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
HISTORY = [
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"},
]
# A Hermes / Qwen 2.5-style template that renders tools, calls and results itself.
NATIVE = (
    "{%- if tools %}<|im_start|>system\nTOOLS:{% for t in tools %}{{ t.function.name }};{% endfor %}"
    "<|im_end|>\n{% endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'tool' %}<|im_start|>user\n<tool_response>{{ m.content }}</tool_response><|im_end|>\n"
    "{%- else %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{%- for c in m.tool_calls or [] %}"
    "<tool_call>{{ c.function.name }} {{ c.function.arguments.city }}</tool_call>{% endfor %}"
    "<|im_end|>\n{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_tool_conversations_render_natively_or_through_the_fallback(llm: LLM) -> None:
    native = ChatTemplate(NATIVE)
    assert native.supports_tools
    text = native.render(HISTORY, tools=TOOLS)
    assert (
        "TOOLS:get_weather;" in text and "<tool_call>get_weather Paris</tool_call>" in text
    )  # arguments: object
    assert "<tool_response>18 C, sunny</tool_response>" in text
    smol = ChatTemplate.from_metadata(llm.metadata, llm.tokenizer)  # SmolLM2's template knows no tools
    assert not smol.supports_tools
    text = smol.render(HISTORY, tools=TOOLS)
    assert '"name": "get_weather"' in text.split("<|im_start|>user")[0]  # the tool list, in the system turn
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
    assert "<|im_start|>user\n<tool_response>\n18 C, sunny\n</tool_response><|im_end|>" in text
    gemma = ChatTemplate.from_metadata({"general.architecture": "gemma3"})  # alternating roles only
    assert not gemma.supports_tools
    assert "<start_of_turn>user\n<tool_response>" in gemma.render(HISTORY, tools=TOOLS)
