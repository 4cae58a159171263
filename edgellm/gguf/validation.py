"""Everything a GGUF file says, checked against what the kernels assume, before any kernel runs.

Numba does no bounds checks: a head size, a rotary width or a tensor shape that disagrees with what a kernel
indexes writes past an array and corrupts the heap (a rope.dimension_count larger than the head size did).
`validate_model` runs right after `config_from_gguf` (which has already checked each key's type and range)
and checks what the kernels and the model code take for granted:

- nothing the runtime does not implement: every tensor and metadata key is one the architecture's tables
  in understood.py list (or a key at a value that changes nothing), so a file whose math differs from what
  runs is refused rather than silently mis-run;
- heads: head sizes 1..MAX_HEAD_DIM (CUDA holds a query head in shared memory of that size), the rotary
  width even and within the head (rope_cached_cpu rotates pairs i, i + n_rot/2 of each head), query heads a
  multiple of KV heads (attention groups query heads by KV head);
- every tensor the architecture reads (arch/common.py) exists with exactly the shape the config implies and
  a type the runtime runs, and a quantized matrix's rows hold whole activation blocks (quantize_act_cpu
  reads 32 or 256 values per block);
- the vocabulary: at least 2 tokens (the warm-up runs tokens 0 and 1), and the tokenizer metadata of the
  types and lengths the tokenizer indexes (token ids in range, per-token arrays as long as the vocabulary).

The reader has already checked the file's structure: tensor data inside the file, aligned offsets,
dimensions that fit the file. Errors are `GGUFError`s naming the file, the key or tensor, and the values.
"""

from __future__ import annotations

import re

import numpy as np
from gguf import GGMLQuantizationType

from edgellm.gguf.config import MAX_HEAD_DIM, ModelConfig
from edgellm.gguf.lfm2 import check_lfm2_layers, lfm2_tensors
from edgellm.gguf.metadata import describe, get_bool, get_str, is_int
from edgellm.gguf.reader import GGUFError, GGUFFile
from edgellm.gguf.understood import check_understood
from edgellm.quants.traits import QUANT_TRAITS, UnsupportedQuantError
from edgellm.tokenizer import Tokenizer
from edgellm.tokenizer.bpe import PRE_TYPES
from edgellm.tokenizer.vocab import TYPE_BYTE, TokenizerError

TOKENIZER_MODELS = ("llama", "gpt2")
# Token ids the tokenizer emits (BOS/EOS are added to prompts); others only feed the EOG set or the SPM
# model, which ignore ids outside the vocabulary as llama.cpp does.
_USED_TOKEN_IDS = ("tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id")
_OTHER_TOKEN_IDS = (
    "tokenizer.ggml.unknown_token_id",  # the SPM model falls back to none when it is out of range
    "tokenizer.ggml.padding_token_id",
    "tokenizer.ggml.eot_token_id",
    "tokenizer.ggml.eom_token_id",
    "tokenizer.ggml.fim_pad_token_id",
    "tokenizer.ggml.fim_rep_token_id",
    "tokenizer.ggml.fim_sep_token_id",
)
_TOKENIZER_FLAGS = (
    "tokenizer.ggml.add_bos_token",
    "tokenizer.ggml.add_eos_token",
    "tokenizer.ggml.add_space_prefix",
)
_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")
SEPARATE_QKV = tuple(f"attn_{x}.{kind}" for kind in ("weight", "bias") for x in "qkv")
ACT_BLOCK = {"q8_0": 32, "q8_1": 32, "q8_K": 256}  # activation block of each vec_dot type (matmul.py)


class UnsupportedTensorTypeError(GGUFError, UnsupportedQuantError):
    """A tensor the model reads has a GGML type the runtime cannot run (both a GGUF and a quant error)."""


class TokenizerMetadataError(GGUFError, TokenizerError):
    """Tokenizer metadata the tokenizer cannot be built from (both a GGUF and a tokenizer error)."""


