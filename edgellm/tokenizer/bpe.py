"""Byte-level BPE ('gpt2' model: SmolLM2, Llama 3, Qwen 2/3) with llama.cpp's pre-tokenizer regexes.

llama.cpp splits each raw fragment with a list of regexes applied in turn (every regex re-splits the pieces
of the previous one, unmatched spans kept as pieces), maps the bytes of each piece to GPT-2's printable
byte alphabet and runs rank-ordered BPE merges (lowest rank first, ties leftmost). HF `tokenizers` does the
same with a Sequence of isolated Splits, a ByteLevel step without its own regex and a BPE model, so we hand
it the GGUF vocabulary and merges.
"""

from __future__ import annotations

from collections.abc import Sequence

from edgellm.tokenizer.vocab import TokenizerError

# Regexes copied from llama.cpp's llm_tokenizer_bpe (src/llama-vocab.cpp), by pre-tokenizer family.
_GPT2_WORDS = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_LLAMA3 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
# Qwen 3.5: Qwen 2's with combining marks (\p{M}) part of a word, not of a punctuation run
_QWEN35 = (
    _CONTRACTIONS
    + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# GPT-4o / o200k (gpt-oss, Llama 4): llama.cpp's form of tokenizer.json's regex (LLAMA_VOCAB_PRE_TYPE_GPT4O),
# which spells the case runs [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]* / [\p{Ll}\p{Lm}\p{Lo}\p{M}]+ as "letters
# other than a-z" / "other than A-Z": a non-ASCII letter fits either run there, so it is split as there.
_GPT4O_UPPER = r"((?=[\p{L}])([^a-z]))"
_GPT4O_LOWER = r"((?=[\p{L}])([^A-Z]))"
_GPT4O = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_GPT4O_UPPER}*{_GPT4O_LOWER}+{_CONTRACTIONS}?"
    rf"|[^\r\n\p{{L}}\p{{N}}]?{_GPT4O_UPPER}+{_GPT4O_LOWER}*{_CONTRACTIONS}?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

PRE_TOKENIZER_REGEXES: dict[str, tuple[str, ...]] = {
    "default": (r"[\p{P}\$\+<=>\^~\|]+", _GPT2_WORDS, r"\p{N}+", r"[0-9][0-9][0-9]"),
    "llama3": (_LLAMA3,),
    "gpt2": (_GPT2_WORDS,),
    "qwen2": (_QWEN2,),
    "qwen35": (_QWEN35,),
    "smollm": (r"\p{N}", _GPT2_WORDS),
    "gpt4o": (_GPT4O,),
}
# tokenizer.ggml.pre value -> (regex family, ignore_merges, add_bos default), as llama.cpp maps them.
PRE_TYPES: dict[str, tuple[str, bool, bool]] = {
    "default": ("default", False, False),
    "llama3": ("llama3", True, True),
    "llama-v3": ("llama3", True, True),
    "llama-bpe": ("llama3", True, True),
    "falcon3": ("llama3", True, True),
    "pixtral": ("llama3", True, True),
    "lfm2": ("llama3", True, True),
    "gpt-2": ("gpt2", False, False),
    "phi-2": ("gpt2", False, False),
    "qwen2": ("qwen2", False, False),
    "deepseek-r1-qwen": ("qwen2", False, False),
    "qwen35": ("qwen35", False, False),
    "smollm": ("smollm", False, False),
    "starcoder": ("smollm", False, False),
    "refact": ("smollm", False, False),
    "codeshell": ("smollm", False, False),
    "gpt-4o": ("gpt4o", False, False),
    "llama4": ("gpt4o", False, False),
}


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable characters."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {byte: chr(char) for byte, char in zip(printable, chars, strict=True)}


# Fragments at least this long are encoded with the GIL released (encode_batch costs ~13 us more a call).
_RELEASE_GIL_CHARS = 1024

BYTE_TO_CHAR = _bytes_to_unicode()
CHAR_TO_BYTE = {char: byte for byte, char in BYTE_TO_CHAR.items()}


def byte_level_decode(text: str) -> bytes:
    """llama.cpp's llama_decode_text: byte-level characters back to raw bytes."""
    out = bytearray()
    for char in text:
        byte = CHAR_TO_BYTE.get(char)
        if byte is None:
            # llama.cpp prints characters outside the byte alphabet this way instead of failing.
            out += f"[UNK_BYTE_0x{char.encode('utf-8').hex()}{text}]".encode()
        else:
            out.append(byte)
    return bytes(out)


class BpeModel:
    """Encodes raw-text fragments (special tokens already split out) into ids, llama.cpp's BPE way."""

    def __init__(self, tokens: Sequence[str], merges: Sequence[str], pre: str) -> None:
        if pre not in PRE_TYPES:
            raise TokenizerError(
                f"unsupported tokenizer.ggml.pre '{pre}' for gpt2 tokenizer (supported: {sorted(PRE_TYPES)})"
            )
        family, self.ignore_merges, self.default_add_bos = PRE_TYPES[pre]
        from tokenizers import Regex, Tokenizer, models, pre_tokenizers

        self._tokens = tokens
        vocab: dict[str, int] = {}
        for tid, text in enumerate(tokens):
            vocab.setdefault(text, tid)
        merge_pairs: list[tuple[str, str]] = []
        for merge in merges:
            # llama.cpp splits at the first space after position 0 (a merge may start with a space char).
            cut = merge.find(" ", 1)
            if cut < 0:
                continue
            left, right = merge[:cut], merge[cut + 1 :]
            # HF rejects merges whose parts are not tokens; llama.cpp could never use such a merge's
            # result as an id either, so dropping them only matters for broken vocabularies.
            if left in vocab and right in vocab and left + right in vocab:
                merge_pairs.append((left, right))
        model = models.BPE(vocab=vocab, merges=merge_pairs, ignore_merges=self.ignore_merges)
        self._hf = Tokenizer(model)
        splits = [
            pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False)
            for regex in PRE_TOKENIZER_REGEXES[family]
        ]
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        self._hf.pre_tokenizer = pre_tokenizers.Sequence([*splits, byte_level])

    def encode_fragment(self, text: str) -> list[int]:
        if not text:
            return []
        if len(text) >= _RELEASE_GIL_CHARS:
            # encode_batch runs without the GIL (encode holds it throughout: ~3 s for 3.4 MB, during
            # which no other thread of the process, e.g. a server's event loop, runs). Same ids.
            return self._hf.encode_batch([text], add_special_tokens=False)[0].ids
        return self._hf.encode(text, add_special_tokens=False).ids

    def piece_bytes(self, tid: int) -> bytes:
        """llama.cpp token_to_piece for a NORMAL token."""
        return byte_level_decode(self._tokens[tid])
