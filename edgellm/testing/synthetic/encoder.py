"""Tiny random-weight BERT-family encoders (bert, nomic-bert) with a small WordPiece vocabulary, written as
llama.cpp's converter lays them out (convert_hf_to_gguf.py BertModel / NomicBertModel): the same keys,
value types and tensor names, so llama.cpp and edgellm load the same file (scripts/fixtures/
make_encoder_fixtures.py records llama.cpp's vectors and scores; tests/gguf/test_encoders.py compares).

The vocabulary keeps BERT's special ids ([PAD] 0, [UNK] 100, [CLS] 101, [SEP] 102, [MASK] 103, [unusedN]
between), then words as the converter writes them: a word start "▁word", a continuation "word" (HF's
"##word").
"""

from __future__ import annotations

import math
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType

from edgellm.testing.encode import encode_tensor

T = GGMLQuantizationType
ENCODER_ARCHS = (
    "bert",
    "nomic-bert",
    "jina-bert-v2",
)  # tests/gguf/test_encoders.py's, apart from the decoders' oracle cases
PHANTOM = "\u2581"
WORDS = (
    "the",
    "a",
    "an",
    "is",
    "of",
    "and",
    "to",
    "in",
    "it",
    "cat",
    "dog",
    "sat",
    "on",
    "mat",
    "paris",
    "capital",
    "france",
    "what",
    "where",
    "hello",
    "world",
    "play",
    "run",
    "quick",
    "brown",
    "fox",
    "cafe",
    "naive",
    "resume",
    "embed",
    "rank",
    "query",
    "document",
)
SUFFIXES = ("ing", "ed", "s", "er", "ly")
PUNCT = tuple(".,!?;:'\"()-")


def wordpiece_vocab() -> tuple[list[str], list[int]]:
    """(tokens, token types) of the tiny WordPiece vocabulary."""
    tokens = ["[PAD]"] + [f"[unused{i}]" for i in range(1, 100)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    types = [3] * 100 + [2, 3, 3, 3]  # CONTROL; [UNK] UNKNOWN
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)] + [str(d) for d in range(10)]
    normal = [PHANTOM + w for w in WORDS] + [PHANTOM + c for c in letters] + list(letters)
    normal += list(SUFFIXES) + [PHANTOM + p for p in PUNCT] + [PHANTOM + "\u4e2d", PHANTOM + "\u6587"]
    normal = list(dict.fromkeys(normal))  # each text once: llama.cpp asserts a one-to-one vocabulary
    tokens += normal
    types += [1] * len(normal)
    return tokens, types


