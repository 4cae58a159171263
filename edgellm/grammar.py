"""Grammars for constrained decoding, on llguidance (the Rust grammar engine llama.cpp and vLLM use): a JSON
Schema, a Lark or GBNF grammar, or a regular expression becomes one llguidance grammar string, checked
here, in the front-end, so a grammar that cannot compile is a ValueError naming the problem before the
request reaches the engine core. The core builds one matcher per constrained sequence from that string
and an llguidance tokenizer made from our own vocabulary (`ll_tokenizer`)."""

from __future__ import annotations

import json
import threading
from typing import Any

# JSON as models write it in prose (`{"a": 1, "b": [2, 3]}`): one space after ':' and ',' and no other
# whitespace. llguidance's default (any run of whitespace between tokens) lets a small model fill its
# whole budget with newlines before the closing brace. A schema's own "x-guidance" options override these.
JSON_OPTIONS = {"whitespace_flexible": False, "key_separator": ": ", "item_separator": ", "}
# Grammar sources larger than this are refused (a request body is at most a few MiB anyway).
MAX_GRAMMAR_CHARS = 1 << 20


class GrammarError(ValueError):
    """A grammar, schema or regex that cannot be compiled; the message says what is wrong."""


def compile_grammar(
    json_schema: dict[str, Any] | str | bool | None = None,
    grammar: str | None = None,
    regex: str | None = None,
) -> str | None:
    """The llguidance grammar for at most one of the three, validated; None when none is given.
    `json_schema` is a schema (dict or JSON text); True means any JSON object. `grammar` is Lark (llguidance's
    dialect) or llama.cpp's GBNF."""
    import llguidance as llg

    sources = (("json_schema", json_schema), ("grammar", grammar), ("regex", regex))
    given = [name for name, value in sources if value is not None]
    if not given:
        return None
    if len(given) > 1:
        raise GrammarError(f"give at most one of json_schema, grammar and regex (got {', '.join(given)})")
    try:
        if json_schema is not None:
            schema = {"type": "object"} if json_schema is True else json_schema
            if isinstance(schema, str):
                schema = json.loads(schema)
            if not isinstance(schema, dict):
                raise GrammarError(f"json_schema must be a JSON object, got {type(schema).__name__}")
            text = llg.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
            what = "JSON schema"
        elif grammar is not None:
            _check_source("grammar", grammar)
            text = llg.grammar_from("grammar", grammar)  # Lark, or GBNF converted to Lark
            what = "grammar"
        else:
            _check_source("regex", regex)
            text = llg.LLMatcher.grammar_from_regex(regex)
            what = "regex"
    except GrammarError:
        raise
    except (ValueError, TypeError, RecursionError) as e:
        raise GrammarError(f"invalid {given[0]}: {e}") from None
    error = llg.LLMatcher.validate_grammar(text)
    if error:
        raise GrammarError(f"the {what} does not compile: {error.strip()}")
    return text


def _check_source(name: str, text: Any) -> None:
    if not isinstance(text, str) or not text:
        raise GrammarError(f"{name} must be a non-empty string")
    if len(text) > MAX_GRAMMAR_CHARS:
        raise GrammarError(f"{name} is longer than {MAX_GRAMMAR_CHARS} characters")


_tokenizers: dict[int, Any] = {}
_tokenizers_lock = threading.Lock()


def ll_tokenizer(tok: Any, n_vocab: int | None = None) -> Any:
    """llguidance's tokenizer for our `Tokenizer` (byte-level BPE or SentencePiece alike): every token's
    bytes as we decode them, control tokens (and user-defined ones that look like "<...>") marked special
    with llguidance's 0xFF prefix so grammar text never matches them, and our end-of-generation ids as its
    EOS set, so a finished grammar allows exactly those. Built once per tokenizer (about 1 s for Gemma's
    262k tokens) and padded to the model's `n_vocab` logits."""
    import llguidance as llg

    key = id(tok)
    with _tokenizers_lock:
        cached = _tokenizers.get(key)
        if cached is not None and cached[0] is tok:
            return cached[1]
        pieces = []
        for tid in range(tok.vocab_size):
            piece = tok.token_bytes(tid)
            if tok.is_control(tid) or (tok.is_user_defined(tid) and piece[:1] == b"<" and piece[-1:] == b">"):
                piece = b"\xff" + piece
            pieces.append(piece)
        eos = sorted(tok.eog_ids) or ([tok.eos_id] if tok.eos_id is not None else [])
        if not eos:
            raise GrammarError("the vocabulary has no end-of-generation token: a grammar could never end")
        wrapper = llg.TokenizerWrapper(_Encoder(tok, pieces, eos))
        lltok = llg.LLTokenizer(wrapper, n_vocab=max(n_vocab or 0, tok.vocab_size), eos_token=eos)
        _tokenizers[key] = (tok, lltok)
        return lltok


class _Encoder:
    """What llguidance.TokenizerWrapper reads: the token list, EOS/BOS, and text -> ids (plain text: no BOS,
    no space prefix, no special tokens), used by llguidance for forced text."""

    def __init__(self, tok: Any, pieces: list[bytes], eos: list[int]) -> None:
        self.tok, self.tokens = tok, pieces
        self.eos_token_id, self.bos_token_id = eos[0], tok.bos_id
        self.special_token_ids: list[int] = []

    def __call__(self, text: str | bytes) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return self.tok.encode_fragment(text)
