"""Memory-mapped GGUF reader.

gguf-py's `GGUFReader` builds a numpy view per array element of the metadata, which takes 3.6 s on
SmolLM2 and 17.5 s on Gemma 3 (a 262,144-entry vocabulary) before the first token. This reader parses
the same format in one pass over a memory map (~0.3 s for Gemma) and still uses gguf-py for everything
it owns: value-type and quant-type enums and the block sizes (`GGML_QUANT_SIZES`). Tensor data stays in
the memory map; nothing is copied into Python objects. `tests/gguf/test_gguf_reader.py` checks that both
readers agree on the real model files.
"""

from __future__ import annotations

import math
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
# Arrays of arrays are legal GGUF; real files nest one level at most. The limit keeps a crafted file from
# recursing the parser into a RecursionError.
MAX_ARRAY_NESTING = 8


class GGUFError(ValueError):
    """A GGUF file that cannot be used; the message names the file and the problem."""


# Scalar value types: struct format and numpy dtype.
_SCALAR_FORMATS: dict[GGUFValueType, str] = {
    GGUFValueType.UINT8: "<B",
    GGUFValueType.INT8: "<b",
    GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I",
    GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f",
    GGUFValueType.BOOL: "<?",
    GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q",
    GGUFValueType.FLOAT64: "<d",
}
_SCALAR_DTYPES: dict[GGUFValueType, np.dtype] = {t: np.dtype(f) for t, f in _SCALAR_FORMATS.items()}


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of the file. `shape` is numpy order (outermost first), i.e. GGUF's ne reversed."""

    name: str
    qtype: GGMLQuantizationType
    shape: tuple[int, ...]
    offset: int  # absolute byte offset of the data in its file (its part's, for a split model)
    n_bytes: int
    data: np.ndarray  # read-only uint8 memmap view, (rows, row_bytes) where rows = prod(shape[:-1])

    @property
    def type_name(self) -> str:
        return self.qtype.name


@dataclass
class GGUFFile:
    """A model: one GGUF file, or every part of a split one (gguf-split's `-0000K-of-0000N.gguf`, joined
    by split.py: `path` is the first part, whose metadata is the model's; `parts` lists them all)."""

    path: Path
    version: int
    metadata: dict[str, Any]
    tensors: dict[str, TensorInfo]
    file_size: int  # bytes of all its files together
    _mmaps: tuple[mmap.mmap, ...] = ()
    parts: tuple[Path, ...] = ()

    def release_pages(self) -> None:
        """Drop the file's pages from this process's resident set (MADV_DONTNEED). Call once weights have
        been repacked: nothing reads the raw blocks again, and re-reading would just fault them back in
        from the file. Without it the raw GGUF stays counted in RSS next to the repacked weights."""
        if hasattr(mmap, "MADV_DONTNEED"):
            for mm in self._mmaps:
                mm.madvise(mmap.MADV_DONTNEED)

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    @property
    def architecture(self) -> str:
        arch = self.metadata.get("general.architecture")
        if not isinstance(arch, str):
            raise GGUFError(f"{self.path}: metadata has no general.architecture")
        return arch


def release_mapped_pages(a: np.ndarray) -> bool:
    """Drop the pages under `a`, a contiguous view of a file mapping made by load_gguf (a tensor's raw
    rows), from this process's resident set once they have been repacked: reading them again would
    just fault them back in from the file. Pages shared with the neighbouring bytes go too (they are
    clean file pages; a later read refaults them). Anything else (arrays in anonymous memory, where
    MADV_DONTNEED would zero the data) is left alone. Returns whether pages were released."""
    base: Any = a
    while isinstance(base, np.ndarray):
        base = base.base
    if isinstance(base, memoryview):
        base = base.obj
    if not isinstance(base, mmap.mmap) or not a.flags.c_contiguous or not hasattr(mmap, "MADV_DONTNEED"):
        return False
    start = a.ctypes.data // mmap.PAGESIZE * mmap.PAGESIZE
    return _madvise(start, a.ctypes.data + a.nbytes - start, mmap.MADV_DONTNEED) == 0


def _madvise(addr: int, length: int, advice: int) -> int:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return libc.madvise(addr, length, advice)


class _Cursor:
    """Bounds-checked little-endian reads over the memory map; running past the end means truncation."""

    def __init__(self, buf: memoryview, path: Path) -> None:
        self.buf = buf
        self.pos = 0
        self.path = path
        self.depth = 0  # arrays open around the value being read

    def _need(self, n: int, what: str) -> None:
        if self.pos + n > len(self.buf):
            raise GGUFError(
                f"{self.path}: truncated GGUF file: needed {n} bytes for {what} at offset {self.pos}, "
                f"file has {len(self.buf)} bytes"
            )

    def scalar(self, fmt: str, what: str) -> Any:
        size = struct.calcsize(fmt)
        self._need(size, what)
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return value

    def string(self, what: str) -> str:
        n = self.scalar("<Q", what)
        self._need(n, what)
        raw = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        return raw.decode("utf-8", errors="replace")

    def value(self, vtype: GGUFValueType, what: str) -> Any:
        if vtype == GGUFValueType.STRING:
            return self.string(what)
        if vtype == GGUFValueType.ARRAY:
            return self.array(what)
        return self.scalar(_SCALAR_FORMATS[vtype], what)

    def array(self, what: str) -> Any:
        etype = _value_type(self.scalar("<I", what), self.path, what)
        count = self.scalar("<Q", what)
        if etype in _SCALAR_DTYPES:
            dtype = _SCALAR_DTYPES[etype]
            self._need(count * dtype.itemsize, what)
            arr = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.pos).copy()
            self.pos += count * dtype.itemsize
            return arr
        if etype == GGUFValueType.STRING:
            return self._string_array(count, what)
        if self.depth >= MAX_ARRAY_NESTING:
            raise GGUFError(
                f"{self.path}: corrupt GGUF: {what} nests arrays more than {MAX_ARRAY_NESTING} deep"
            )
        self.depth += 1
        # Each element needs at least its 12-byte array header, so a huge count hits truncation quickly.
        out = [self.value(etype, what) for _ in range(count)]
        self.depth -= 1
        return out

    def _string_array(self, count: int, what: str) -> list[str]:
        buf, pos, out = self.buf, self.pos, []
        unpack = struct.Struct("<Q").unpack_from
        end = len(buf)
        append = out.append
        for _ in range(count):
            if pos + 8 > end:
                self.pos = pos
                self._need(8, what)
            (n,) = unpack(buf, pos)
            pos += 8
            if pos + n > end:
                self.pos = pos
                self._need(n, what)
            append(str(buf[pos : pos + n], "utf-8", "replace"))
            pos += n
        self.pos = pos
        return out


