"""The other APIs through their real clients from PyPI against one `edgellm serve` (SmolLM2): the `ollama`
client on /api/*, the `anthropic` SDK on /v1/messages, the `openai` SDK's responses.create on
/v1/responses. Each greedy answer is checked against the OpenAI chat route's for the same conversation:
one engine and one front-end behind every API."""

from __future__ import annotations

import json
from typing import Literal

import anthropic
import httpx
import ollama
import openai
import pytest

MODEL = "smollm2-135m"
PROMPT = "Name three colours."
# The anthropic SDK's current releases take no sampling parameters; the Messages API does (extra_body).
GREEDY = {"temperature": 0}
COLOUR = {"enum": ["red", "green", "blue"]}
COLOUR_SCHEMA = {
    "type": "object",
    "properties": {"colour": COLOUR},
    "required": ["colour"],
    "additionalProperties": False,
}
WEATHER_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


@pytest.fixture(scope="module")
def oai(apis_server: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{apis_server}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def olla(apis_server: str) -> ollama.Client:
    return ollama.Client(host=apis_server, timeout=120)


@pytest.fixture(scope="module")
def claude(apis_server: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=apis_server, api_key="unused", max_retries=0, timeout=120)


def _chat(oai: openai.OpenAI, messages: list[dict], max_tokens: int = 12) -> openai.types.chat.ChatCompletion:
    return oai.chat.completions.create(model=MODEL, messages=messages, max_tokens=max_tokens, temperature=0)


# ---- Ollama ---------------------------------------------------------------------------------------------
def test_ollama_chat_whole_and_streamed_is_the_openai_answer(olla: ollama.Client, oai: openai.OpenAI) -> None:
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": PROMPT}]
    want = _chat(oai, msgs)
    opts = {"temperature": 0, "num_predict": 12, "num_thread": 4}  # num_thread: a documented no-op
    r = olla.chat(model=MODEL, messages=msgs, options=opts, stream=False, keep_alive="5m")
    assert r.message.role == "assistant" and r.message.content == want.choices[0].message.content
    assert r.done and r.done_reason == want.choices[0].finish_reason
    assert (r.prompt_eval_count, r.eval_count) == (want.usage.prompt_tokens, want.usage.completion_tokens)
    parts = list(olla.chat(model=MODEL, messages=msgs, options=opts, stream=True))
    assert all(not p.done for p in parts[:-1]) and parts[-1].done and parts[-1].done_reason
    assert len(parts) > 2 and "".join(p.message.content for p in parts) == r.message.content


def test_ollama_generate_through_the_template_and_raw(olla: ollama.Client, oai: openai.OpenAI) -> None:
    want = _chat(oai, [{"role": "user", "content": PROMPT}]).choices[0].message.content
    opts = {"temperature": 0, "num_predict": 12}
    assert olla.generate(model=MODEL, prompt=PROMPT, options=opts).response == want
    streamed = list(olla.generate(model=MODEL, prompt=PROMPT, options=opts, stream=True))
    assert "".join(p.response for p in streamed) == want and streamed[-1].done
    raw = olla.generate(model=MODEL, prompt="The sky is", raw=True, options=opts)
    completion = oai.completions.create(model=MODEL, prompt="The sky is", max_tokens=12, temperature=0)
    assert raw.response == completion.choices[0].text and raw.eval_count == completion.usage.completion_tokens
    loaded = olla.generate(model=MODEL)  # no prompt: Ollama's "load the model"
    assert loaded.done and loaded.done_reason == "load" and loaded.response == ""


def test_ollama_format_schema_and_tool_history(olla: ollama.Client) -> None:
    r = olla.chat(
        model=MODEL,
        messages=[{"role": "user", "content": PROMPT}],
        format=COLOUR_SCHEMA,
        options={"temperature": 0, "num_predict": 40},
    )
    assert json.loads(r.message.content)["colour"] in COLOUR["enum"]
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER_SCHEMA}}
    history = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
        },
        {"role": "tool", "content": "sunny, 21 C", "tool_name": "get_weather"},
    ]
    r = olla.chat(model=MODEL, messages=history, tools=[tool], options={"temperature": 0, "num_predict": 8})
    assert r.done and r.message.content is not None


