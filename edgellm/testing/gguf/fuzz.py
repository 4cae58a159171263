"""Structured GGUF mutations for the fuzz tests (tests/gguf/test_gguf_fuzz.py); the child process that loads
the mutated files is edgellm/testing/gguf/fuzz_worker.py.

`mutations(model)` is a hypothesis strategy of 1-3 edits of an `EditableGGUF`: any metadata value (with
boundary values: 0, -1, 2^31, 2^63, NaN, inf...), any value type, deleted and added keys, array element types,
lengths and nesting, key and string-value length fields, tensor dimensions, dimension counts, types, offsets,
names, dropped and duplicated tensors, header counts, the version, and truncation; `apply` makes
the mutated copy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from gguf import GGMLQuantizationType
from gguf import GGUFValueType as V
from hypothesis import strategies as st

from edgellm.testing.gguf.edit import FLOAT_TYPES, INT_TYPES, EditableGGUF, Field, Tensor

INTERESTING_INTS = [
    0, 1, 2, 3, 4, 5, 7, 8, 12, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 255, 256, 257, 511, 512, 513,
    576, 1000, 1024, 4096, 65535, 65536, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**40, 2**63 - 1, 2**63,
    2**64 - 1, -1, -2, -5, -(2**31), -(2**63),
]  # fmt: skip
INTERESTING_FLOATS = [
    0.0,
    -0.0,
    1.0,
    -1.0,
    0.5,
    1e-45,
    1e-30,
    1e-6,
    1e30,
    3.5e38,
    math.nan,
    math.inf,
    -math.inf,
]
INTERESTING_STRINGS = [
    "", "llama", "gemma3", "qwen2", "qwen3", "gpt2", "mamba", "bert", "default", "x" * 300, "\x00", "é",
]  # fmt: skip
ALL_VTYPES = [int(t) for t in V] + [13, 255, 2**32 - 1]  # the last three are not GGUF types
QTYPE_IDS = [int(t) for t in GGMLQuantizationType] + [4, 5, 31, 39, 1000, 2**32 - 1]
# Keys a mutation may add (with the architecture prefix where it starts with "."): optional keys the
# loader reads with a default, so adding them reaches code the base file does not.
OPTIONAL_KEYS = [
    ".rope.dimension_count", ".attention.key_length", ".attention.value_length", ".attention.head_count_kv",
    ".attention.sliding_window", ".final_logit_softcapping", ".vocab_size", ".context_length",
    ".attention.layer_norm_rms_epsilon", ".rope.freq_base", "general.alignment", "general.name",
    "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.unknown_token_id",
    "tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token", "tokenizer.ggml.pre",
]  # fmt: skip


def convert(value: Any, vtype: int) -> Any:
    """A value re-expressed in another GGUF type (what a converter bug or a bit flip could produce)."""
    if vtype == V.ARRAY:
        return (V.INT32 if isinstance(value, int) else V.STRING, [value])
    if vtype == V.STRING:
        return str(value)[:200]
    if vtype in FLOAT_TYPES:
        try:
            return float(value)
        except (TypeError, ValueError):
            return 0.0
    try:
        return int(value) if not (isinstance(value, float) and not math.isfinite(value)) else 0
    except (TypeError, ValueError):
        return len(value) if isinstance(value, str | list) else 0


def _scalar_value(vtype: int) -> st.SearchStrategy:
    if vtype in INT_TYPES or vtype == V.BOOL:
        return st.one_of(st.sampled_from(INTERESTING_INTS), st.integers(-(2**64), 2**64))
    if vtype in FLOAT_TYPES:
        return st.one_of(st.sampled_from(INTERESTING_FLOATS), st.floats(allow_nan=True))
    return st.one_of(st.sampled_from(INTERESTING_STRINGS), st.text(max_size=40))


@dataclass
class Mutation:
    """One edit; `describe` says exactly what it did (the reproducer in a failure report)."""

    kind: str
    args: tuple

    def describe(self) -> str:
        return f"{self.kind}{self.args!r}"


@st.composite
def mutation(draw: st.DrawFn, model: EditableGGUF, arch: str) -> Mutation:
    n_f, n_t = len(model.fields), len(model.tensors)
    kind = draw(
        st.sampled_from(
            ["set_value"] * 6
            + ["set_type"] * 2
            + ["delete_key", "add_key", "add_key", "array_type", "array_length", "array_nest"]
            + ["string_length", "tensor_dim", "tensor_dim", "tensor_ndims", "tensor_type", "tensor_offset"]
            + ["tensor_drop", "tensor_dup", "tensor_rename", "header_count", "version", "truncate"]
        )
    )
    fi = draw(st.integers(0, n_f - 1))
    ti = draw(st.integers(0, n_t - 1))
    f = model.fields[fi]
    if kind == "set_value":
        if f.vtype == V.ARRAY:
            etype, items = f.value
            if not items:
                return Mutation("delete_key", (f.key,))
            return Mutation(
                "set_element", (f.key, draw(st.integers(0, len(items) - 1)), draw(_scalar_value(etype)))
            )
        return Mutation(kind, (f.key, draw(_scalar_value(f.vtype))))
    if kind == "set_type":
        return Mutation(kind, (f.key, draw(st.sampled_from(ALL_VTYPES))))
    if kind == "delete_key":
        return Mutation(kind, (f.key,))
    if kind == "add_key":
        key = draw(st.sampled_from(OPTIONAL_KEYS))
        key = arch + key if key.startswith(".") else key
        vtype = draw(st.sampled_from([V.UINT32, V.INT32, V.UINT64, V.FLOAT32, V.STRING, V.BOOL]))
        return Mutation(kind, (key, int(vtype), draw(_scalar_value(vtype))))
    if kind in ("array_type", "array_length", "array_nest"):
        arrays = [g.key for g in model.fields if g.vtype == V.ARRAY]
        key = draw(st.sampled_from(arrays))
        if kind == "array_type":
            return Mutation(kind, (key, draw(st.sampled_from(ALL_VTYPES[:13]))))
        if kind == "array_length":
            return Mutation(kind, (key, draw(st.sampled_from([0, 1, 2, 3, 100, 287, 289, 1000]))))
        return Mutation(kind, (key, draw(st.one_of(st.integers(1, 12), st.just(200)))))
    if kind == "string_length":
        target = draw(st.sampled_from(["key", "value"]))
        delta = draw(st.sampled_from([-8, -1, 1, 7, 2**40, 2**63, 2**64 - 1]))
        return Mutation(kind, (f.key, target, delta))
    t = model.tensors[ti]
    if kind == "tensor_dim":
        dim = draw(st.integers(0, max(3, len(t.ne) - 1)))
        old = t.ne[dim] if dim < len(t.ne) else 1
        value = draw(
            st.one_of(st.sampled_from(INTERESTING_INTS), st.sampled_from([old * 2, old // 2, old + 1]))
        )
        return Mutation(kind, (t.name, dim, value % 2**64))
    if kind == "tensor_ndims":
        return Mutation(kind, (t.name, draw(st.sampled_from([0, 1, 2, 3, 4, 5, 2**32 - 1]))))
    if kind == "tensor_type":
        return Mutation(kind, (t.name, draw(st.sampled_from(QTYPE_IDS))))
    if kind == "tensor_offset":
        return Mutation(kind, (t.name, draw(st.sampled_from([1, 4, 31, 32, -32, 2**40, 2**63, -(2**20)]))))
    if kind == "tensor_drop":
        return Mutation(kind, (t.name,))
    if kind == "tensor_dup":
        return Mutation(kind, (t.name,))
    if kind == "tensor_rename":
        other = model.tensors[draw(st.integers(0, n_t - 1))].name
        return Mutation(
            kind, (t.name, draw(st.sampled_from([other, "", "x" * 100, t.name + ".x", "blk.99." + t.name])))
        )
    if kind == "header_count":
        which = draw(st.sampled_from(["n_tensors", "n_kv"]))
        real = n_t if which == "n_tensors" else n_f
        return Mutation(kind, (which, draw(st.sampled_from([0, real - 1, real + 1, 2**32, 2**64 - 1]))))
    if kind == "version":
        return Mutation(kind, (draw(st.sampled_from([0, 1, 2, 4, 2**32 - 1])),))
    return Mutation("truncate", (draw(st.floats(0.0, 1.0)),))


def mutations(model: EditableGGUF, arch: str) -> st.SearchStrategy[list[Mutation]]:
    return st.lists(mutation(model, arch), min_size=1, max_size=3)


def _tensor_index(model: EditableGGUF, name: str) -> int | None:
    return next((i for i, t in enumerate(model.tensors) if t.name == name), None)


def _edit_field(m: EditableGGUF, f: Field, k: str, a: tuple) -> None:
    if k == "set_value" and f.vtype != V.ARRAY:
        f.value = convert(a[1], f.vtype)
    elif k == "set_element" and f.vtype == V.ARRAY:
        etype, items = f.value
        items = list(items)
        if a[1] < len(items):
            items[a[1]] = convert(a[2], etype)
        f.value = (etype, items)
    elif k == "set_type":
        if a[1] == V.ARRAY:
            if f.vtype != V.ARRAY:
                f.vtype, f.value = V.ARRAY, (f.vtype, [f.value])
            return
        value = (f.value[1][0] if f.value[1] else 0) if f.vtype == V.ARRAY else f.value
        f.vtype, f.value = a[1], convert(value, a[1])
    elif k == "delete_key":
        m.fields.remove(f)
    elif k == "array_type" and f.vtype == V.ARRAY:
        f.value = (a[1], [convert(x, a[1]) for x in f.value[1]] if a[1] != V.ARRAY else [])
    elif k == "array_length" and f.vtype == V.ARRAY:
        etype, items = f.value
        f.value = (etype, (list(items) * (a[1] // max(1, len(items)) + 1))[: a[1]])
    elif k == "array_nest":
        value = (f.vtype, f.value) if f.vtype == V.ARRAY else (V.ARRAY, (f.vtype, [f.value]))
        for _ in range(a[1]):
            value = (V.ARRAY, (V.ARRAY, [value[1]]))
        f.vtype, f.value = value
    elif k == "string_length":
        if a[1] == "key":
            f.key_len_delta = a[2]
        else:
            f.value_len_delta = a[2]  # used when the value is a string


def _edit_tensor(m: EditableGGUF, i: int, k: str, a: tuple) -> None:
    t = m.tensors[i]
    if k == "tensor_dim":
        t.ne = list(t.ne) + [1] * (a[1] + 1 - len(t.ne))
        t.ne[a[1]] = a[2]
    elif k == "tensor_ndims":
        t.n_dims = a[1]
    elif k == "tensor_type":
        t.qtype = a[1]
    elif k == "tensor_offset":
        t.offset_delta = a[1]
    elif k == "tensor_drop":
        del m.tensors[i]
    elif k == "tensor_dup":
        m.tensors.insert(i, Tensor(t.name, list(t.ne), t.qtype, t.data))
    elif k == "tensor_rename":
        t.name = a[1]


def apply(model: EditableGGUF, muts: list[Mutation]) -> EditableGGUF:
    """A mutated copy. An edit whose target an earlier edit removed does nothing."""
    m = model.copy()
    for mut in muts:
        k, a = mut.kind, mut.args
        if k == "add_key":
            if m.find(a[0]) is None:
                m.fields.append(Field(a[0], a[1], convert(a[2], a[1])))
        elif k.startswith("tensor_"):
            i = _tensor_index(m, a[0])
            if i is not None:
                _edit_tensor(m, i, k, a)
        elif k == "header_count":
            setattr(m, a[0], a[1])
        elif k == "version":
            m.version = a[0]
        elif k == "truncate":
            m.truncate_at = a[0]
        else:
            f = m.find(a[0])
            if f is not None:
                _edit_field(m, f, k, a)
    return m
