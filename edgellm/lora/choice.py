"""Which adapters a request runs with, as llama-server decides it: the loaded adapters' global scales
(`--lora` 1.0, `--lora-scaled` its scale, `POST /lora-adapters`), unless the request names its own list
(`"lora": [{"id": 0, "scale": 1.0}]`), in which case an adapter the list does not name is at 0 for it.

A request's choice is resolved once, when the engine core admits it (LoraChoice: the adapters at a nonzero
scale, by id), so changing the global scales later never changes a request already running; the choice
also keys the prefix cache (KV computed under one adapter set is never reused under another).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import Any

# ((adapter id, scale), ...) sorted by id, scales nonzero; () = the base model alone
LoraChoice = tuple[tuple[int, float], ...]


def request_lora(value: Any) -> dict[int, float] | None:
    """A request's `lora` field (llama-server's list of {"id", "scale"}, or {id: scale}) as {id: scale};
    None when absent. ValueError naming the problem for anything else."""
    if value is None:
        return None
    if isinstance(value, Mapping):
        items = list(value.items())
    elif isinstance(value, Sequence) and not isinstance(value, str | bytes):
        items = []
        for entry in value:
            if not isinstance(entry, Mapping) or "id" not in entry:
                raise ValueError(f"each lora entry must be an object with 'id' and 'scale', got {entry!r}")
            items.append((entry["id"], entry.get("scale", 0.0)))  # llama-server's default
    else:
        raise ValueError(f"lora must be a list of {{'id', 'scale'}} objects, got {value!r}")
    out: dict[int, float] = {}
    for k, s in items:
        if isinstance(k, bool) or not isinstance(k, int | str) or not str(k).lstrip("-").isdigit():
            raise ValueError(f"lora id must be an integer, got {k!r}")
        if isinstance(s, bool) or not isinstance(s, int | float) or s != s or abs(s) == float("inf"):
            raise ValueError(f"lora scale must be a finite number, got {s!r}")
        out[int(k)] = float(s)
    return out


def resolve_lora(requested: Mapping[int, float] | None, global_scales: Sequence[float]) -> LoraChoice:
    """The adapters (id, scale) a request runs with. ValueError for an id no adapter has."""
    n = len(global_scales)
    if requested is None:
        return tuple((k, float(s)) for k, s in enumerate(global_scales) if s != 0)
    for k in requested:
        if not 0 <= k < n:
            loaded = f"ids 0..{n - 1}" if n else "none loaded"
            raise ValueError(f"unknown LoRA adapter id {k} ({loaded})")
    return tuple((k, float(s)) for k, s in sorted(requested.items()) if s != 0)


def parse_lora_arg(text: str, scale: str | float | None = None) -> tuple[str, float]:
    """A `--lora-scaled` argument: FILE and SCALE given apart, or llama-server's FILE:SCALE in one."""
    if scale is None:
        path, sep, tail = text.rpartition(":")
        if not sep or not path:
            raise ValueError(f"--lora-scaled needs FILE SCALE or FILE:SCALE, got {text!r}")
        text, scale = path, tail
    try:
        value = float(scale)
    except ValueError:
        raise ValueError(f"LoRA scale must be a number, got {scale!r}") from None
    if value != value or abs(value) == float("inf"):
        raise ValueError(f"LoRA scale must be finite, got {scale!r}")
    return text, value


def lora_files(lora: Sequence[Any]) -> list[tuple[str, float]]:
    """EngineConfig.lora's entries (a path: scale 1; (path, scale); llama-server's "FILE:SCALE" only as
    the one argument of --lora-scaled) as [(path, global scale)]."""
    out = []
    for entry in lora:
        if isinstance(entry, str | bytes) or hasattr(entry, "__fspath__"):
            out.append((str(entry), 1.0))
        elif isinstance(entry, Sequence) and len(entry) == 2:
            out.append(parse_lora_arg(str(entry[0]), entry[1]))
        else:
            raise ValueError(f"a LoRA adapter is a path or (path, scale), got {entry!r}")
    return out


class LoraFlag(argparse.Action):
    """--lora FILE and --lora-scaled FILE SCALE | FILE:SCALE[,FILE:SCALE...] both append to `lora`, in
    the order given (the adapters' ids)."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:  # noqa: ANN001
        items = list(getattr(namespace, "lora", None) or [])
        if option_string == "--lora":
            items.extend((p, 1.0) for p in str(values).split(","))
        else:
            values = list(values)
            try:
                if len(values) == 2 and ":" not in values[1]:
                    items.append(parse_lora_arg(values[0], values[1]))
                elif len(values) == 1:
                    items.extend(parse_lora_arg(v) for v in values[0].split(","))
                else:
                    raise ValueError(f"--lora-scaled takes FILE SCALE or FILE:SCALE, got {' '.join(values)}")
            except ValueError as e:
                parser.error(str(e))
        namespace.lora = items
