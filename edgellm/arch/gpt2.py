"""GPT-2 decoder (and the files of its derivatives that llama.cpp's converter writes as gpt2).

    x = embed(tokens) + position_embd[positions]                        # [T, n_embd]: learned positions
    for each layer:
        h = layernorm(x) * attn_norm + attn_norm_b
        q | k | v = W_qkv h + b_qkv                                     # one fused projection, no rope
        x += Wo @ attention(q, k, v) + bo
        h = layernorm(x) * ffn_norm + ffn_norm_b
        x += W_down @ gelu(W_up h + b_up) + b_down
    logits = W_out @ (layernorm(x) * output_norm + output_norm_b)      # tied when the file has no output

position_embd.weight has one row per position of gpt2.context_length, so the context never goes past it
(the engine caps n_ctx at the file's context length). Everything else is StarCoder 2's (starcoder2.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from edgellm.arch.common import ForwardBatch, TensorSource
from edgellm.arch.spec import FUSED_QKV, GLOBAL_TENSORS, ArchSpec, Shapes
from edgellm.arch.starcoder2 import (
    LAYER_NORM_FLAGS,
    LAYER_NORM_MATRICES,
    LAYER_NORM_NORMS,
    Starcoder2Model,
    layer_norm_shapes,
    read_layer_norm_arch,
)
from edgellm.gguf.model_config import ROPE_NONE, ModelConfig
from edgellm.gguf.reader import GGUFFile

if TYPE_CHECKING:
    from edgellm.backends.base import Backend


def gpt2_shapes(cfg: ModelConfig) -> Shapes:
    """StarCoder 2's tensors with one fused attn_qkv, and position_embd: one row per position of the
    context."""
    return {
        "token_embd.weight": (cfg.n_vocab, cfg.n_embd),
        "position_embd.weight": (cfg.n_ctx_train, cfg.n_embd),
    } | layer_norm_shapes(cfg, fused_qkv=True)


SPEC = ArchSpec(
    name="gpt2",
    block_tensors=LAYER_NORM_NORMS | LAYER_NORM_MATRICES | FUSED_QKV,
    keys=frozenset({"attention.layer_norm_epsilon"}),
    global_tensors=GLOBAL_TENSORS | {"output_norm.bias", "position_embd.weight"},
    rope_type=ROPE_NONE,  # learned absolute positions
    flags=LAYER_NORM_FLAGS,
    read=read_layer_norm_arch,
    tensor_shapes=gpt2_shapes,
)


class Gpt2Model(Starcoder2Model):
    def __init__(self, cfg: ModelConfig, gguf: GGUFFile, be: Backend, progress=None) -> None:
        super().__init__(cfg, gguf, be, progress)
        shape = (cfg.n_ctx_train, cfg.n_embd)
        self.pos_embd = be.load_matrix([TensorSource(gguf).get("position_embd.weight", shape)])
        gguf.release_pages()

    def load_qkv(self, src: TensorSource, il: int) -> Any:
        rows = sum(self.qkv_rows().values())
        return self.be.load_matrix([src.get(f"blk.{il}.attn_qkv.weight", (rows, self.cfg.n_embd))])

    def load_qkv_bias(self, src: TensorSource, il: int) -> Any:
        return self.be.load_vector(src.get(f"blk.{il}.attn_qkv.bias", (sum(self.qkv_rows().values()),)))

    def embed(self, batch: ForwardBatch, inp: Any) -> Any:
        x = super().embed(batch, inp)
        # the step's positions where the backend holds them (a device backend's graph replays that copy)
        from edgellm.backends.base import StepIndex  # the arch files import no backend at load (registry.py)

        positions = StepIndex(np.asarray(batch.positions), inp.positions)
        self.be.add(x, self.be.embed(self.pos_embd, positions, 1.0))  # ggml_get_rows, ggml_add
        return x


MODEL = Gpt2Model
