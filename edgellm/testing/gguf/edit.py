"""A GGUF file as an editable structure, written back byte for byte by its own serializer.

gguf-py's writer refuses what a fuzzer needs to write: a key of the wrong value type, a count that does not
match, a tensor whose dimensions disagree with its data, a string whose length field lies. `EditableGGUF`
holds the typed metadata and the tensor table of a valid file (read with gguf-py, which keeps each value's
GGUF type) and `serialize` writes whatever it holds, including such inconsistencies, so that the fuzz tests
(`tests/gguf/test_gguf_fuzz.py`) can mutate every field of a small synthetic model.

Typed values: `(vtype, value)` for scalars and strings, `(ARRAY, (element_type, [values]))` for arrays,
where the elements of an array of arrays are `(element_type, [values])` pairs themselves.
"""

from __future__ import annotations

import copy
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from gguf import GGUFValueType as V

from edgellm.gguf.reader import load_gguf_part

SCALAR_FORMATS = {
    V.UINT8: "<B", V.INT8: "<b", V.UINT16: "<H", V.INT16: "<h", V.UINT32: "<I", V.INT32: "<i",
    V.FLOAT32: "<f", V.BOOL: "<B", V.UINT64: "<Q", V.INT64: "<q", V.FLOAT64: "<d",
}  # fmt: skip
INT_TYPES = (V.UINT8, V.INT8, V.UINT16, V.INT16, V.UINT32, V.INT32, V.UINT64, V.INT64)
FLOAT_TYPES = (V.FLOAT32, V.FLOAT64)


@dataclass
class Field:
    key: str
    vtype: int
    value: Any  # see the module docstring
    key_len_delta: int = 0  # added to the key's length field (a string that lies about its length)
    value_len_delta: int = 0  # the same for a string value's length field


@dataclass
class Tensor:
    name: str
    ne: list[int]  # GGUF order (innermost first)
    qtype: int
    data: bytes
    offset_delta: int = 0  # added to the natural (aligned, in file order) offset
    n_dims: int | None = None  # written instead of len(ne) when set


@dataclass
class EditableGGUF:
    version: int = 3
    fields: list[Field] = field(default_factory=list)
    tensors: list[Tensor] = field(default_factory=list)
    n_tensors: int | None = None  # header counts written instead of the real ones when set
    n_kv: int | None = None
    truncate_at: int | None = None  # bytes kept, as a fraction of the file when a float

    def copy(self) -> EditableGGUF:
        # tensor data (bytes) is immutable: a shallow copy of each record is enough
        out = copy.copy(self)
        out.fields = [copy.deepcopy(f) for f in self.fields]
        out.tensors = [copy.copy(t) for t in self.tensors]
        return out

    def find(self, key: str) -> Field | None:
        return next((f for f in self.fields if f.key == key), None)


def _typed(types: list[int], contents: Any) -> tuple[int, Any]:
    if types[0] == V.ARRAY:
        return V.ARRAY, (types[-1], list(contents))
    return types[0], contents


def read_editable(path: str | Path) -> EditableGGUF:
    """A valid GGUF file (single-level arrays, as the converters write them) as an EditableGGUF."""
    theirs = gguf.GGUFReader(path)
    model = EditableGGUF(version=int(theirs.fields["GGUF.version"].contents()))
    for key, f in theirs.fields.items():
        if not key.startswith("GGUF."):
            model.fields.append(Field(key, *_typed([int(t) for t in f.types], f.contents())))
    for name, t in load_gguf_part(path).tensors.items():
        ne = list(reversed(t.shape))
        model.tensors.append(Tensor(name, ne, int(t.qtype), t.data.tobytes()))
    return model


def _wrap_int(value: int, fmt: str) -> int:
    bits = struct.calcsize(fmt) * 8
    value &= (1 << bits) - 1
    return value - (1 << bits) if fmt.islower() and value >= 1 << (bits - 1) else value


