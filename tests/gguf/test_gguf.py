"""GGUF loading: every way a file can be unusable gives an error that names the problem.

Broken files are tiny synthetic models (edgellm.testing.synthetic.models) cut or patched at known byte
offsets. Parity of the reader with gguf-py is in test_gguf_reader.py.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from edgellm import LLM
from edgellm.gguf.config import UnsupportedArchitectureError
from edgellm.gguf.load import load_gguf
from edgellm.gguf.reader import GGUFError
from edgellm.models.catalog import ModelNotFoundError
from edgellm.quants import UnsupportedQuantError
from edgellm.testing.gguf.edit import record_start, write
from edgellm.testing.synthetic.models import write_tiny_model
from edgellm.tokenizer.vocab import TokenizerError

LLM_KW = dict(n_ctx=64, kv_cache_memory=1 << 20)


@pytest.fixture(scope="module")
def tiny_bytes(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, gguf.GGUFReader]:
    """A valid tiny model's bytes, with gguf-py's parse of it (for the section boundaries)."""
    path = write_tiny_model(tmp_path_factory.mktemp("gguf") / "tiny.gguf", "llama")
    return path.read_bytes(), gguf.GGUFReader(path)


def patch_u32(raw: bytes, offset: int, value: int) -> bytes:
    return raw[:offset] + struct.pack("<I", value) + raw[offset + 4 :]


# ---- not a GGUF at all ----------------------------------------------------------------------------------
def test_random_bytes_are_not_gguf(tmp_path: Path) -> None:
    path = write(tmp_path, np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    with pytest.raises(GGUFError, match=r"not a GGUF file \(magic .*expected b'GGUF'\)") as exc:
        load_gguf(path)
    assert str(path) in str(exc.value)


def test_text_file_is_not_gguf(tmp_path: Path) -> None:
    path = write(tmp_path, b"# just a README\n" * 20, "model.txt")
    with pytest.raises(GGUFError, match=r"not a GGUF file \(magic b'# ju'"):
        LLM(path, **LLM_KW)


@pytest.mark.parametrize("size", [0, 3])
def test_empty_or_tiny_file(tmp_path: Path, size: int) -> None:
    path = write(tmp_path, b"GGU"[:size])
    with pytest.raises(GGUFError, match=rf"not a GGUF file \(only {size} bytes\)"):
        load_gguf(path)


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="model file not found"):
        load_gguf(tmp_path / "nope.gguf")
    with pytest.raises(FileNotFoundError, match="model file not found"):
        load_gguf(tmp_path)
    with pytest.raises(ModelNotFoundError, match=r"nope\.gguf.*no such file"):
        LLM(tmp_path / "nope.gguf", **LLM_KW)


@pytest.mark.parametrize("version", [1, 4, 0x03000000])  # the last: a big-endian v3 file read as LE
def test_unsupported_version(tmp_path: Path, tiny_bytes: tuple[bytes, Any], version: int) -> None:
    path = write(tmp_path, patch_u32(tiny_bytes[0], 4, version))
    with pytest.raises(GGUFError, match=rf"unsupported GGUF version {version} \(supported: 2, 3\)"):
        load_gguf(path)


def test_absurd_counts_in_header(tmp_path: Path) -> None:
    path = write(tmp_path, b"GGUF" + struct.pack("<IQQ", 3, 1 << 40, 0))
    with pytest.raises(GGUFError, match=r"corrupt GGUF header \(1099511627776 tensors"):
        load_gguf(path)


# ---- truncated files --------------------------------------------------------------------------------------
def section_cuts(raw: bytes, reader: gguf.GGUFReader) -> dict[str, tuple[int, str]]:
    """Cut points inside each section of the file, with the part of the message naming where it broke."""
    fields = [f for k, f in reader.fields.items() if not k.startswith("GGUF.")]
    merges = reader.fields["tokenizer.ggml.merges"]
    table = reader.tensors[0].field.offset  # first tensor-info record
    last = reader.tensors[-1]
    return {
        "header-version": (6, "for version"),
        "header-counts": (12, "for tensor count"),
        "metadata-first-key": (fields[0].offset + 3, "for metadata key #0"),
        "metadata-value": (fields[2].offset + 20, f"for {fields[2].name}"),
        "metadata-string-array": (merges.offset + 100, "for tokenizer.ggml.merges"),
        "tensor-table-first": (table + 4, "for tensor #0 name"),
        "tensor-table-dims": (table + 8 + len("token_embd.weight") + 6, "for token_embd.weight"),
        "tensor-table-last": (int(reader.data_offset) - 40, f"for {last.name}"),
        "tensor-data-start": (int(reader.data_offset) + 10, f"tensor '{reader.tensors[0].name}' needs bytes"),
        "tensor-data-last-byte": (len(raw) - 1, f"tensor '{last.name}' needs bytes"),
    }


@pytest.mark.parametrize(
    "where",
    [
        "header-version",
        "header-counts",
        "metadata-first-key",
        "metadata-value",
        "metadata-string-array",
        "tensor-table-first",
        "tensor-table-dims",
        "tensor-table-last",
        "tensor-data-start",
        "tensor-data-last-byte",
    ],
)
def test_truncated_file(tmp_path: Path, tiny_bytes: tuple[bytes, gguf.GGUFReader], where: str) -> None:
    raw, reader = tiny_bytes
    cut, names = section_cuts(raw, reader)[where]
    path = write(tmp_path, raw[:cut])
    with pytest.raises(GGUFError, match="truncated GGUF file") as exc:
        load_gguf(path)
    msg = str(exc.value)
    assert names in msg and f"file has {cut} bytes" in msg and str(path) in msg, msg


def test_truncated_model_fails_in_llm_too(tmp_path: Path, tiny_bytes: tuple[bytes, Any]) -> None:
    raw = tiny_bytes[0]
    with pytest.raises(GGUFError, match=r"truncated GGUF file: tensor 'output\.weight'"):
        LLM(write(tmp_path, raw[: len(raw) - 1000]), **LLM_KW)


# ---- corrupt records ---------------------------------------------------------------------------------------
def test_unknown_metadata_value_type(tmp_path: Path, tiny_bytes: tuple[bytes, Any]) -> None:
    raw = tiny_bytes[0]
    key = "llama.feed_forward_length"
    path = write(tmp_path, patch_u32(raw, record_start(raw, key) + 8 + len(key), 99))
    with pytest.raises(GGUFError, match=rf"unknown metadata value type 99 in {key}"):
        load_gguf(path)


def test_unknown_array_element_type(tmp_path: Path, tiny_bytes: tuple[bytes, Any]) -> None:
    raw = tiny_bytes[0]
    key = "tokenizer.ggml.token_type"
    path = write(tmp_path, patch_u32(raw, record_start(raw, key) + 8 + len(key) + 4, 77))
    with pytest.raises(GGUFError, match=rf"unknown metadata value type 77 in {key}"):
        load_gguf(path)


def tensor_type_offset(raw: bytes, name: str) -> int:
    """Offset of the ggml type field of a tensor-info record: name, n_dims, ne[n_dims], type, offset."""
    at = record_start(raw, name) + 8 + len(name)
    (n_dims,) = struct.unpack_from("<I", raw, at)
    return at + 4 + 8 * n_dims


def test_unknown_ggml_type_id(tmp_path: Path, tiny_bytes: tuple[bytes, Any]) -> None:
    raw = tiny_bytes[0]
    path = write(tmp_path, patch_u32(raw, tensor_type_offset(raw, "blk.1.ffn_up.weight"), 250))
    with pytest.raises(GGUFError, match=r"tensor 'blk\.1\.ffn_up\.weight' has unknown ggml type id 250"):
        load_gguf(path)


def test_too_many_dimensions(tmp_path: Path, tiny_bytes: tuple[bytes, Any]) -> None:
    raw = tiny_bytes[0]
    name = "blk.0.attn_v.weight"
    path = write(tmp_path, patch_u32(raw, record_start(raw, name) + 8 + len(name), 7))
    with pytest.raises(GGUFError, match=rf"corrupt tensor '{name}': 7 dimensions"):
        load_gguf(path)


def test_row_not_multiple_of_block(tmp_path: Path, tiny_bytes: tuple[bytes, Any]) -> None:
    """ne[0] = 48 for a Q4_0 tensor (blocks of 32)."""
    raw = tiny_bytes[0]
    name = "blk.0.attn_q.weight"  # Q4_0 in the default mix
    ne0 = record_start(raw, name) + 8 + len(name) + 4
    path = write(tmp_path, raw[:ne0] + struct.pack("<Q", 48) + raw[ne0 + 8 :])
    with pytest.raises(GGUFError, match=rf"'{name}' \(Q4_0\) row length 48 is not a multiple of .* 32"):
        load_gguf(path)


# ---- valid GGUF, unusable model ---------------------------------------------------------------------------
def test_unsupported_architecture(tmp_path: Path) -> None:
    path = write_tiny_model(
        tmp_path / "m.gguf", "llama", metadata_overrides={"general.architecture": "mamba"}
    )
    with pytest.raises(UnsupportedArchitectureError, match=r"unsupported architecture 'mamba' \(supported: "):
        LLM(path, **LLM_KW)
    assert issubclass(UnsupportedArchitectureError, GGUFError)


def test_missing_architecture_key(tmp_path: Path) -> None:
    path = write_tiny_model(tmp_path / "m.gguf", "qwen3", metadata_overrides={"general.architecture": None})
    with pytest.raises(GGUFError, match="metadata has no general.architecture"):
        LLM(path, **LLM_KW)


@pytest.mark.parametrize(
    "qtype,tensor",
    [(T.NVFP4, "blk.1.attn_q.weight"), (T.Q8_1, "blk.0.ffn_down.weight"), (T.NVFP4, "output.weight")],
    ids=lambda v: v.name if isinstance(v, T) else v,
)
def test_unsupported_tensor_type(tmp_path: Path, qtype: T, tensor: str) -> None:
    """Block-32/64 types the runtime does not run, written as raw blocks (they fit a 64-wide model)."""
    path = write_tiny_model(tmp_path / "m.gguf", "llama", {tensor: qtype, "*": T.Q8_0})
    assert load_gguf(path).tensors[tensor].qtype == qtype  # the file itself is fine
    with pytest.raises(
        UnsupportedQuantError, match=rf"unsupported tensor type {qtype.name} in tensor {tensor}"
    ):
        LLM(path, **LLM_KW)


def test_unsupported_k_quant_sized_type(tmp_path: Path) -> None:
    """Q8_K (blocks of 256, llama.cpp's activation type, never a weight) on a 256-wide model."""
    path = write_tiny_model(
        tmp_path / "m.gguf", "llama", {"attn_k": T.Q8_K, "*": T.Q4_K}, n_embd=256, head_dim=64, n_ff=256
    )
    with pytest.raises(UnsupportedQuantError, match=r"Q8_K in tensor blk\.0\.attn_k\.weight"):
        LLM(path, **LLM_KW)


@pytest.mark.parametrize(
    "arch,tensor",
    [
        ("llama", "blk.1.ffn_gate.weight"),
        ("llama", "output_norm.weight"),
        ("llama", "token_embd.weight"),
        ("qwen2", "blk.0.attn_v.bias"),
        ("qwen3", "blk.1.attn_k_norm.weight"),
        ("gemma3", "blk.0.post_ffw_norm.weight"),
    ],
)
def test_missing_tensor(tmp_path: Path, arch: str, tensor: str) -> None:
    path = write_tiny_model(tmp_path / "m.gguf", arch, skip_tensors=[tensor])
    with pytest.raises(GGUFError, match=rf"missing tensor '{tensor}'"):
        LLM(path, **LLM_KW)


def test_more_blocks_than_tensors(tmp_path: Path) -> None:
    path = write_tiny_model(tmp_path / "m.gguf", "llama", metadata_overrides={"llama.block_count": 3})
    with pytest.raises(GGUFError, match=r"missing tensor 'blk\.2\."):
        LLM(path, **LLM_KW)


@pytest.mark.parametrize(
    "arch,tensor,shape,expected",
    [
        ("llama", "blk.0.ffn_up.weight", (96, 64), (128, 64)),
        ("llama", "blk.1.attn_output.weight", (64, 32), (64, 64)),
        ("qwen2", "blk.1.attn_q.bias", (32,), (64,)),
        ("gemma3", "blk.0.attn_q_norm.weight", (32,), (16,)),
        ("llama", "output.weight", (288, 32), (288, 64)),
    ],
)
def test_mis_shaped_tensor(
    tmp_path: Path, arch: str, tensor: str, shape: tuple[int, ...], expected: tuple[int, ...]
) -> None:
    path = write_tiny_model(tmp_path / "m.gguf", arch, "F32", shape_overrides={tensor: shape})
    esc = tensor.replace(".", r"\.")
    with pytest.raises(
        GGUFError, match=rf"tensor '{esc}' has shape \({shape[0]},.*\), expected \({expected[0]},"
    ):
        LLM(path, **LLM_KW)


@pytest.mark.parametrize(
    "arch,key",
    [
        ("llama", "llama.embedding_length"),
        ("llama", "llama.block_count"),
        ("qwen2", "qwen2.attention.head_count"),
        ("gemma3", "gemma3.feed_forward_length"),
    ],
)
def test_missing_required_metadata(tmp_path: Path, arch: str, key: str) -> None:
    path = write_tiny_model(tmp_path / "m.gguf", arch, metadata_overrides={key: None})
    with pytest.raises(GGUFError, match=rf"missing metadata key '{key}'"):
        LLM(path, **LLM_KW)


@pytest.mark.parametrize(
    "key,message",
    [
        ("tokenizer.ggml.model", "no tokenizer.ggml.model"),
        ("tokenizer.ggml.tokens", "no tokenizer.ggml.tokens"),
        ("tokenizer.ggml.merges", "without tokenizer.ggml.merges"),
    ],
)
def test_missing_tokenizer_metadata(tmp_path: Path, key: str, message: str) -> None:
    path = write_tiny_model(tmp_path / "m.gguf", "qwen2", metadata_overrides={key: None})
    with pytest.raises(TokenizerError, match=message):
        LLM(path, **LLM_KW)


def test_heads_not_multiple_of_kv_heads(tmp_path: Path) -> None:
    path = write_tiny_model(tmp_path / "m.gguf", "llama", n_heads=4, n_kv_heads=3)
    with pytest.raises(GGUFError, match="4 attention heads are not a multiple of 3 KV heads"):
        LLM(path, **LLM_KW)


# ---- invalid values that once slipped through -------------------------------------------------------------
def test_zero_alignment_is_a_clear_error(tmp_path: Path) -> None:
    path = write_tiny_model(tmp_path / "m.gguf", "llama", metadata_overrides={"general.alignment": 0})
    with pytest.raises(GGUFError, match="general.alignment"):
        load_gguf(path)


def test_non_power_of_two_alignment_is_rejected(tmp_path: Path) -> None:
    path = write_tiny_model(tmp_path / "m.gguf", "llama", metadata_overrides={"general.alignment": 3})
    with pytest.raises(GGUFError, match="general.alignment"):
        load_gguf(path)


@pytest.mark.parametrize("key", ["llama.attention.head_count", "llama.attention.head_count_kv"])
def test_zero_heads_is_a_clear_error(tmp_path: Path, key: str) -> None:
    path = write_tiny_model(tmp_path / "m.gguf", "llama", metadata_overrides={key: 0})
    with pytest.raises(GGUFError, match=key.removeprefix("llama.")):
        LLM(path, **LLM_KW)


def test_embedding_smaller_than_vocabulary_fails_at_load(tmp_path: Path) -> None:
    shapes = {"token_embd.weight": (200, 64), "output.weight": (200, 64)}  # the vocabulary has 288 tokens
    path = write_tiny_model(tmp_path / "m.gguf", "llama", shape_overrides=shapes)
    with pytest.raises(GGUFError, match=r"token_embd\.weight"):
        LLM(path, **LLM_KW)


def test_duplicate_tensor_name_is_rejected(tmp_path: Path, tiny_bytes: tuple[bytes, Any]) -> None:
    raw = tiny_bytes[0]
    at = record_start(raw, "blk.0.attn_k.weight") + 8
    path = write(tmp_path, raw[:at] + b"blk.0.attn_q.weight" + raw[at + 19 :])
    with pytest.raises(GGUFError, match=r"duplicate.*blk\.0\.attn_q\.weight"):
        load_gguf(path)
