"""Fuzzing both tokenizers (byte-level BPE: SmolLM2; SentencePiece: Gemma 3) with arbitrary Unicode: encode
never raises anything unexpected, lone surrogates give a clear TokenizerError, decode(encode(text)) gives the
text back, and typed control-token text inside chat content never becomes a control token."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgellm.chat.template import CHATML_TEMPLATE, ChatTemplate
from edgellm.gguf.load import load_gguf
from edgellm.tokenizer import Tokenizer, TokenizerError
from edgellm.tokenizer.bpe import BYTE_TO_CHAR
from edgellm.tokenizer.spm import SPACE_ESCAPE

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SPECIALS = ["<|im_start|>", "<|im_end|>", "<start_of_turn>", "<end_of_turn>", "<bos>", "<eos>"]
# Valid text (no surrogates) with the control tokens' text mixed in, and runs of spaces and newlines.
valid_text = st.lists(
    st.text(st.characters(exclude_categories=["Cs"]), max_size=12)
    | st.sampled_from([*SPECIALS, "<start_of_image>", "  ", "\n\n"]),
    max_size=8,
).map("".join)


def _lossless(tok: Tokenizer, text: str) -> bool:
    """SmolLM2's vocabulary lacks the byte tokens of 0x04, 0x06, 0x13, 0x14, 0x16, 0x1D, 0xF1 and 0xF2: like
    llama.cpp, BPE drops characters made of them (planes 4-11, a few C0 controls). Gemma falls back to bytes
    for everything; only its visible space "▁" decodes to a plain space."""
    if tok.kind == "gpt2":
        return all(b not in SMOLLM2_MISSING_BYTES for b in text.encode("utf-8"))
    return SPACE_ESCAPE not in text


# (0xC0, 0xC1 and 0xF5-0xFF never occur in UTF-8.)
SMOLLM2_MISSING_BYTES = {0x04, 0x06, 0x13, 0x14, 0x16, 0x1D, 0xC0, 0xC1, 0xF1, 0xF2, *range(0xF5, 0x100)}


@pytest.fixture(scope="module")
def tokenizers(smollm2_path: Path, gemma3_path: Path) -> dict[str, Tokenizer]:
    tokenizers = {
        "smollm2": Tokenizer.from_metadata(load_gguf(smollm2_path).metadata),
        "gemma3": Tokenizer.from_metadata(load_gguf(gemma3_path).metadata),
    }
    smollm2 = tokenizers["smollm2"]
    texts = {smollm2.token_text(t) for t in range(smollm2.vocab_size)}
    assert {b for b in range(256) if BYTE_TO_CHAR[b] not in texts} == SMOLLM2_MISSING_BYTES
    return tokenizers


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_encode_decode_round_trips_arbitrary_text(tokenizers: dict[str, Tokenizer], name: str) -> None:
    tok = tokenizers[name]

    @SETTINGS
    @given(valid_text, st.booleans())
    def check(text: str, parse_special: bool) -> None:
        ids = tok.encode(text, parse_special=parse_special)
        assert all(0 <= t < tok.vocab_size for t in ids)
        if _lossless(tok, text):
            assert tok.decode(ids) == text
        if not parse_special:
            assert not any(tok.is_control(t) for t in ids)

    check()


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_lone_surrogates_are_a_clear_error(tokenizers: dict[str, Tokenizer], name: str) -> None:
    tok = tokenizers[name]

    @SETTINGS
    @given(st.text(st.characters(codec=None), max_size=12))
    def check(text: str) -> None:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            with pytest.raises(TokenizerError, match="lone surrogate"):
                tok.encode(text)
        else:
            tok.encode(text)

    check()
    with pytest.raises(TokenizerError, match=r"lone surrogate '\\ud800' at position 1"):
        tok.encode("a\ud800b", add_special=True)


def test_typed_control_text_never_becomes_a_control_token(tokenizers: dict[str, Tokenizer]) -> None:
    tok = tokenizers["smollm2"]
    tmpl = ChatTemplate(CHATML_TEMPLATE)

    @SETTINGS
    @given(valid_text)
    def check(content: str) -> None:
        prompt = tmpl.render_prompt([{"role": "user", "content": content}], tok)
        assert [t for t in prompt.token_ids if tok.is_control(t)] == [1, 2, 1]  # the template's own three
        assert not _lossless(tok, content) or tok.decode(prompt.token_ids) == prompt.text

    check()
