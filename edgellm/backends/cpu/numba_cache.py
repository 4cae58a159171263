"""Numba's on-disk cache, made to follow the files a kernel's compiled code comes from.

Numba keys a cached function on its own source file only, yet the machine code it stores includes every
njit function it calls and every IR builder behind an intrinsic (vnni_ir.py, tile_layouts.py, ...): an
edit to one of those would leave a stale kernel in the cache. follow_sources adds a hash of this package's
sources (and the tables its kernels read as constants) and the CPU tiers whose IR the kernels hold
(tiers.compiled_tiers) to a function's cache stamp, so any such edit or another set of tiers recompiles
it. (Numba itself keys entries on the target CPU and features, NUMBA_CPU_NAME / NUMBA_CPU_FEATURES.)
Each set of compiled tiers also gets index and data files of its own (the tier names in the file names):
Numba keeps one stamp per index file and drops every entry of a stale one, so processes of different
tiers sharing one index (a benchmark alternating EDGELLM_CPU_TIER, tests forcing each tier) would each
throw out the other's kernels and compile them again (20-35 s and ~400 MB of peak RSS per start).
"""

from __future__ import annotations

import hashlib
import os
from functools import cache
from pathlib import Path

from numba.core.caching import NullCache

from edgellm.backends.cpu.tiers import compiled_tiers

_PACKAGE = Path(__file__).resolve().parent
_EXTRA = [_PACKAGE.parent.parent / "quants" / "packing.py"]  # ACT_* modes, read as compile-time constants


@cache
def sources_hash() -> str:
    """sha256 over the compiled tiers' names and the names and contents of the CPU backend's sources
    (and _EXTRA)."""
    h = hashlib.sha256(" ".join(t.name for t in compiled_tiers()).encode())
    for path in sorted(_PACKAGE.glob("*.py")) + _EXTRA:
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def follow_sources(*dispatchers) -> None:  # noqa: ANN002 - Numba dispatchers
    """Make each cached dispatcher's cache entries valid only for the current sources_hash(). Where
    Numba's cache internals are not as expected, the function is not cached at all (correct, slower)."""
    tag = "+".join(t.name for t in compiled_tiers()) or "untiled"
    for fn in dispatchers:
        cache_file = getattr(getattr(fn, "_cache", None), "_cache_file", None)
        names = ("_source_stamp", "_cache_path", "_index_name", "_index_path", "_data_name_pattern")
        if cache_file is None or not all(hasattr(cache_file, n) for n in names):
            fn._cache = NullCache()
            continue
        cache_file._source_stamp = (cache_file._source_stamp, sources_hash())
        base = cache_file._index_name.removesuffix(".nbi")
        cache_file._index_name = f"{base}.{tag}.nbi"
        cache_file._index_path = os.path.join(cache_file._cache_path, cache_file._index_name)
        cache_file._data_name_pattern = f"{base}.{tag}.{{number:d}}.nbc"
