"""Tokenizer ids and text vs llama.cpp fixtures (scripts/fixtures/make_tokenizer_fixtures.py) on
the real models."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pytest

from edgellm.gguf.load import load_gguf
from edgellm.testing.paths import FIXTURES
from edgellm.tokenizer import StreamDecoder, Tokenizer, TokenizerError
from edgellm.tokenizer.spm import SPACE_ESCAPE, SpmModel, spm_tokenize_ref

MODELS = ("smollm2", "gemma3")


def load_fixture(name: str) -> dict:
    return json.loads((FIXTURES / f"tokenizer_{name}.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def metadata(smollm2_path: Path, gemma3_path: Path) -> dict[str, dict]:
    return {"smollm2": load_gguf(smollm2_path).metadata, "gemma3": load_gguf(gemma3_path).metadata}


@pytest.fixture(scope="module")
def tokenizers(metadata: dict[str, dict]) -> dict[str, Tokenizer]:
    built = {}
    for name in MODELS:
        start = time.perf_counter()
        built[name] = Tokenizer.from_metadata(metadata[name])
        print(f"\n{name}: Tokenizer.from_metadata {time.perf_counter() - start:.3f} s")
    return built


@pytest.mark.parametrize("name", MODELS)
def test_ids_match_llama_cpp(tokenizers: dict[str, Tokenizer], name: str) -> None:
    tok, fixture = tokenizers[name], load_fixture(name)
    mismatches = []
    for case in fixture["cases"]:
        text = case["text"]
        got = {
            "ids": tok.encode(text),
            "ids_add_special": tok.encode(text, add_special=True),
            "ids_no_parse_special": tok.encode(text, parse_special=False),
        }
        for key, ids in got.items():
            if ids != case[key]:
                mismatches.append((text[:40], key, ids[:12], case[key][:12]))
    total = len(fixture["cases"]) * 3
    print(f"\n{name}: {total - len(mismatches)}/{total} id lists match")
    assert not mismatches


@pytest.mark.parametrize("name", MODELS)
def test_vocab_facts_match_llama_cpp(tokenizers: dict[str, Tokenizer], name: str) -> None:
    tok, fixture = tokenizers[name], load_fixture(name)
    assert tok.vocab_size == fixture["vocab_size"]
    assert (tok.bos_id, tok.eos_id) == (fixture["bos_id"], fixture["eos_id"])
    assert (tok.add_bos, tok.add_eos) == (fixture["add_bos"], fixture["add_eos"])
    assert tok.eog_ids == set(fixture["eog_ids"])
    control = {tid for first, last in fixture["control_id_ranges"] for tid in range(first, last + 1)}
    assert {tid for tid in range(tok.vocab_size) if tok.is_control(tid)} == control


@pytest.mark.parametrize("name", MODELS)
def test_decode_matches_llama_cpp_pieces(tokenizers: dict[str, Tokenizer], name: str) -> None:
    tok, fixture = tokenizers[name], load_fixture(name)
    n_roundtrips = 0
    for case in fixture["cases"]:
        ids = case["ids_add_special"]
        assert tok.decode(ids) == case["decoded_add_special"]
        assert tok.decode(ids, skip_special=True) == case["decoded_add_special_skip"]
        if case["roundtrips"]:
            assert tok.decode(tok.encode(case["text"])) == case["text"]
            n_roundtrips += 1
    assert n_roundtrips >= len(fixture["cases"]) - 2


def test_other_pre_tokenizers_match_llama_cpp(metadata: dict[str, dict]) -> None:
    """llama-bpe / qwen2 / gpt-2 / default / gpt-4o regexes: SmolLM2 vocabulary with another
    tokenizer.ggml.pre."""
    fixture = json.loads((FIXTURES / "tokenizer_smollm2_pre_variants.json").read_text(encoding="utf-8"))
    base = {k: v for k, v in metadata["smollm2"].items() if k != "tokenizer.ggml.add_bos_token"}
    for pre, variant in fixture["variants"].items():
        tok = Tokenizer.from_metadata({**base, "tokenizer.ggml.pre": pre})
        assert tok.add_bos == variant["add_bos"], pre
        got = [tok.encode(text, add_special=True) for text in fixture["texts"]]
        n_match = sum(g == e for g, e in zip(got, variant["ids_add_special"], strict=True))
        print(f"\npre={pre}: {n_match}/{len(got)} match")
        assert n_match == len(got), pre


def _complete_prefix(data: bytes) -> str:
    """The text of the longest prefix of data that ends on a character boundary."""
    for cut in range(len(data), max(len(data) - 4, -1), -1):
        try:
            return data[:cut].decode("utf-8")
        except UnicodeDecodeError:
            continue
    raise AssertionError(f"not UTF-8 with an incomplete tail: {data!r}")


@pytest.mark.parametrize("name", MODELS)
def test_stream_decoder_holds_back_partial_characters(tokenizers: dict[str, Tokenizer], name: str) -> None:
    tok = tokenizers[name]
    split_chars_seen = 0
    texts = ("family 👨\u200d👩\u200d👧\u200d👦 🧬🫠 𐍈", "日本語の文章です。한국어 ༺", "emoji 😀👍🏽 🚀!")
    for text in texts:
        ids = tok.encode(text)
        decoder = StreamDecoder(tok)
        streamed = ""
        for i, tid in enumerate(ids):
            streamed += decoder.push(tid)
            # After every token: exactly the complete characters so far, never a replacement character.
            assert streamed == _complete_prefix(tok.decode_bytes(ids[: i + 1]))
            try:
                tok.token_bytes(tid).decode("utf-8")
            except UnicodeDecodeError:
                split_chars_seen += 1
        streamed += decoder.flush()
        assert streamed == tok.decode(ids) == text
    assert split_chars_seen > 0  # the case under test occurred: tokens holding part of a character


def test_stream_decoder_flushes_unfinished_character(tokenizers: dict[str, Tokenizer]) -> None:
    tok = tokenizers["gemma3"]
    # A character Gemma spells with <0xNN> byte tokens (byte fallback).
    rare = next(c for c in "𐍈𓀀𝕏" if all(tok.token_text(t).startswith("<0x") for t in tok.encode(c)))
    byte_ids = tok.encode(rare)
    assert len(byte_ids) == len(rare.encode("utf-8"))
    decoder = StreamDecoder(tok)
    assert [decoder.push(tid) for tid in byte_ids[:-1]] == [""] * (len(byte_ids) - 1)
    assert decoder.flush() == "\ufffd"
    assert decoder.push(tok.encode("a")[0]) == "a"  # reusable after flush
    assert "".join(decoder.push(tid) for tid in byte_ids) == rare


def test_token_bytes(tokenizers: dict[str, Tokenizer]) -> None:
    gemma, smol = tokenizers["gemma3"], tokenizers["smollm2"]
    byte_41 = gemma.encode("<0x41>", parse_special=False)
    assert gemma.token_bytes(gemma._model.id_by_text["<0x41>"]) == b"A"
    assert len(byte_41) > 1  # literal text, not the byte token
    world = smol.encode(" world")
    assert len(world) == 1 and smol.token_bytes(world[0]) == b" world"
    assert smol.token_text(world[0]) == "Ġworld"
    assert gemma.token_bytes(gemma.bos_id) == b"<bos>"
    assert gemma.decode([gemma.bos_id], skip_special=True) == ""
    assert gemma.is_control(gemma.bos_id) and not gemma.is_control(gemma.encode("a")[0])


def test_special_text_parsing(tokenizers: dict[str, Tokenizer]) -> None:
    smol, gemma = tokenizers["smollm2"], tokenizers["gemma3"]
    assert smol.encode("<|im_start|>") == [1]
    assert len(smol.encode("<|im_start|>", parse_special=False)) > 1
    turn = gemma.encode("<start_of_turn>")
    assert len(turn) == 1 and gemma.is_control(turn[0])
    # User-defined tokens split out even without parse_special, as in llama.cpp (Gemma's "\n\n", "  ").
    assert gemma.encode("a\n\nb", parse_special=False) == gemma.encode("a\n\nb")
    assert gemma.token_text(gemma.encode("a  b")[1]) == "  "


def test_spm_sentencepiece_path_equals_llama_port(metadata: dict[str, dict]) -> None:
    md = metadata["gemma3"]
    model = Tokenizer.from_metadata(md)._model
    assert isinstance(model, SpmModel) and model._processor is not None
    scores = [float(s) for s in md["tokenizer.ggml.scores"]]
    rng = random.Random(0)
    alphabet = "abcdefghij ABC 012 éüß 日本語 한국 😀🫠 .,;'\"-_"
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40)))
        expected = spm_tokenize_ref(text.replace(" ", SPACE_ESCAPE), model.id_by_text, scores, model.byte_ids)
        assert model.encode_fragment(text) == expected, text


def test_unsupported_metadata_raises() -> None:
    base = {"tokenizer.ggml.tokens": ["a", "b", "ab"], "tokenizer.ggml.merges": ["a b"]}
    with pytest.raises(TokenizerError, match="t5"):  # unigram (llama.cpp's UGM): not implemented
        Tokenizer.from_metadata({**base, "tokenizer.ggml.model": "t5"})
    with pytest.raises(TokenizerError, match="falcon"):
        Tokenizer.from_metadata({**base, "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "falcon"})
    with pytest.raises(TokenizerError, match="tokenizer.ggml.model"):
        Tokenizer.from_metadata({"tokenizer.ggml.tokens": ["a"]})
    with pytest.raises(TokenizerError, match="merges"):
        Tokenizer.from_metadata({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a"]})
    tiny = Tokenizer.from_metadata({**base, "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt-2"})
    assert tiny.encode("ab") == [2] and tiny.encode("aab") == [0, 2]
    with pytest.raises(TokenizerError, match="outside the vocabulary"):
        tiny.decode([3])
    with pytest.raises(TokenizerError):
        tiny.token_bytes(-1)


@pytest.mark.parametrize("name", MODELS)
def test_encode_speed_benchmark(tokenizers: dict[str, Tokenizer], name: str) -> None:
    """Prints the time to tokenize a ~10,000-token prompt (a benchmark, not a timed assertion)."""
    tok = tokenizers[name]
    cases = load_fixture(name)["cases"]
    paragraph = " ".join(case["text"] for case in cases if case["roundtrips"] and "<" not in case["text"])
    text = paragraph
    while len(tok.encode(text)) < 10_000:
        text += "\n" + paragraph
    start = time.perf_counter()
    ids = tok.encode(text, add_special=True)
    elapsed = time.perf_counter() - start
    print(f"\n{name}: encoded {len(ids)} tokens ({len(text)} chars) in {elapsed * 1000:.1f} ms")
    assert tok.decode(ids, skip_special=True) == text
