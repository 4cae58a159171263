"""Nomic BERT encoder (nomic-embed-text v1 / v1.5), as llama.cpp's llama_model_nomic_bert: BERT's post-norm
layers (arch/encoder.py) with rope on Q and K (NEOX: the two halves of each head) instead of learned
positions, one fused Q|K|V, and a SwiGLU MLP W_down @ (silu(W_gate x) * W_up x). llama.cpp's graph applies
no FFN biases for it (it loads ffn_up.bias / ffn_down.bias and never adds them), so neither is read here.

Tensors (numpy order): token_embd [V, e], token_types [n_types, e] (optional), token_embd_norm [e] x2; per
layer attn_qkv [3e, e] (+ bias) or attn_q/k/v, attn_output [e, e] (+ bias), attn_output_norm [e] x2,
ffn_gate / ffn_up [f, e], ffn_down [e, f], layer_output_norm [e] x2.
"""

from __future__ import annotations

from typing import Any

from edgellm.arch.bert import BERT_BLOCK, encoder_shapes
from edgellm.arch.common import TensorSource
from edgellm.arch.encoder import ENCODER_GLOBALS, ENCODER_KEYS, EncoderModel, read_encoder
from edgellm.arch.spec import ArchSpec, Shapes
from edgellm.gguf.model_config import ROPE_NEOX, ModelConfig
from edgellm.gguf.reader import GGUFError, GGUFFile


def read_nomic_bert(g: GGUFFile, cfg: ModelConfig) -> None:
    read_encoder(g, cfg)
    if cfg.rope_dim != cfg.head_dim:
        raise GGUFError(
            f"{g.path}: nomic-bert.rope.dimension_count = {cfg.rope_dim}: partial rotary embedding is not "
            f"implemented (heads of {cfg.head_dim})"
        )


def nomic_bert_shapes(cfg: ModelConfig) -> Shapes:
    return encoder_shapes(cfg, gated=True, positions=False)


SPEC = ArchSpec(
    name="nomic-bert",
    block_tensors=BERT_BLOCK | {"ffn_gate.weight"},
    keys=ENCODER_KEYS,
    global_tensors=ENCODER_GLOBALS,
    fused_qkv=True,
    rope_type=ROPE_NEOX,
    read=read_nomic_bert,
    tensor_shapes=nomic_bert_shapes,
)


class NomicBertModel(EncoderModel):
    rope = True
    position_embd = False

    def load_ffn(self, src: TensorSource, il: int) -> tuple[str, Any, Any, Any]:
        """silu(W_gate x) * W_up x, no biases (llama.cpp's graph passes none for nomic-bert)."""
        p, e, f = f"blk.{il}.", self.cfg.n_embd, self.cfg.n_ff
        gate_up = [src.get(p + "ffn_gate.weight", (f, e)), src.get(p + "ffn_up.weight", (f, e))]
        return "swiglu", self.be.load_matrix(gate_up), None, None


MODEL = NomicBertModel
