"""Everything a GGUF file says, checked against what the kernels assume, before any kernel runs.

Numba does no bounds checks: a head size, a rotary width or a tensor shape that disagrees with what a kernel
indexes writes past an array and corrupts the heap (a rope.dimension_count larger than the head size did).
`validate_model` runs right after `config_from_gguf` (which has already checked each key's type and range)
and checks what the kernels and the model code take for granted:

- nothing the runtime does not implement: every tensor and metadata key is one understood.py accepts for
  the architecture (its spec in edgellm/arch/ lists them), or a key at a value that changes nothing, so a
  file whose math differs from what runs is refused rather than silently mis-run;
- heads: head sizes 1..ArchSpec.max_head_dim (CUDA holds a query head in shared memory of 512), the rotary
  width even and within the head (rope_cached_cpu rotates pairs i, i + n_rot/2 of each head), query heads a
  multiple of KV heads (attention groups query heads by KV head);
- every tensor the architecture reads (its spec's tensor_shapes) exists with exactly the shape the config
  implies and a type the runtime runs, and a quantized matrix's rows hold whole activation blocks
  (quantize_act_cpu reads 32 or 256 values per block);
- the vocabulary: at least 2 tokens (the warm-up runs tokens 0 and 1), and the tokenizer metadata of the
  types and lengths the tokenizer indexes (token ids in range, per-token arrays as long as the vocabulary).

The reader has already checked the file's structure: tensor data inside the file, aligned offsets,
dimensions that fit the file. Errors are `GGUFError`s naming the file, the key or tensor, and the values.
"""

from __future__ import annotations

import re

import numpy as np
from gguf import GGMLQuantizationType

from edgellm.gguf.config import arch_spec_of
from edgellm.gguf.metadata import describe, get_bool, get_str, is_int
from edgellm.gguf.model_config import ModelConfig
from edgellm.gguf.reader import GGUFError, GGUFFile
from edgellm.gguf.understood import check_understood
from edgellm.quants.traits import QUANT_TRAITS, UnsupportedQuantError
from edgellm.tokenizer import Tokenizer
from edgellm.tokenizer.bpe import PRE_TYPES
from edgellm.tokenizer.vocab import TYPE_BYTE, TokenizerError

TOKENIZER_MODELS = ("llama", "gpt2", "bert")
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
    spec = arch_spec_of(g)
    check_understood(g, cfg, spec)  # first: a tensor or key it does not implement explains a shape error
    check_qkv_forms(g, cfg)
    if spec.check is not None:  # what the architecture's tables cannot say (LFM2's two layer kinds)
        spec.check(g, cfg)
    shapes = spec.tensor_shapes(cfg)
    shapes.update({n: s for n, s in optional_tensors(cfg).items() if n in g.tensors and n not in shapes})
    for name in [n for n in shapes if n.split(".", 2)[-1] in spec.checked_shapes and n.startswith("blk.")]:
        del shapes[name]  # spec.check checked it
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
    limit = arch_spec_of(g).max_head_dim  # MAX_HEAD_DIM but for DeepSeek 2's latent heads (CPU only)
    for key, value in (("attention.key_length", cfg.head_dim), ("attention.value_length", cfg.head_dim_v)):
        if not 1 <= value <= limit:
            raise GGUFError(f"{g.path}: head size {p}{key} = {value} is out of range: must be 1..{limit}")
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
    if model == "bert":  # WordPiece adds [CLS] and [SEP] and emits [UNK]: llama.cpp's defaults 101, 102, 100
        for key, default in (("bos", 101), ("seperator", 102), ("unknown", 100)):
            value = md.get(f"tokenizer.ggml.{key}_token_id", default)
            if not (is_int(value) and 0 <= value < n):
                raise _tokenizer_error(
                    g, f"tokenizer.ggml.{key}_token_id = {value} is outside the vocabulary of {n} tokens"
                )
