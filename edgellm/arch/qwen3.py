"""Qwen 3 decoder (dense: 0.6B .. 32B): llama with per-head RMSNorms of Q and K, rope rotating halves (NEOX).

x = embed(tokens)                                  # [T, n_embd]
for each layer:
    q, k = rmsnorm_heads(Wq h) * attn_q_norm, rmsnorm_heads(Wk h) * attn_k_norm   # per head [d]
    x += Wo @ attention(rope(q), rope(k), Wv h)    with h = rmsnorm(x) * attn_norm
    x += W_down @ (silu(W_gate h) * (W_up h))      with h = rmsnorm(x) * ffn_norm
logits = W_out @ (rmsnorm(x) * output_norm)        # tied to the embedding when the file has no output
score = softmax(cls_out @ (rmsnorm(x) * output_norm))[0] at the last token   # a reranker, pooling rank
"""

from __future__ import annotations

from edgellm.arch.llama import LlamaModel
from edgellm.arch.spec import GLOBAL_TENSORS, LLAMA_BLOCK, QK_NORMS, QKV_BIASES, ArchSpec
from edgellm.gguf.model_config import ModelConfig
from edgellm.gguf.reader import GGUFError, GGUFFile


def read_qwen3(g: GGUFFile, cfg: ModelConfig) -> None:
    """A Qwen3-Reranker's head: cls.output [n_cls_out, n_embd] (its labels qwen3.classifier.output_labels,
    "yes"/"no"), run with pooling rank at the last token and a softmax over the labels (llama.cpp's
    build_pooling): LlamaModel.forward_hidden."""
    labels = g.get("qwen3.classifier.output_labels")
    if labels is not None:
        if not isinstance(labels, list) or not labels:
            raise GGUFError(f"{g.path}: metadata qwen3.classifier.output_labels must be a non-empty array")
        cfg.n_cls_out = len(labels)
    cfg.rank_head = "cls.output.weight" in g.tensors


SPEC = ArchSpec(
    name="qwen3",
    block_tensors=LLAMA_BLOCK | QKV_BIASES | QK_NORMS,
    keys=frozenset({"classifier.output_labels"}),
    global_tensors=GLOBAL_TENSORS | {"cls.output.weight"},
    fused_qkv=True,
    flags={"qk_norm": True},
    read=read_qwen3,
)
MODEL = LlamaModel  # the Q/K norms are AttentionWeights.q_norm / k_norm, which the attention block applies
