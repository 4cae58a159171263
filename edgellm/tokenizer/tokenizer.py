"""Tokenizer built from GGUF metadata, producing the same ids as llama.cpp's llama_tokenize."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from edgellm.tokenizer.bpe import BpeModel
from edgellm.tokenizer.spm import SpmModel
from edgellm.tokenizer.vocab import (
    TYPE_BYTE,
    TYPE_CONTROL,
    TYPE_NORMAL,
    TYPE_UNKNOWN,
    TYPE_USER_DEFINED,
    SpecialSplitter,
    TextTooLongError,
    TokenizerError,
    find_eog_ids,
)
from edgellm.tokenizer.wpm import WpmModel

# Token types whose piece is their raw text (llama.cpp's token_to_piece with special=true).
_RAW_TEXT_TYPES = (TYPE_CONTROL, TYPE_UNKNOWN, TYPE_USER_DEFINED)
# Token types dropped when decoding with skip_special (llama.cpp's special=false).
_SKIPPABLE_TYPES = (TYPE_CONTROL, TYPE_UNKNOWN)


def _optional_int(metadata: Mapping[str, Any], key: str, default: int | None) -> int | None:
    value = metadata.get(key)
    return default if value is None else int(value)


def _optional_bool(metadata: Mapping[str, Any], key: str, default: bool) -> bool:
    value = metadata.get(key)
    return default if value is None else bool(value)


class Tokenizer:
    """Text <-> token ids for a GGUF model ('llama' SentencePiece-style or 'gpt2' byte-level BPE)."""

    def __init__(
        self,
        kind: str,
        tokens: list[str],
        token_types: np.ndarray,
        model: SpmModel | BpeModel | WpmModel,
        bos_id: int | None,
        eos_id: int | None,
        eog_ids: set[int],
        add_bos: bool,
        add_eos: bool,
        add_space_prefix: bool,
        sep_id: int | None = None,
    ) -> None:
        self.kind = kind
        # WordPiece ('bert'): [CLS] text [SEP] with add_special, whatever add_bos says (llama.cpp's WPM)
        self.sep_id = sep_id
        self.add_sep = kind == "bert"  # llama_vocab_get_add_sep: a rerank prompt's query-document separator
        self._tokens = tokens
        self._types = token_types.tolist()
        self._model = model
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.eog_ids = eog_ids
        self.add_bos = add_bos
        self.add_eos = add_eos
        self.add_space_prefix = add_space_prefix
        self.vocab_size = len(tokens)
        specials = [(tid, tokens[tid]) for tid, t in enumerate(self._types) if t in _RAW_TEXT_TYPES]
        skippable = {tid for tid, t in enumerate(self._types) if t in _SKIPPABLE_TYPES}
        self._splitter = SpecialSplitter(specials, skippable)
        self._pieces: list[bytes | None] = [None] * len(tokens)
        self._max_token_bytes: int | None = None

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any]) -> Tokenizer:
        model_name = metadata.get("tokenizer.ggml.model")
        if model_name is None:
            raise TokenizerError("GGUF metadata has no tokenizer.ggml.model")
        tokens = metadata.get("tokenizer.ggml.tokens")
        if not tokens:
            raise TokenizerError("GGUF metadata has no tokenizer.ggml.tokens")
        tokens = list(tokens)
        raw_types = metadata.get("tokenizer.ggml.token_type")
        # llama.cpp treats every token as NORMAL when the types array is missing.
        if raw_types is None:
            types = np.full(len(tokens), TYPE_NORMAL, np.int32)
        else:
            types = np.array(raw_types, np.int32)
        if len(types) != len(tokens):
            raise TokenizerError("tokenizer.ggml.token_type and tokenizer.ggml.tokens differ in length")
        # Defaults are llama.cpp's for each model when the metadata does not say.
        if model_name == "llama":
            scores = metadata.get("tokenizer.ggml.scores")
            scores = np.zeros(len(tokens), np.float32) if scores is None else np.asarray(scores, np.float32)
            unknown_id = _optional_int(metadata, "tokenizer.ggml.unknown_token_id", 0)
            model: SpmModel | BpeModel = SpmModel(tokens, scores, types, unknown_id)
            bos, eos, add_bos, add_space_prefix = 1, 2, True, True
        elif model_name == "gpt2":
            merges = metadata.get("tokenizer.ggml.merges")
            if merges is None:
                raise TokenizerError("gpt2 tokenizer without tokenizer.ggml.merges")
            pre = metadata.get("tokenizer.ggml.pre") or "default"
            model = BpeModel(tokens, merges, str(pre))
            bos, eos, add_bos, add_space_prefix = 11, 11, model.default_add_bos, False
        elif model_name == "bert":  # llama.cpp's WPM defaults: [CLS] 101, [UNK] 100, [SEP] 102, no EOS
            lowercase = _optional_bool(metadata, "tokenizer.ggml.normalizer.lowercase", True)
            strip = _optional_bool(metadata, "tokenizer.ggml.normalizer.strip_accents", lowercase)
            unknown_id = _optional_int(metadata, "tokenizer.ggml.unknown_token_id", 100)
            model = WpmModel(tokens, unknown_id if unknown_id is not None else 100, lowercase, strip)
            bos, eos, add_bos, add_space_prefix = 101, None, True, False
        else:
            raise TokenizerError(
                f"unsupported tokenizer.ggml.model '{model_name}' (supported: llama, gpt2, bert)"
            )
        bos_id = _optional_int(metadata, "tokenizer.ggml.bos_token_id", bos)
        eos_id = _optional_int(metadata, "tokenizer.ggml.eos_token_id", eos)
        metadata_with_eos = {**metadata, "tokenizer.ggml.eos_token_id": eos_id}
        eog_ids = find_eog_ids(tokens, types, metadata_with_eos)  # also forces EOG tokens to CONTROL
        return cls(
            kind=model_name,
            tokens=tokens,
            token_types=types,
            model=model,
            bos_id=bos_id,
            eos_id=eos_id,
            eog_ids=eog_ids,
            add_bos=_optional_bool(metadata, "tokenizer.ggml.add_bos_token", add_bos),
            add_eos=_optional_bool(metadata, "tokenizer.ggml.add_eos_token", False),
            add_space_prefix=_optional_bool(metadata, "tokenizer.ggml.add_space_prefix", add_space_prefix),
            sep_id=_optional_int(metadata, "tokenizer.ggml.seperator_token_id", 102)
            if model_name == "bert"
            else None,
        )

    @property
    def max_token_bytes(self) -> int:
        """The longest piece any token stands for, in bytes (at least 1); found once."""
        if self._max_token_bytes is None:
            self._max_token_bytes = max(1, *(len(self.token_bytes(t)) for t in range(self.vocab_size)))
        return self._max_token_bytes

    def min_tokens(self, text: str, add_special: bool = False) -> int:
        """A lower bound on len(encode(text, add_special)) from the text's size alone, in time linear in
        its length but with no tokenizing: every token stands for at most max_token_bytes of it (a text
        is the concatenation of its tokens' pieces, plus a space prefix or BOS/EOS, which only add)."""
        size = len(text.encode("utf-8", "surrogatepass"))
        specials = int(add_special and self.add_bos) + int(add_special and self.add_eos)
        if self.kind == "bert":  # accent stripping drops characters: the text's size bounds nothing
            return 2 * int(add_special)
        return -(-size // self.max_token_bytes) + specials

    def encode(
        self,
        text: str,
        add_special: bool = False,
        parse_special: bool = True,
        literal: Mapping[str, str] | None = None,
        max_tokens: int | None = None,
    ) -> list[int]:
        """Token ids for text, as llama_tokenize(text, add_special, parse_special).

        `literal` maps placeholder strings to texts put back into the raw fragments after special tokens
        are split out: their text merges with its neighbours as plain text and never becomes a special
        token (chat message content; see chat_template.ChatTemplate.render_prompt).
        `max_tokens`: text that is surely longer (min_tokens) raises TextTooLongError before any work
        proportional to it (a prompt that cannot fit the context); shorter text is encoded in full."""
        if not isinstance(text, str):
            raise TokenizerError(f"expected text (str) to tokenize, got {type(text).__name__}")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise TokenizerError(
                f"text is not valid Unicode: lone surrogate {text[e.start]!r} at position {e.start}"
            ) from None
        if max_tokens is not None:
            final = text
            for placeholder, original in (literal or {}).items():
                final = final.replace(placeholder, original)
            least = self.min_tokens(final, add_special)
            if least > max_tokens:
                raise TextTooLongError(least, max_tokens)
        output: list[int] = []
        if add_special and (self.add_bos or self.kind == "bert"):
            if self.bos_id is None:
                raise TokenizerError("add_bos is set but the vocabulary has no BOS token")
            output.append(self.bos_id)
        is_prev_special = True  # SPM prefixes a space to the first fragment and to any after a special token
        for fragment in self._splitter.split(text, parse_special):
            if isinstance(fragment, int):
                output.append(fragment)
                is_prev_special = True
                continue
            if literal:
                for placeholder, original in literal.items():
                    fragment = fragment.replace(placeholder, original)
            if self.kind == "llama" and self.add_space_prefix and is_prev_special:
                fragment = " " + fragment
            output.extend(self._model.encode_fragment(fragment))
            is_prev_special = False
        if add_special and self.kind == "bert":
            if self.sep_id is None:
                raise TokenizerError("a WordPiece vocabulary needs a [SEP] token to add")
            output.append(self.sep_id)
        elif add_special and self.add_eos:
            if self.eos_id is None:
                raise TokenizerError("add_eos is set but the vocabulary has no EOS token")
            output.append(self.eos_id)
        return output

    def encode_fragment(self, text: str) -> list[int]:
        """Ids for plain text: no BOS, no space prefix, special-token text not parsed (decode gives the text
        back; what a grammar engine needs to tokenize text it forces)."""
        return self._model.encode_fragment(text)

    def control_texts_in(self, text: str) -> list[str]:
        """Texts of the special tokens that occur in `text` and are parsed only with parse_special
        (control and unknown tokens), longest first."""
        return self._splitter.parse_special_only_texts(text)

    def _check_id(self, tid: int) -> None:
        if not 0 <= tid < self.vocab_size:
            raise TokenizerError(f"token id {tid} outside the vocabulary (size {self.vocab_size})")

    def token_bytes(self, tid: int) -> bytes:
        """Raw bytes of a token's piece (llama.cpp token_to_piece with special=true)."""
        self._check_id(tid)
        piece = self._pieces[tid]
        if piece is None:
            token_type = self._types[tid]
            if token_type in _RAW_TEXT_TYPES:
                piece = self._tokens[tid].encode("utf-8")
            elif token_type == TYPE_NORMAL or (token_type == TYPE_BYTE and self.kind == "llama"):
                if isinstance(self._model, SpmModel):
                    piece = self._model.piece_bytes(tid, token_type)
                else:
                    piece = self._model.piece_bytes(tid)
            else:
                piece = b""  # unused / undefined tokens render as nothing in llama.cpp
            self._pieces[tid] = piece
        return piece

    def piece(self, tid: int, skip_special: bool = False) -> bytes:
        """Bytes one token contributes to decoded text; empty for control/unknown tokens when skipping."""
        if skip_special:
            self._check_id(tid)
            if self._types[tid] in _SKIPPABLE_TYPES:
                return b""
        return self.token_bytes(tid)

    def decode_bytes(self, ids: Iterable[int], skip_special: bool = False) -> bytes:
        return b"".join(self.piece(int(tid), skip_special) for tid in ids)

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        """Concatenated pieces as text; invalid UTF-8 (e.g. a cut-off byte sequence) becomes U+FFFD."""
        return self.decode_bytes(ids, skip_special).decode("utf-8", errors="replace")

    def is_control(self, tid: int) -> bool:
        self._check_id(tid)
        return self._types[tid] == TYPE_CONTROL

    def is_user_defined(self, tid: int) -> bool:
        self._check_id(tid)
        return self._types[tid] == TYPE_USER_DEFINED

    def is_eog(self, tid: int) -> bool:
        return tid in self.eog_ids

    def token_text(self, tid: int) -> str:
        """The vocabulary entry as stored in the GGUF (e.g. '▁world', 'Ġworld', '<0x0A>')."""
        self._check_id(tid)
        return self._tokens[tid]
