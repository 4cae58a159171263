"""llama-server's own routes (issue 59): /completion with its prompt shapes, streaming, reply object and
timings, the samplers it defines taken only when off; /props, /slots, /apply-template. Against one real
server (SmolLM2), compared with the OpenAI routes of the same engine."""

from __future__ import annotations

import json
import time

import jsonschema
import pytest

from edgellm.testing.servers import httpx

MODEL = "smollm2-135m"
PROMPT = "The capital of France is"


def _post(url: str, path: str, **body: object) -> httpx.Response:
    return httpx.post(f"{url}{path}", json=body, timeout=120)


def test_completion_is_the_openai_completion_in_llama_servers_shape(apis_server: str) -> None:
    r = _post(apis_server, "/completion", prompt=PROMPT, n_predict=8, temperature=0, return_tokens=True)
    assert r.status_code == 200, r.text
    got = r.json()
    want = _post(apis_server, "/v1/completions", model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0)
    assert got["content"] == want.json()["choices"][0]["text"]
    assert (got["stop"], got["stop_type"], got["stopping_word"], got["truncated"]) == (
        True,
        "limit",
        "",
        False,
    )
    assert got["tokens_predicted"] == 8 and got["tokens_evaluated"] == want.json()["usage"]["prompt_tokens"]
    assert got["prompt"] == PROMPT and len(got["tokens"]) == 8
    detok = _post(apis_server, "/detokenize", tokens=got["tokens"]).json()["content"]
    assert detok == got["content"]
    t = got["timings"]
    assert t["predicted_n"] == 8 and t["prompt_n"] + t["cache_n"] == got["tokens_evaluated"]
    assert t["predicted_ms"] > 0 and t["predicted_per_second"] > 0 and t["prompt_ms"] > 0
    # the rate is over the 7 decode steps after the first token (which the prompt's pass gives)
    assert t["predicted_per_second"] == pytest.approx(7e3 / t["predicted_ms"], rel=1e-9)
    one = _post(apis_server, "/completion", prompt=PROMPT, n_predict=1, temperature=0).json()["timings"]
    assert one["predicted_n"] == 1 and one["predicted_per_second"] == one["predicted_per_token_ms"] == 0.0


def test_completion_streams_what_it_returns_whole(apis_server: str) -> None:
    whole = _post(apis_server, "/completion", prompt=PROMPT, n_predict=6, temperature=0).json()
    body = {"prompt": PROMPT, "n_predict": 6, "temperature": 0, "stream": True, "return_tokens": True}
    events = []
    with httpx.stream("POST", f"{apis_server}/completion", json=body, timeout=120) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    assert all(e["stop"] is False for e in events[:-1]) and events[-1]["stop"] is True
    assert "".join(e["content"] for e in events) == whole["content"]
    assert events[-1]["tokens_predicted"] == 6 and len(events[-1]["tokens"]) == 6


def test_prompt_shapes_tokens_mixed_and_several(apis_server: str) -> None:
    ids = _post(apis_server, "/tokenize", content=PROMPT).json()["tokens"]
    text = _post(apis_server, "/completion", prompt=PROMPT, n_predict=4, temperature=0).json()
    tokens = _post(apis_server, "/completion", prompt=ids, n_predict=4, temperature=0).json()
    assert tokens["content"] == text["content"]
    head, tail = "The capital", " of France is"  # text, then its rest as token ids
    tail_ids = _post(apis_server, "/tokenize", content=tail, add_special=False).json()["tokens"]
    mixed = _post(apis_server, "/completion", prompt=[head, *tail_ids], n_predict=4, temperature=0)
    assert mixed.status_code == 200 and mixed.json()["prompt"] == PROMPT
    several = _post(
        apis_server, "/completion", prompt=[PROMPT, "Once upon a time"], n_predict=3, temperature=0
    )
    replies = several.json()
    assert [r["index"] for r in replies] == [0, 1]
    assert text["content"].startswith(replies[0]["content"])  # the same greedy start, 3 of its 4 tokens


