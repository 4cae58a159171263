"""The tiny tokenizer vocabularies of the synthetic models (testing/synthetic/models.py): a byte-level BPE
vocabulary (llama / qwen files) and a Gemma-style SentencePiece one, each a few hundred tokens."""

from __future__ import annotations

from collections.abc import Iterable

# Token type ids of tokenizer.ggml.token_type.
NORMAL, CONTROL, BYTE = 1, 3, 6

# Common English fragments for the merges / pieces of the tiny vocabularies (the text they cover encodes
# into multi-byte tokens; everything else falls back to single bytes).
# fmt: off
_MERGES = [
    ("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("Ġ", "a"), ("e", "r"), ("o", "n"), ("Ġ", "s"),
    ("r", "e"), ("a", "n"), ("Ġ", "w"), ("o", "r"), ("l", "l"), ("Ġw", "or"), ("Ġwor", "l"),
    ("Ġworl", "d"), ("he", "ll"), ("hell", "o"), ("H", "e"), ("He", "ll"), ("Hell", "o"), ("Ġa", "n"),
    ("Ġan", "d"), ("Ġ", "i"), ("Ġi", "s"), ("Ġ", "c"), ("a", "t"), ("Ġc", "at"), ("in", "g"),
]
_SPM_PIECES = [
    "▁", "▁the", "▁a", "▁and", "▁is", "▁cat", "▁world", "▁hello", "he", "ll", "o", "in", "er", "on",
    "an", "re", "at", "ing", "e", "t", "a", "h", "l", "w", "r", "d", "s", "i", "n", "c", "g", "H",
]
# fmt: on


def gpt2_byte_chars() -> list[str]:
    """GPT-2's printable stand-in character for each byte 0..255 (byte-level BPE alphabet)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    printable += range(ord("®"), ord("ÿ") + 1)
    chars = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def bpe_vocab(specials: Iterable[str]) -> tuple[list[str], list[int], list[str]]:
    """(tokens, token types, merges) of a byte-level BPE vocabulary: specials, the 256 byte symbols, and
    one token per merge result."""
    tokens = list(specials)
    types = [CONTROL] * len(tokens)
    tokens += gpt2_byte_chars()
    types += [NORMAL] * 256
    for left, right in _MERGES:
        tokens.append(left + right)
        types.append(NORMAL)
    return tokens, types, [f"{left} {right}" for left, right in _MERGES]


def spm_vocab() -> tuple[list[str], list[int], list[float]]:
    """(tokens, token types, scores) of a Gemma-style SentencePiece vocabulary: <pad> <eos> <bos> <unk>,
    byte tokens <0x00>..<0xFF>, then pieces whose scores favour longer merges."""
    tokens = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
    types = [CONTROL] * len(tokens)
    scores = [-1000.0] * len(tokens)
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [BYTE] * 256
    scores += [0.0] * 256
    for i, piece in enumerate(_SPM_PIECES):
        tokens.append(piece)
        types.append(NORMAL)
        scores.append(-float(i) if len(piece) > 1 else -100.0 - i)
    return tokens, types, scores