def write_tiny_encoder(
    path: str | Path,
    arch: str = "bert",
    *,
    pooling: int = 1,
    reranker: bool = False,
    n_layers: int = 2,
    n_embd: int = 64,
    n_heads: int = 4,
    n_ff: int = 128,
    context_length: int = 128,
    qtype: GGMLQuantizationType = T.F32,
    fused_qkv: bool | None = None,
    gate_in_up: bool = False,
    seed: int = 0,
) -> Path:
    """A tiny `arch` encoder (bert or nomic-bert) with {arch}.pooling_type `pooling` (0 none, 1 mean,
    2 cls, 3 last, 4 rank); `reranker`: with the classification head (cls, cls.output: one label; jina:
    one cls row) and
    pooling rank. Matrices in `qtype`; norms, biases and embeddings F32. nomic-bert: fused Q|K|V by
    default, as its converter writes it. jina-bert-v2: Q and K norms, attn_norm_2, and a separate ffn_gate,
    or with `gate_in_up` the gate as the first half of a 2 * n_ff ffn_up."""
    if arch not in ENCODER_ARCHS:
        raise ValueError(f"unknown encoder {arch!r}")
    if reranker:
        pooling = 4
    fused = arch == "nomic-bert" if fused_qkv is None else fused_qkv
    path = Path(path)
    rng = np.random.default_rng(seed)
    tokens, types = wordpiece_vocab()
    e, f = n_embd, n_ff
    w = gguf.GGUFWriter(path, arch)
    p = arch + "."
    w.add_uint32(p + "context_length", context_length)
    w.add_uint32(p + "embedding_length", e)
    w.add_uint32(p + "feed_forward_length", f)
    w.add_uint32(p + "block_count", n_layers)
    w.add_uint32(p + "attention.head_count", n_heads)
    w.add_float32(p + "attention.layer_norm_epsilon", 1e-12)
    w.add_bool(p + "attention.causal", False)
    w.add_uint32(p + "pooling_type", pooling)
    if arch == "nomic-bert":
        w.add_float32(p + "rope.freq_base", 1000.0)
    if reranker:
        w.add_array(p + "classifier.output_labels", ["LABEL_0"])
    w.add_string("tokenizer.ggml.model", "bert")
    w.add_array("tokenizer.ggml.tokens", tokens)
    w.add_array("tokenizer.ggml.token_type", types)
    w.add_uint32("tokenizer.ggml.token_type_count", 2)
    for key, tid in (("bos", 101), ("seperator", 102), ("unknown", 100), ("padding", 0), ("cls", 101),
                     ("mask", 103)):  # fmt: skip
        w.add_uint32(f"tokenizer.ggml.{key}_token_id", tid)

    shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (len(tokens), e), "token_types.weight": (2, e)}
    if arch == "bert":
        shapes["position_embd.weight"] = (context_length, e)
    shapes.update({"token_embd_norm.weight": (e,), "token_embd_norm.bias": (e,)})
    for il in range(n_layers):
        b = f"blk.{il}."
        if fused:
            shapes.update({b + "attn_qkv.weight": (3 * e, e), b + "attn_qkv.bias": (3 * e,)})
        else:
            for n in "qkv":
                shapes.update({b + f"attn_{n}.weight": (e, e), b + f"attn_{n}.bias": (e,)})
        shapes.update({b + "attn_output.weight": (e, e), b + "attn_output.bias": (e,),
                       b + "attn_output_norm.weight": (e,), b + "attn_output_norm.bias": (e,)})  # fmt: skip
        if arch == "jina-bert-v2":
            for n in ("attn_q_norm", "attn_k_norm", "attn_norm_2"):
                shapes.update({b + n + ".weight": (e,), b + n + ".bias": (e,)})
        if arch == "nomic-bert" or (arch == "jina-bert-v2" and not gate_in_up):
            shapes[b + "ffn_gate.weight"] = (f, e)
        shapes.update({b + "ffn_up.weight": (f, e), b + "ffn_up.bias": (f,), b + "ffn_down.weight": (e, f),
                       b + "ffn_down.bias": (e,), b + "layer_output_norm.weight": (e,),
                       b + "layer_output_norm.bias": (e,)})  # fmt: skip
        if arch == "nomic-bert":  # its converter writes no FFN biases (llama.cpp would ignore them)
            del shapes[b + "ffn_up.bias"], shapes[b + "ffn_down.bias"]
        if gate_in_up:
            shapes.update({b + "ffn_up.weight": (2 * f, e), b + "ffn_up.bias": (2 * f,)})
    if reranker and arch == "jina-bert-v2":  # jina-reranker-v1: one cls row and tanh, no cls.output
        shapes.update({"cls.weight": (1, e), "cls.bias": (1,)})
    elif reranker:
        shapes.update({"cls.weight": (e, e), "cls.bias": (e,), "cls.output.weight": (1, e),
                       "cls.output.bias": (1,)})  # fmt: skip
    for name, shape in shapes.items():
        role = name.removeprefix("blk.").split(".", 1)[-1] if name.startswith("blk.") else name
        if "norm" in role and role.endswith("weight"):
            mean, std = 1.0, 0.1
        elif role.endswith("bias"):
            mean, std = 0.0, 0.1
        elif name in ("token_embd.weight", "token_types.weight", "position_embd.weight"):
            mean, std = 0.0, 1.0
        elif name == "cls.output.weight":  # scores spread over a few units: their order is clear
            mean, std = 0.0, 1.0
        else:
            mean, std = 0.0, 1.0 / math.sqrt(shape[-1])
        q = qtype if len(shape) == 2 and not name.startswith(("token_", "position_")) else T.F32
        if name == "cls.output.weight":
            q = T.F32  # one row
        data = encode_tensor(q, shape, std, mean, rng)
        w.add_tensor(name, data, raw_dtype=None if q == T.F32 else q)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
