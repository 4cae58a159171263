"""Server-wide sampling defaults: `edgellm serve --temperature 0.7 --top-k 40 ...` (llama-server's
`--temp`/`--top-k`, Ollama's Modelfile PARAMETERs) apply to every request that does not set the field
itself, on every API (each is translated to the chat body `protocol._common` reads). The presets file of
`serve --models` sets them per model through the same flags."""

from __future__ import annotations

import argparse
from typing import Any

from edgellm.sampling.sampler import MAX_SEED, SamplingParams

# flag -> (SamplingParams field, type). One table: the parser, the presets file and the check read it.
SAMPLING_DEFAULT_FLAGS: dict[str, tuple[str, type]] = {
    "--temperature": ("temperature", float),
    "--top-p": ("top_p", float),
    "--top-k": ("top_k", int),
    "--min-p": ("min_p", float),
    "--repeat-penalty": ("repetition_penalty", float),
    "--presence-penalty": ("presence_penalty", float),
    "--frequency-penalty": ("frequency_penalty", float),
    "--seed": ("seed", int),
}


def add_sampling_default_args(p: argparse.ArgumentParser) -> None:
    for flag, (field, kind) in SAMPLING_DEFAULT_FLAGS.items():
        p.add_argument(
            flag,
            dest=f"default_{field}",
            type=kind,
            default=None,
            metavar=kind.__name__.upper(),
            help=f"default {field} for requests that do not set it",
        )


def sampling_default_flags(args: argparse.Namespace) -> list[str]:
    """The flags given, as they were: `serve --models` passes them on to every model's server."""
    given = ((flag, getattr(args, f"default_{f}", None)) for flag, (f, _) in SAMPLING_DEFAULT_FLAGS.items())
    return [f"{flag}={value}" for flag, value in given if value is not None]


def sampling_defaults(args: argparse.Namespace) -> dict[str, Any]:
    """The flags given, as SamplingParams fields; top_k -1 means off, as a request's does, and seed -1 a
    random seed per request, as llama-server's does."""
    out = {}
    for field, _ in SAMPLING_DEFAULT_FLAGS.values():
        value = getattr(args, f"default_{field}", None)
        if value is None or (field == "seed" and value == -1):
            continue
        out[field] = max(value, 0) if field == "top_k" else value
    return out


def check_sampling_defaults(defaults: dict[str, Any]) -> None:
    """A default out of SamplingParams' bounds is an error at start, naming the flag."""
    flag_of = {field: flag for flag, (field, _) in SAMPLING_DEFAULT_FLAGS.items()}
    for field, value in defaults.items():
        if field not in flag_of:
            raise ValueError(f"unknown sampling default {field!r} (known: {', '.join(flag_of)})")
        if field == "seed" and not 0 <= value <= MAX_SEED:
            raise ValueError(f"--seed {value}: must be -1 (random) or in 0..{MAX_SEED}")
        try:
            SamplingParams(**{field: value})
        except (TypeError, ValueError) as e:
            raise ValueError(f"{flag_of[field]} {value}: {e}") from None


# GGUF keys a model's maker may set its recommended sampling with (llama.cpp's general.sampling.*), as
# SamplingParams fields.
GGUF_SAMPLING_KEYS: dict[str, tuple[str, type]] = {
    "general.sampling.temp": ("temperature", float),
    "general.sampling.top_p": ("top_p", float),
    "general.sampling.top_k": ("top_k", int),
    "general.sampling.min_p": ("min_p", float),
    "general.sampling.penalty_repeat": ("repetition_penalty", float),
}


def model_sampling_defaults(metadata: Any) -> dict[str, Any]:
    """The sampling a GGUF recommends (its general.sampling.* keys), as SamplingParams fields; a value out
    of SamplingParams' bounds or of the wrong type is left out, not an error: the file is the maker's."""
    out: dict[str, Any] = {}
    for key, (field, kind) in GGUF_SAMPLING_KEYS.items():
        value = metadata.get(key) if metadata is not None else None
        if value is None or isinstance(value, bool | str | bytes):
            continue
        try:
            value = kind(value)
            SamplingParams(**{field: value})
        except (TypeError, ValueError):
            continue
        out[field] = value
    return out