def expected_tensors(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor the model code reads (arch/common.py, arch/llama.py) -> its numpy-order shape.
    output.weight is optional (tied embeddings) and not listed."""
    e, f, V = cfg.n_embd, cfg.n_ff, cfg.n_vocab
    H, Hkv, d, dv = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.head_dim_v
    if cfg.layer_norm:
        return _layer_norm_tensors(cfg)
    if cfg.arch == "lfm2":  # attention and short-conv layers (gguf/lfm2.py)
        return lfm2_tensors(cfg)
    shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (V, e)}
    for il in range(cfg.n_layers):
        p = f"blk.{il}."
        layer = {
            "attn_norm.weight": (e,),
            "attn_q.weight": (H * d, e),
            "attn_k.weight": (Hkv * d, e),
            "attn_v.weight": (Hkv * dv, e),
            "attn_output.weight": (e, H * dv),
            "ffn_norm.weight": (e,),
            "ffn_gate.weight": (f, e),
            "ffn_up.weight": (f, e),
            "ffn_down.weight": (e, f),
        }
        if cfg.qkv_fused[il]:  # Q|K|V biases, required for Qwen 2: check_qkv_forms
            del layer["attn_q.weight"], layer["attn_k.weight"], layer["attn_v.weight"]
            layer["attn_qkv.weight"] = ((H + Hkv) * d + Hkv * dv, e)
        if cfg.gate_up_fused:
            del layer["ffn_gate.weight"]
            layer["ffn_up.weight"] = (2 * f, e)
        if cfg.n_expert:  # the experts in place of the dense FFN (arch/moe.py)
            E, fe = cfg.n_expert, cfg.n_ff_exp
            for name in ("ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"):
                layer.pop(name, None)
            layer.update(
                {
                    "ffn_gate_inp.weight": (E, e),
                    "ffn_gate_exps.weight": (E, fe, e),
                    "ffn_up_exps.weight": (E, fe, e),
                    "ffn_down_exps.weight": (E, e, fe),
                }
            )
        if cfg.n_ff_shexp:
            fs = cfg.n_ff_shexp
            layer.update(
                {
                    "ffn_gate_inp_shexp.weight": (e,),
                    "ffn_gate_shexp.weight": (fs, e),
                    "ffn_up_shexp.weight": (fs, e),
                    "ffn_down_shexp.weight": (e, fs),
                }
            )
        if not cfg.pre_norms:
            del layer["attn_norm.weight"], layer["ffn_norm.weight"]
        if cfg.qk_norm:
            layer.update({"attn_q_norm.weight": (d,), "attn_k_norm.weight": (d,)})
        if cfg.qk_norm_full:
            layer.update({"attn_q_norm.weight": (H * d,), "attn_k_norm.weight": (Hkv * d,)})
        if cfg.post_norms:
            layer.update({"post_attention_norm.weight": (e,), "post_ffw_norm.weight": (e,)})
        if cfg.arch == "gpt-oss":
            layer = _gpt_oss_layer(cfg, layer)
        shapes.update({p + name: shape for name, shape in layer.items()})
    shapes["output_norm.weight"] = (e,)
    if cfg.arch in ("olmo2", "gpt-oss"):  # llama.cpp requires their own output matrix
        shapes["output.weight"] = (V, e)
    return shapes


def _gpt_oss_layer(cfg: ModelConfig, layer: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """A gpt-oss layer (arch/gpt_oss.py): post_attention_norm is the experts' pre-norm, the attention
    sinks, and the biases llama.cpp requires (output projection, router, every expert matrix)."""
    e, E, fe = cfg.n_embd, cfg.n_expert, cfg.n_ff_exp
    out = {name: shape for name, shape in layer.items() if name != "ffn_norm.weight"}
    out.update(
        {
            "post_attention_norm.weight": (e,),
            "attn_sinks.weight": (cfg.n_heads,),
            "attn_output.bias": (e,),
            "ffn_gate_inp.bias": (E,),
            "ffn_gate_exps.bias": (E, fe),
            "ffn_up_exps.bias": (E, fe),
            "ffn_down_exps.bias": (E, e),
        }
    )
    return out


def _layer_norm_tensors(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """StarCoder 2 / GPT-2 (arch/starcoder2.py): every norm with its bias, every matrix with its bias, no
    ffn_gate; GPT-2's fused attn_qkv and position_embd (one row per position of its context)."""
    e, f, kv = cfg.n_embd, cfg.n_ff, cfg.n_kv_heads * cfg.head_dim
    shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (cfg.n_vocab, e)}
    if cfg.arch == "gpt2":
        shapes["position_embd.weight"] = (cfg.n_ctx_train, e)
    for il in range(cfg.n_layers):
        p = f"blk.{il}."
        layer = {"attn_norm.weight": (e,), "attn_norm.bias": (e,), "ffn_norm.weight": (e,),
                 "ffn_norm.bias": (e,), "attn_output.weight": (e, e), "attn_output.bias": (e,),
                 "ffn_up.weight": (f, e), "ffn_up.bias": (f,), "ffn_down.weight": (e, f),
                 "ffn_down.bias": (e,)}  # fmt: skip
        if cfg.arch == "gpt2":
            layer.update({"attn_qkv.weight": (e + 2 * kv, e), "attn_qkv.bias": (e + 2 * kv,)})
        else:
            for n, rows in (("q", e), ("k", kv), ("v", kv)):
                layer.update({f"attn_{n}.weight": (rows, e), f"attn_{n}.bias": (rows,)})
        shapes.update({p + name: shape for name, shape in layer.items()})
    shapes.update({"output_norm.weight": (e,), "output_norm.bias": (e,)})
    return shapes


