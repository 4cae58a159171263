"""StarCoder 2 decoder (3B, 7B, 15B; IBM's Granite Code 20B / 34B files use it too).

    x = embed(tokens)                                                   # [T, n_embd]
    for each layer:
        h = layernorm(x) * attn_norm + attn_norm_b
        x += Wo @ attention(rope(Wq h + bq), rope(Wk h + bk), Wv h + bv) + bo
        h = layernorm(x) * ffn_norm + ffn_norm_b
        x += W_down @ gelu(W_up h + b_up) + b_down
    logits = W_out @ (layernorm(x) * output_norm + output_norm_b)      # tied when the file has no output

LayerNorm: (x - mean) / sqrt(var + eps) with eps = starcoder2.attention.layer_norm_epsilon. Rope rotates
the two halves of each whole head (NEOX). GELU is ggml's (tanh form through an f16 table:
backends/cpu/layernorm_gelu.py). llama.cpp reads every bias as required.
"""

from __future__ import annotations

from typing import Any

from edgellm.arch.common import AttentionWeights, FeedForwardWeights, TensorSource, load_biases
from edgellm.arch.llama import LlamaModel
from edgellm.arch.spec import GLOBAL_TENSORS, QKV_BIASES, ArchSpec, Shapes
from edgellm.gguf.metadata import get_float
from edgellm.gguf.model_config import ModelConfig
from edgellm.gguf.reader import GGUFError, GGUFFile

# The LayerNorm architectures' layers (StarCoder 2, GPT-2: gpt2.py): every norm has a bias; the MLP is up ->
# GELU -> down (no ffn_gate), every matrix biased
LAYER_NORM_NORMS = frozenset({"attn_norm.weight", "attn_norm.bias", "ffn_norm.weight", "ffn_norm.bias"})
LAYER_NORM_MATRICES = frozenset(
    f"{m}.{part}" for m in ("attn_output", "ffn_up", "ffn_down") for part in ("weight", "bias")
)
# LayerNorm everywhere RMSNorm would be, an ungated GELU MLP
LAYER_NORM_FLAGS = {"layer_norm": True, "gated_ffn": False, "activation": "gelu"}


def read_layer_norm_arch(g: GGUFFile, cfg: ModelConfig) -> None:
    """StarCoder 2 and GPT-2 as llama.cpp's llama_model_starcoder2 / _gpt2 read them: the required
    {arch}.attention.layer_norm_epsilon; Q is as wide as the model (n_heads * head size = n_embd)."""
    eps_key = f"{cfg.arch}.attention.layer_norm_epsilon"
    cfg.layer_norm_eps = get_float(g, eps_key, lo=0.0, hi=1.0, lo_open=True)
    if cfg.n_heads * cfg.head_dim != cfg.n_embd or cfg.head_dim_v != cfg.head_dim:
        raise GGUFError(
            f"{g.path}: {cfg.arch} heads of {cfg.head_dim} (K) / {cfg.head_dim_v} (V) x {cfg.n_heads} must "
            f"span {cfg.arch}.embedding_length = {cfg.n_embd} (llama.cpp's {cfg.arch} shapes)"
        )


def read_starcoder2(g: GGUFFile, cfg: ModelConfig) -> None:
    read_layer_norm_arch(g, cfg)
    if cfg.rope_dim != cfg.head_dim:  # llama.cpp asserts a full rotation
        raise GGUFError(
            f"{g.path}: metadata starcoder2.rope.dimension_count = {cfg.rope_dim}: partial rotary embedding "
            f"is not implemented for starcoder2 (llama.cpp rotates the whole head of {cfg.head_dim})"
        )


