"""WordPiece ('bert' tokenizer.ggml.model), as llama.cpp's llm_tokenizer_wpm_session runs it.

Text is normalised (NFD and accent marks dropped when strip_accents; lowercased when lowercase: both from
tokenizer.ggml.normalizer.*, default on), split on whitespace, and every punctuation mark, ASCII symbol and
CJK ideograph becomes a word of its own; control characters, U+0000 and U+FFFD are dropped. Each word gets
the phantom-space prefix "▁" and is covered greedily by the longest vocabulary entries from the left; a
word with a position no entry covers becomes one [UNK]. The whole input is [CLS] ... [SEP] with
add_special (Tokenizer.encode).
"""

from __future__ import annotations

import unicodedata

from edgellm.tokenizer.vocab import TokenizerError

PHANTOM_SPACE = "\u2581"
# llama.cpp's unicode whitespace table (scripts/gen-unicode-data.py: Unicode's White_Space property)
WHITESPACE = frozenset(
    [
        *range(0x09, 0x0E),
        *range(0x2000, 0x200B),
        0x20,
        0x85,
        0xA0,
        0x1680,
        0x2028,
        0x2029,
        0x202F,
        0x205F,
        0x3000,
    ]
)
CONTROL_CATEGORIES = frozenset({"Cc", "Cf", "Co", "Cs"})  # llama.cpp's CODEPOINT_FLAG_CONTROL


def is_chinese_char(cp: int) -> bool:
    """llama.cpp's is_chinese_char (HF's ranges, 0x2B920 as the Rust code has it)."""
    return (
        0x4E00 <= cp <= 0x9FFF
        or 0x3400 <= cp <= 0x4DBF
        or 0x20000 <= cp <= 0x2A6DF
        or 0x2A700 <= cp <= 0x2B73F
        or 0x2B740 <= cp <= 0x2B81F
        or 0x2B920 <= cp <= 0x2CEAF
        or 0xF900 <= cp <= 0xFAFF
        or 0x2F800 <= cp <= 0x2FA1F
    )


def _lower(ch: str) -> str:
    """One code point lowered as llama.cpp's unicode_tolower (a simple one-to-one mapping)."""
    low = ch.lower()
    return low[0] if low else ch


def split_words(text: str, lowercase: bool, strip_accents: bool) -> list[str]:
    """llm_tokenizer_wpm_session::preprocess: the normalised words of `text`, in order."""
    if strip_accents:
        text = unicodedata.normalize("NFD", text)
    words: list[str] = []
    word: list[str] = []
    for ch in text:
        cp = ord(ch)
        if cp in WHITESPACE:
            if word:
                words.append("".join(word))
                word = []
            continue
        cat = unicodedata.category(ch)
        if cp == 0 or cp == 0xFFFD or cat in CONTROL_CATEGORIES:
            continue
        if strip_accents and cat[0] == "M":
            continue
        s = _lower(ch) if lowercase else ch
        if cat[0] == "P" or (cp < 0x7F and cat[0] == "S") or is_chinese_char(cp):
            if word:
                words.append("".join(word))
                word = []
            words.append(s)
        else:
            word.append(s)
    if word:
        words.append("".join(word))
    return words


class WpmModel:
    def __init__(self, tokens: list[str], unknown_id: int, lowercase: bool, strip_accents: bool) -> None:
        self._ids = {t.encode("utf-8"): i for i, t in enumerate(tokens)}
        if len(self._ids) != len(tokens):  # llama.cpp asserts id_to_token.size() == token_to_id.size()
            raise TokenizerError(f"the vocabulary has {len(tokens) - len(self._ids)} duplicate token texts")
        self._tokens = tokens
        self.max_token_len = max(len(t) for t in self._ids)  # bytes, as llama.cpp's max_token_len
        self.unknown_id, self.lowercase, self.strip_accents = unknown_id, lowercase, strip_accents

    def encode_fragment(self, text: str) -> list[int]:
        out: list[int] = []
        for word in split_words(text, self.lowercase, self.strip_accents):
            w = (PHANTOM_SPACE + word).encode("utf-8")
            n, start, i = len(w), len(out), 0
            while i < n:  # the longest entry at i, then on from its end
                for j in range(min(n, i + self.max_token_len + 1), i, -1):
                    tid = self._ids.get(w[i:j])
                    if tid is not None:
                        out.append(tid)
                        i = j
                        break
                else:  # a position no entry covers: the whole word is one [UNK]
                    del out[start:]
                    break
            if len(out) == start:
                out.append(self.unknown_id)
        return out

    def piece_bytes(self, tid: int) -> bytes:
        """llama.cpp token_to_piece for a NORMAL token: the phantom space shown as a space."""
        return self._tokens[tid].replace(PHANTOM_SPACE, " ").encode("utf-8")
