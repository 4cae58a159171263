"""llguidance's side of a grammar: a checked source compiled to one llguidance grammar string (in a compile
worker, grammar/worker.py, never in a serving process), and the matcher of such a string for our
tokenizer, built by a worker once to check it and by the engine core (engine/guidance.py) for each
constrained sequence. llguidance itself is imported only when one of these runs."""

from __future__ import annotations

import threading
from typing import Any

from edgellm.grammar.limits import GrammarError

# JSON as models write it in prose (`{"a": 1, "b": [2, 3]}`): one space after ':' and ',' and no other
# whitespace. llguidance's default (any run of whitespace between tokens) lets a small model fill its
# whole budget with newlines before the closing brace. A schema's own "x-guidance" options override these.
JSON_OPTIONS = {"whitespace_flexible": False, "key_separator": ": ", "item_separator": ", "}

_WHAT = {"json_schema": "JSON schema", "grammar": "grammar", "regex": "regex"}


def compile_source(kind: str, source: Any) -> str:
    """The validated llguidance grammar for one checked source (`grammar_job`'s). Runs llguidance's
    native compiler: call it in a compile worker, never in a serving process."""
    import llguidance as llg

    try:
        if kind == "json_schema":
            text = llg.LLMatcher.grammar_from_json_schema(source, defaults=JSON_OPTIONS)
        elif kind == "grammar":
            text = llg.grammar_from("grammar", source)  # Lark, or GBNF converted to Lark
        else:
            text = llg.LLMatcher.grammar_from_regex(source)
    except (ValueError, TypeError, RecursionError) as e:
        raise GrammarError(f"invalid {kind}: {e}") from None
    error = llg.LLMatcher.validate_grammar(text)
    if error:
        raise GrammarError(f"the {_WHAT[kind]} does not compile: {error.strip()}")
    return text


_mask_executor: Any = None  # llguidance.LLExecutor of this compile worker


def build_matcher(grammar: str, tokenizer: Any, n_vocab: int, check_first_mask: bool = False) -> Any:
    """The llguidance matcher of `grammar` for our tokenizer, as the engine core uses it. With
    `check_first_mask`, its first mask is computed the way the core computes masks (on an LLExecutor), and
    a grammar that allows no output at all is a GrammarError."""
    import llguidance as llg

    matcher = llg.LLMatcher(ll_tokenizer(tokenizer, n_vocab), grammar, log_level=0)
    if matcher.is_error():
        raise GrammarError(f"the grammar does not compile for this vocabulary: {matcher.get_error()}")
    if check_first_mask:
        import numpy as np
        from llguidance.numpy import fill_next_token_bitmask_par

        global _mask_executor
        if _mask_executor is None:
            _mask_executor = llg.LLExecutor(num_threads=1)  # the engine core's MASK_THREADS
        bitmask = np.zeros((1, (n_vocab + 31) // 32), np.int32)  # [1, n_vocab / 32] bit words
        fill_next_token_bitmask_par(_mask_executor, [(matcher, 0)], bitmask)
        if matcher.is_error() or not bitmask.any():
            why = matcher.get_error().strip().splitlines()[0] if matcher.is_error() else "no token allowed"
            raise GrammarError(f"the grammar matches no output at all (llguidance: {why})")
    return matcher


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