def test_ollama_embed_is_the_openai_embedding(olla: ollama.Client, oai: openai.OpenAI) -> None:
    r = olla.embed(model=MODEL, input=["red", "a green tree"])
    want = oai.embeddings.create(model=MODEL, input=["red", "a green tree"], encoding_format="float")
    assert len(r.embeddings) == 2 and r.prompt_eval_count == want.usage.prompt_tokens
    for got, exp in zip(r.embeddings, want.data, strict=True):
        assert got == pytest.approx(exp.embedding, rel=1e-5, abs=1e-6)
    legacy = olla.embeddings(model=MODEL, prompt="red")
    assert legacy.embedding == pytest.approx(r.embeddings[0], rel=1e-5, abs=1e-6)


def test_ollama_list_show_ps_version_pull(olla: ollama.Client, apis_server: str) -> None:
    (entry,) = olla.list().models
    assert entry.model == MODEL and entry.size > 0 and entry.details.format == "gguf"
    assert entry.details.family == "llama" and entry.details.quantization_level == "Q4_1"
    show = olla.show(MODEL)
    assert "completion" in show.capabilities and "tools" in show.capabilities
    assert show.modelinfo["llama.context_length"] == 512 and "im_start" in show.template
    assert [m.model for m in olla.ps().models] == [MODEL]
    version = httpx.get(f"{apis_server}/api/version").json()["version"]  # the client has no call for it
    assert tuple(map(int, version.split("."))) >= (0, 6, 4)  # VS Code's Copilot checks this
    assert httpx.get(f"{apis_server}/").text == "Ollama is running"  # what Ollama clients probe
    assert olla.pull(MODEL).status == "success"  # cached in the catalog already: nothing to fetch
    with pytest.raises(ollama.ResponseError) as e:
        olla.pull("no-such-model")
    assert e.value.status_code == 404 and "catalog models" in e.value.error


def test_langchain_ollama_embeddings_and_chat_with_every_option_null(
    apis_server: str, olla: ollama.Client, oai: openai.OpenAI
) -> None:
    """langchain-ollama sends every option it leaves unset as null (num_ctx, mirostat, tfs_z,
    repeat_last_n, ...): null is unset, as in Ollama, so its calls are answered as the plain client's."""
    from langchain_ollama import ChatOllama, OllamaEmbeddings

    emb = OllamaEmbeddings(model=MODEL, base_url=apis_server)
    assert set(emb._default_params.values()) == {None}  # what it sends: every option null
    vectors = emb.embed_documents(["red", "a green tree"])
    want = olla.embed(model=MODEL, input=["red", "a green tree"]).embeddings
    for got, exp in zip(vectors, want, strict=True):
        assert got == pytest.approx(exp, rel=1e-5, abs=1e-6)
    assert emb.embed_query("red") == pytest.approx(want[0], rel=1e-5, abs=1e-6)
    chat = ChatOllama(model=MODEL, base_url=apis_server, temperature=0, num_predict=12)
    reply = chat.invoke(PROMPT)
    expected = oai.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": PROMPT}], max_tokens=12, temperature=0
    )
    assert reply.content == expected.choices[0].message.content


