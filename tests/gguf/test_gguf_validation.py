"""Metadata and tensor tables that once crashed, froze or misled the loader now fail at load with a GGUFError
naming the key and the values (issue #10). The heap-corruption cases run in a child process: before the
validator they killed the process (SIGSEGV / malloc aborts) inside a Numba kernel.
"""

from __future__ import annotations

import struct
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import GGUFValueType as V

from edgellm import LLM
from edgellm.gguf.config import config_from_gguf
from edgellm.gguf.load import load_gguf
from edgellm.gguf.reader import GGUFError
from edgellm.gguf.validation import tokenizer_from_gguf, validate_model
from edgellm.testing.gguf.edit import record_start, write
from edgellm.testing.limits import HANG_S
from edgellm.testing.paths import ROOT
from edgellm.testing.synthetic.models import spm_vocab, write_tiny_model

LLM_KW = dict(n_ctx=64, kv_cache_memory=1 << 20, threads=1)
REPO = ROOT

# Loads a model and greedily generates 2 tokens; prints the GGUFError's message when loading refuses it.
CHILD = textwrap.dedent(
    """
    import sys
    from edgellm import LLM
    from edgellm.gguf.reader import GGUFError
    from edgellm.sampling.sampler import SamplingParams
    try:
        llm = LLM(sys.argv[1], n_ctx=64, kv_cache_memory=1 << 20, threads=1)
    except GGUFError as e:
        print("GGUFError:", e)
    else:
        out = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=2, temperature=0))
        print("generated", out[0].token_ids)
    """
)


def load_in_child(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", CHILD, str(path)], cwd=REPO, capture_output=True, text=True, timeout=HANG_S
    )


@pytest.mark.parametrize(
    "kwargs,key",
    [
        (dict(metadata_overrides={"llama.rope.dimension_count": 1000}), "llama.rope.dimension_count = 1000"),
        (
            dict(
                n_heads=36, n_kv_heads=12, head_dim=1, metadata_overrides={"llama.rope.dimension_count": 64}
            ),
            "llama.rope.dimension_count = 64",
        ),
        (
            dict(
                n_heads=576, n_kv_heads=192, head_dim=1, metadata_overrides={"llama.rope.dimension_count": 64}
            ),
            "llama.rope.dimension_count = 64",
        ),
    ],
    ids=["rope-1000", "heads-36-12-rope-64", "heads-576-192-rope-64"],
)
def test_rope_wider_than_head_is_an_error_not_heap_corruption(
    tmp_path: Path, kwargs: dict[str, Any], key: str
) -> None:
    """F32 weights, so that tensors shaped for 1-wide heads are valid files: only the rope width is wrong."""
    path = write_tiny_model(tmp_path / "m.gguf", "llama", "F32", **kwargs)
    proc = load_in_child(path)
    assert proc.returncode == 0, f"child died with {proc.returncode}: {proc.stderr[-2000:]}"
    assert "GGUFError:" in proc.stdout and key in proc.stdout, proc.stdout + proc.stderr[-2000:]
    assert "head size" in proc.stdout


def test_valid_model_loads_and_generates_in_child(tmp_path: Path) -> None:
    """The child script itself works: a valid model generates."""
    proc = load_in_child(write_tiny_model(tmp_path / "m.gguf", "qwen3"))
    assert proc.returncode == 0 and "generated [" in proc.stdout, proc.stdout + proc.stderr[-2000:]


# ---- reader ------------------------------------------------------------------------------------------------
def tensor_dims_offset(raw: bytes, name: str) -> int:
    """Offset of ne[0] in a tensor-info record: name, n_dims (u32), ne[n_dims] (u64 each), type, offset."""
    return record_start(raw, name) + 8 + len(name) + 4


@pytest.mark.parametrize("dim", [1, 0], ids=["ne1", "ne0"])
def test_tensor_dim_of_two_to_the_63(tmp_path: Path, dim: int) -> None:
    raw = write_tiny_model(tmp_path / "ok.gguf", "llama").read_bytes()
    at = tensor_dims_offset(raw, "blk.0.attn_q.weight") + 8 * dim
    path = write(tmp_path, raw[:at] + struct.pack("<Q", 2**63 + (32 if dim == 0 else 0)) + raw[at + 8 :])
    with pytest.raises(GGUFError, match=r"blk\.0\.attn_q\.weight"):
        load_gguf(path)


