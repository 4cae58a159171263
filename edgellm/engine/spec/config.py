"""`speculative=` as the user writes it ("ngram", "draft:PATH", or a dict) -> one checked SpeculativeConfig.

Plain values only: the config crosses to the engine core process inside EngineConfig."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

METHODS = ("ngram", "draft")
MAX_SPEC_TOKENS = 16  # drafts per sequence per step at most (each is a query token of the verify forward)


@dataclass
class SpeculativeConfig:
    method: str  # "ngram" (prompt lookup) or "draft" (a smaller GGUF with the same vocabulary)
    num_tokens: int = 8  # k: draft tokens per sequence per step at most (adaptive k grows to it)
    model: str | None = None  # draft: catalog name or .gguf path
    ngram_min: int = 2  # ngram: shortest suffix looked up
    ngram_max: int = 4  # ngram: longest suffix looked up (longer matches are tried first)
    adaptive: bool = True  # per sequence: shrink k, and pause speculation, while drafts are rejected

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"speculative method must be one of {', '.join(METHODS)}, got {self.method!r}")
        if isinstance(self.num_tokens, bool) or not isinstance(self.num_tokens, int):
            raise ValueError(f"speculative num_tokens must be an integer, got {self.num_tokens!r}")
        if not 1 <= self.num_tokens <= MAX_SPEC_TOKENS:
            raise ValueError(f"speculative num_tokens must be in 1..{MAX_SPEC_TOKENS}, got {self.num_tokens}")
        if self.method == "draft" and not self.model:
            raise ValueError("speculative method 'draft' needs a draft model ('model': PATH)")
        if self.method == "ngram" and self.model is not None:
            raise ValueError("speculative method 'ngram' takes no model")
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ValueError(
                f"ngram sizes need 1 <= ngram_min <= ngram_max, got {self.ngram_min}..{self.ngram_max}"
            )
        if self.model is not None:
            self.model = str(self.model)


def parse_speculative(value: Any, num_tokens: int | None = None) -> SpeculativeConfig | None:
    """None/"" -> no speculation; "ngram"; "draft:PATH"; a dict of SpeculativeConfig's fields; or a
    SpeculativeConfig. num_tokens (--num-speculative-tokens) overrides the config's k."""
    if value is None or value == "":
        if num_tokens is not None:
            raise ValueError("--num-speculative-tokens needs --speculative")
        return None
    if isinstance(value, SpeculativeConfig):
        cfg = SpeculativeConfig(**{f.name: getattr(value, f.name) for f in fields(value)})
    elif isinstance(value, str):
        method, _, model = value.partition(":")
        if method == "draft" and not model:
            raise ValueError("speculative 'draft' needs a model: draft:PATH")
        if method != "draft" and model:
            raise ValueError(f"speculative {value!r}: only 'draft' takes a model (draft:PATH)")
        cfg = SpeculativeConfig(method, model=model or None)
    elif isinstance(value, dict):
        known = {f.name for f in fields(SpeculativeConfig)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"unknown speculative option(s) {unknown}; known: {sorted(known)}")
        if "method" not in value:
            raise ValueError("speculative options need a 'method' (ngram or draft)")
        cfg = SpeculativeConfig(**value)
    else:
        raise ValueError(f"speculative must be 'ngram', 'draft:PATH' or a dict, got {type(value).__name__}")
    if num_tokens is not None:
        cfg.num_tokens = num_tokens
        cfg.__post_init__()
    return cfg


def check_draft_model(model: str, target_gguf: Any, target_cfg: Any) -> Any:
    """The draft model's local path, once it is known to load and to share the target's vocabulary
    (every token id must mean the same text in both, or its drafts are noise)."""
    from edgellm.gguf.config import config_from_gguf
    from edgellm.gguf.load import load_gguf
    from edgellm.gguf.validation import validate_model
    from edgellm.models.catalog import resolve_model

    path = resolve_model(model)
    gguf = load_gguf(path)
    cfg = config_from_gguf(gguf)
    validate_model(gguf, cfg)
    key = "tokenizer.ggml.tokens"
    if cfg.n_vocab != target_cfg.n_vocab or gguf.metadata.get(key) != target_gguf.metadata.get(key):
        raise ValueError(
            f"draft model {path.name} has another vocabulary than the target ({cfg.n_vocab} vs "
            f"{target_cfg.n_vocab} tokens, or different token texts): speculative decoding needs the same one"
        )
    return path
