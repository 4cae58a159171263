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

Hooks for error-path tests and oracle cases (testing/oracle/cases.py): `metadata_overrides` (a value of None
deletes the key; `Typed` gives a new key its GGUF type), `extra_tensors` (biases, `rope_freqs.weight`, or any
tensor the architecture does not write), `skip_tensors`, `shape_overrides` (writes a tensor with another
shape) and per-tensor `qtypes`. The bytes are a function of the arguments alone (same arguments and seed,
same file), so a fixture can record the file's sha256.

The tensor names and shapes per architecture: testing/synthetic/shapes.py; the metadata keys and tokenizer:
testing/synthetic/metadata.py; LFM2's part of both: testing/synthetic/lfm2.py.

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
from edgellm.testing.synthetic.metadata import model_metadata
from edgellm.testing.synthetic.shapes import (  # noqa: F401 - importable from here
    LAYER_NORM_ARCHS,
    glm4moe_layers,
    layer_norm_shapes,
    mla_layers,
    tensor_shapes,
    with_experts,
)
from edgellm.testing.tiny_vocab import spm_vocab  # noqa: F401 - importable from here

T = GGMLQuantizationType
ARCHS = (
    "llama", "qwen2", "qwen3", "gemma2", "gemma3", "granite", "olmo2", "starcoder2", "gpt2", "phi3",
    "smollm3", "qwen3moe", "olmoe", "qwen2moe", "lfm2", "gpt-oss", "qwen35", "qwen35moe",
    "qwen3next",
    # issue 56's families
    "mistral3", "seed_oss", "glm4moe", "deepseek2", "llama4",
)
# always with experts (llama: with n_expert > 0, as Mixtral)
MOE_ARCHS = (
    "qwen3moe", "olmoe", "qwen2moe", "gpt-oss", "qwen35moe", "qwen3next", "glm4moe", "deepseek2", "llama4",
)  # fmt: skip
# expert_feed_forward_length written (llama, OLMoE: n_ff wide)
EXPERT_WIDTH_ARCHS = (
    "qwen3moe", "qwen2moe", "gpt-oss", "qwen35moe", "qwen3next", "glm4moe", "deepseek2", "llama4",
)  # fmt: skip
SHARED_EXPERT_ARCHS = ("qwen2moe", "qwen35moe", "qwen3next")  # a shared expert n_ff_shexp wide
DEFAULT_N_EXPERT = 4

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
    conv = ("shortconv.conv", "ssm_conv1d")
    if role.endswith("norm") or role.endswith(".bias") or role == "ffn_gate_inp" or role in conv:
        return T.F32
    if qtypes is None:
        qtypes = DEFAULT_QTYPES
    if not isinstance(qtypes, Mapping):
        return _as_qtype(qtypes)
    for key in (name, role, "*"):
        if key in qtypes:
            return _as_qtype(qtypes[key])
    return T.F32

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
        token. n_ff_shexp: qwen2moe's and qwen35moe's shared expert width (default n_ff).
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
    md = model_metadata(
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
    n_ff_shexp = (n_ff_shexp or n_ff) if arch in SHARED_EXPERT_ARCHS else 0
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
    if arch in ("glm4moe", "deepseek2"):  # leading dense layers, the selection bias, ungated shared experts
        lead, n_shared = md[arch + ".leading_dense_block_count"][0], md[arch + ".expert_shared_count"][0]
        standard = glm4moe_layers(standard, n_embd, n_ff, n_ff_exp * n_shared, n_expert, lambda il: il < lead)
    if arch == "llama4":  # experts on every step-th layer, with an ungated shared expert as wide
        step = md["llama4.interleave_moe_layer_step"][0]
        standard = glm4moe_layers(
            standard, n_embd, n_ff, n_ff_exp, n_expert, lambda il: (il + 1) % step != 0, selection_bias=False
        )
    if arch == "deepseek2":  # the latent attention's tensors in place of Q/K/V (testing/synthetic/shapes.py)
        q_lora = md.get("deepseek2.attention.q_lora_rank", (0,))[0]  # 0: attn_q (V2-Lite)
        standard = mla_layers(standard, n_embd, n_heads, head_dim, q_lora)
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
        if role == "ssm_a":  # -exp(A_log): negative, a decay per token of exp(softplus(.) * a)
            mean, std = -0.5, 0.05
        elif role.endswith("norm"):
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
