"""The fast reader (`edgellm.gguf.load.load_gguf`) returns exactly what gguf-py's `GGUFReader` reads:
metadata keys, values and types, and the tensor table, on tiny synthetic models, a file with every value
type, and both real models. gguf-py needs ~3.6 s (SmolLM2) and ~18 s (Gemma 3) to open the real files.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGUFValueType as V

from edgellm.gguf.load import load_gguf
from edgellm.gguf.reader import release_mapped_pages
from edgellm.testing.synthetic.models import write_tiny_model


def assert_same_as_gguf_py(path: Path, check_data: bool = True) -> None:
    """Metadata (keys in order, values and their Python/numpy types) and the tensor table (names in order,
    types, shapes, absolute offsets, sizes, and the bytes themselves) equal gguf.GGUFReader's."""
    mine = load_gguf(path)
    theirs = gguf.GGUFReader(path)
    keys = [k for k in theirs.fields if not k.startswith("GGUF.")]
    assert list(mine.metadata) == keys
    assert mine.version == theirs.fields["GGUF.version"].contents()
    for key in keys:
        field, value, expected = theirs.fields[key], mine.metadata[key], theirs.fields[key].contents()
        kind = field.types[0]
        if kind == V.ARRAY and len(field.types) > 2:  # array of arrays: gguf-py flattens them
            assert [x for inner in value for x in list(inner)] == expected, key
        elif kind == V.ARRAY and field.types[-1] == V.STRING:
            assert isinstance(value, list) and value == expected, key
        elif kind == V.ARRAY:
            assert isinstance(value, np.ndarray) and value.dtype == field.parts[field.data[0]].dtype, key
            assert value.tolist() == expected, key
        else:
            py_type = {V.STRING: str, V.BOOL: bool, V.FLOAT32: float, V.FLOAT64: float}.get(kind, int)
            assert type(value) is py_type and value == expected, (key, value, expected)
    assert list(mine.tensors) == [t.name for t in theirs.tensors]
    for t in theirs.tensors:
        info = mine.tensors[t.name]
        assert info.qtype == t.tensor_type, t.name
        assert info.shape == tuple(int(n) for n in reversed(t.shape)), t.name
        assert (info.offset, info.n_bytes) == (int(t.data_offset), int(t.n_bytes)), t.name
        assert info.data.dtype == np.uint8 and not info.data.flags.writeable
        assert info.data.shape[0] == int(np.prod(info.shape[:-1], dtype=np.int64))
        if check_data:
            np.testing.assert_array_equal(
                info.data.reshape(-1), np.ascontiguousarray(t.data).view(np.uint8).ravel()
            )


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "gemma3"])
def test_reader_parity_on_tiny_models(tmp_path: Path, arch: str) -> None:
    qtypes = {"*": "Q8_0", "attn_q": "Q4_K", "attn_k": "Q6_K", "ffn_down": "BF16", "ffn_up": "F16"}
    path = write_tiny_model(tmp_path / "m.gguf", arch, qtypes, n_embd=256, head_dim=64, n_ff=256, tied=False)
    assert_same_as_gguf_py(path)


def test_reader_parity_on_every_value_type(tmp_path: Path) -> None:
    path = tmp_path / "values.gguf"
    w = gguf.GGUFWriter(path, "llama")
    scalars = [
        (V.UINT8, 255), (V.INT8, -128), (V.UINT16, 65535), (V.INT16, -32768), (V.UINT32, 2**32 - 1),
        (V.INT32, -(2**31)), (V.UINT64, 2**64 - 1), (V.INT64, -(2**63)), (V.FLOAT32, 0.1),
        (V.FLOAT64, 1e-300), (V.BOOL, True), (V.STRING, "ünïcødé ▁ 🦙"),
    ]  # fmt: skip
    for vtype, value in scalars:
        w.add_key_value(f"t.{vtype.name.lower()}", value, vtype)
        if vtype != V.BOOL:
            w.add_key_value(f"t.arr_{vtype.name.lower()}", [value, value, value], V.ARRAY, vtype)
    w.add_key_value("t.empty_string", "", V.STRING)
    w.add_key_value("t.nested", [[1, 2], [3]], V.ARRAY)
    w.add_tensor("x", np.arange(64, dtype=np.float32).reshape(2, 32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert_same_as_gguf_py(path)
    assert load_gguf(path).metadata["t.float32"] == np.float32(0.1)


def test_reader_parity_smollm2(smollm2_path: Path) -> None:
    assert_same_as_gguf_py(smollm2_path)


def test_reader_parity_gemma3(gemma3_path: Path) -> None:
    """gguf-py takes ~18 s to open this file (262,144-token vocabulary); the one slow test of the file."""
    assert_same_as_gguf_py(gemma3_path)


def _resident_kb() -> int:
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def test_release_mapped_pages_drops_file_pages_only(gemma3_path: Path) -> None:
    """A tensor's pages of the file mapping leave the resident set and read back the same bytes (they are
    the file's); an array in anonymous memory is left alone (MADV_DONTNEED would zero it)."""
    emb = load_gguf(gemma3_path).tensors["token_embd.weight"].data  # ~178 MB
    before = emb[::512].copy()
    emb.sum(dtype=np.uint64)  # fault every page in
    rss_in = _resident_kb()
    assert release_mapped_pages(emb)
    assert rss_in - _resident_kb() > 100_000  # kB
    np.testing.assert_array_equal(emb[::512], before)
    heap = np.arange(1 << 20, dtype=np.uint8)
    assert not release_mapped_pages(heap)
    np.testing.assert_array_equal(heap, np.arange(1 << 20, dtype=np.uint8))
