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
