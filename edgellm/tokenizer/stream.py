"""Incremental detokenization that never emits half a UTF-8 character."""

from __future__ import annotations

import codecs

from edgellm.tokenizer.tokenizer import Tokenizer


class StreamDecoder:
    """Turns a stream of token ids into text pieces as they become complete UTF-8.

    A character can be spread over several byte tokens (emoji, CJK with byte fallback); the incremental
    UTF-8 decoder holds back an incomplete tail until its last byte arrives, and replaces bytes that can
    never form a character with U+FFFD, exactly as a one-shot decode of all the bytes would.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = False) -> None:
        self._tokenizer = tokenizer
        self._skip_special = skip_special
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, tid: int) -> str:
        """Adds one token; returns the text it completes (possibly empty)."""
        return self._decoder.decode(self._tokenizer.piece(tid, self._skip_special))

    def flush(self) -> str:
        """Ends the stream: an unfinished trailing sequence comes out as U+FFFD. The decoder is reusable."""
        text = self._decoder.decode(b"", final=True)
        self._decoder.reset()
        return text