def test_zero_tensor_dim(tmp_path: Path) -> None:
    raw = write_tiny_model(tmp_path / "ok.gguf", "llama").read_bytes()
    at = tensor_dims_offset(raw, "blk.0.attn_k.weight") + 8
    path = write(tmp_path, raw[:at] + struct.pack("<Q", 0) + raw[at + 8 :])
    with pytest.raises(GGUFError, match=r"'blk\.0\.attn_k\.weight': empty dimension"):
        load_gguf(path)


def insert_metadata(raw: bytes, key: str, vtype: int, payload: bytes) -> bytes:
    """A copy of a GGUF file with one more metadata record first, and a string record "general.pad" after it
    sized so that the tensor data keeps its alignment (32)."""
    record = struct.pack("<Q", len(key)) + key.encode() + struct.pack("<I", vtype) + payload
    pad_key = b"general.pad"
    pad_len = -(len(record) + 8 + len(pad_key) + 4 + 8) % 32
    record += struct.pack("<Q", len(pad_key)) + pad_key
    record += struct.pack("<IQ", V.STRING, pad_len) + b"p" * pad_len
    (n_kv,) = struct.unpack_from("<Q", raw, 16)
    return raw[:16] + struct.pack("<Q", n_kv + 2) + record + raw[24:]


def nested_array(depth: int) -> bytes:
    """`depth` arrays, each holding one array, around an empty uint8 array."""
    return struct.pack("<IQ", V.ARRAY, 1) * (depth - 1) + struct.pack("<IQ", V.UINT8, 0)


def test_arrays_nested_5000_deep(tmp_path: Path) -> None:
    raw = write_tiny_model(tmp_path / "ok.gguf", "llama").read_bytes()
    path = write(tmp_path, insert_metadata(raw, "x.nested", V.ARRAY, nested_array(5000)))
    with pytest.raises(GGUFError, match=r"x\.nested nests arrays more than 8 deep"):
        load_gguf(path)


def test_arrays_nested_a_few_deep_still_load(tmp_path: Path) -> None:
    raw = write_tiny_model(tmp_path / "ok.gguf", "llama").read_bytes()
    g = load_gguf(write(tmp_path, insert_metadata(raw, "general.nested", V.ARRAY, nested_array(3))))
    assert len(g.metadata["general.nested"][0][0]) == 0
    validate_model(g, config_from_gguf(g))


def test_misaligned_tensor_offset(tmp_path: Path) -> None:
    raw = write_tiny_model(tmp_path / "ok.gguf", "llama").read_bytes()
    name = "blk.1.ffn_up.weight"
    at = tensor_dims_offset(raw, name) + 8 * 2 + 4  # after ne[2] and the type: the offset field
    (offset,) = struct.unpack_from("<Q", raw, at)
    path = write(tmp_path, raw[:at] + struct.pack("<Q", offset + 4) + raw[at + 8 :])
    with pytest.raises(GGUFError, match=rf"'{name}': data offset {offset + 4} is not a multiple of .* 32"):
        load_gguf(path)


def test_duplicate_metadata_key(tmp_path: Path) -> None:
    raw = write_tiny_model(tmp_path / "ok.gguf", "llama").read_bytes()
    key = "general.name"
    record = record_start(raw, key)
    path = write(tmp_path, raw[:record] + struct.pack("<Q", len("general.type")) + b"general.type" + raw[
        record + 8 + len(key) :
    ])  # fmt: skip
    with pytest.raises(GGUFError, match=r"duplicate metadata key 'general\.type'"):
        load_gguf(path)


def test_alignment_of_the_wrong_type(tmp_path: Path) -> None:
    path = write_tiny_model(tmp_path / "m.gguf", "llama", metadata_overrides={"general.alignment": "32"})
    with pytest.raises(GGUFError, match=r"general\.alignment '32' is not a positive power of two"):
        load_gguf(path)


