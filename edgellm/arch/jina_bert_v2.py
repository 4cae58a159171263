"""Jina BERT v2 encoder (jina-embeddings-v2-small/base-en, jina-reranker-v1-*), as llama.cpp's
llama_model_jina_bert_v2 runs it through the BERT graph (arch/encoder.py): no position embeddings but ALiBi
(each head's slope, from max_bias 8 as ggml_soft_max_ext derives it, times -|i - j| added to its scores),
optional LayerNorms of Q and of K over the whole projection, an optional second norm after attention
(attn_norm_2: x = norm2(norm(attention + x) + x)), and a GEGLU MLP: gelu(W_gate x) * (W_up x + b_up) with
a separate ffn_gate, gelu|up halves of one ffn_up of 2 * n_ff rows without it, else gelu(W_up x + b_up).
Its rerankers' head is one cls row [1, n_embd] (+ bias) and tanh, without cls.output.

Tensors (numpy order): token_embd [V, e], token_types [n_types, e] (required), token_embd_norm [e] x2; per
layer attn_q/k/v [e, e] (+ bias) or attn_qkv, attn_q_norm / attn_k_norm [e] x2 (optional), attn_output
[e, e] + bias, attn_output_norm [e] x2, attn_norm_2 [e] x2 (optional), ffn_gate [f, e] (optional), ffn_up
[f | 2f, e] (+ bias), ffn_down [e, f] + bias, layer_output_norm [e] x2; cls [1 | e, e] + bias (optional).
"""

from __future__ import annotations

from typing import Any

from edgellm.arch.bert import BERT_BLOCK, encoder_shapes
from edgellm.arch.common import TensorSource, load_biases
from edgellm.arch.encoder import ENCODER_GLOBALS, ENCODER_KEYS, EncoderModel, read_encoder
from edgellm.arch.spec import ArchSpec, Shapes
from edgellm.gguf.model_config import ROPE_NONE, ModelConfig
from edgellm.gguf.reader import GGUFError, GGUFFile

MAX_ALIBI_BIAS = 8.0  # llama.cpp's hparams.f_max_alibi_bias for jina-bert-v2
JINA_BLOCK = BERT_BLOCK | frozenset(
    {"ffn_gate.weight"}
    | {f"{n}.{p}" for n in ("attn_q_norm", "attn_k_norm", "attn_norm_2") for p in ("weight", "bias")}
)


def jina_shapes(cfg: ModelConfig) -> Shapes:
    """The required tensors but ffn_up, whose rows (n_ff; 2 * n_ff holding the gate) check_jina checks."""
    shapes = encoder_shapes(cfg, positions=False)
    for il in range(cfg.n_layers):
        del shapes[f"blk.{il}.ffn_up.weight"]
    return shapes


def check_jina(g: GGUFFile, cfg: ModelConfig) -> None:
    if "token_types.weight" not in g.tensors:
        raise GGUFError(f"{g.path}: missing tensor 'token_types.weight' (jina-bert-v2 requires it)")
    f, e = cfg.n_ff, cfg.n_embd
    for il in range(cfg.n_layers):
        p = f"blk.{il}."
        up = g.tensors.get(p + "ffn_up.weight")
        if up is None:
            raise GGUFError(f"{g.path}: missing tensor {p + 'ffn_up.weight'!r}")
        gate = p + "ffn_gate.weight" in g.tensors
        allowed = [(f, e)] if gate else [(f, e), (2 * f, e)]
        if tuple(up.shape) not in allowed:
            raise GGUFError(
                f"{g.path}: tensor {p + 'ffn_up.weight'!r} has shape {up.shape}, expected one of {allowed}"
            )
        bias = g.tensors.get(p + "ffn_up.bias")
        if bias is not None and tuple(bias.shape) != up.shape[:1]:
            raise GGUFError(
                f"{g.path}: tensor {p + 'ffn_up.bias'!r} has shape {bias.shape}, expected {up.shape[:1]}"
            )


SPEC = ArchSpec(
    name="jina-bert-v2",
    block_tensors=JINA_BLOCK,
    keys=ENCODER_KEYS,
    global_tensors=ENCODER_GLOBALS - {"cls.output.weight", "cls.output.bias"},
    fused_qkv=True,
    rope_type=ROPE_NONE,  # ALiBi
    read=read_encoder,
    tensor_shapes=jina_shapes,
    check=check_jina,
    checked_shapes=frozenset({"ffn_up.weight", "ffn_up.bias"}),
)


class JinaBertV2Model(EncoderModel):
    position_embd = False
    alibi_max_bias = MAX_ALIBI_BIAS

    def load_ffn(self, src: TensorSource, il: int) -> tuple[str, Any, Any, Any]:
        be, p, e, f = self.be, f"blk.{il}.", self.cfg.n_embd, self.cfg.n_ff
        b_down = load_biases(be, src, [(p + "ffn_down.bias", e)])
        if src.has(p + "ffn_gate.weight"):  # gelu(gate) * up: the gate unbiased, as llama.cpp passes it
            w = be.load_matrix([src.get(p + "ffn_gate.weight", (f, e)), src.get(p + "ffn_up.weight", (f, e))])
            return (
                "geglu",
                w,
                load_biases(be, src, [(p + "ffn_gate.none", f), (p + "ffn_up.bias", f)]),
                b_down,
            )
        rows = src.gguf.tensors[p + "ffn_up.weight"].shape[0]
        w = be.load_matrix([src.get(p + "ffn_up.weight", (rows, e))])
        return (
            ("geglu" if rows == 2 * f else "gelu"),
            w,
            load_biases(be, src, [(p + "ffn_up.bias", rows)]),
            b_down,
        )


MODEL = JinaBertV2Model
