"""Fill-in-the-middle prompts: the FIM token ids a GGUF names in its metadata, and the prompt llama.cpp's
server builds from them (format_infill in tools/server/utils.hpp), token for token:

    [FIM_REP]myproject\\n [FIM_SEP]file0\\n text0 ... [FIM_SEP]filename\\n     (repo-level extra context)
    [BOS] [FIM_PRE] prefix prompt [FIM_SUF] suffix [FIM_MID]

The extra chunks go before everything, BOS included, as llama.cpp puts them. A model without FIM_REP /
FIM_SEP gets each chunk after a plain-text "--- snippet ---" separator instead. Every piece is tokenized
on its own without BOS and, but for `prompt`, without special-token parsing (llama.cpp's
tokenize(text, false, false); `prompt` it tokenizes with parse_special): code that contains "<|fim_prefix|>"
stays text. Unlike llama.cpp nothing is cut to fit a batch: a prompt longer than
the context is refused by the usual prompt check.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from edgellm.tokenizer.tokenizer import Tokenizer

# Each FIM role's metadata keys, the current one first; files converted before llama.cpp's FIM keys (2024)
# name the first three prefix/suffix/middle.
_KEYS: dict[str, tuple[str, ...]] = {
    "pre": ("tokenizer.ggml.fim_pre_token_id", "tokenizer.ggml.prefix_token_id"),
    "suf": ("tokenizer.ggml.fim_suf_token_id", "tokenizer.ggml.suffix_token_id"),
    "mid": ("tokenizer.ggml.fim_mid_token_id", "tokenizer.ggml.middle_token_id"),
    "rep": ("tokenizer.ggml.fim_rep_token_id",),
    "sep": ("tokenizer.ggml.fim_sep_token_id",),
}
# llama.cpp's separator for extra chunks when the model has no FIM_SEP, and its placeholder names.
SNIPPET_SEPARATOR = "\n\n--- snippet ---\n\n"
REPO_NAME = "myproject"
CURRENT_FILE_NAME = "filename"
DEFAULT_CHUNK_FILE_NAME = "tmp"


class NoFimError(ValueError):
    """The model's metadata names no usable fill-in-the-middle tokens."""


@dataclass(frozen=True)
class FimTokens:
    pre: int
    suf: int
    mid: int
    rep: int | None = None  # repository-name marker (Qwen2.5-Coder's <|repo_name|>)
    sep: int | None = None  # file separator (<|file_sep|>)


def _token_id(metadata: Mapping[str, Any], keys: tuple[str, ...], vocab_size: int) -> int | None:
    for key in keys:
        value = metadata.get(key)
        if value is None:
            continue
        tid = int(value)
        if not 0 <= tid < vocab_size:
            raise NoFimError(f"{key} = {tid} is outside the vocabulary (0..{vocab_size - 1})")
        return tid
    return None


def fim_tokens(metadata: Mapping[str, Any], vocab_size: int) -> FimTokens:
    """The FIM token ids of a GGUF's metadata; NoFimError naming the missing keys when it has none."""
    ids = {role: _token_id(metadata, keys, vocab_size) for role, keys in _KEYS.items()}
    missing = [_KEYS[role][0] for role in ("pre", "suf", "mid") if ids[role] is None]
    if missing:
        raise NoFimError(
            "this model has no fill-in-the-middle tokens: its GGUF metadata lacks "
            + ", ".join(missing)
            + " (older files: tokenizer.ggml.prefix/suffix/middle_token_id)"
        )
    return FimTokens(**ids)  # type: ignore[arg-type]


def _text(tok: Tokenizer, text: str) -> list[int]:
    return tok.encode(text, add_special=False, parse_special=False)


def fim_prompt_ids(
    tok: Tokenizer,
    fim: FimTokens,
    prefix: str,
    suffix: str,
    prompt: str = "",
    extra: Sequence[tuple[str, str]] = (),
) -> list[int]:
    """The PSM prompt for infilling between `prefix` and `suffix` (`prompt`: text already written after
    the prefix), `extra` (filename, text) chunks of other files before it; see the module docstring."""
    extra_ids: list[int] = []
    if fim.rep is not None:
        extra_ids += [fim.rep, *_text(tok, REPO_NAME + "\n")]
    for filename, text in extra:
        if fim.sep is not None:
            extra_ids += [fim.sep, *_text(tok, filename + "\n")]
        else:
            extra_ids += _text(tok, SNIPPET_SEPARATOR)
        extra_ids += _text(tok, text)
    if fim.sep is not None:
        extra_ids += [fim.sep, *_text(tok, CURRENT_FILE_NAME + "\n")]
    bos = [tok.bos_id] if tok.add_bos and tok.bos_id is not None else []
    return [
        *extra_ids,
        *bos,
        fim.pre,
        *_text(tok, prefix),
        *tok.encode(prompt, add_special=False, parse_special=True),  # as llama.cpp tokenizes `prompt`
        fim.suf,
        *_text(tok, suffix),
        fim.mid,
    ]
