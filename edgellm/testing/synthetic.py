"""Tiny synthetic GGUF models (random weights) for end-to-end tests of loading, forward passes and backends.

`write_tiny_model(path, arch)` writes a complete GGUF file the way llama.cpp's converters lay one out for
that architecture: the same metadata keys and value types (`llama.*`, `qwen2.*`, `qwen3.*`, `gemma3.*`,
`tokenizer.ggml.*`), the same tensor names and shapes, and a tiny but valid tokenizer (a byte-level BPE
vocabulary for llama/qwen, a SentencePiece 'llama' vocabulary for Gemma 3). A 2-layer, 64-wide model is
a few hundred KiB, loads in milliseconds and runs through every code path of the real models.

Weights are random (seeded), encoded by encode.py: through `gguf.quants.quantize` where gguf-py can
quantize the type; Q4_K / Q6_K by our reference quantizers when asked (`quantize_kquants`); any other type
as random raw blocks scaled to the intended spread. Read the weights back with `gguf.quants.dequantize`
(or `gguf.GGUFReader`) to build a reference. `n_vocab` pads the vocabulary with control tokens to a real
model's size (the LM head and the argmax then have real shapes: see real_shapes.py).

Hooks for error-path tests and oracle cases (testing/oracle_cases.py): `metadata_overrides` (a value of None
deletes the key; `Typed` gives a new key its GGUF type), `extra_tensors` (biases, `rope_freqs.weight`, or any
tensor the architecture does not write), `skip_tensors`, `shape_overrides` (writes a tensor with another
shape) and per-tensor `qtypes`. The bytes are a function of the arguments alone (same arguments and seed,
same file), so a fixture can record the file's sha256.

Example:
    path = write_tiny_model(tmp_path / "tiny.gguf", "qwen3", qtypes={"*": "Q8_0", "ffn_down": "F16"})
    llm = LLM(path, n_ctx=128, kv_cache_memory=1 << 20)
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType

from edgellm.testing.encode import encode_tensor
from edgellm.testing.harmony import HARMONY_SPECIALS, HARMONY_TEMPLATE
from edgellm.testing.synthetic_lfm2 import lfm2_metadata, lfm2_shapes
from edgellm.testing.tiny_vocab import CONTROL, bpe_vocab, spm_vocab

T = GGMLQuantizationType
ARCHS = (
    "llama", "qwen2", "qwen3", "gemma2", "gemma3", "granite", "olmo2", "starcoder2", "gpt2", "phi3",
    "smollm3", "qwen3moe", "olmoe", "qwen2moe", "lfm2", "gpt-oss",
)
LAYER_NORM_ARCHS = ("starcoder2", "gpt2")  # LayerNorm with biases, biased ungated MLP (layer_norm_shapes)
# always with experts (llama: with n_expert > 0, as Mixtral)
MOE_ARCHS = ("qwen3moe", "olmoe", "qwen2moe", "gpt-oss")
EXPERT_WIDTH_ARCHS = ("qwen3moe", "qwen2moe", "gpt-oss")  # expert_feed_forward_length (llama, OLMoE: n_ff)
DEFAULT_N_EXPERT = 4
GEMMA_ARCHS = ("gemma2", "gemma3")  # SentencePiece vocabulary, head size always written
POST_NORM_ARCHS = ("gemma2", "gemma3", "olmo2")  # post_attention_norm and post_ffw_norm
# written by llama.cpp's LlamaModel converter (and its subclasses)
LLAMA_ROPE_ARCHS = ("llama", "granite", "smollm3")
# Phi-3's converter keeps the checkpoint's fused attn_qkv and gate|up (ffn_up of 2 * n_ff rows, no ffn_gate)
FUSED_ARCHS = ("phi3",)
# Granite's four multipliers (the real 3.x 2B has 12, 0.22, 1/64 and 8: with tiny random weights those
# leave the embedding so dominant that a wrong attention scale moves the logits by NMSE 1e-5 only). These
# each move them by NMSE 5e-3 or more when dropped.
BPE_PRE = {
    "llama": "default", "granite": "default", "smollm3": "default", "starcoder2": "starcoder",
    "gpt2": "gpt-2", "lfm2": "lfm2", "gpt-oss": "gpt-4o",
}  # fmt: skip
GRANITE_SCALES = {"embedding_scale": 2.0, "residual_scale": 0.5, "attention.scale": 0.5, "logit_scale": 2.0}

# A mix of the block-32 types (n_embd=64 rows cannot hold the 256-wide k-quant blocks). Keys are tensor
# roles (the name without "blk.N." and ".weight"), full tensor names, or "*" for every other matrix.
DEFAULT_QTYPES: dict[str, GGMLQuantizationType] = {
    "*": T.Q8_0,
    "attn_q": T.Q4_0,
    "attn_k": T.Q4_1,
    "attn_v": T.Q5_0,
    "attn_output": T.Q5_1,
    "ffn_gate": T.Q4_0,
    "ffn_up": T.Q8_0,
    "ffn_down": T.F16,
    "output": T.Q8_0,
}


@dataclass(frozen=True)
class Typed:
    """A metadata value with its GGUF type, for keys the writer does not know (llama.cpp refuses a key of
    the wrong type: a UINT32 key written as the INT32 a Python int infers fails to load)."""

    value: Any
    vtype: GGUFValueType
    sub_type: GGUFValueType | None = None  # element type of an ARRAY


def tensor_shapes(
    arch: str,
    n_layers: int,
    n_embd: int,
    n_heads: int,
    n_kv_heads: int,
    head_dim: int,
    n_ff: int,
    n_vocab: int,
    tied: bool,
) -> dict[str, tuple[int, ...]]:
    """Tensor name -> numpy-order shape (rows, cols) as llama.cpp's loader expects them, in file order."""
    if arch in LAYER_NORM_ARCHS:
        return layer_norm_shapes(arch, n_layers, n_embd, n_kv_heads * head_dim, n_ff, n_vocab, tied)
    if arch == "lfm2":
        return lfm2_shapes(n_layers, n_embd, n_kv_heads, head_dim, n_ff, n_vocab, tied)
    shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (n_vocab, n_embd)}
    q_rows, kv_rows = n_heads * head_dim, n_kv_heads * head_dim
    for il in range(n_layers):
        p = f"blk.{il}."
        if arch != "olmo2":  # OLMo 2 norms after the blocks only
            shapes[p + "attn_norm.weight"] = (n_embd,)
        if arch in FUSED_ARCHS:
            shapes[p + "attn_qkv.weight"] = (q_rows + 2 * kv_rows, n_embd)
        else:
            shapes[p + "attn_q.weight"] = (q_rows, n_embd)
            shapes[p + "attn_k.weight"] = (kv_rows, n_embd)
            shapes[p + "attn_v.weight"] = (kv_rows, n_embd)
        if arch in ("qwen2", "qwen2moe", "gpt-oss"):
            shapes[p + "attn_q.bias"] = (q_rows,)
            shapes[p + "attn_k.bias"] = (kv_rows,)
            shapes[p + "attn_v.bias"] = (kv_rows,)
        if arch in ("qwen3", "gemma3", "qwen3moe"):
            shapes[p + "attn_q_norm.weight"] = (head_dim,)
            shapes[p + "attn_k_norm.weight"] = (head_dim,)
        if arch in ("olmo2", "olmoe"):  # over the whole projection
            shapes[p + "attn_q_norm.weight"] = (q_rows,)
            shapes[p + "attn_k_norm.weight"] = (kv_rows,)
        shapes[p + "attn_output.weight"] = (n_embd, q_rows)
        if arch == "gpt-oss":  # the output bias (required there) and the attention sinks
            shapes[p + "attn_output.bias"] = (n_embd,)
            shapes[p + "attn_sinks.weight"] = (n_heads,)
        if arch in POST_NORM_ARCHS or arch == "gpt-oss":  # gpt-oss: the FFN's pre-norm has this name
            shapes[p + "post_attention_norm.weight"] = (n_embd,)
        if arch not in ("olmo2", "gpt-oss"):
            shapes[p + "ffn_norm.weight"] = (n_embd,)
        if arch in FUSED_ARCHS:
            shapes[p + "ffn_up.weight"] = (2 * n_ff, n_embd)
        else:
            shapes[p + "ffn_gate.weight"] = (n_ff, n_embd)
            shapes[p + "ffn_up.weight"] = (n_ff, n_embd)
        shapes[p + "ffn_down.weight"] = (n_embd, n_ff)
        if arch in POST_NORM_ARCHS:
            shapes[p + "post_ffw_norm.weight"] = (n_embd,)
    shapes["output_norm.weight"] = (n_embd,)
    if not tied and arch != "gemma2":  # Gemma 2's output is always the embedding
        shapes["output.weight"] = (n_vocab, n_embd)
    return shapes