# ---- metadata values ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "arch,key,value,message",
    [
        ("llama", "llama.attention.key_length", 0, "key_length = 0 is out of range: must be 1..512"),
        ("llama", "llama.embedding_length", 0, "embedding_length = 0 is out of range"),
        ("llama", "llama.block_count", 0, "block_count = 0 is out of range"),
        ("llama", "llama.rope.dimension_count", 2**32 - 1, "rope.dimension_count = 4294967295 must be even"),
        ("llama", "llama.rope.dimension_count", 15, "rope.dimension_count = 15 must be even"),
        ("llama", "llama.context_length", 0, "context_length = 0 is out of range: must be 2.."),
        ("llama", "llama.context_length", 1, "context_length = 1 is out of range: must be 2.."),
        ("llama", "llama.feed_forward_length", 0, "feed_forward_length = 0 is out of range"),
        ("llama", "llama.attention.layer_norm_rms_epsilon", -1.0, "layer_norm_rms_epsilon = -1.0 is out of"),
        ("llama", "llama.rope.freq_base", float("nan"), "freq_base = nan is out of range"),
        (
            "gemma3",
            "gemma3.attention.value_length",
            1024,
            "value_length = 1024 is out of range: must be 1..512",
        ),
        ("gemma3", "gemma3.final_logit_softcapping", float("inf"), "final_logit_softcapping = inf is out"),
        ("qwen2", "qwen2.attention.head_count_kv", 8, r"head_count_kv = 8 is out of range: must be 1\.\.4"),
    ],
)
def test_out_of_range_metadata(tmp_path: Path, arch: str, key: str, value: Any, message: str) -> None:
    """Each of these raised ZeroDivisionError / MemoryError, or loaded a model that refused every prompt."""
    path = write_tiny_model(tmp_path / "m.gguf", arch, metadata_overrides={key: value})
    with pytest.raises(GGUFError, match=message) as exc:
        LLM(path, **LLM_KW)
    assert str(path) in str(exc.value)


def retype_u32(raw: bytes, key: str, vtype: int, value: bytes) -> bytes:
    """Rewrite a u32 metadata record's type and 4-byte value in place (same length)."""
    at = record_start(raw, key) + 8 + len(key)
    return raw[:at] + struct.pack("<I", vtype) + value + raw[at + 8 :]


def test_block_count_two_to_the_40(tmp_path: Path) -> None:
    """A u64 block_count (the synthetic writer keeps the u32 type): MemoryError before the bound."""
    path = write_tiny_model(tmp_path / "ok.gguf", "llama", metadata_overrides={"llama.block_count": None})
    raw = insert_metadata(path.read_bytes(), "llama.block_count", V.UINT64, struct.pack("<Q", 2**40))
    path = write(tmp_path, raw)
    with pytest.raises(
        GGUFError, match=r"block_count = 1099511627776 is out of range: must be 1\.\.\d+ \(\d+ tensors"
    ):
        LLM(path, **LLM_KW)


def test_negative_context_length(tmp_path: Path) -> None:
    raw = write_tiny_model(tmp_path / "ok.gguf", "llama").read_bytes()
    path = write(tmp_path, retype_u32(raw, "llama.context_length", V.INT32, struct.pack("<i", -5)))
    with pytest.raises(GGUFError, match=r"llama\.context_length = -5 is out of range"):
        LLM(path, **LLM_KW)


@pytest.mark.parametrize(
    "vtype,value,message",
    [
        (V.FLOAT32, struct.pack("<f", 2.0), "must be an integer, got float 2.0"),
        (V.BOOL, b"\x01\x00\x00\x00", "must be an integer, got bool True"),
    ],
)
def test_integer_key_of_another_type(tmp_path: Path, vtype: int, value: bytes, message: str) -> None:
    """A 4-byte value of another type: the file stays the same length, only the key's type is wrong. (A
    BOOL takes one byte, so its record also swallows 3 bytes of the next one: that is caught later.)"""
    raw = write_tiny_model(tmp_path / "ok.gguf", "llama").read_bytes()
    path = write(tmp_path, retype_u32(raw, "llama.block_count", vtype, value))
    with pytest.raises(GGUFError):
        LLM(path, **LLM_KW)
    if vtype == V.FLOAT32:
        with pytest.raises(GGUFError, match=rf"llama\.block_count {message}"):
            LLM(path, **LLM_KW)


@pytest.mark.parametrize(
    "key,value,message",
    [
        ("llama.block_count", "2", r"llama\.block_count must be an integer, got str '2'"),
        ("llama.embedding_length", np.array([64], np.uint32), "must be an integer, got an array of 1 uint32"),
        ("llama.rope.freq_base", "1e4", r"rope\.freq_base must be a number, got str"),
        ("general.name", 3, r"general\.name must be a string, got int 3"),
        ("general.architecture", 7, "metadata has no general.architecture"),
    ],
)
def test_value_of_the_wrong_type(tmp_path: Path, key: str, value: Any, message: str) -> None:
    """Values as the reader returns them for other GGUF types (set on the parsed file)."""
    g = load_gguf(write_tiny_model(tmp_path / "m.gguf", "llama"))
    g.metadata[key] = value
    with pytest.raises(GGUFError, match=message):
        config_from_gguf(g)


