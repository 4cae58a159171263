"""End to end on tiny random models of every supported architecture (written by
edgellm.testing.synthetic.models).

The check that matters is `llm.score` against an independent float64 numpy forward pass written here from
llama.cpp's graph definitions (src/models/llama.cpp, qwen2.cpp, qwen3.cpp, gemma3.cpp), reading the file
with gguf-py's own reader and dequantizer. It covers what the real-model fixtures cannot isolate: Qwen 2's
QKV biases, Q/K norms, NEOX vs NORM rope, GQA head grouping, Gemma's embedding scale, post norms, GeGLU,
sliding-window layers with their own rope base.

Error measures, relative to the spread of the reference logits: rms = RMS(logits - ref) / std(ref) and
max = max|logits - ref| / std(ref). The runtime rounds K/V to f16 and, for quantized weights, quantizes
activations to int8 per block as llama.cpp does; the reference does neither. Measured over seeds 1/3/5 and
all four architectures (2 layers; Gemma 3 7 layers):
- F32 weights (only f16 K/V rounding and f32 accumulation): rms <= 2.8e-4, max <= 1.6e-3.
  Limits: rms 1e-3, max 5e-3.
- quantized weights: int8 activations add ~0.5% relative noise per matmul (a rounding step of amax/127
  over 32 values), ~11 matmuls deep: rms 0.6..1.4e-2, max up to 7.7e-2 (the largest of ~6000 logits).
  Limits: rms 3e-2, max 0.15.
A wrong rope layout, missing bias or norm, wrong head grouping or window gives rms and max of order 1.
"""

from __future__ import annotations

import math
from pathlib import Path

import gguf
import numpy as np
import pytest

from edgellm import LLM, SamplingParams
from edgellm.gguf.model_config import ROPE_NEOX, ROPE_NORM
from edgellm.testing.synthetic.models import write_tiny_model

# The architectures this module's float64 forward implements; gemma2, granite and olmo2 are checked against
# llama.cpp itself (tests/gguf/test_oracle_cases.py).
ARCHS = ("llama", "qwen2", "qwen3", "gemma3")

LLM_KW = dict(n_ctx=128, kv_cache_memory=1 << 20)
TOL_F32 = (1e-3, 5e-3)  # (rms, max), see the module docstring
TOL_QUANT = (3e-2, 0.15)
GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