def layer_norm_shapes(
    arch: str, n_layers: int, n_embd: int, kv_rows: int, n_ff: int, n_vocab: int, tied: bool
) -> dict[str, tuple[int, ...]]:
    """StarCoder 2 / GPT-2 tensors as their converters write them: Q as wide as the model, every norm and
    matrix biased, no ffn_gate; GPT-2's fused attn_qkv (write_tiny_model adds its position_embd, one row
    per position of the context)."""
    shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (n_vocab, n_embd)}
    qkv = n_embd + 2 * kv_rows
    for il in range(n_layers):
        p = f"blk.{il}."
        shapes[p + "attn_norm.weight"] = shapes[p + "attn_norm.bias"] = (n_embd,)
        if arch == "gpt2":
            shapes[p + "attn_qkv.weight"], shapes[p + "attn_qkv.bias"] = (qkv, n_embd), (qkv,)
        else:
            for n, rows in (("q", n_embd), ("k", kv_rows), ("v", kv_rows)):
                shapes[p + f"attn_{n}.weight"], shapes[p + f"attn_{n}.bias"] = (rows, n_embd), (rows,)
        shapes[p + "attn_output.weight"], shapes[p + "attn_output.bias"] = (n_embd, n_embd), (n_embd,)
        shapes[p + "ffn_norm.weight"] = shapes[p + "ffn_norm.bias"] = (n_embd,)
        shapes[p + "ffn_up.weight"], shapes[p + "ffn_up.bias"] = (n_ff, n_embd), (n_ff,)
        shapes[p + "ffn_down.weight"], shapes[p + "ffn_down.bias"] = (n_embd, n_ff), (n_embd,)
    shapes["output_norm.weight"] = shapes["output_norm.bias"] = (n_embd,)
    if not tied:
        shapes["output.weight"] = (n_vocab, n_embd)
    return shapes


