"""Tokenizers built from GGUF metadata with token ids identical to llama.cpp's."""

from edgellm.tokenizer.stream import StreamDecoder
from edgellm.tokenizer.tokenizer import Tokenizer
from edgellm.tokenizer.vocab import TextTooLongError, TokenizerError

__all__ = ["StreamDecoder", "TextTooLongError", "Tokenizer", "TokenizerError"]