# ---- independent float64 reference ---------------------------------------------------------------------
class Reference:
    """A model file read with gguf.GGUFReader, weights dequantized by gguf-py, forward in float64."""

    def __init__(self, path: Path) -> None:
        r = gguf.GGUFReader(path)
        self.md = {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}
        self.w = {
            t.name: gguf.quants.dequantize(t.data, t.tensor_type)
            .reshape(tuple(int(n) for n in reversed(t.shape)))
            .astype(np.float64)
            for t in r.tensors
        }
        self.arch = self.md["general.architecture"]
        p = self.arch + "."
        self.n_layers = self.md[p + "block_count"]
        self.n_embd = self.md[p + "embedding_length"]
        self.H = self.md[p + "attention.head_count"]
        self.Hkv = self.md[p + "attention.head_count_kv"]
        self.d = self.md.get(p + "attention.key_length", self.n_embd // self.H)
        self.eps = self.md[p + "attention.layer_norm_rms_epsilon"]
        self.base = self.md[p + "rope.freq_base"]
        self.window = self.md.get(p + "attention.sliding_window", 0)

    @staticmethod
    def rms(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w

    def rope(self, x: np.ndarray, pos: np.ndarray, base: float) -> np.ndarray:
        """x: [T, heads, d]. llama: NORM (adjacent pairs); qwen2/qwen3/gemma3: NEOX (halves)."""
        d = x.shape[-1]
        theta = pos[:, None] * base ** (-np.arange(0, d, 2) / d)  # [T, d/2]
        cos, sin = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
        if self.arch == "llama":
            a, b = x[..., 0::2], x[..., 1::2]
        else:
            a, b = x[..., : d // 2], x[..., d // 2 :]
        ra, rb = a * cos - b * sin, a * sin + b * cos
        out = np.empty_like(x)
        if self.arch == "llama":
            out[..., 0::2], out[..., 1::2] = ra, rb
        else:
            out[..., : d // 2], out[..., d // 2 :] = ra, rb
        return out

    def is_swa(self, il: int) -> bool:
        return self.arch == "gemma3" and self.window > 0 and il % 6 < 5

    def attention(self, h: np.ndarray, il: int) -> np.ndarray:
        w, p = self.w, f"blk.{il}."
        T, H, Hkv, d = h.shape[0], self.H, self.Hkv, self.d
        q, k, v = h @ w[p + "attn_q.weight"].T, h @ w[p + "attn_k.weight"].T, h @ w[p + "attn_v.weight"].T
        if self.arch == "qwen2":
            q, k, v = q + w[p + "attn_q.bias"], k + w[p + "attn_k.bias"], v + w[p + "attn_v.bias"]
        q, k, v = q.reshape(T, H, d), k.reshape(T, Hkv, d), v.reshape(T, Hkv, d)
        if self.arch in ("qwen3", "gemma3"):
            q = self.rms(q, w[p + "attn_q_norm.weight"], self.eps)
            k = self.rms(k, w[p + "attn_k_norm.weight"], self.eps)
        base = 10000.0 if self.is_swa(il) else self.base  # Gemma 3's local layers: rope base 10k
        pos = np.arange(T, dtype=np.float64)
        q, k = self.rope(q, pos, base), self.rope(k, pos, base)
        i, j = np.arange(T)[:, None], np.arange(T)[None, :]
        allowed = j <= i
        if self.is_swa(il):
            allowed &= i - j < self.window  # llama.cpp masks p1 - p0 >= n_swa
        out = np.empty((T, H, d))
        for head in range(H):
            kv = head // (H // Hkv)  # GQA: consecutive query heads share a KV head (ggml broadcast)
            s = q[:, head] @ k[:, kv].T / math.sqrt(d)
            s = np.where(allowed, s, -np.inf)
            prob = np.exp(s - s.max(-1, keepdims=True))
            out[:, head] = (prob / prob.sum(-1, keepdims=True)) @ v[:, kv]
        o = out.reshape(T, H * d) @ w[p + "attn_output.weight"].T
        if self.arch == "gemma3":
            o = self.rms(o, w[p + "post_attention_norm.weight"], self.eps)
        return o

    def feed_forward(self, h: np.ndarray, il: int) -> np.ndarray:
        w, p = self.w, f"blk.{il}."
        g, u = h @ w[p + "ffn_gate.weight"].T, h @ w[p + "ffn_up.weight"].T
        if self.arch == "gemma3":  # GeGLU, tanh form
            act = 0.5 * g * (1 + np.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g**3)))
        else:  # SwiGLU
            act = g / (1 + np.exp(-g))
        f = (act * u) @ w[p + "ffn_down.weight"].T
        if self.arch == "gemma3":
            f = self.rms(f, w[p + "post_ffw_norm.weight"], self.eps)
        return f

    def logits(self, ids: list[int]) -> np.ndarray:
        w = self.w
        x = w["token_embd.weight"][ids]
        if self.arch == "gemma3":
            x = x * math.sqrt(self.n_embd)
        for il in range(self.n_layers):
            x = x + self.attention(self.rms(x, w[f"blk.{il}.attn_norm.weight"], self.eps), il)
            x = x + self.feed_forward(self.rms(x, w[f"blk.{il}.ffn_norm.weight"], self.eps), il)
        x = self.rms(x, w["output_norm.weight"], self.eps)
        return x @ w.get("output.weight", w["token_embd.weight"]).T


def rel_errors(got: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
    """(rms, max) of got - ref, relative to std(ref)."""
    diff, scale = got - ref, ref.std()
    return float(np.sqrt((diff**2).mean()) / scale), float(np.abs(diff).max() / scale)


def assert_close(got: np.ndarray, ref: np.ndarray, tol: tuple[float, float], what: str) -> None:
    rms, mx = rel_errors(got, ref)
    assert rms < tol[0] and mx < tol[1], f"{what}: logit error rms {rms:.2e}, max {mx:.2e} (limits {tol})"


# ---- fixtures --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tiny")


@pytest.fixture(scope="module", params=ARCHS)
def tiny(request: pytest.FixtureRequest, tiny_dir: Path) -> tuple[str, Path, LLM]:
    """Each architecture with the default quant mix, loaded once for the module."""
    arch = request.param
    path = write_tiny_model(tiny_dir / f"{arch}.gguf", arch, seed=1)
    return arch, path, LLM(path, **LLM_KW)


def prompt_ids(llm: LLM, n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, llm.config.n_vocab, n).tolist()


# ---- config ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ARCHS)
def test_config_read_from_metadata(arch: str, tmp_path: Path) -> None:
    # head_dim != n_embd / n_heads so that attention.key_length must be read, not derived
    path = write_tiny_model(
        tmp_path / "m.gguf",
        arch,
        n_layers=7,
        n_heads=4,
        n_kv_heads=1,
        head_dim=32,
        n_ff=96,
        sliding_window=5,
        rope_base=50000.0,
        rms_eps=1e-6,
    )
    llm = LLM(path, **LLM_KW)
    cfg = llm.config
    assert (cfg.arch, cfg.n_layers, cfg.n_embd, cfg.n_ff) == (arch, 7, 64, 96)
    assert (cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.head_dim_v) == (4, 1, 32, 32)
    assert cfg.n_vocab == len(llm.metadata["tokenizer.ggml.tokens"]) == llm.tokenizer.vocab_size
    assert cfg.n_ctx_train == 256 and cfg.rope.base == 50000.0
    assert cfg.rms_eps == pytest.approx(1e-6)
    assert cfg.rope_type == (ROPE_NORM if arch == "llama" else ROPE_NEOX)
    assert cfg.qkv_bias == (arch == "qwen2")
    assert cfg.qk_norm == (arch in ("qwen3", "gemma3"))
    assert cfg.post_norms == (arch == "gemma3")
    assert cfg.attn_scale == pytest.approx(1 / math.sqrt(32))
    if arch == "gemma3":
        assert cfg.sliding_window == 5 and cfg.activation == "gelu"
        assert cfg.swa_layers == [True] * 5 + [False, True]  # five local layers, then a global one
        assert cfg.embd_scale == pytest.approx(8.0)
    else:
        assert cfg.swa_layers == [False] * 7 and cfg.activation == "silu"


# ---- forward pass vs the reference ------------------------------------------------------------------------
def test_score_matches_reference(tiny: tuple[str, Path, LLM]) -> None:
    arch, path, llm = tiny
    ids = prompt_ids(llm, 14, seed=2)
    got = llm.score(ids)
    ref = Reference(path).logits(ids)
    assert got.shape == ref.shape == (14, llm.config.n_vocab)
    assert_close(got, ref, TOL_QUANT, arch)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_score_matches_reference_f32(arch: str, tied: bool, tmp_path: Path) -> None:
    """Float weights leave only f16 K/V rounding: a tight check of every architecture detail. Gemma 3 gets
    7 layers and a 4-token window so that both local and global layers (and their rope bases) count."""
    n_layers = 7 if arch == "gemma3" else 2
    path = write_tiny_model(tmp_path / "m.gguf", arch, "F32", n_layers=n_layers, tied=tied, seed=3)
    llm = LLM(path, **LLM_KW)
    ids = prompt_ids(llm, 20, seed=4)
    got, ref = llm.score(ids), Reference(path).logits(ids)
    assert_close(got, ref, TOL_F32, f"{arch} F32")


@pytest.mark.parametrize(
    "qtypes",
    [
        {"*": "BF16"},
        {"*": "Q4_K", "attn_v": "Q6_K", "ffn_down": "Q5_K", "attn_output": "Q3_K", "ffn_up": "Q2_K"},
    ],
    ids=["bf16", "k-quants"],
)
def test_score_matches_reference_other_types(qtypes: dict[str, str], tmp_path: Path) -> None:
    """BF16 and the k-quants (random raw blocks: gguf cannot quantize them) on a 256-wide model."""
    path = write_tiny_model(
        tmp_path / "m.gguf",
        "qwen3",
        qtypes,
        n_embd=256,
        n_heads=4,
        n_kv_heads=2,
        head_dim=64,
        n_ff=512,
        seed=6,
    )
    llm = LLM(path, **LLM_KW)
    ids = prompt_ids(llm, 12, seed=7)
    assert_close(llm.score(ids), Reference(path).logits(ids), TOL_QUANT, str(qtypes))


def test_reference_detects_architecture_details(tmp_path: Path) -> None:
    """The reference is sensitive to what it checks: dropping Gemma's window, or using the wrong rope
    layout for Qwen, moves the logits far beyond the tolerance."""
    path = write_tiny_model(tmp_path / "g.gguf", "gemma3", "F32", n_layers=7, seed=3)
    ref = Reference(path)
    ids = list(range(3, 23))
    good = ref.logits(ids)
    ref.window = 0
    assert rel_errors(ref.logits(ids), good)[0] > 5 * TOL_QUANT[0]
    path = write_tiny_model(tmp_path / "q.gguf", "qwen2", "F32", seed=3)
    ref = Reference(path)
    good = ref.logits(ids)
    ref.arch = "llama"  # NORM rope and no biases
    assert rel_errors(ref.logits(ids), good)[0] > 5 * TOL_QUANT[0]


# ---- generation --------------------------------------------------------------------------------------------
def test_greedy_generation_is_deterministic_and_follows_reference(tiny: tuple[str, Path, LLM]) -> None:
    """Greedy decode (prefill, then one token at a time through the KV cache) picks, at every step, a token
    the reference also ranks first, up to the tolerance."""
    arch, path, llm = tiny
    prompt = prompt_ids(llm, 6, seed=5)
    first = llm.generate(prompt, GREEDY)[0]
    second = llm.generate(prompt, GREEDY)[0]
    assert first.token_ids == second.token_ids
    assert len(first.token_ids) == GREEDY.max_tokens and first.finish_reason == "length"
    assert first.text == llm.detokenize(first.token_ids)
    ref = Reference(path).logits(prompt + first.token_ids)
    scale = ref.std()
    for step, tok in enumerate(first.token_ids):
        row = ref[len(prompt) - 1 + step]
        gap = (row.max() - row[tok]) / scale
        best = int(row.argmax())
        assert gap <= TOL_QUANT[1], f"{arch}: step {step} chose {tok}, reference best {best} ({gap:.2e})"


def test_batched_generation_equals_single(tiny: tuple[str, Path, LLM]) -> None:
    arch, _, llm = tiny
    prompts = [prompt_ids(llm, n, seed=10 + n) for n in (3, 9, 17)]
    alone = [llm.generate(p, GREEDY)[0].token_ids for p in prompts]
    together = [out.token_ids for out in llm.generate(prompts, GREEDY)]
    assert together == alone, arch


def test_text_prompt_roundtrip(tiny: tuple[str, Path, LLM]) -> None:
    """The tiny vocabularies are real tokenizers: text encodes with merges/pieces and decodes back."""
    arch, _, llm = tiny
    text = "Hello world and the cat is in"
    ids = llm.tokenize(text)
    assert len(ids) < len(text.encode())  # merges / pieces were used, not just bytes
    assert llm.detokenize(ids).strip() == text
    out = llm.generate(text, GREEDY)[0]
    assert out.prompt_token_ids[-len(ids) :] == ids