def test_stop_words_grammar_and_ignore_eos(apis_server: str) -> None:
    stopped = _post(apis_server, "/completion", prompt=PROMPT, n_predict=30, temperature=0, stop=["."]).json()
    assert (stopped["stop_type"], stopped["stopping_word"]) == ("word", ".") and "." not in stopped["content"]
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    constrained = _post(
        apis_server, "/completion", prompt=PROMPT, n_predict=40, temperature=0, json_schema=schema
    )
    jsonschema.validate(json.loads(constrained.json()["content"]), schema)
    chat = _post(
        apis_server, "/apply-template", messages=[{"role": "user", "content": "Say just: Hi"}]
    ).json()
    free = _post(apis_server, "/completion", prompt=chat["prompt"], n_predict=60, temperature=0).json()
    assert free["stop_type"] == "eos" and free["tokens_predicted"] < 60, free
    held = _post(
        apis_server, "/completion", prompt=chat["prompt"], n_predict=60, temperature=0, ignore_eos=True
    )
    assert held.json()["stop_type"] == "limit" and held.json()["tokens_predicted"] == 60


def test_n_probs_are_the_openai_logprobs_in_llama_servers_shape(apis_server: str) -> None:
    """n_probs: each generated token with its id, text, bytes and logprob, and the n most likely (the same
    figures as /v1/completions' logprobs); streamed, each chunk carries its own tokens'."""
    r = _post(apis_server, "/completion", prompt=PROMPT, n_predict=5, temperature=0, n_probs=4).json()
    probs = r["completion_probabilities"]
    want = _post(apis_server, "/v1/completions", model=MODEL, prompt=PROMPT, max_tokens=5, temperature=0,
                 logprobs=4).json()["choices"][0]["logprobs"]  # fmt: skip
    assert [p["token"] for p in probs] == want["tokens"] and r["generation_settings"]["n_probs"] == 4
    assert [p["logprob"] for p in probs] == pytest.approx(want["token_logprobs"], abs=1e-5)
    for p, top in zip(probs, want["top_logprobs"], strict=True):
        assert len(p["top_logprobs"]) == 4 and bytes(p["bytes"]).decode() == p["token"]
        assert {t["token"]: t["logprob"] for t in p["top_logprobs"]} == pytest.approx(
            {k: v for k, v in top.items() if k in {t["token"] for t in p["top_logprobs"]}}, abs=1e-5
        )
        assert p["id"] == p["top_logprobs"][0]["id"]  # greedy: the chosen token is the most likely
    body = {"prompt": PROMPT, "n_predict": 5, "temperature": 0, "n_probs": 4, "stream": True}
    with httpx.stream("POST", f"{apis_server}/completion", json=body, timeout=120) as s:
        chunks = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: ")]
    streamed = [p for c in chunks for p in c.get("completion_probabilities", [])]
    assert [p["id"] for p in streamed] == [p["id"] for p in probs]
    assert all(c["completion_probabilities"] for c in chunks if not c["stop"])
    plain = _post(apis_server, "/completion", prompt=PROMPT, n_predict=2).json()
    assert "completion_probabilities" not in plain


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"mirostat": 2}, "'mirostat'"),
        ({"dry_multiplier": 0.8}, "'dry_multiplier'"),
        ({"mirostat_tau": 5.0, "mirostat": 1}, "'mirostat'"),
        ({"n_probs": 3, "post_sampling_probs": True}, "'post_sampling_probs'"),
        ({"n_probs": 99}, "'n_probs'"),
        ({"n_predict": 0}, "'n_predict'"),
        ({"samplers": ["temperature", "top_k"]}, "'samplers'"),
        ({"frobnicate": 1}, "'frobnicate'"),
        ({"logit_bias": [[1.5, 1.0]]}, "'logit_bias'"),
        ({"prompt": [[1, 2], {"bogus": "x"}]}, "'prompt'"),
    ],
)
def test_what_completion_cannot_honour_is_a_400_naming_it(apis_server: str, fields: dict, named: str) -> None:
    r = _post(apis_server, "/completion", **{"prompt": PROMPT, "n_predict": 2, **fields})
    assert r.status_code == 400 and named in r.json()["error"]["message"], r.text