def _value_type(raw: int, path: Path, what: str) -> GGUFValueType:
    try:
        return GGUFValueType(raw)
    except ValueError:
        raise GGUFError(f"{path}: corrupt GGUF: unknown metadata value type {raw} in {what}") from None


def load_gguf_part(path: str | Path) -> GGUFFile:
    """One GGUF file as it stands: a whole model, or one part of a split one."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"model file not found: {path}")
    size = path.stat().st_size
    if size < 4:
        raise GGUFError(f"{path}: not a GGUF file (only {size} bytes)")
    with path.open("rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    buf = memoryview(mm)
    if bytes(buf[:4]) != GGUF_MAGIC:
        raise GGUFError(f"{path}: not a GGUF file (magic {bytes(buf[:4])!r}, expected b'GGUF')")
    cur = _Cursor(buf, path)
    cur.pos = 4
    version = cur.scalar("<I", "version")
    if version not in (2, 3):
        raise GGUFError(f"{path}: unsupported GGUF version {version} (supported: 2, 3)")
    n_tensors = cur.scalar("<Q", "tensor count")
    n_kv = cur.scalar("<Q", "metadata count")
    if n_tensors > size or n_kv > size:
        raise GGUFError(f"{path}: corrupt GGUF header ({n_tensors} tensors, {n_kv} metadata entries)")

    metadata: dict[str, Any] = {}
    for i in range(n_kv):
        key = cur.string(f"metadata key #{i}")
        if key in metadata:
            raise GGUFError(f"{path}: corrupt GGUF: duplicate metadata key {key!r}")
        vtype = _value_type(cur.scalar("<I", key), path, key)
        metadata[key] = cur.value(vtype, key)

    raw_infos = []
    for i in range(n_tensors):
        name = cur.string(f"tensor #{i} name")
        n_dims = cur.scalar("<I", name)
        if not 1 <= n_dims <= 4:
            raise GGUFError(f"{path}: corrupt tensor {name!r}: {n_dims} dimensions (GGUF allows 1 to 4)")
        ne = [cur.scalar("<Q", name) for _ in range(n_dims)]
        qraw = cur.scalar("<I", name)
        offset = cur.scalar("<Q", name)
        raw_infos.append((name, ne, qraw, offset))

    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if type(alignment) is not int or alignment <= 0 or alignment & (alignment - 1):
        raise GGUFError(
            f"{path}: corrupt GGUF: general.alignment {alignment!r} is not a positive power of two"
        )
    data_start = (cur.pos + alignment - 1) // alignment * alignment
    tensors: dict[str, TensorInfo] = {}
    for name, ne, qraw, offset in raw_infos:
        if name in tensors:
            raise GGUFError(f"{path}: corrupt GGUF: duplicate tensor name {name!r}")
        tensors[name] = _tensor_info(mm, path, size, data_start, alignment, name, ne, qraw, offset)
    return GGUFFile(
        path=path,
        version=version,
        metadata=metadata,
        tensors=tensors,
        file_size=size,
        _mmaps=(mm,),
        parts=(path,),
    )


def _tensor_info(
    mm: mmap.mmap,
    path: Path,
    size: int,
    data_start: int,
    alignment: int,
    name: str,
    ne: list[int],
    qraw: int,
    offset: int,
) -> TensorInfo:
    try:
        qtype = GGMLQuantizationType(qraw)
    except ValueError:
        raise GGUFError(f"{path}: tensor {name!r} has unknown ggml type id {qraw}") from None
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    if 0 in ne:
        raise GGUFError(f"{path}: corrupt tensor {name!r}: empty dimension in shape {tuple(reversed(ne))}")
    if ne[0] % block_size:
        raise GGUFError(
            f"{path}: tensor {name!r} ({qtype.name}) row length {ne[0]} "
            f"is not a multiple of its block size {block_size}"
        )
    if offset % alignment:
        raise GGUFError(
            f"{path}: corrupt tensor {name!r}: data offset {offset} is not a multiple of the "
            f"alignment {alignment}"
        )
    # Python integers: dimensions up to 2^64 - 1 must not overflow before they are compared to the file.
    row_bytes = ne[0] // block_size * type_size
    rows = math.prod(ne[1:])
    n_bytes = rows * row_bytes
    start = data_start + offset
    if start + n_bytes > size:
        raise GGUFError(
            f"{path}: truncated GGUF file: tensor {name!r} needs bytes {start}..{start + n_bytes} "
            f"(shape {tuple(reversed(ne))}), file has {size} bytes"
        )
    data = np.frombuffer(mm, dtype=np.uint8, count=n_bytes, offset=start).reshape(rows, row_bytes)
    return TensorInfo(
        name=name, qtype=qtype, shape=tuple(reversed(ne)), offset=start, n_bytes=n_bytes, data=data
    )