def encode_value(vtype: int, value: Any) -> bytes:
    """Any value in any type: ints wrap to the type's width, floats round to f32 (inf past its range)."""
    if vtype == V.STRING:
        raw = value if isinstance(value, bytes) else str(value).encode("utf-8", "surrogatepass")
        return struct.pack("<Q", len(raw)) + raw
    if vtype == V.ARRAY:
        etype, items = value
        head = struct.pack("<IQ", etype, len(items))
        if etype in SCALAR_FORMATS and etype != V.BOOL:
            dtype = np.dtype(SCALAR_FORMATS[etype])
            if dtype.kind in "iu":
                items = [_wrap_int(int(x), SCALAR_FORMATS[etype]) for x in items]
            with np.errstate(over="ignore"):
                return (
                    head
                    + np.asarray(items, dtype=np.float64 if dtype.kind == "f" else None)
                    .astype(dtype)
                    .tobytes()
                )
        return head + b"".join(encode_value(etype, x) for x in items)
    fmt = SCALAR_FORMATS.get(vtype)
    if fmt is None:  # not a GGUF value type: write 4 bytes, the reader must refuse the type first
        return struct.pack("<I", 0)
    if vtype in FLOAT_TYPES:
        with np.errstate(over="ignore"):
            return np.asarray(float(value), np.float64).astype(fmt).tobytes()
    if vtype == V.BOOL:
        return struct.pack("<B", int(value) & 0xFF)
    return struct.pack(fmt, _wrap_int(int(value), fmt))


def _string(text: str, len_delta: int = 0) -> bytes:
    raw = text.encode("utf-8", "surrogatepass")
    return struct.pack("<Q", (len(raw) + len_delta) % 2**64) + raw


def alignment_of(model: EditableGGUF) -> int:
    f = model.find("general.alignment")
    if f is not None and f.vtype in INT_TYPES and isinstance(f.value, int) and f.value > 0:
        if f.value & (f.value - 1) == 0 and f.value <= 4096:
            return f.value
    return 32


def serialize(model: EditableGGUF) -> bytes:
    """The file's bytes: header, metadata, tensor table, padding, tensor data (each at its natural aligned
    offset; the table may say otherwise)."""
    align = alignment_of(model)
    n_tensors = len(model.tensors) if model.n_tensors is None else model.n_tensors
    n_kv = len(model.fields) if model.n_kv is None else model.n_kv
    out = bytearray(
        b"GGUF" + struct.pack("<IQQ", model.version & 0xFFFFFFFF, n_tensors % 2**64, n_kv % 2**64)
    )
    for f in model.fields:
        out += _string(f.key, f.key_len_delta) + struct.pack("<I", f.vtype & 0xFFFFFFFF)
        if f.vtype == V.STRING and isinstance(f.value, str):
            out += _string(f.value, f.value_len_delta)
        else:
            out += encode_value(f.vtype, f.value)
    offsets, at = [], 0
    for t in model.tensors:
        offsets.append(at)
        at += -(-len(t.data) // align) * align
    for t, natural in zip(model.tensors, offsets, strict=True):
        n_dims = len(t.ne) if t.n_dims is None else t.n_dims
        out += _string(t.name) + struct.pack("<I", n_dims & 0xFFFFFFFF)
        out += b"".join(struct.pack("<Q", d % 2**64) for d in t.ne)
        out += struct.pack("<IQ", t.qtype & 0xFFFFFFFF, (natural + t.offset_delta) % 2**64)
    out += b"\0" * (-len(out) % align)
    for t in model.tensors:  # back to back, each padded to the alignment: the natural offsets
        out += t.data + b"\0" * (-len(t.data) % align)
    if model.truncate_at is not None:
        keep = model.truncate_at
        keep = int(len(out) * keep) if isinstance(keep, float) else keep
        del out[max(0, keep) :]
    return bytes(out)


def write(tmp_path: Path, data: bytes, name: str = "m.gguf") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def record_start(raw: bytes, text: str) -> int:
    """Offset of a GGUF string record (u64 length + bytes) holding `text`; unique in the file."""
    needle = struct.pack("<Q", len(text)) + text.encode()
    at = raw.find(needle)
    assert at >= 0 and raw.find(needle, at + 1) < 0, text
    return at
