"""Typed, range-checked reads of GGUF metadata values.

The reader returns whatever the file holds (any of GGUF's value types), so a key can carry a string, an
array or a float where an integer belongs, or a value no kernel can run (0 heads, 2^40 layers). Every read
here checks the type and the range and raises `GGUFError` naming the file, the key and the value, before
anything uses it for arithmetic or an allocation.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from edgellm.gguf.reader import GGUFError, GGUFFile

_MISSING = object()
INT32_MAX = 2**31 - 1


def describe(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return f"an array of {value.size} {value.dtype}"
    if isinstance(value, list):
        return f"an array of {len(value)} elements"
    text = repr(value)
    return f"{type(value).__name__} {text[:60] + '...' if len(text) > 60 else text}"


def _raw(g: GGUFFile, key: str, default: Any) -> Any:
    if key in g.metadata:
        return g.metadata[key]
    if default is _MISSING:
        raise GGUFError(f"{g.path}: missing metadata key {key!r}")
    return default


def is_int(value: Any) -> bool:
    """A GGUF integer scalar (the reader gives Python ints; bools are a type of their own in GGUF)."""
    return isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_)


def check_int_range(g: GGUFFile, key: str, value: int, lo: int, hi: int, why: str = "") -> int:
    if not lo <= value <= hi:
        reason = f" ({why})" if why else ""
        raise GGUFError(f"{g.path}: metadata {key} = {value} is out of range: must be {lo}..{hi}{reason}")
    return value


def get_int(
    g: GGUFFile, key: str, default: Any = _MISSING, lo: int = 0, hi: int = INT32_MAX, why: str = ""
) -> int:
    """An integer-valued key (any GGUF integer type) within [lo, hi]."""
    value = _raw(g, key, default)
    if not is_int(value):
        raise GGUFError(f"{g.path}: metadata {key} must be an integer, got {describe(value)}")
    return check_int_range(g, key, int(value), lo, hi, why)


def get_float(
    g: GGUFFile,
    key: str,
    default: Any = _MISSING,
    lo: float = -math.inf,
    hi: float = math.inf,
    lo_open: bool = False,
) -> float:
    """A finite number (any GGUF integer or float type) in [lo, hi], or (lo, hi] with lo_open."""
    value = _raw(g, key, default)
    if not (is_int(value) or isinstance(value, float | np.floating)):
        raise GGUFError(f"{g.path}: metadata {key} must be a number, got {describe(value)}")
    value = float(value)
    low_ok = value > lo if lo_open else value >= lo
    if not (math.isfinite(value) and low_ok and value <= hi):
        bound = f"> {lo}" if lo_open else f">= {lo}"
        raise GGUFError(
            f"{g.path}: metadata {key} = {value} is out of range: must be finite, {bound} and <= {hi}"
        )
    return value


def get_str(g: GGUFFile, key: str, default: Any = _MISSING) -> str:
    value = _raw(g, key, default)
    if not isinstance(value, str):
        raise GGUFError(f"{g.path}: metadata {key} must be a string, got {describe(value)}")
    return value


def get_bool(g: GGUFFile, key: str, default: Any = _MISSING) -> bool:
    """A flag: GGUF bool, or an integer 0/1 as some converters write them."""
    value = _raw(g, key, default)
    if isinstance(value, bool | np.bool_):
        return bool(value)
    if is_int(value) and value in (0, 1):
        return bool(value)
    raise GGUFError(f"{g.path}: metadata {key} must be a bool, got {describe(value)}")