def test_ollama_pull_streams_progress_and_edgellm_ps_lists_the_loaded_model(
    olla: ollama.Client, apis_server: str
) -> None:
    import subprocess
    import sys

    steps = list(olla.pull(MODEL, stream=True))
    assert [s.status for s in steps][0] == "pulling manifest" and steps[-1].status == "success"
    [layer] = [s for s in steps if s.digest]
    assert layer.total == layer.completed > 0 and layer.digest.startswith("sha256:")
    out = subprocess.run(
        [sys.executable, "-m", "edgellm", "ps", "--url", f"{apis_server}/v1"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    head, row = out.stdout.splitlines()
    assert out.returncode == 0 and head.split() == ["NAME", "SIZE", "CONTEXT", "UNTIL"], out
    assert row.split()[0] == MODEL and row.split()[3] == "512" and row.endswith("forever"), row


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"mirostat": 2}, "options.mirostat"),
        ({"tfs_z": 0.5}, "options.tfs_z"),
        ({"foo": 1}, "options.foo"),
        ({"num_ctx": 100000}, "options.num_ctx"),
        ({"temperature": 9}, "options.temperature"),
        ({"num_predict": 0}, "options.num_predict"),
        ({"repeat_last_n": 64, "repeat_penalty": 1.3}, "options.repeat_last_n"),
    ],
)
def test_ollama_options_that_cannot_be_honoured_are_400s(
    olla: ollama.Client, options: dict, named: str
) -> None:
    with pytest.raises(ollama.ResponseError) as e:
        olla.chat(model=MODEL, messages=[{"role": "user", "content": "hi"}], options=options)
    assert e.value.status_code == 400 and f"'{named}'" in e.value.error


# ---- Anthropic ------------------------------------------------------------------------------------------
def test_anthropic_message_whole_and_streamed(claude: anthropic.Anthropic, oai: openai.OpenAI) -> None:
    want = _chat(oai, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": PROMPT}])
    kw = {
        "model": MODEL,
        "max_tokens": 12,
        "extra_body": GREEDY,
        "system": "Be brief.",
        "messages": [{"role": "user", "content": [{"type": "text", "text": PROMPT}]}],
    }
    m = claude.messages.create(**kw)
    assert (
        m.type == "message" and m.role == "assistant" and m.content[0].text == want.choices[0].message.content
    )
    assert m.stop_reason == {"length": "max_tokens", "stop": "end_turn"}[want.choices[0].finish_reason]
    # the prefix cache is automatic: what it served is cache_read_input_tokens, as Anthropic counts it
    u = m.usage
    assert (u.input_tokens + u.cache_read_input_tokens, u.output_tokens) == (
        want.usage.prompt_tokens,
        want.usage.completion_tokens,
    )
    assert u.cache_read_input_tokens > 0 and u.cache_creation_input_tokens == 0  # the same prompt again
    with claude.messages.stream(**kw) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text == m.content[0].text and final.content[0].text == text and final.stop_reason == m.stop_reason
    assert final.usage.input_tokens + final.usage.cache_read_input_tokens == want.usage.prompt_tokens
    assert claude.messages.count_tokens(
        model=MODEL, system="Be brief.", messages=kw["messages"]
    ).input_tokens == (want.usage.prompt_tokens)


def test_anthropic_structured_outputs(claude: anthropic.Anthropic) -> None:
    """output_config.format (the SDK's structured outputs) on the grammar path, and messages.parse."""
    import pydantic

    msgs = [{"role": "user", "content": "Pick a colour."}]
    schema = {**COLOUR_SCHEMA}
    m = claude.messages.create(
        model=MODEL, max_tokens=40, messages=msgs, extra_body=GREEDY,
        output_config={"format": {"type": "json_schema", "schema": schema}},
    )  # fmt: skip
    assert json.loads(m.content[0].text)["colour"] in COLOUR["enum"]

    class Colour(pydantic.BaseModel):  # bounded, greedy: a sampled free-form field could run past max_tokens
        colour: Literal["red", "green", "blue"]

    parsed = claude.messages.parse(
        model=MODEL, max_tokens=60, messages=msgs, output_format=Colour, extra_body=GREEDY
    )
    assert isinstance(parsed.parsed_output, Colour)
    with pytest.raises(anthropic.BadRequestError) as e:
        claude.messages.create(
            model=MODEL, max_tokens=8, messages=msgs, output_config={"format": {"type": "text"}}
        )
    assert "output_config.format" in str(e.value)


def test_anthropic_stop_sequence_is_reported(claude: anthropic.Anthropic) -> None:
    kw = {
        "model": MODEL,
        "max_tokens": 16,
        "extra_body": GREEDY,
        "messages": [{"role": "user", "content": PROMPT}],
    }
    text = claude.messages.create(**kw).content[0].text
    word = text.split()[2]  # a word the greedy answer holds: asked to stop there, it stops there
    m = claude.messages.create(**kw, stop_sequences=[word, "zzz-never"])
    assert (m.stop_reason, m.stop_sequence) == ("stop_sequence", word)
    assert m.content[0].text == text[: text.index(word)]


def test_anthropic_tool_round_trip_whole_and_streamed(claude: anthropic.Anthropic) -> None:
    tools = [{"name": "get_weather", "description": "Weather in a city", "input_schema": WEATHER_SCHEMA}]
    msgs: list = [{"role": "user", "content": "What is the weather in Paris?"}]
    kw = {
        "model": MODEL,
        "max_tokens": 40,
        "extra_body": GREEDY,
        "tools": tools,
        "tool_choice": {"type": "any"},
    }
    m = claude.messages.create(messages=msgs, **kw)
    uses = [b for b in m.content if b.type == "tool_use"]
    assert m.stop_reason == "tool_use" and uses and uses[0].name == "get_weather"
    assert isinstance(uses[0].input["city"], str) and uses[0].id.startswith("toolu_")
    with claude.messages.stream(messages=msgs, **kw) as s:
        streamed = s.get_final_message()
    assert streamed.stop_reason == "tool_use"
    assert [(b.name, b.input) for b in streamed.content] == [(b.name, b.input) for b in uses]
    msgs += [
        {"role": "assistant", "content": [b.model_dump() for b in m.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": "sunny"}]},
    ]
    answer = claude.messages.create(model=MODEL, max_tokens=12, extra_body=GREEDY, tools=tools, messages=msgs)
    assert answer.stop_reason in ("end_turn", "max_tokens", "tool_use") and answer.content


def test_anthropic_errors_in_its_shape(claude: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.BadRequestError) as e:
        claude.messages.create(
            model=MODEL,
            max_tokens=8,
            messages=[
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/png", "data": "AA=="},
                        }
                    ],
                }
            ],
        )
    assert e.value.body["type"] == "error" and e.value.body["error"]["type"] == "invalid_request_error"
    assert "takes no images" in e.value.body["error"]["message"]  # a model started without --mmproj
    with pytest.raises(anthropic.BadRequestError, match="max_tokens"):
        claude.post(
            "/v1/messages",
            cast_to=object,
            body={"model": MODEL, "messages": [{"role": "user", "content": "x"}]},
        )


