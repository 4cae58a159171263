"""Vocabulary facts shared by both tokenizer models: token types, special-token splitting, EOG detection.

Everything here mirrors llama.cpp's llama-vocab.cpp so that token ids match it exactly.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

# GGUF / llama.cpp token types (tokenizer.ggml.token_type).
TYPE_UNDEFINED = 0
TYPE_NORMAL = 1
TYPE_UNKNOWN = 2
TYPE_CONTROL = 3
TYPE_USER_DEFINED = 4
TYPE_UNUSED = 5
TYPE_BYTE = 6

# Texts llama.cpp treats as end-of-generation whatever their declared type (it forces them to CONTROL).
# "</s>" is on llama.cpp's list for PaddleOCR, so Gemma 3's strikethrough tag "</s>" is EOG there too.
EOG_TEXTS = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
})
# End-of-turn candidates (llama.cpp's special_eot_id search); also forced to CONTROL.
EOT_TEXTS = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>", "<EOT>",
    "_<EOT>", "<｜end▁of▁sentence｜>", "<end_of_utterance>",
})
# FIM pad / repo / file-separator tokens: llama.cpp adds these to the EOG set too.
FIM_EOG_TEXTS = frozenset({
    "<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>",
    "<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>",
    "<|file_sep|>",
})
_FORCED_CONTROL_TEXTS = EOG_TEXTS | EOT_TEXTS | FIM_EOG_TEXTS
# Metadata keys whose token ids llama.cpp adds to the EOG set.
EOG_ID_KEYS = (
    "tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id",
    "tokenizer.ggml.fim_pad_token_id", "tokenizer.ggml.fim_rep_token_id", "tokenizer.ggml.fim_sep_token_id",
)


class TokenizerError(ValueError):
    """Raised for metadata we cannot build a tokenizer from, or ids outside the vocabulary."""


class TextTooLongError(TokenizerError):
    """Text that cannot encode to at most `max_tokens` ids, told by its size before any work is done:
    it is at least `num_tokens` tokens (Tokenizer.min_tokens)."""

    def __init__(self, num_tokens: int, max_tokens: int) -> None:
        self.num_tokens, self.max_tokens = num_tokens, max_tokens
        super().__init__(f"text of at least {num_tokens} tokens; at most {max_tokens} allowed")


def find_eog_ids(tokens: Sequence[str], token_types: np.ndarray, metadata: Mapping[str, Any]) -> set[int]:
    """End-of-generation ids as llama.cpp computes them; updates token_types in place like llama.cpp does
    (EOG/EOT/FIM-looking tokens become CONTROL, its model-specific exceptions are undone)."""
    eog: set[int] = set()
    for key in EOG_ID_KEYS:
        tid = metadata.get(key)
        if tid is not None and 0 <= int(tid) < len(tokens):
            eog.add(int(tid))
    eog_id_by_text: dict[str, int] = {}
    for tid, text in enumerate(tokens):
        if text in _FORCED_CONTROL_TEXTS:
            if text in EOG_TEXTS or text in FIM_EOG_TEXTS:
                eog.add(tid)
                eog_id_by_text[text] = tid
            token_types[tid] = TYPE_CONTROL
    # gpt-oss renders these as text: llama.cpp makes them user-defined.
    for tid, text in enumerate(tokens):
        if text in ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"):
            token_types[tid] = TYPE_USER_DEFINED
    # o200k_harmony / solar-open: "<|end|>" is not EOG when the return/call (or call/flush) tokens are.
    has_call = "<|call|>" in eog_id_by_text or "<|calls|>" in eog_id_by_text
    if "<|end|>" in eog_id_by_text and has_call and (
        "<|return|>" in eog_id_by_text or "<|flush|>" in eog_id_by_text
    ):
        end_id = eog_id_by_text["<|end|>"]
        eog.discard(end_id)
        token_types[end_id] = TYPE_USER_DEFINED
    # Gemma 4: "</s>" is plain text when "<|tool_response>" exists.
    if "<|tool_response>" in eog_id_by_text and "</s>" in eog_id_by_text:
        s_id = eog_id_by_text["</s>"]
        eog.discard(s_id)
        token_types[s_id] = TYPE_NORMAL
    return eog


class SpecialSplitter:
    """Splits text on special-token text exactly like llama.cpp's tokenizer_st_partition.

    llama.cpp walks its special tokens longest-first and, for each, cuts every occurrence out of the
    remaining raw fragments. Scanning thousands of specials (Gemma has ~6,400) per call would be slow, so
    we first collect the specials that occur anywhere in the text with a prefix-set walk from each position
    whose character can start one, then run llama.cpp's algorithm on those candidates only. Any special that
    llama.cpp would cut out occurs in the text, so the candidate set loses nothing.
    """

    def __init__(self, specials: list[tuple[int, str]], control_ids: set[int]) -> None:
        self._id_by_text: dict[str, int] = {}
        for tid, text in specials:
            if text:
                self._id_by_text.setdefault(text, tid)
        self._length_by_id = {tid: len(text) for text, tid in self._id_by_text.items()}
        self._text_by_id = {tid: text for text, tid in self._id_by_text.items()}
        self._control_ids = control_ids
        # Every proper prefix (length >= 2) of a special text: lets the scan stop after a character or two.
        self._prefixes: set[str] = set()
        for text in self._id_by_text:
            for end in range(2, len(text)):
                self._prefixes.add(text[:end])
        first_chars = sorted({text[0] for text in self._id_by_text})
        char_class = "[" + "".join(re.escape(c) for c in first_chars) + "]"
        self._start_re = re.compile(char_class) if first_chars else None

    def _candidates(self, text: str, parse_special: bool) -> list[int]:
        found: set[int] = set()
        id_by_text, prefixes = self._id_by_text, self._prefixes
        for match in self._start_re.finditer(text):
            start = match.start()
            end = start + 1
            while end <= len(text):
                piece = text[start:end]
                tid = id_by_text.get(piece)
                if tid is not None:
                    found.add(tid)
                if piece not in prefixes and end - start >= 2:
                    break
                end += 1
        if not parse_special:
            # Control and unknown tokens are plain text when parse_special is false; user-defined still split.
            found -= self._control_ids
        # Longest first; llama.cpp's sort is unstable on ties, ids give a fixed order.
        return sorted(found, key=lambda tid: (-self._length_by_id[tid], tid))

    def parse_special_only_texts(self, text: str) -> list[str]:
        """Texts of the specials in `text` that only parse_special=True cuts out, longest first."""
        if not text or self._start_re is None:
            return []
        found = [tid for tid in self._candidates(text, True) if tid in self._control_ids]
        return [self._text_by_id[tid] for tid in found]

    def split(self, text: str, parse_special: bool) -> list[str | int]:
        """Returns the text as a list of raw-text fragments (str) and special token ids (int)."""
        if not text:
            return []
        if self._start_re is None:
            return [text]
        candidates = self._candidates(text, parse_special)
        fragments: list[str | int] = [text]
        for tid in candidates:
            special_text = self._text_by_id[tid]
            if not any(isinstance(f, str) and special_text in f for f in fragments):
                continue
            out: list[str | int] = []
            for fragment in fragments:
                if isinstance(fragment, int) or special_text not in fragment:
                    out.append(fragment)
                    continue
                pieces = fragment.split(special_text)
                for i, piece in enumerate(pieces):
                    if i:
                        out.append(tid)
                    if piece:
                        out.append(piece)
            fragments = out
        return fragments