def optional_tensors(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Tensors the model code reads when the file has them -> their numpy-order shape: the untied output
    and the biases (understood.py says which of them an architecture may carry)."""
    e, f = cfg.n_embd, cfg.n_ff
    H, Hkv, d, dv = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.head_dim_v
    shapes: dict[str, tuple[int, ...]] = {"output.weight": (cfg.n_vocab, e)}
    biases = {
        "attn_q.bias": (H * d,),
        "attn_k.bias": (Hkv * d,),
        "attn_v.bias": (Hkv * dv,),
        "attn_output.bias": (e,),
        "ffn_gate.bias": (f,),
        "ffn_up.bias": (f,),
        "ffn_down.bias": (e,),
    }
    for il in range(cfg.n_layers):
        shapes.update({f"blk.{il}.{name}": shape for name, shape in biases.items()})
        if cfg.qkv_fused[il]:
            shapes[f"blk.{il}.attn_qkv.bias"] = ((H + Hkv) * d + Hkv * dv,)
    return shapes


def check_qkv_forms(g: GGUFFile, cfg: ModelConfig) -> None:
    """Each layer's Q|K|V weights come either as attn_qkv.weight or as attn_q/k/v.weight, and its biases as
    attn_qkv.bias (with the fused weight only) or as attn_q/k/v.bias, never both: llama.cpp's
    create_tensor_qkv reads one form and refuses a file with a tensor left over. Qwen 2 needs the biases."""
    for il in range(cfg.n_layers):
        p = f"blk.{il}."
        present = [n for n in ("attn_qkv.weight", "attn_qkv.bias") + SEPARATE_QKV if p + n in g.tensors]
        fused_w, fused_b = "attn_qkv.weight" in present, "attn_qkv.bias" in present
        separate_w = any(n.endswith(".weight") and n in SEPARATE_QKV for n in present)
        separate_b = any(n.endswith(".bias") and n in SEPARATE_QKV for n in present)
        if fused_w and separate_w or fused_b and (separate_b or not fused_w):
            raise GGUFError(
                f"{g.path}: layer {il} has Q|K|V tensors in both forms ({', '.join(present)}): llama.cpp "
                "reads attn_qkv.weight (and attn_qkv.bias) or attn_q/k/v, one form per layer"
            )
        missing = [p + n for n in SEPARATE_QKV if n.endswith(".bias") and n not in present]
        if cfg.qkv_bias and not fused_b and missing:
            raise GGUFError(f"{g.path}: missing tensor {missing[0]!r} ({cfg.arch} has Q|K|V biases)")


def validate_model(g: GGUFFile, cfg: ModelConfig) -> None:
    """Raise GGUFError unless every shape the kernels will assume for this file holds (see the module doc)."""
    _check_heads(g, cfg)
    check_understood(g, cfg)  # first: a tensor or key it does not implement explains a shape error after
    check_qkv_forms(g, cfg)
    if cfg.arch == "lfm2":
        check_lfm2_layers(g, cfg)
    shapes = expected_tensors(cfg)
    shapes.update({n: s for n, s in optional_tensors(cfg).items() if n in g.tensors and n not in shapes})
    for name, shape in shapes.items():
        _check_tensor(g, name, shape)
    _check_tokenizer_metadata(g, cfg)


def tokenizer_from_gguf(g: GGUFFile) -> Tokenizer:
    """The model's tokenizer; metadata it cannot be built from (after validate_model's type checks: content
    such as a vocabulary sentencepiece rejects) is a TokenizerMetadataError naming the file."""
    try:
        return Tokenizer.from_metadata(g.metadata)
    except TokenizerMetadataError:
        raise
    except TokenizerError as e:
        raise TokenizerMetadataError(f"{g.path}: {e}") from e


def _check_heads(g: GGUFFile, cfg: ModelConfig) -> None:
    p = cfg.arch + "."
    for key, value in (("attention.key_length", cfg.head_dim), ("attention.value_length", cfg.head_dim_v)):
        if not 1 <= value <= MAX_HEAD_DIM:
            raise GGUFError(
                f"{g.path}: head size {p}{key} = {value} is out of range: must be 1..{MAX_HEAD_DIM}"
            )
    if not (2 <= cfg.rope_dim <= cfg.head_dim and cfg.rope_dim % 2 == 0):
        raise GGUFError(
            f"{g.path}: {p}rope.dimension_count = {cfg.rope_dim} must be even and within the head size "
            f"{cfg.head_dim}"
        )
    if cfg.n_kv_heads < 1 or cfg.n_heads % cfg.n_kv_heads:
        raise GGUFError(
            f"{g.path}: {cfg.n_heads} attention heads are not a multiple of {cfg.n_kv_heads} KV heads"
        )
    if cfg.n_vocab < 2:
        raise GGUFError(f"{g.path}: the vocabulary has {cfg.n_vocab} tokens; a model needs at least 2")
    if len(cfg.swa_layers) != cfg.n_layers:
        raise GGUFError(f"{g.path}: {len(cfg.swa_layers)} sliding-window flags for {cfg.n_layers} layers")


def _check_tensor(g: GGUFFile, name: str, shape: tuple[int, ...]) -> None:
    t = g.tensors.get(name)
    if t is None:
        raise GGUFError(f"{g.path}: missing tensor {name!r}")
    if tuple(t.shape) != shape:
        raise GGUFError(f"{g.path}: tensor {name!r} has shape {t.shape}, expected {shape}")
    traits = QUANT_TRAITS.get(t.qtype)
    if traits is None:
        supported = ", ".join(tr.name for tr in QUANT_TRAITS.values())
        raise UnsupportedTensorTypeError(
            f"{g.path}: unsupported tensor type {GGMLQuantizationType(t.qtype).name} in tensor {name} "
            f"(supported: {supported})"
        )
    block = ACT_BLOCK.get(traits.vec_dot)
    if block and shape[-1] % block:
        raise GGUFError(
            f"{g.path}: tensor {name!r} ({traits.name}) has rows of {shape[-1]} values, not a multiple of "
            f"the {block}-value activation blocks its matmul quantizes"
        )


def _tokenizer_error(g: GGUFFile, message: str) -> TokenizerMetadataError:
    return TokenizerMetadataError(f"{g.path}: {message}")


def _check_tokenizer_metadata(g: GGUFFile, cfg: ModelConfig) -> None:
    md = g.metadata
    if "tokenizer.ggml.model" not in md:
        raise _tokenizer_error(g, "GGUF metadata has no tokenizer.ggml.model")
    model = get_str(g, "tokenizer.ggml.model")
    if model not in TOKENIZER_MODELS:
        raise _tokenizer_error(
            g, f"unsupported tokenizer.ggml.model '{model}' (supported: {', '.join(TOKENIZER_MODELS)})"
        )
    tokens = md.get("tokenizer.ggml.tokens")
    if tokens is None or (isinstance(tokens, list) and not tokens):
        raise _tokenizer_error(g, "GGUF metadata has no tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
        raise _tokenizer_error(
            g, f"tokenizer.ggml.tokens must be an array of strings, got {describe(tokens)}"
        )
    n = len(tokens)
    if n != cfg.n_vocab:
        raise _tokenizer_error(g, f"the vocabulary has {n} tokens but the model {cfg.n_vocab} embedding rows")
    for key, kinds in (("tokenizer.ggml.token_type", "iu"), ("tokenizer.ggml.scores", "iuf")):
        value = md.get(key)
        if value is None:
            continue
        if not (isinstance(value, np.ndarray) and value.ndim == 1 and value.dtype.kind in kinds):
            raise _tokenizer_error(g, f"{key} must be a numeric array, got {describe(value)}")
        if len(value) != n:
            raise _tokenizer_error(g, f"{key} has {len(value)} entries for {n} tokens")
        if value.dtype.kind == "f" and not np.isfinite(value).all():
            raise _tokenizer_error(g, f"{key} holds non-finite values")
    types = md.get("tokenizer.ggml.token_type")
    if model == "llama" and types is not None:
        for tid in np.flatnonzero(types == TYPE_BYTE):  # decoded as the byte their text names
            if not _BYTE_TOKEN.fullmatch(tokens[tid]):
                raise _tokenizer_error(g, f"byte token {tid} is {tokens[tid]!r}, not of the form <0xNN>")
    if model == "gpt2":
        merges = md.get("tokenizer.ggml.merges")
        if merges is None:
            raise _tokenizer_error(g, "gpt2 tokenizer without tokenizer.ggml.merges")
        if not isinstance(merges, list) or not all(isinstance(m, str) for m in merges):
            raise _tokenizer_error(
                g, f"tokenizer.ggml.merges must be an array of strings, got {describe(merges)}"
            )
    if "tokenizer.ggml.pre" in md:
        pre = get_str(g, "tokenizer.ggml.pre")
        if model == "gpt2" and (pre or "default") not in PRE_TYPES:
            raise _tokenizer_error(
                g,
                f"unsupported tokenizer.ggml.pre '{pre}' for gpt2 tokenizer (supported: {sorted(PRE_TYPES)})",
            )
    for key in _USED_TOKEN_IDS + _OTHER_TOKEN_IDS:
        if key not in md:
            continue
        value = md[key]
        if not is_int(value):
            raise _tokenizer_error(g, f"{key} must be an integer, got {describe(value)}")
        if key in _USED_TOKEN_IDS and not 0 <= value < n:
            raise _tokenizer_error(g, f"{key} = {value} is outside the vocabulary of {n} tokens")
    for key in _TOKENIZER_FLAGS:
        if key in md:
            get_bool(g, key)