def with_experts(
    shapes: dict[str, tuple[int, ...]],
    n_embd: int,
    n_expert: int,
    n_ff_exp: int,
    n_ff_shexp: int = 0,
    biases: bool = False,
) -> dict[str, tuple[int, ...]]:
    """`shapes` with each layer's dense FFN replaced by a router and 3-D expert matrices (llama.cpp's
    ffn_gate_inp, ffn_{gate,up,down}_exps: numpy order [expert, rows, cols]), in the dense FFN's place,
    with n_ff_shexp a shared expert and its gate (Qwen 2 MoE's *_shexp), with `biases` the router's and
    each expert's (gpt-oss: ffn_gate_inp.bias [E], ffn_{gate,up}_exps.bias [E, n_ff_exp],
    ffn_down_exps.bias [E, n_embd])."""
    out: dict[str, tuple[int, ...]] = {}
    dense = {"ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"}
    for name, shape in shapes.items():
        il, _, role = name.removeprefix("blk.").partition(".")
        if not name.startswith("blk.") or role not in dense:
            out[name] = shape
        elif role == "ffn_gate.weight":
            p = f"blk.{il}."
            out[p + "ffn_gate_inp.weight"] = (n_expert, n_embd)
            out[p + "ffn_gate_exps.weight"] = (n_expert, n_ff_exp, n_embd)
            out[p + "ffn_up_exps.weight"] = (n_expert, n_ff_exp, n_embd)
            out[p + "ffn_down_exps.weight"] = (n_expert, n_embd, n_ff_exp)
            if biases:
                out[p + "ffn_gate_inp.bias"] = (n_expert,)
                out[p + "ffn_gate_exps.bias"] = (n_expert, n_ff_exp)
                out[p + "ffn_up_exps.bias"] = (n_expert, n_ff_exp)
                out[p + "ffn_down_exps.bias"] = (n_expert, n_embd)
            if n_ff_shexp:
                out[p + "ffn_gate_inp_shexp.weight"] = (n_embd,)
                out[p + "ffn_gate_shexp.weight"] = (n_ff_shexp, n_embd)
                out[p + "ffn_up_shexp.weight"] = (n_ff_shexp, n_embd)
                out[p + "ffn_down_shexp.weight"] = (n_embd, n_ff_shexp)
    return out