def test_what_changes_nothing_or_is_off_is_accepted(apis_server: str) -> None:
    base = {"prompt": PROMPT, "n_predict": 3, "temperature": 0}
    plain = _post(apis_server, "/completion", **base).json()["content"]
    order = ["penalties", "dry", "top_k", "typ_p", "top_p", "min_p", "temperature"]  # llama-server's
    quiet = {"cache_prompt": True, "n_keep": -1, "id_slot": -1, "mirostat": 0, "mirostat_tau": 5.0,
             "typical_p": 1.0, "samplers": order, "logit_bias": [], "seed": -1}  # fmt: skip
    r = _post(apis_server, "/completion", **base, **quiet)
    assert r.status_code == 200 and r.json()["content"] == plain, r.text
    banned = _post(apis_server, "/tokenize", content=plain, add_special=False).json()["tokens"][0]
    other = _post(apis_server, "/completion", **base, logit_bias=[[banned, False]]).json()["content"]
    assert not other.startswith(plain)


def test_generation_settings_show_the_logit_bias_and_ignore_eos_as_banned_ends(apis_server: str) -> None:
    base = {"prompt": PROMPT, "n_predict": 2, "temperature": 0}
    off = _post(apis_server, "/completion", **base, ignore_eos=False).json()["generation_settings"]
    assert off["logit_bias"] == []
    on = _post(apis_server, "/completion", **base, ignore_eos=True).json()["generation_settings"]
    assert on["logit_bias"] and all(e["bias"] is None for e in on["logit_bias"])  # null: -inf
    ends = {e["token"] for e in on["logit_bias"]}
    biased = _post(apis_server, "/completion", **base, logit_bias=[[17, 2.5]]).json()["generation_settings"]
    assert biased["logit_bias"] == [{"bias": 2.5, "token": 17}] and 17 not in ends


def test_metrics_carry_llama_servers_process_start_header(apis_server: str) -> None:
    r = httpx.get(f"{apis_server}/metrics", timeout=30)
    started = int(r.headers["Process-Start-Time-Unix"])
    assert r.status_code == 200 and 0 < time.time() - started < 24 * 3600


def test_props_slots_and_apply_template(apis_server: str) -> None:
    props = httpx.get(f"{apis_server}/props", timeout=30).json()
    assert props["default_generation_settings"]["n_ctx"] == 512 and props["total_slots"] >= 1
    assert props["model_path"].endswith(".gguf") and "im_start" in props["chat_template"]
    assert httpx.post(f"{apis_server}/props", json={}, timeout=30).status_code == 501
    slots = httpx.get(f"{apis_server}/slots", timeout=30).json()
    assert len(slots) == props["total_slots"] and all(s["n_ctx"] == 512 for s in slots)
    msgs = [{"role": "user", "content": "hi"}]
    prompt = _post(apis_server, "/apply-template", messages=msgs).json()["prompt"]
    ids = _post(apis_server, "/tokenize", messages=msgs).json()["tokens"]
    assert _post(apis_server, "/detokenize", tokens=ids).json()["content"] == prompt