def test_per_layer_kv_head_arrays(tmp_path: Path) -> None:
    key = "llama.attention.head_count_kv"
    g = load_gguf(write_tiny_model(tmp_path / "m.gguf", "llama"))
    g.metadata[key] = np.array([2, 2], np.uint32)
    assert config_from_gguf(g).n_kv_heads == 2
    g.metadata[key] = np.array([2, 4], np.uint32)
    with pytest.raises(GGUFError, match=r"head_count_kv is a per-layer array \[2, 4\]"):
        config_from_gguf(g)


# ---- tensors and types -------------------------------------------------------------------------------------
def test_unsupported_tensor_type_is_a_gguf_error(tmp_path: Path) -> None:
    path = write_tiny_model(tmp_path / "m.gguf", "llama", {"blk.0.attn_v.weight": T.NVFP4, "*": T.Q8_0})
    with pytest.raises(GGUFError, match=r"unsupported tensor type NVFP4 in tensor blk\.0\.attn_v\.weight"):
        LLM(path, **LLM_KW)


def test_unknown_architecture_is_a_gguf_error(tmp_path: Path) -> None:
    path = write_tiny_model(
        tmp_path / "m.gguf", "qwen2", metadata_overrides={"general.architecture": "rwkv7"}
    )
    with pytest.raises(GGUFError, match=r"unsupported architecture 'rwkv7'"):
        LLM(path, **LLM_KW)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "gemma3"])
def test_validator_accepts_every_synthetic_architecture(tmp_path: Path, arch: str) -> None:
    g = load_gguf(write_tiny_model(tmp_path / "m.gguf", arch))
    validate_model(g, config_from_gguf(g))


def test_validator_accepts_the_real_models(smollm2_path: Path, gemma3_path: Path) -> None:
    for path in (smollm2_path, gemma3_path):
        g = load_gguf(path)
        validate_model(g, config_from_gguf(g))


@pytest.mark.parametrize(
    "key,value,message",
    [
        ("tokenizer.ggml.tokens", [1, 2], "tokenizer.ggml.tokens must be an array of strings"),
        ("tokenizer.ggml.model", "t5", "unsupported tokenizer.ggml.model 't5'"),
        ("tokenizer.ggml.bos_token_id", 100000, "bos_token_id = 100000 is outside the vocabulary of 288"),
        ("tokenizer.ggml.token_type", [1, 1, 1], "token_type has 3 entries for 288 tokens"),
        ("tokenizer.ggml.add_bos_token", "yes", "add_bos_token must be a bool"),
    ],
)
def test_tokenizer_metadata_types(tmp_path: Path, key: str, value: Any, message: str) -> None:
    path = write_tiny_model(tmp_path / "m.gguf", "llama", metadata_overrides={key: None})
    g = load_gguf(path)
    cfg = config_from_gguf(g)
    g.metadata[key] = np.asarray(value, np.int32) if key.endswith("token_type") else value
    with pytest.raises(GGUFError, match=message):
        validate_model(g, cfg)


def test_head_size_limit_is_the_cuda_kernels():
    """MAX_HEAD_DIM is duplicated in gguf/config.py so that loading never imports the CUDA backend."""
    from edgellm.backends.cuda.config import MAX_HEAD_DIM as CUDA_MAX_HEAD_DIM
    from edgellm.gguf.config import MAX_HEAD_DIM

    assert MAX_HEAD_DIM == CUDA_MAX_HEAD_DIM


def test_a_vocabulary_without_byte_fallback_tokens_is_a_gguf_error_at_load(tmp_path: Path) -> None:
    """A SentencePiece vocabulary missing a byte token used to load and then fail every encode with a bare
    TokenizerError; it is refused at load, naming the file and the key."""
    tokens, types, _ = spm_vocab()
    newline = tokens.index("<0x0A>")
    tokens[newline], types[newline] = "<0x0A>x", 1  # an ordinary piece now: no token spells byte 0x0A
    path = write_tiny_model(
        tmp_path / "m.gguf",
        "gemma3",
        n_layers=1,
        metadata_overrides={"tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types},
    )
    g = load_gguf(path)
    validate_model(g, config_from_gguf(g))
    with pytest.raises(GGUFError) as exc:
        tokenizer_from_gguf(g)
    assert str(path) in str(exc.value) and "tokenizer.ggml.tokens" in str(exc.value)
    assert "lacks 1 of the 256 byte-fallback tokens (<0x0A>)" in str(exc.value)