def tensor_role(name: str) -> str:
    """'blk.3.attn_q.weight' -> 'attn_q'; 'attn_q.bias' roles keep '.bias'; 'output.weight' -> 'output'."""
    parts = name.split(".")
    if parts[0] == "blk":
        parts = parts[2:]
    return ".".join(parts[:-1]) if parts[-1] == "weight" else ".".join(parts)


def _as_qtype(q: GGMLQuantizationType | str | int) -> GGMLQuantizationType:
    return T[q.upper()] if isinstance(q, str) else T(q)


def pick_qtype(
    name: str, qtypes: Mapping[str, GGMLQuantizationType | str] | GGMLQuantizationType | str | None
) -> GGMLQuantizationType:
    """The type of one tensor: 1-D tensors (norms, biases) are always F32, as llama.cpp writes them."""
    role = tensor_role(name)
    # the MoE router and LFM2's conv kernel too: llama.cpp's quantizer leaves them unquantized
    if role.endswith("norm") or role.endswith(".bias") or role in ("ffn_gate_inp", "shortconv.conv"):
        return T.F32
    if qtypes is None:
        qtypes = DEFAULT_QTYPES
    if not isinstance(qtypes, Mapping):
        return _as_qtype(qtypes)
    for key in (name, role, "*"):
        if key in qtypes:
            return _as_qtype(qtypes[key])
    return T.F32


def _vocab_padding(n_base: int, n_vocab: int | None) -> list[str]:
    """Control tokens that bring a base vocabulary of n_base tokens up to n_vocab."""
    if n_vocab is None:
        return []
    if n_vocab < n_base:
        raise ValueError(f"n_vocab must be at least the base vocabulary's {n_base} tokens, got {n_vocab}")
    return [f"<extra_{i}>" for i in range(n_vocab - n_base)]