def layer_norm_shapes(cfg: ModelConfig, fused_qkv: bool = False) -> Shapes:
    """Every tensor Starcoder2Model reads -> its shape: every norm and every matrix with its bias, no
    ffn_gate; Q|K|V as three matrices, or as one attn_qkv with `fused_qkv` (GPT-2)."""
    e, f, kv = cfg.n_embd, cfg.n_ff, cfg.n_kv_heads * cfg.head_dim
    shapes: Shapes = {"token_embd.weight": (cfg.n_vocab, e)}
    for il in range(cfg.n_layers):
        p = f"blk.{il}."
        layer = {"attn_norm.weight": (e,), "attn_norm.bias": (e,), "ffn_norm.weight": (e,),
                 "ffn_norm.bias": (e,), "attn_output.weight": (e, e), "attn_output.bias": (e,),
                 "ffn_up.weight": (f, e), "ffn_up.bias": (f,), "ffn_down.weight": (e, f),
                 "ffn_down.bias": (e,)}  # fmt: skip
        if fused_qkv:
            layer.update({"attn_qkv.weight": (e + 2 * kv, e), "attn_qkv.bias": (e + 2 * kv,)})
        else:
            for n, rows in (("q", e), ("k", kv), ("v", kv)):
                layer.update({f"attn_{n}.weight": (rows, e), f"attn_{n}.bias": (rows,)})
        shapes.update({p + name: shape for name, shape in layer.items()})
    shapes.update({"output_norm.weight": (e,), "output_norm.bias": (e,)})
    return shapes


SPEC = ArchSpec(
    name="starcoder2",
    block_tensors=LAYER_NORM_NORMS
    | LAYER_NORM_MATRICES
    | QKV_BIASES
    | {"attn_q.weight", "attn_k.weight", "attn_v.weight"},
    keys=frozenset({"attention.layer_norm_epsilon"}),
    global_tensors=GLOBAL_TENSORS | {"output_norm.bias"},
    flags=LAYER_NORM_FLAGS,
    read=read_starcoder2,
    tensor_shapes=layer_norm_shapes,
)


class Starcoder2Model(LlamaModel):
    """LlamaModel's loop and output; the layer weights carry the norms' biases and an ungated MLP, which
    the shared blocks apply from the ModelConfig flags (layer_norm, gated_ffn)."""

    def load_layer(self, src: TensorSource, il: int) -> tuple[AttentionWeights, FeedForwardWeights]:
        be, cfg, p = self.be, self.cfg, f"blk.{il}."
        e, f = cfg.n_embd, cfg.n_ff
        attn = AttentionWeights(
            norm=be.load_vector(src.get(p + "attn_norm.weight", (e,))),
            norm_b=be.load_vector(src.get(p + "attn_norm.bias", (e,))),
            wqkv=self.load_qkv(src, il),
            bqkv=self.load_qkv_bias(src, il),
            wo=be.load_matrix([src.get(p + "attn_output.weight", (e, e))]),
            bo=be.load_vector(src.get(p + "attn_output.bias", (e,))),
        )
        ffn = FeedForwardWeights(
            norm=be.load_vector(src.get(p + "ffn_norm.weight", (e,))),
            norm_b=be.load_vector(src.get(p + "ffn_norm.bias", (e,))),
            w_gate_up=be.load_matrix([src.get(p + "ffn_up.weight", (f, e))]),  # up alone: no gate
            b_gate_up=be.load_vector(src.get(p + "ffn_up.bias", (f,))),
            w_down=be.load_matrix([src.get(p + "ffn_down.weight", (e, f))]),
            b_down=be.load_vector(src.get(p + "ffn_down.bias", (e,))),
        )
        return attn, ffn

    def qkv_rows(self) -> dict[str, int]:
        e, kv = self.cfg.n_embd, self.cfg.n_kv_heads * self.cfg.head_dim
        return {"q": e, "k": kv, "v": kv}

    def load_qkv(self, src: TensorSource, il: int) -> Any:
        """Q|K|V stacked [n_embd + 2 * n_kv_heads * head, n_embd] from the three projections."""
        e = self.cfg.n_embd
        return self.be.load_matrix(
            [src.get(f"blk.{il}.attn_{n}.weight", (r, e)) for n, r in self.qkv_rows().items()]
        )

    def load_qkv_bias(self, src: TensorSource, il: int) -> Any:
        """[n_embd + 2 * n_kv_heads * head] (validate_model requires the three: llama.cpp does)."""
        return load_biases(self.be, src, [(f"blk.{il}.attn_{n}.bias", r) for n, r in self.qkv_rows().items()])


MODEL = Starcoder2Model
