"""DeepSeek 2 decoder with multi-head latent attention (DeepSeek V2 / V2-Lite / V3 / R1, Kimi K2,
GLM-4.7-Flash; llama.cpp's LLM_ARCH_DEEPSEEK2, src/models/deepseek2.cpp, the MLA form of files converted
with attn_k_b / attn_v_b), the absorbed form: every head attends over one shared latent K/V per token, which
is what the KV cache holds (not the per-head K/V expanded from it).

Sizes: r = attention.kv_lora_rank, n_rot = rope.dimension_count, dk = attention.key_length_mla (= nope +
n_rot), dv = attention.value_length_mla; the cache's K is r + n_rot wide (attention.key_length), its V r
(attention.value_length), one KV head (attention.head_count_kv = 1).

x = embed(tokens)                                  # [T, n_embd]
for each layer il:
    h = rmsnorm(x) * attn_norm
    q = Wq_b (rmsnorm(Wq_a h) * q_a_norm)          # [T, H, dk]; q-LoRA (or q = Wq h: V2-Lite)
    q_nope, q_pe = q[..., :nope], rope(q[..., nope:])
    c, k_pe = Wkv_a h split at r                   # [T, r], [T, n_rot]
    c = rmsnorm(c) * kv_a_norm; k_pe = rope(k_pe)  # the latent and the shared rotated key
    Q = [Wk_b[h] q_nope[h] | q_pe[h]]              # [T, H, r + n_rot]: absorbed per head
    K, V = [c | k_pe], c                           # [T, 1, r + n_rot], [T, 1, r]: cached
    o[h] = Wv_b[h] attention(Q, K, V)[h]           # [T, H, dv], scale mscale^2 / sqrt(dk)
    x += Wo o
    h = rmsnorm(x) * ffn_norm
    il < leading_dense_block_count: x += dense SwiGLU FFN (n_ff)
    else: x += MoE(h) + shared experts (arch/moe.py: softmax or sigmoid gating, exp_probs_b, groups)
logits = W_out @ (rmsnorm(x) * output_norm)

mscale: llama.cpp's YaRN pre-scaling, attn_factor (1 + 0.1 ln s)(1 + 0.1 m ln s) with s the scaling factor
and m rope.scaling.yarn_log_multiplier / 0.1 (the converter's 0.1 cancelled). What remains (issue 56): the
cache holds V beside K although V is K's first r columns (llama.cpp caches K only: 2r + n_rot values a
token here against r + n_rot), and the expanded (non-absorbed) form for long prefills; the legacy unsplit
attn_kv_b files and Mistral Large's temperature keys are refused; multi-token-prediction layers are
skipped, as llama.cpp skips them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from edgellm.arch.common import ForwardBatch, TensorSource, load_feed_forward, pre_norm
from edgellm.arch.glm4moe import SELECTION_BIAS, SHARED_EXPERT, glm4moe_ffn_block
from edgellm.arch.llama import LlamaModel
from edgellm.arch.moe import expert_slice, load_moe_feed_forward
from edgellm.arch.spec import (
    DENSE_FFN,
    EXPERT_GROUP_KEYS,
    EXPERT_KEYS,
    EXPERT_TENSORS,
    ArchSpec,
    Experts,
    Shapes,
)
from edgellm.gguf.metadata import get_float, get_int
from edgellm.gguf.model_config import MAX_HEAD_DIM, ROPE_NORM, ModelConfig, UnsupportedArchitectureError
from edgellm.gguf.reader import GGUFError, GGUFFile

if TYPE_CHECKING:
    from edgellm.backends.base import Backend

MLA_TENSORS = frozenset(
    {
        "attn_norm.weight",
        "attn_q.weight",  # without q-LoRA (V2-Lite)
        "attn_q_a.weight",
        "attn_q_a_norm.weight",
        "attn_q_b.weight",
        "attn_kv_a_mqa.weight",
        "attn_kv_a_norm.weight",
        "attn_k_b.weight",
        "attn_v_b.weight",
        "attn_output.weight",
        "ffn_norm.weight",
    }
)
GATING_FUNCS = {1: "softmax", 2: "sigmoid"}  # llama_expert_gating_func_type (0: by the model, below)


def read_deepseek2(g: GGUFFile, cfg: ModelConfig) -> None:
    """As llama_model_deepseek2::load_arch_hparams: the LoRA ranks (q_lora_rank 0 or absent: no q-LoRA),
    the MLA head sizes (required here: the absorbed form), the shared experts, leading dense layers, the
    experts' weight norm / scale / gating (0: softmax, sigmoid for GLM-4.7-Flash's shape), and the YaRN
    pre-scaling of Q.K."""
    p = "deepseek2."
    # llama.cpp requires the q-LoRA rank (0: attn_q) except of the Lite shapes, which may omit it
    lite = cfg.n_layers in (26, 27) or (cfg.n_layers == 48 and cfg.n_vocab == 128256)
    q_lora_default = {"default": 0} if lite else {}
    cfg.mla_q_lora_rank = get_int(g, p + "attention.q_lora_rank", lo=0, hi=g.file_size, **q_lora_default)
    r = cfg.mla_kv_lora_rank = get_int(g, p + "attention.kv_lora_rank", lo=1, hi=g.file_size)
    dk = cfg.mla_head_dim_k = get_int(g, p + "attention.key_length_mla", lo=1, hi=g.file_size)
    cfg.mla_head_dim_v = get_int(g, p + "attention.value_length_mla", lo=1, hi=g.file_size)
    if cfg.n_kv_heads != 1 or cfg.head_dim != r + cfg.rope_dim or cfg.head_dim_v != r or dk <= cfg.rope_dim:
        raise GGUFError(
            f"{g.path}: MLA needs head_count_kv 1, key_length = kv_lora_rank + rope.dimension_count, "
            f"value_length = kv_lora_rank and key_length_mla > rope.dimension_count; the file has "
            f"{cfg.n_kv_heads}, {cfg.head_dim} (r {r}, rope {cfg.rope_dim}), {cfg.head_dim_v}, {dk}"
        )
    n_shared = get_int(g, p + "expert_shared_count", lo=0, hi=cfg.n_expert)
    cfg.n_ff_shexp = cfg.n_ff_exp * n_shared
    cfg.shared_expert_gate = False
    cfg.n_layer_dense_lead = get_int(g, p + "leading_dense_block_count", 0, lo=0, hi=cfg.n_layers)
    cfg.moe_norm_weights = bool(g.get(p + "expert_weights_norm", False))
    cfg.moe_weights_scale = get_float(g, p + "expert_weights_scale", 0.0, lo=0.0)
    func = get_int(g, p + "expert_gating_func", 0)
    if func == 0:  # V2 / V2.5 files without the key; GLM-4.7-Flash's shape sigmoid
        flash = cfg.n_layers in (47, 48) and cfg.n_vocab == 154880
        func = 2 if flash else 1
    if func not in GATING_FUNCS:
        raise GGUFError(f"{g.path}: metadata {p}expert_gating_func = {func} is not implemented for deepseek2")
    cfg.moe_gating = GATING_FUNCS[func]
    # llama.cpp's kq_scale: the rope's attn_factor with YaRN's 1 + 0.1 ln s put back, times the log
    # multiplier's mscale, squared (float32 as the graph computes it)
    log_mul = get_float(g, p + "rope.scaling.yarn_log_multiplier", 0.0) / np.float32(0.1)
    s = np.float32(1.0) / np.float32(cfg.rope.freq_scale)
    f32 = np.float32
    attn_org = f32(cfg.rope.attn_factor) * (f32(1.0) + f32(0.1) * np.log(s))
    if cfg.rope.ext_factor and log_mul != 0.0:  # llama-context's DeepSeek case: mscale ratio 1
        attn_factor = f32(1.0) / (f32(1.0) + f32(0.1) * np.log(s)) * f32(_rope_attn(g))
        cfg.rope = cfg.rope_swa = replace(cfg.rope, attn_factor=float(attn_factor))
        attn_org = f32(attn_factor) * (f32(1.0) + f32(0.1) * np.log(s))
    mscale = attn_org * (f32(1.0) + f32(0.1) * f32(log_mul) * np.log(s))
    cfg.attn_scale = float(f32(1.0) * mscale * mscale / np.sqrt(f32(dk)))


def _rope_attn(g: GGUFFile) -> float:
    return get_float(g, "deepseek2.rope.scaling.attn_factor", 1.0, lo=0.0, lo_open=True)


def deepseek2_shapes(cfg: ModelConfig) -> Shapes:
    """Every tensor the model reads -> its numpy-order shape (module doc's sizes)."""
    e, f, V, H = cfg.n_embd, cfg.n_ff, cfg.n_vocab, cfg.n_heads
    r, n_rot, dk, dv = cfg.mla_kv_lora_rank, cfg.rope_dim, cfg.mla_head_dim_k, cfg.mla_head_dim_v
    E, fe, fs, qr = cfg.n_expert, cfg.n_ff_exp, cfg.n_ff_shexp, cfg.mla_q_lora_rank
    shapes: Shapes = {"token_embd.weight": (V, e), "output_norm.weight": (e,)}
    for il in range(cfg.n_layers):
        layer: Shapes = {
            "attn_norm.weight": (e,),
            "attn_kv_a_mqa.weight": (r + n_rot, e),
            "attn_kv_a_norm.weight": (r,),
            "attn_k_b.weight": (H, r, dk - n_rot),
            "attn_v_b.weight": (H, dv, r),
            "attn_output.weight": (e, H * dv),
            "ffn_norm.weight": (e,),
        }
        if qr:
            layer.update(
                {"attn_q_a.weight": (qr, e), "attn_q_a_norm.weight": (qr,), "attn_q_b.weight": (H * dk, qr)}
            )
        else:
            layer["attn_q.weight"] = (H * dk, e)
        if il < cfg.n_layer_dense_lead:
            layer.update({"ffn_gate.weight": (f, e), "ffn_up.weight": (f, e), "ffn_down.weight": (e, f)})
        else:
            layer.update(
                {
                    "ffn_gate_inp.weight": (E, e),
                    "ffn_gate_exps.weight": (E, fe, e),
                    "ffn_up_exps.weight": (E, fe, e),
                    "ffn_down_exps.weight": (E, e, fe),
                }
            )
            if fs:
                layer.update(
                    {
                        "ffn_gate_shexp.weight": (fs, e),
                        "ffn_up_shexp.weight": (fs, e),
                        "ffn_down_shexp.weight": (e, fs),
                    }
                )
        shapes.update({f"blk.{il}.{name}": shape for name, shape in layer.items()})
    return shapes


SPEC = ArchSpec(
    name="deepseek2",
    block_tensors=MLA_TENSORS | DENSE_FFN | EXPERT_TENSORS | SHARED_EXPERT | {SELECTION_BIAS},
    keys=EXPERT_KEYS
    | EXPERT_GROUP_KEYS
    | {
        "attention.q_lora_rank",
        "attention.kv_lora_rank",
        "attention.key_length_mla",
        "attention.value_length_mla",
        "expert_feed_forward_length",
        "expert_shared_count",
        "leading_dense_block_count",
        "expert_weights_norm",
        "expert_weights_scale",
        "expert_gating_func",
        "nextn_predict_layers",
    },
    nextn_layers=True,  # GLM-4.5's and DeepSeek V3's released files carry one
    rope_type=ROPE_NORM,
    yarn_keys=("yarn_log_multiplier",),  # read_deepseek2 applies it (llama.cpp's DeepSeek case)
    experts=Experts(renormalise=False, width_key=True, groups=True),
    max_head_dim=2 * MAX_HEAD_DIM,  # the latent K: 576 in the released files (CPU only: DeepSeek2Model)
    read=read_deepseek2,
    tensor_shapes=deepseek2_shapes,
)


@dataclass
class LatentAttentionWeights:
    norm: Any  # [n_embd]
    wq: Any  # [H * dk, n_embd] without q-LoRA; else None
    wq_a: Any  # [q_lora_rank, n_embd]
    q_a_norm: Any  # [q_lora_rank]
    wq_b: Any  # [H * dk, q_lora_rank]
    wkv_a: Any  # [r + n_rot, n_embd]: the latent | the shared rotated key
    kv_a_norm: Any  # [r]
    wk_b: list[Any]  # H x [r, nope]: q_nope -> the latent's space (absorbed into Q)
    wv_b: list[Any]  # H x [dv, r]: the latent's attention output -> the head's value
    wo: Any  # [n_embd, H * dv]


def load_latent_attention(
    be: Backend, src: TensorSource, cfg: ModelConfig, il: int
) -> LatentAttentionWeights:
    p = f"blk.{il}."
    e, H, r, n_rot = cfg.n_embd, cfg.n_heads, cfg.mla_kv_lora_rank, cfg.rope_dim
    dk, dv, qr = cfg.mla_head_dim_k, cfg.mla_head_dim_v, cfg.mla_q_lora_rank
    k_b = src.get(p + "attn_k_b.weight", (H, r, dk - n_rot))  # [H, r, nope]: one matrix per head
    v_b = src.get(p + "attn_v_b.weight", (H, dv, r))
    w = LatentAttentionWeights(
        norm=be.load_vector(src.get(p + "attn_norm.weight", (e,))),
        wq=None,
        wq_a=None,
        q_a_norm=None,
        wq_b=None,
        wkv_a=be.load_matrix([src.get(p + "attn_kv_a_mqa.weight", (r + n_rot, e))]),
        kv_a_norm=be.load_vector(src.get(p + "attn_kv_a_norm.weight", (r,))),
        wk_b=[be.load_matrix([expert_slice(k_b, h)]) for h in range(H)],
        wv_b=[be.load_matrix([expert_slice(v_b, h)]) for h in range(H)],
        wo=be.load_matrix([src.get(p + "attn_output.weight", (e, H * dv))]),
    )
    if qr:
        w.wq_a = be.load_matrix([src.get(p + "attn_q_a.weight", (qr, e))])
        w.q_a_norm = be.load_vector(src.get(p + "attn_q_a_norm.weight", (qr,)))
        w.wq_b = be.load_matrix([src.get(p + "attn_q_b.weight", (H * dk, qr))])
    else:
        w.wq = be.load_matrix([src.get(p + "attn_q.weight", (H * dk, e))])
    return w


def latent_attention_block(
    be: Backend,
    cfg: ModelConfig,
    w: LatentAttentionWeights,
    x: Any,
    batch: ForwardBatch,
    kv: Any,
    il: int,
    inp: Any,
) -> None:
    """x += MLA(norm(x)) in the absorbed form (module doc), writing the tokens' latent K/V. x: [T, n_embd]."""
    T, H = batch.n_tokens, cfg.n_heads
    r, n_rot, dk, dv = cfg.mla_kv_lora_rank, cfg.rope_dim, cfg.mla_head_dim_k, cfg.mla_head_dim_v
    nope = dk - n_rot
    h = pre_norm(be, cfg, w.norm, x, T)  # [T, n_embd]
    q = be.empty((T, H * dk))
    if w.wq is not None:
        be.matmul(h, w.wq, q)
    else:
        qa = be.empty((T, cfg.mla_q_lora_rank))
        be.matmul(h, w.wq_a, qa)
        be.rmsnorm(qa, w.q_a_norm, cfg.rms_eps, qa)
        be.matmul(qa, w.wq_b, q)
    q_host = be.to_host(q).reshape(T, H, dk)
    q_pe = be.from_host(np.ascontiguousarray(q_host[:, :, nope:]))  # [T, H, n_rot]
    ckv = be.empty((T, r + n_rot))
    be.matmul(h, w.wkv_a, ckv)  # [T, r + n_rot]
    ckv_host = be.to_host(ckv)
    latent = be.from_host(np.ascontiguousarray(ckv_host[:, :r]))  # [T, r]
    k_pe = be.from_host(np.ascontiguousarray(ckv_host[:, r:].reshape(T, 1, n_rot)))  # [T, 1, n_rot]
    be.rope(k_pe, inp.positions, cfg.rope)
    be.rmsnorm(latent, w.kv_a_norm, cfg.rms_eps, latent)
    be.rope(q_pe, inp.positions, cfg.rope)
    q_full = np.empty((T, H, r + n_rot), np.float32)  # [T, H, r + n_rot]: absorbed Q | rotated Q
    q_full[:, :, r:] = be.to_host(q_pe)
    for head in range(H):
        q_abs = be.empty((T, r))
        be.matmul(be.from_host(np.ascontiguousarray(q_host[:, head, :nope])), w.wk_b[head], q_abs)
        q_full[:, head, :r] = be.to_host(q_abs)
    latent_host = be.to_host(latent)
    k_full = np.concatenate([latent_host, be.to_host(k_pe).reshape(T, n_rot)], axis=1).reshape(
        T, 1, r + n_rot
    )
    v = be.from_host(np.ascontiguousarray(latent_host.reshape(T, 1, r)))
    be.write_kv(kv, il, be.from_host(np.ascontiguousarray(k_full, np.float32)), v, inp.slots)
    attn = be.empty((T, H, r))
    be.attention(
        be.from_host(q_full), kv, il, inp.block_tables, inp.seq_index, inp.positions, 0, cfg.attn_scale, attn
    )
    attn_host = be.to_host(attn)
    o = np.empty((T, H * dv), np.float32)
    for head in range(H):
        oh = be.empty((T, dv))
        be.matmul(be.from_host(np.ascontiguousarray(attn_host[:, head, :])), w.wv_b[head], oh)
        o[:, head * dv : (head + 1) * dv] = be.to_host(oh)
    out = be.empty((T, cfg.n_embd))
    be.matmul(be.from_host(o), w.wo, out)
    be.add(x, out)


class DeepSeek2Model(LlamaModel):
    def __init__(self, cfg: ModelConfig, gguf: GGUFFile, be: Backend, progress=None) -> None:
        if be.name != "cpu" and max(cfg.head_dim, cfg.head_dim_v) > MAX_HEAD_DIM:
            raise UnsupportedArchitectureError(
                f"{gguf.path}: deepseek2's latent head of {cfg.head_dim} exceeds the {be.name} backend's "
                f"attention bound of {MAX_HEAD_DIM}: use --backend cpu"
            )
        super().__init__(cfg, gguf, be, progress)
        self.ffn_block = glm4moe_ffn_block  # a leading layer's dense FFN, else the experts
        self.fused = [None] * cfg.n_layers  # no backend has a one-call MLA layer

    def load_layer(self, src: TensorSource, il: int) -> tuple[Any, Any]:
        be, cfg = self.be, self.cfg
        attn = load_latent_attention(be, src, cfg, il)
        if il < cfg.n_layer_dense_lead:
            return attn, load_feed_forward(be, src, cfg, il)
        return attn, load_moe_feed_forward(be, src, cfg, il)

    def _layers(self, batch: ForwardBatch, kv: Any) -> tuple[Any, Any]:
        be, cfg = self.be, self.cfg
        inp = be.step_inputs(batch)
        x = self.embed(batch, inp)  # [T, n_embd]
        for il, (attn_w, ffn_w) in enumerate(self.layers):
            latent_attention_block(be, cfg, attn_w, x, batch, kv, il, inp)
            self.ffn_block(be, cfg, ffn_w, x, batch.n_tokens)
        return x, inp


MODEL = DeepSeek2Model