def _metadata(
    arch: str,
    n_layers: int,
    n_embd: int,
    n_heads: int,
    n_kv_heads: int,
    head_dim: int,
    n_ff: int,
    context_length: int,
    rope_base: float,
    rms_eps: float,
    sliding_window: int,
    n_vocab: int | None = None,
) -> dict[str, tuple[Any, GGUFValueType, GGUFValueType | None]]:
    """Key -> (value, type, array element type) as llama.cpp's convert_hf_to_gguf.py writes them."""
    U32, F32, STR, BOOL, ARR = (
        GGUFValueType.UINT32,
        GGUFValueType.FLOAT32,
        GGUFValueType.STRING,
        GGUFValueType.BOOL,
        GGUFValueType.ARRAY,
    )
    md: dict[str, tuple[Any, GGUFValueType, GGUFValueType | None]] = {
        "general.type": ("model", STR, None),
        # not "phi3" for phi3: llama.cpp then looks up Phi-3's SentencePiece tokens (</s>), which a tiny BPE
        # vocabulary lacks
        "general.name": ("Tiny Phi 3" if arch == "phi3" else f"Tiny {arch}", STR, None),
        "general.quantization_version": (2, U32, None),
    }
    p = arch + "."
    md[p + "block_count"] = (n_layers, U32, None)
    md[p + "context_length"] = (context_length, U32, None)
    md[p + "embedding_length"] = (n_embd, U32, None)
    md[p + "feed_forward_length"] = (n_ff, U32, None)
    md[p + "attention.head_count"] = (n_heads, U32, None)
    md[p + "attention.head_count_kv"] = (n_kv_heads, U32, None)
    md[p + "rope.freq_base"] = (rope_base, F32, None)
    if arch in LAYER_NORM_ARCHS:
        md[p + "attention.layer_norm_epsilon"] = (rms_eps, F32, None)
        if arch == "gpt2":  # no rope
            del md[p + "rope.freq_base"]
    else:
        md[p + "attention.layer_norm_rms_epsilon"] = (rms_eps, F32, None)
    if arch in LLAMA_ROPE_ARCHS or arch == "phi3":
        md[p + "rope.dimension_count"] = (head_dim, U32, None)
    if arch == "phi3":  # Phi-3's converter: the original context (LongRoPE's switch) and the window
        md[p + "rope.scaling.original_context_length"] = (context_length, U32, None)
        md[p + "attention.sliding_window"] = (sliding_window, U32, None)
    # The converters write the head size whenever it is not n_embd / n_heads (always for Gemma).
    if arch in GEMMA_ARCHS or head_dim != n_embd // n_heads:
        md[p + "attention.key_length"] = (head_dim, U32, None)
        md[p + "attention.value_length"] = (head_dim, U32, None)
    if arch == "gemma2":  # Gemma 2's config values (convert_hf_to_gguf.py Gemma2Model)
        md[p + "attn_logit_softcapping"] = (50.0, F32, None)
        md[p + "final_logit_softcapping"] = (30.0, F32, None)
    if arch == "granite":
        md.update({p + k: (v, F32, None) for k, v in GRANITE_SCALES.items()})
    if arch == "lfm2":
        md.update(lfm2_metadata(n_layers, n_kv_heads))
    if arch == "gpt-oss":
        md[p + "attention.sliding_window"] = (sliding_window, U32, None)
    if arch in GEMMA_ARCHS:
        md[p + "attention.sliding_window"] = (sliding_window, U32, None)
        tokens, types, scores = spm_vocab()
        extra = _vocab_padding(len(tokens), n_vocab)
        tokens, types, scores = tokens + extra, types + [CONTROL] * len(extra), scores + [0.0] * len(extra)
        md.update(
            {
                "tokenizer.ggml.model": ("llama", STR, None),
                "tokenizer.ggml.pre": ("default", STR, None),
                "tokenizer.ggml.tokens": (tokens, ARR, STR),
                "tokenizer.ggml.scores": (scores, ARR, F32),
                "tokenizer.ggml.token_type": (types, ARR, GGUFValueType.INT32),
                "tokenizer.ggml.bos_token_id": (2, U32, None),
                "tokenizer.ggml.eos_token_id": (1, U32, None),
                "tokenizer.ggml.unknown_token_id": (3, U32, None),
                "tokenizer.ggml.padding_token_id": (0, U32, None),
                "tokenizer.ggml.add_bos_token": (True, BOOL, None),
                "tokenizer.ggml.add_eos_token": (False, BOOL, None),
                "tokenizer.ggml.add_space_prefix": (False, BOOL, None),
            }
        )
    else:
        specials = HARMONY_SPECIALS if arch == "gpt-oss" else ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        tokens, types, merges = bpe_vocab(specials)
        extra = _vocab_padding(len(tokens), n_vocab)
        tokens, types = tokens + extra, types + [CONTROL] * len(extra)
        if arch in LLAMA_ROPE_ARCHS or arch == "lfm2":
            md[p + "vocab_size"] = (len(tokens), U32, None)
        md.update(
            {
                "tokenizer.ggml.model": ("gpt2", STR, None),
                "tokenizer.ggml.pre": (BPE_PRE.get(arch, "qwen2"), STR, None),
                "tokenizer.ggml.tokens": (tokens, ARR, STR),
                "tokenizer.ggml.token_type": (types, ARR, GGUFValueType.INT32),
                "tokenizer.ggml.merges": (merges, ARR, STR),
                "tokenizer.ggml.bos_token_id": (0, U32, None),
                "tokenizer.ggml.eos_token_id": (2, U32, None),
                "tokenizer.ggml.padding_token_id": (0, U32, None),
                "tokenizer.ggml.add_bos_token": (False, BOOL, None),
            }
        )
        if arch == "gpt-oss":
            md["tokenizer.chat_template"] = (HARMONY_TEMPLATE, STR, None)
    return md