# ---- OpenAI Responses -----------------------------------------------------------------------------------
def test_responses_plain_and_streamed(oai: openai.OpenAI) -> None:
    want = _chat(oai, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": PROMPT}])
    kw = {
        "model": MODEL,
        "instructions": "Be brief.",
        "input": PROMPT,
        "max_output_tokens": 12,
        "temperature": 0,
    }
    r = oai.responses.create(**kw)
    assert (
        r.output_text == want.choices[0].message.content and r.usage.input_tokens == want.usage.prompt_tokens
    )
    assert r.status == ("incomplete" if want.choices[0].finish_reason == "length" else "completed")
    events = list(oai.responses.create(**kw, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1].startswith("response.")
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == r.output_text
    assert events[-1].response.output_text == r.output_text
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_responses_json_schema_format(oai: openai.OpenAI) -> None:
    r = oai.responses.create(
        model=MODEL,
        input=PROMPT,
        max_output_tokens=40,
        temperature=0,
        text={"format": {"type": "json_schema", "name": "c", "schema": COLOUR_SCHEMA, "strict": True}},
    )
    assert json.loads(r.output_text)["colour"] in COLOUR["enum"]


def test_responses_tool_call_and_its_output_through_previous_response_id(oai: openai.OpenAI) -> None:
    tools = [{"type": "function", "name": "get_weather", "parameters": WEATHER_SCHEMA, "strict": True}]
    kw = {"model": MODEL, "input": "What is the weather in Paris?", "tools": tools, "tool_choice": "required"}
    r = oai.responses.create(**kw, max_output_tokens=40, temperature=0)
    (call,) = [o for o in r.output if o.type == "function_call"]
    assert call.name == "get_weather" and isinstance(json.loads(call.arguments)["city"], str)
    streamed = list(oai.responses.create(**kw, max_output_tokens=40, temperature=0, stream=True))
    done = [e for e in streamed if e.type == "response.function_call_arguments.done"]
    assert [e.arguments for e in done] == [call.arguments]
    out = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}
    follow = oai.responses.create(
        model=MODEL, previous_response_id=r.id, input=[out], tools=tools, max_output_tokens=8, temperature=0
    )
    assert follow.status in ("completed", "incomplete") and follow.previous_response_id == r.id
    with pytest.raises(openai.BadRequestError, match="previous_response_id"):
        oai.responses.create(model=MODEL, previous_response_id="resp_unknown", input="hi")


def test_responses_retrieve_delete_and_input_items(oai: openai.OpenAI) -> None:
    """Stored responses come back whole (GET), their input items listed (newest first by default, paged),
    and go away (DELETE): the SDK's retrieve, input_items.list and delete."""
    items = [
        {"role": "user", "content": "My name is Ada."},
        {"role": "assistant", "content": "Hello Ada."},
        {"role": "user", "content": PROMPT},
    ]
    r = oai.responses.create(model=MODEL, input=items, max_output_tokens=8, temperature=0)
    got = oai.responses.retrieve(r.id)
    assert got.id == r.id and got.output_text == r.output_text and got.usage.output_tokens == 8
    listed = oai.responses.input_items.list(r.id)
    texts = [i.content[0].text for i in listed.data]
    assert texts == [PROMPT, "Hello Ada.", "My name is Ada."] and all(i.id for i in listed.data)
    page = oai.responses.input_items.list(r.id, order="asc", limit=2)
    assert [i.id for i in page.data] == [i.id for i in reversed(listed.data)][:2] and page.has_more
    rest = oai.responses.input_items.list(r.id, order="asc", limit=2, after=page.data[-1].id)
    assert [i.id for i in rest.data] == [listed.data[0].id] and not rest.has_more
    oai.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        oai.responses.retrieve(r.id)
    with pytest.raises(openai.BadRequestError):  # nor can a later response build on it
        oai.responses.create(model=MODEL, input="And?", previous_response_id=r.id, max_output_tokens=2)
    unstored = oai.responses.create(model=MODEL, input=PROMPT, max_output_tokens=2, store=False)
    with pytest.raises(openai.NotFoundError):
        oai.responses.retrieve(unstored.id)


def test_responses_include_summary_and_truncation(oai: openai.OpenAI, apis_server: str) -> None:
    """What Codex and agents send: include of data these responses never carry (accepted), a
    reasoning summary (the reasoning itself), truncation "auto" (the oldest items go until it fits)."""
    r = oai.responses.create(
        model=MODEL, input=PROMPT, max_output_tokens=4, temperature=0, store=False,
        include=["reasoning.encrypted_content"], reasoning={"summary": "auto"},
    )  # fmt: skip
    assert r.output_text and r.reasoning.summary == "auto"
    with pytest.raises(openai.BadRequestError) as e:
        oai.responses.create(model=MODEL, input=PROMPT, include=["message.output_text.logprobs"])
    assert "include" in str(e.value)
    long_turns = []
    for i in range(12):  # ~1,100 tokens of earlier conversation: past the 512-token context
        long_turns += [{"role": "user", "content": f"Fact {i}: " + "the sky is blue and wide. " * 15},
                       {"role": "assistant", "content": "Noted."}]  # fmt: skip
    long_turns.append({"role": "user", "content": PROMPT})
    with pytest.raises(openai.BadRequestError) as e:
        oai.responses.create(model=MODEL, input=long_turns, max_output_tokens=4)
    assert "context length" in str(e.value)
    cut = oai.responses.create(model=MODEL, input=long_turns, max_output_tokens=4, truncation="auto")
    assert cut.truncation == "auto" and cut.output_text and cut.usage.input_tokens < 512
    kept = [i.content[0].text for i in oai.responses.input_items.list(cut.id, order="asc", limit=100).data]
    assert kept == [t["content"] for t in long_turns]  # the items as sent; the prompt dropped the oldest