def test_apply_template_renders_the_whole_chat_body(apis_server: str) -> None:
    msgs = [{"role": "user", "content": "What is today?"}]
    tool = {"type": "function", "function": {"name": "get_the_date", "parameters": {"type": "object"}}}
    plain = _post(apis_server, "/apply-template", messages=msgs).json()["prompt"]
    with_tools = _post(apis_server, "/apply-template", messages=msgs, tools=[tool]).json()["prompt"]
    assert "get_the_date" in with_tools and "get_the_date" not in plain
    chat = _post(apis_server, "/tokenize", messages=msgs).json()["tokens"]
    assert _post(apis_server, "/detokenize", tokens=chat).json()["content"] == plain
    bare = _post(apis_server, "/apply-template", messages=msgs, add_generation_prompt=False).json()["prompt"]
    assert plain.endswith("<|im_start|>assistant\n") and plain.startswith(bare) and bare != plain
    r = _post(apis_server, "/apply-template", messages=msgs, frobnicate=1)
    assert r.status_code == 400 and "'frobnicate'" in r.json()["error"]["message"], r.text
    for path in ("/v1/chat/completions/input_tokens", "/chat/completions/input_tokens"):
        assert _post(apis_server, path, messages=msgs).json() == {"input_tokens": len(chat)}
        assert _post(apis_server, path, messages=msgs, tools=[tool]).json()["input_tokens"] > len(chat) + 5


def test_openai_replies_carry_llama_servers_timings(apis_server: str) -> None:
    msgs = [{"role": "user", "content": "Hi"}]
    chat = {"model": MODEL, "messages": msgs, "max_tokens": 5, "temperature": 0}
    r = _post(apis_server, "/v1/chat/completions", **chat).json()
    t, u = r["timings"], r["usage"]
    assert t["predicted_n"] == u["completion_tokens"] and t["prompt_n"] + t["cache_n"] == u["prompt_tokens"]
    assert t["predicted_ms"] > 0 and t["prompt_ms"] > 0
    body = {"model": MODEL, "messages": msgs, "max_tokens": 5, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{apis_server}/v1/chat/completions", json=body, timeout=120) as s:
        chunks = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: {")]
    [last] = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert last["timings"]["predicted_n"] == u["completion_tokens"] and "timings" not in chunks[0]
    two = _post(apis_server, "/v1/completions", model=MODEL, prompt="Hi", max_tokens=3, n=2).json()
    assert "timings" not in two  # one request's timings only


def test_tokenize_with_pieces_as_llama_server_gives_them(apis_server: str) -> None:
    content = "This is a test string with unicode 媽 and emoji 🤗"
    plain = _post(apis_server, "/tokenize", content=content).json()["tokens"]
    pieces = _post(apis_server, "/tokenize", content=content, with_pieces=True).json()["tokens"]
    assert [p["id"] for p in pieces] == plain and all(p["piece"] for p in pieces)
    raw = [p["piece"].encode() if isinstance(p["piece"], str) else bytes(p["piece"]) for p in pieces]
    joined = b"".join(raw)
    assert joined.decode() == content and any(isinstance(p["piece"], list) for p in pieces)  # 媽's bytes


def test_completion_takes_json_prompts_text_logit_bias_and_response_fields(apis_server: str) -> None:
    """What llama.cpp's test_completion sends besides: a JSON prompt object, a text's logit bias (each of
    its tokens), response_fields (picked, "a/b" from inside a); has_new_line and generation_settings."""
    base = {"n_predict": 6, "temperature": 0}
    text = _post(apis_server, "/completion", prompt=PROMPT, **base).json()
    as_json = _post(apis_server, "/completion", prompt={"prompt_string": PROMPT}, **base).json()
    assert as_json["content"] == text["content"] and isinstance(text["has_new_line"], bool)
    assert text["generation_settings"]["n_predict"] == 6 and text["generation_settings"]["temperature"] == 0
    word = text["content"].split()[0]
    for bias in ([[" " + word, False]], {" " + word: -100}):
        other = _post(apis_server, "/completion", prompt=PROMPT, logit_bias=bias, **base).json()
        assert not other["content"].startswith(" " + word), (bias, other["content"])
    fields = ["content", "generation_settings/n_predict", "nope"]
    picked = _post(apis_server, "/completion", prompt=PROMPT, response_fields=fields, **base).json()
    assert picked == {"content": text["content"], "generation_settings/n_predict": 6}
    bad = _post(
        apis_server, "/completion", prompt={"prompt_string": PROMPT, "multimodal_data": ["aGk="]}, **base
    )
    assert bad.status_code == 400 and "multimodal_data" in bad.json()["error"]["message"]