def write_tiny_model(
    path: str | Path,
    arch: str = "llama",
    qtypes: Mapping[str, GGMLQuantizationType | str] | GGMLQuantizationType | str | None = None,
    *,
    n_layers: int = 2,
    n_embd: int = 64,
    n_heads: int = 4,
    n_kv_heads: int = 2,
    head_dim: int = 16,
    n_ff: int = 128,
    seed: int = 0,
    tied: bool = False,
    context_length: int = 256,
    rope_base: float | None = None,
    rms_eps: float = 1e-5,
    sliding_window: int = 4,
    n_vocab: int | None = None,
    quantize_kquants: bool = False,
    n_expert: int = 0,
    n_expert_used: int = 2,
    n_ff_exp: int | None = None,
    n_ff_shexp: int | None = None,
    metadata_overrides: Mapping[str, Any] | None = None,
    extra_tensors: Mapping[str, np.ndarray | tuple[int, ...]] | None = None,
    skip_tensors: Iterable[str] = (),
    shape_overrides: Mapping[str, tuple[int, ...]] | None = None,
    split_max_tensors: int = 0,
    weight_scale: Mapping[str, float] | None = None,
) -> Path:
    """Write a tiny random `arch` model (one of ARCHS) to `path`; returns it.

    qtypes: one type for every matrix, or {tensor name | role | "*": type} (see DEFAULT_QTYPES, the default);
        norms and biases are always F32. Types may be given as names ("Q4_K").
    tied: no output.weight (the embedding is the vocabulary projection), as SmolLM2 and Gemma 3 (Gemma 2:
        always, as llama.cpp reads it). Off by
        default: with random tied weights the residual stream stays close to the input embedding, so greedy
        decoding just repeats the last token; an own output matrix gives varied continuations.
    rope_base: default 10000 (llama, qwen) or 1e6 (gemma3, whose sliding-window layers use 10000).
    sliding_window: Gemma and gpt-oss only; Gemma 3's layers il % 6 < 5 use it, Gemma 2's and gpt-oss's
        even layers (llama.cpp's default patterns). Phi-3 files carry it too; llama.cpp ignores it there.
    n_vocab: pad the vocabulary with control tokens to this size (default: the tiny vocabulary, ~300).
    quantize_kquants: Q4_K / Q6_K matrices quantized from normal weights (encode.KQUANT_REF) rather than
        random blocks.
    n_expert, n_expert_used, n_ff_exp: a mixture-of-experts FFN (qwen3moe, olmoe always, default
        DEFAULT_N_EXPERT experts; llama with n_expert > 0, as Mixtral): n_expert experts of width n_ff_exp
        (default n_ff; qwen3moe and qwen2moe write it as expert_feed_forward_length), n_expert_used per
        token. n_ff_shexp: qwen2moe's shared expert width (default n_ff).
    metadata_overrides: key -> value replacing or adding metadata (None deletes the key); the value type is
        the replaced key's, else inferred (a `Typed` value sets it). "general.architecture" can be overridden.
    extra_tensors: name -> array (written as F32, values as given) or numpy-order shape (random weights of
        the name's role, typed by `qtypes` as the standard tensors are: biases F32 ~N(0, 0.1^2)). Written
        after the standard tensors and drawn after them, so adding one leaves every other weight unchanged.
    skip_tensors / shape_overrides: leave tensors out / write them with another (numpy-order) shape.
    weight_scale: role -> factor on the spread of that role's random weights (gpt-oss's clamp shows only
        where gate / up values pass 7).
    split_max_tensors: write a split model of parts of at most this many tensors, as llama.cpp's gguf-split
        lays them out (gguf-py's own sharding: PATH-00001-of-0000N.gguf, ...); returns the first part.
    """
    if arch not in ARCHS:
        raise ValueError(f"unknown synthetic architecture {arch!r} (one of {ARCHS})")
    path = Path(path)
    rng = np.random.default_rng(seed)
    if rope_base is None:
        rope_base = 1e6 if arch == "gemma3" else 10000.0
    md = _metadata(
        arch,
        n_layers,
        n_embd,
        n_heads,
        n_kv_heads,
        head_dim,
        n_ff,
        context_length,
        rope_base,
        rms_eps,
        sliding_window,
        n_vocab,
    )
    n_vocab = len(md["tokenizer.ggml.tokens"][0])
    if arch in MOE_ARCHS and not n_expert:
        n_expert = DEFAULT_N_EXPERT
    if arch not in EXPERT_WIDTH_ARCHS and n_ff_exp not in (None, n_ff):
        raise ValueError(f"{arch}'s experts are n_ff wide (llama.cpp reads no expert width for it)")
    n_ff_exp = n_ff_exp or n_ff
    if n_expert:
        md[arch + ".expert_count"] = (n_expert, GGUFValueType.UINT32, None)
        md[arch + ".expert_used_count"] = (n_expert_used, GGUFValueType.UINT32, None)
        if arch in EXPERT_WIDTH_ARCHS:
            md[arch + ".expert_feed_forward_length"] = (n_ff_exp, GGUFValueType.UINT32, None)
    n_ff_shexp = (n_ff_shexp or n_ff) if arch == "qwen2moe" else 0
    if n_ff_shexp:
        md[arch + ".expert_shared_feed_forward_length"] = (n_ff_shexp, GGUFValueType.UINT32, None)
    md = {"general.architecture": (arch, GGUFValueType.STRING, None), **md}
    for key, value in (metadata_overrides or {}).items():
        if value is None:
            md.pop(key, None)
        elif isinstance(value, Typed):
            md[key] = (value.value, value.vtype, value.sub_type)
        elif key in md:
            md[key] = (value, md[key][1], md[key][2])
        elif isinstance(value, list | tuple):
            md[key] = (list(value), GGUFValueType.ARRAY, GGUFValueType.get_type(value[0]))
        else:
            md[key] = (value, GGUFValueType.get_type(value), None)

    writer = gguf.GGUFWriter(
        path, str(md.get("general.architecture", (arch,))[0]), split_max_tensors=split_max_tensors
    )
    writer.kv_data[0].clear()  # the constructor's general.architecture: written from `md` instead
    for key, (value, vtype, sub_type) in md.items():
        writer.add_key_value(key, value, vtype, sub_type)

    standard = tensor_shapes(arch, n_layers, n_embd, n_heads, n_kv_heads, head_dim, n_ff, n_vocab, tied)
    if n_expert:
        standard = with_experts(standard, n_embd, n_expert, n_ff_exp, n_ff_shexp, arch == "gpt-oss")
    shapes: dict[str, tuple[int, ...] | np.ndarray] = dict(standard)
    if arch == "gpt2":  # learned positions, after the token embedding as GPT-2's converter writes them
        shapes = {"token_embd.weight": shapes.pop("token_embd.weight"),
                  "position_embd.weight": (context_length, n_embd), **shapes}  # fmt: skip
    for name, spec in (extra_tensors or {}).items():
        if name in shapes:
            raise ValueError(f"extra tensor {name!r} is one the writer already writes (use shape_overrides)")
        shapes[name] = spec
    skip = set(skip_tensors)
    for name, spec in shapes.items():
        if isinstance(spec, np.ndarray):
            if name not in skip:
                writer.add_tensor(name, np.ascontiguousarray(spec, np.float32))
            continue
        shape = tuple((shape_overrides or {}).get(name, spec))
        # vectors and biases (gpt-oss's expert biases are 2-D) F32, as llama.cpp writes them
        qtype = T.F32 if len(shape) == 1 or name.endswith(".bias") else pick_qtype(name, qtypes)
        role = tensor_role(name)
        # Norm weights near 1 (Gemma's files store 1 + w), small biases, embeddings ~N(0, 1), matrices
        # ~N(0, 1/cols) so activations stay O(1) through the layers.
        if role.endswith("norm"):
            mean, std = 1.0, 0.1
        elif role == "attn_sinks":  # logits a little above Q.K's: each takes a visible share of its softmax
            mean, std = 2.0, 1.0
        elif role.endswith(".bias"):
            mean, std = 0.0, 0.1
        elif role == "token_embd":
            mean, std = 0.0, 1.0
        elif role == "position_embd":  # half the tokens' spread: positions move the logits visibly
            mean, std = 0.0, 0.5
        else:
            mean, std = 0.0, 1.0 / math.sqrt(shape[-1])
        std *= (weight_scale or {}).get(role, 1.0)
        # drawn even when skipped: same weights
        data = encode_tensor(qtype, shape, std, mean, rng, quantize_kquants)
        if name in skip:
            continue
        writer.add_tensor(name, data, raw_dtype=None if qtype == T.F32 else qtype)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return writer.format_shard_names(path)[0]
