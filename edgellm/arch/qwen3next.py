"""Qwen3-Next (80B-A3B): Qwen 3.5's earlier form, as llama.cpp's llama_model_qwen3next
(src/models/qwen3next.cpp) runs it: the layers of arch/qwen35.py (Gated DeltaNet, gated full attention) and
the experts of arch/qwen35moe.py, with three differences:

- beta and alpha come from one matrix, ssm_ba [2 * Hv, n_embd], whose rows are grouped by key head (per
  key head g: its Hv/Hk betas, then its Hv/Hk alphas); loaded regrouped as [betas | alphas];
- value head h reads key head h // (Hv / Hk) (llama.cpp repeat-interleaves the key heads here; Qwen 3.5's
  converter reorders the value heads so that a plain repeat works);
- the rope is the plain NEOX one on the first rope.dimension_count dims (no sections).

The older single ssm_in projection (q|k|v|z per key head) is not implemented: such a file is refused naming
the tensor (llama.cpp's converter has written attn_qkv and attn_gate since).
"""

from __future__ import annotations

from typing import Any

from edgellm.arch.common import TensorSource
from edgellm.arch.deltanet import BETA_ALPHA, DELTANET_TENSORS, deltanet_shapes, load_deltanet, read_deltanet
from edgellm.arch.qwen2moe import SHARED_EXPERT
from edgellm.arch.qwen35 import (
    ATTENTION_TENSORS,
    HYBRID_KEYS,
    LAYER_TENSORS,
    MTP_TENSORS,
    hybrid_layer_check,
    read_hybrid_layers,
    skip_mtp_layers,
)
from edgellm.arch.qwen35moe import Qwen35MoeModel, qwen35moe_shapes
from edgellm.arch.spec import DENSE_FFN, EXPERT_KEYS, EXPERT_TENSORS, ArchSpec, Experts, Shapes
from edgellm.gguf.model_config import ModelConfig
from edgellm.gguf.reader import GGUFError, GGUFFile


def read_qwen3next(g: GGUFFile, cfg: ModelConfig) -> None:
    if cfg.head_dim_v != cfg.head_dim:
        raise GGUFError(
            f"{g.path}: qwen3next key / value head sizes {cfg.head_dim} / {cfg.head_dim_v} must be equal"
        )
    read_deltanet(g, cfg)
    skip_mtp_layers(g, cfg)
    read_hybrid_layers(g, cfg)


def qwen3next_shapes(cfg: ModelConfig) -> Shapes:
    """qwen35moe's tensors, each DeltaNet layer's ssm_ba in place of ssm_beta and ssm_alpha."""
    shapes = qwen35moe_shapes(cfg)
    for il in range(cfg.n_layers):
        if cfg.conv_layers[il]:
            p = f"blk.{il}."
            del shapes[p + "ssm_beta.weight"], shapes[p + "ssm_alpha.weight"]
            shapes[p + BETA_ALPHA] = deltanet_shapes(cfg, True)[BETA_ALPHA]
    return shapes


SPEC = ArchSpec(
    name="qwen3next",
    block_tensors=(LAYER_TENSORS - DENSE_FFN)
    | EXPERT_TENSORS
    | SHARED_EXPERT
    | ATTENTION_TENSORS
    | (DELTANET_TENSORS - {"ssm_beta.weight", "ssm_alpha.weight"})
    | {BETA_ALPHA}
    | MTP_TENSORS,
    keys=(HYBRID_KEYS - {"rope.dimension_sections"})
    | EXPERT_KEYS
    | {"expert_feed_forward_length", "expert_shared_feed_forward_length"},
    experts=Experts(renormalise=True, width_key=False, shared=True),
    read=read_qwen3next,
    tensor_shapes=qwen3next_shapes,
    check=hybrid_layer_check(qwen3next_shapes),
)


class Qwen3NextModel(Qwen35MoeModel):
    """Qwen35MoeModel with Qwen3-Next's DeltaNet weights (ssm_ba, grouped heads); cfg.rope has no sections."""

    def load_layer(self, src: TensorSource, il: int) -> tuple[Any, Any]:
        if not self.cfg.conv_layers[il]:
            return super().load_layer(src, il)
        return load_deltanet(self.be, src, self.cfg, il, qwen3next=True), self.load_ffn(src, il)


MODEL = Qwen3NextModel
