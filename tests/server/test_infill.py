"""Code infill: the FIM prompt built from a GGUF's FIM token ids in llama.cpp's layout (format_infill), and
on real server processes (tiny synthetic models, one with FIM tokens and one without) `suffix` on
/v1/completions through the `openai` client and llama.cpp's /infill, streamed and not: the engine gets
exactly the FIM prompt (the same greedy text and prompt token count as sending those ids as the prompt),
and a model without FIM tokens, or a malformed body, is a 400 naming the problem."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from edgellm.gguf.load import load_gguf
from edgellm.testing.api_attacks import INFILL, error_message
from edgellm.testing.servers import httpx, start_server, stop_server
from edgellm.testing.synthetic.models import Typed, write_tiny_model
from edgellm.tokenizer import fim
from edgellm.tokenizer.tokenizer import Tokenizer

try:
    from gguf import GGUFValueType
except ImportError:  # pragma: no cover - gguf-py ships with the test extras
    GGUFValueType = None

N_BASE = 288  # the tiny vocabulary; the six padding tokens after it serve as FIM tokens
PRE, SUF, MID, PAD, REP, SEP = range(N_BASE, N_BASE + 6)
PREFIX = "def add(a, b):\n    "
SUFFIX = "\n\nprint(add(1, 2))\n"
MAX = 8


def _u32(v: int) -> Typed:
    return Typed(v, GGUFValueType.UINT32, None)


FIM_KEYS = {
    "tokenizer.ggml.fim_pre_token_id": PRE,
    "tokenizer.ggml.fim_suf_token_id": SUF,
    "tokenizer.ggml.fim_mid_token_id": MID,
    "tokenizer.ggml.fim_pad_token_id": PAD,
    "tokenizer.ggml.fim_rep_token_id": REP,
    "tokenizer.ggml.fim_sep_token_id": SEP,
}


def _model(path: Path, keys: dict[str, int], **overrides: object) -> Path:
    md = {k: _u32(v) for k, v in keys.items()} | overrides
    return write_tiny_model(path, "llama", n_vocab=N_BASE + 6, metadata_overrides=md)


def _tokenizer(path: Path) -> tuple[Tokenizer, dict]:
    metadata = load_gguf(path).metadata
    return Tokenizer.from_metadata(metadata), metadata


# ---- the prompt builder ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fim_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _model(tmp_path_factory.mktemp("fim") / "fim.gguf", FIM_KEYS)


@pytest.fixture(scope="module")
def plain_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _model(tmp_path_factory.mktemp("plain") / "plain.gguf", {})


def test_repo_level_layout_with_rep_and_sep_tokens(fim_model: Path) -> None:
    tok, metadata = _tokenizer(fim_model)
    toks = fim.fim_tokens(metadata, tok.vocab_size)
    assert toks == fim.FimTokens(PRE, SUF, MID, REP, SEP)

    def text(s: str) -> list[int]:
        return tok.encode(s, add_special=False, parse_special=False)

    ids = fim.fim_prompt_ids(tok, toks, PREFIX, SUFFIX, prompt="return", extra=[("util.py", "X = 1\n")])
    assert ids == [
        REP, *text("myproject\n"),
        SEP, *text("util.py\n"), *text("X = 1\n"),
        SEP, *text("filename\n"),
        PRE, *text(PREFIX), *text("return"), SUF, *text(SUFFIX), MID,
    ]  # fmt: skip
    # a chunk without a filename is llama.cpp's "tmp"
    assert fim.fim_prompt_ids(tok, toks, "", "", extra=[("tmp", "y")]) == fim.fim_prompt_ids(
        tok, toks, "", "", extra=[(fim.DEFAULT_CHUNK_FILE_NAME, "y")]
    )


def test_without_rep_and_sep_chunks_are_text_and_bos_comes_after_them(tmp_path: Path) -> None:
    keys = {  # the pre-2024 key names
        "tokenizer.ggml.prefix_token_id": PRE,
        "tokenizer.ggml.suffix_token_id": SUF,
        "tokenizer.ggml.middle_token_id": MID,
    }
    path = _model(tmp_path / "old.gguf", keys, **{"tokenizer.ggml.add_bos_token": True})
    tok, metadata = _tokenizer(path)
    toks = fim.fim_tokens(metadata, tok.vocab_size)
    assert toks == fim.FimTokens(PRE, SUF, MID) and tok.add_bos and tok.bos_id is not None

    def text(s: str) -> list[int]:
        return tok.encode(s, add_special=False, parse_special=False)

    ids = fim.fim_prompt_ids(tok, toks, "a", "b", extra=[("f.py", "one"), ("g.py", "two")])
    snippet = text("\n\n--- snippet ---\n\n")
    expected = [
        *snippet,
        *text("one"),
        *snippet,
        *text("two"),
        tok.bos_id,
        PRE,
        *text("a"),
        SUF,
        *text("b"),
        MID,
    ]
    assert ids == expected


def test_special_token_text_in_the_code_stays_text(fim_model: Path) -> None:
    tok, metadata = _tokenizer(fim_model)
    toks = fim.fim_tokens(metadata, tok.vocab_size)
    marker = tok.token_text(MID)  # the FIM-middle token's own text, typed into the code
    ids = fim.fim_prompt_ids(tok, toks, f"x{marker}", f"{marker}y")
    assert ids.count(MID) == 1 and ids[-1] == MID
    assert tok.decode(ids[ids.index(PRE) + 1 : ids.index(SUF)]) == f"x{marker}"


def test_missing_or_broken_fim_metadata_names_the_keys(plain_model: Path) -> None:
    tok, metadata = _tokenizer(plain_model)
    with pytest.raises(
        fim.NoFimError, match="no fill-in-the-middle tokens.*fim_pre_token_id.*fim_mid_token_id"
    ):
        fim.fim_tokens(metadata, tok.vocab_size)
    only_pre = {**metadata, "tokenizer.ggml.fim_pre_token_id": PRE}
    with pytest.raises(fim.NoFimError, match="fim_suf_token_id, tokenizer.ggml.fim_mid_token_id") as e:
        fim.fim_tokens(only_pre, tok.vocab_size)
    assert "fim_pre_token_id" not in str(e.value).split("lacks")[1].split("(")[0]
    with pytest.raises(fim.NoFimError, match="fim_suf_token_id = 99999 is outside the vocabulary"):
        fim.fim_tokens({**metadata, **FIM_KEYS, "tokenizer.ggml.fim_suf_token_id": 99999}, tok.vocab_size)


# ---- on a server ----------------------------------------------------------------------------------------

# No end-of-generation token (the tiny vocabulary's and the FIM pad/rep/sep, which llama.cpp makes EOG):
# every reply runs MAX tokens, so equal texts compare MAX greedy steps.
NO_EOG = {str(t): -100 for t in (0, 2, PAD, REP, SEP)}


def _serve(model: Path) -> Iterator[str]:
    proc, url = start_server(str(model), "--ctx", "256", "--threads", "1")  # waits out a cold compile
    try:
        yield url
    finally:
        stop_server(proc)


@pytest.fixture(scope="module")
def fim_server(fim_model: Path) -> Iterator[str]:
    yield from _serve(fim_model)


@pytest.fixture(scope="module")
def plain_server(plain_model: Path) -> Iterator[str]:
    yield from _serve(plain_model)


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)


def _greedy_from_ids(client: openai.OpenAI, ids: list[int]) -> str:
    r = client.completions.create(model="m", prompt=ids, max_tokens=MAX, temperature=0, logit_bias=NO_EOG)
    assert r.usage.prompt_tokens == len(ids) and r.usage.completion_tokens == MAX
    return r.choices[0].text


def test_suffix_on_completions_generates_from_the_fim_prompt(fim_server: str, fim_model: Path) -> None:
    tok, metadata = _tokenizer(fim_model)
    ids = fim.fim_prompt_ids(tok, fim.fim_tokens(metadata, tok.vocab_size), PREFIX, SUFFIX)
    client = _client(fim_server)
    expected = _greedy_from_ids(client, ids)
    kw = {"model": "m", "prompt": PREFIX, "max_tokens": MAX, "temperature": 0, "logit_bias": NO_EOG}
    r = client.completions.create(suffix=SUFFIX, **kw)
    assert r.usage.prompt_tokens == len(ids) and r.choices[0].text == expected
    plain = client.completions.create(**kw)  # no suffix: the prompt as it is
    assert plain.usage.prompt_tokens == len(tok.encode(PREFIX, add_special=True)) != len(ids)
    chunks = list(client.completions.create(suffix=SUFFIX, stream=True, **kw))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == expected
    two = client.completions.create(**{**kw, "prompt": [PREFIX, "x = "]}, suffix=SUFFIX)
    other = fim.fim_prompt_ids(tok, fim.fim_tokens(metadata, tok.vocab_size), "x = ", SUFFIX)
    assert two.usage.prompt_tokens == len(ids) + len(other)
    assert sorted(c.text for c in two.choices) == sorted([expected, _greedy_from_ids(client, other)])


def test_infill_route_streamed_and_not(fim_server: str, fim_model: Path) -> None:
    tok, metadata = _tokenizer(fim_model)
    extra = [{"filename": "util.py", "text": "def sub(a, b):\n    return a - b\n"}]
    ids = fim.fim_prompt_ids(
        tok, fim.fim_tokens(metadata, tok.vocab_size), PREFIX, SUFFIX, "return",
        [(c["filename"], c["text"]) for c in extra],
    )  # fmt: skip
    expected = _greedy_from_ids(_client(fim_server), ids)
    body = {
        "input_prefix": PREFIX, "input_suffix": SUFFIX, "input_extra": extra, "prompt": "return",
        "n_predict": MAX, "temperature": 0, "logit_bias": NO_EOG, "samplers": ["top_k", "infill"],
    }  # fmt: skip
    r = httpx.post(f"{fim_server}/infill", json=body, timeout=120)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["content"] == expected and out["stop"] is True and out["stop_type"] == "limit"
    assert out["tokens_evaluated"] == len(ids) and out["tokens_predicted"] == MAX
    with httpx.stream("POST", f"{fim_server}/infill", json={**body, "stream": True}, timeout=120) as s:
        assert s.status_code == 200 and s.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: ")]
    assert all(e["stop"] is False for e in events[:-1]) and events[-1]["stop"] is True
    assert "".join(e["content"] for e in events) == expected
    assert events[-1]["tokens_evaluated"] == len(ids) and events[-1]["tokens_predicted"] == MAX
    word = next(ch for ch in expected if ch.isascii() and ch.isalnum())
    stopped = httpx.post(f"{fim_server}/infill", json={**body, "stop": [word]}, timeout=120).json()
    assert stopped["stop_type"] == "word" and stopped["stopping_word"] == word
    assert stopped["content"] == expected[: expected.index(word)]


def test_a_model_without_fim_tokens_is_a_400_on_both_routes(plain_server: str) -> None:
    for stream in (False, True):
        r = httpx.post(
            f"{plain_server}/infill",
            json={"input_prefix": "a", "input_suffix": "b", "stream": stream},
            timeout=60,
        )
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert "no fill-in-the-middle tokens" in err["message"] and "fim_pre_token_id" in err["message"]
        with pytest.raises(openai.BadRequestError) as e:
            _client(plain_server).completions.create(
                model="m", prompt="a", suffix="b", max_tokens=2, stream=stream
            )
        assert e.value.body["param"] == "suffix" and "fim_pre_token_id" in e.value.body["message"]
    ok = _client(plain_server).completions.create(model="m", prompt="a", suffix="", max_tokens=2)
    assert ok.usage.completion_tokens >= 1  # an empty suffix is a plain completion


@pytest.mark.parametrize(
    ("path", "body", "named"), INFILL, ids=[f"{p}:{json.dumps(b)[:50]}" for p, b, _ in INFILL]
)
def test_malformed_infill_bodies_are_400s_naming_the_field(
    fim_server: str, path: str, body: dict, named: str
) -> None:
    for stream in (False, True):
        r = httpx.post(f"{fim_server}{path}", json={**body, "stream": stream}, timeout=60)
        assert r.status_code == 400, (stream, r.text)
        message = error_message(path, r.json())
        assert message is not None and named in message, r.text


def test_an_infill_past_the_context_is_a_400_and_the_server_keeps_serving(fim_server: str) -> None:
    r = httpx.post(f"{fim_server}/infill", json={"input_prefix": "x = 1\n" * 400, "n_predict": 1}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text
    ok = httpx.post(f"{fim_server}/infill", json={"input_prefix": "a", "n_predict": 2}, timeout=60)
    assert ok.status_code == 200 and ok.json()["tokens_predicted"] >= 1


PROMPT_IDS = "'prompt': token ids must be in 0..{last}"


@pytest.mark.parametrize(
    ("path", "body", "param", "message"),
    [
        ("/v1/completions", {"prompt": [1, 10**6]}, "prompt", "'prompt': token ids must be in 0..{last}"),
        (
            "/v1/completions",
            {"prompt": [[1, 2], [3, -1]]},
            "prompt",
            "'prompt': token ids must be in 0..{last}",
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "hi"}], "logit_bias": {"999999": 1}},
            "logit_bias",
            "'logit_bias': token id 999999 is outside the vocabulary (0..{last})",
        ),
    ],
)
def test_token_ids_outside_the_vocabulary_are_the_front_ends_400(
    fim_server: str, fim_model: Path, path: str, body: dict, param: str, message: str
) -> None:
    """The front-end's one check (LLM.make_request, in start_generation before a slot is taken) answers
    with the body the parser gave before it: streamed or not, and nothing is left running."""
    message = message.format(last=_tokenizer(fim_model)[0].vocab_size - 1)
    for stream in (False, True):
        r = httpx.post(f"{fim_server}{path}", json={**body, "max_tokens": 2, "stream": stream}, timeout=60)
        assert r.status_code == 400, (stream, r.text)
        err = r.json()["error"]
        assert (err["param"], err["code"], err["message"]) == (param, "invalid_value", message), r.text
    ok = httpx.post(f"{fim_server}/v1/completions", json={"prompt": [1, 2], "max_tokens": 2}, timeout=60)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] >= 1


def test_ollama_generate_with_a_suffix_fills_in_the_middle(fim_server: str, plain_server: str) -> None:
    """Ollama's /api/generate `suffix` (what code-completion plugins send) builds the same FIM prompt as
    /v1/completions' suffix; a model without FIM tokens is a 400 naming `suffix`."""
    import ollama

    kw = {"model": "m", "prompt": PREFIX, "max_tokens": MAX, "temperature": 0}
    want = _client(fim_server).completions.create(suffix=SUFFIX, **kw)
    got = ollama.Client(host=fim_server, timeout=120).generate(
        model="m", prompt=PREFIX, suffix=SUFFIX, options={"num_predict": MAX, "temperature": 0}
    )
    assert got.response == want.choices[0].text and got.prompt_eval_count == want.usage.prompt_tokens
    with pytest.raises(ollama.ResponseError) as e:
        ollama.Client(host=plain_server, timeout=120).generate(model="m", prompt=PREFIX, suffix=SUFFIX)
    assert e.value.status_code == 400 and "'suffix'" in e.value.error
    with pytest.raises(ollama.ResponseError) as e:
        ollama.Client(host=fim_server, timeout=120).generate(
            model="m", prompt=PREFIX, suffix=SUFFIX, system="Be brief."
        )
    assert e.value.status_code == 400 and "'system'" in e.value.error
