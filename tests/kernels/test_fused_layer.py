"""The CPU backend's one-call decoder layer (backends/cpu/layer.py) against the model's kernel-by-kernel
blocks: the same logits bit for bit, for every architecture, over a prefill of two sequences and decode
steps at batch 2 and 1, and the fallbacks where it has no fused form; on every CPU tier the host can run,
the same logits as the best tier's."""

from __future__ import annotations

import numpy as np
import pytest

from edgellm.backends.cpu import tiers, vnni
from edgellm.testing.fused import QTYPES
from edgellm.testing.fused import load_runner as _load
from edgellm.testing.fused import run_logits as _logits
from edgellm.testing.oracle.cases import LLAMA_BIASES, SMALL, SOME_BIASES, bias_tensors
from edgellm.testing.synthetic.models import ARCHS, MOE_ARCHS, write_tiny_model

FUSED_TIERS = [t.name for t in tiers.compiled_tiers() if t.fused_layer]
pytestmark = pytest.mark.skipif(
    not tiers.active_tier().fused_layer, reason="the fused layer needs a tile tier with F16C"
)


# no fused form: OLMo 2 (no pre-norms, whole-projection Q/K norms), StarCoder 2 and GPT-2 (LayerNorm, the
# ungated MLP), OLMoE (whole-projection Q/K norms): the blocks run (qwen3moe, qwen2moe, gpt-oss: the attention
# fused, sinks, biases and sliding window included, the experts after it); GLM-4.5 MoE (its partial rope
# not checked against the fused kernel yet), DeepSeek 2 (latent attention: no fused form), Llama 4 (the L2
# norm after rope, the temperature)
UNFUSED_ARCHS = ("olmo2", "starcoder2", "gpt2", "olmoe", "glm4moe", "deepseek2", "llama4")
# layers with a recurrent state beside attention: LFM2 (test_lfm2_fuses_its_attention_layers_only); the
# Qwen 3.5 family's gated attention (q | gate, sigmoid-gated output) has no fused form
STATE_ARCHS = ("lfm2", "qwen35", "qwen35moe", "qwen3next")


@pytest.mark.parametrize("arch", [a for a in ARCHS if a not in UNFUSED_ARCHS + STATE_ARCHS])
def test_fused_layer_matches_blocks_bit_for_bit(tmp_path, arch: str) -> None:
    path = write_tiny_model(tmp_path / f"{arch}.gguf", arch, QTYPES, n_layers=7 if arch == "gemma3" else 2)
    fused_model, fused = _load(path, True)
    assert all(f is not None for f in fused_model.fused)

    def not_called(*a, **k):  # noqa: ANN002, ANN003, ANN202
        raise AssertionError("a layer kernel ran from Python: the fused layer was not used")

    # a mixture of experts runs its experts after the fused attention (qwen2moe's shared expert: gated_act)
    for name in ("attention", "write_kv", "rope") + (() if arch in MOE_ARCHS else ("gated_act",)):
        setattr(fused.be, name, not_called)
    _, plain = _load(path, False)
    got, want = _logits(fused, np.random.default_rng(1)), _logits(plain, np.random.default_rng(1))
    assert len(got) == len(want) == 9
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


# The table types at their file width (IQ4_NL, MXFP4: blocks of 32) and, 256 wide, IQ4_XS beside the grid
# and ternary types through their int8 rows: Q|K|V of three layouts, gate|up of two
TABLE_QTYPES = {"*": "IQ4_NL", "attn_k": "MXFP4", "attn_v": "Q4_0", "ffn_up": "MXFP4", "ffn_down": "MXFP4"}
WIDE_QTYPES = {"*": "IQ4_XS", "attn_k": "IQ2_S", "attn_v": "IQ1_M", "ffn_up": "TQ2_0", "ffn_down": "IQ3_XXS"}


@pytest.mark.parametrize("qtypes", [TABLE_QTYPES, WIDE_QTYPES], ids=["table32", "wide"])
def test_fused_layer_runs_the_new_quant_types_bit_for_bit(tmp_path, qtypes: dict) -> None:
    wide = qtypes is WIDE_QTYPES
    shape = dict(n_embd=256, head_dim=64, n_ff=256) if wide else {}
    path = write_tiny_model(tmp_path / "m.gguf", "llama", qtypes, **shape)
    fused_model, fused = _load(path, True)
    assert all(f is not None for f in fused_model.fused)
    _, plain = _load(path, False)
    got, want = _logits(fused, np.random.default_rng(3)), _logits(plain, np.random.default_rng(3))
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)
def test_lfm2_fuses_its_attention_layers_only(tmp_path) -> None:
    """LFM2's attention layers (per-head Q/K norms, NEOX rope) take the fused layer; its short-conv
    layers run through the blocks; the logits are the blocks' bit for bit."""
    path = write_tiny_model(tmp_path / "lfm2.gguf", "lfm2", QTYPES, n_layers=3)
    fused_model, fused = _load(path, True)
    assert [f is None for f in fused_model.fused] == fused_model.cfg.conv_layers == [True, False, True]
    _, plain = _load(path, False)
    got, want = _logits(fused, np.random.default_rng(1)), _logits(plain, np.random.default_rng(1))
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("arch", UNFUSED_ARCHS)
def test_fused_layer_declines_where_it_has_no_form(tmp_path, arch: str) -> None:
    path = write_tiny_model(tmp_path / f"{arch}.gguf", arch, QTYPES)
    model, _ = _load(path, True)
    assert model.fused == [None] * model.cfg.n_layers


@pytest.mark.parametrize("roles, n_biased", [(LLAMA_BIASES, 4), (SOME_BIASES, 3)], ids=["all", "some"])
def test_fused_layer_applies_biases_as_the_blocks_do(tmp_path, roles: tuple, n_biased: int) -> None:
    """llama's optional biases (Q|K|V, output, gate|up, down; a stacked matrix partly biased): the fused
    layer adds each where the blocks do, bit for bit, and the biases change the logits."""
    biases = bias_tensors(SMALL, roles)
    path = write_tiny_model(tmp_path / "b.gguf", "llama", QTYPES, extra_tensors=biases, **SMALL)
    fused_model, fused = _load(path, True)
    assert all(f is not None for f in fused_model.fused)
    assert [b.shape[0] > 0 for b in fused_model.fused[0].biases].count(True) == n_biased
    _, plain = _load(path, False)
    got, want = _logits(fused, np.random.default_rng(3)), _logits(plain, np.random.default_rng(3))
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)
    _, unbiased = _load(write_tiny_model(tmp_path / "u.gguf", "llama", QTYPES, **SMALL), True)
    assert np.abs(_logits(unbiased, np.random.default_rng(3))[0] - got[0]).max() > 0.1


@pytest.mark.parametrize("tier", FUSED_TIERS[1:])
@pytest.mark.parametrize("qtypes", [QTYPES, TABLE_QTYPES], ids=["kquants", "table32"])
def test_fused_layer_on_a_lower_tier_gives_the_best_tiers_logits(tmp_path, tier: str, qtypes: dict) -> None:
    """A lower tier's fused layers (its dot, byte shuffle and exp scaling) produce the best tier's logits
    bit for bit: Q|K|V of three layouts (Q8_0's full bytes among them), and the table types."""
    path = write_tiny_model(tmp_path / "t.gguf", "llama", qtypes, **SMALL)
    lower_model, lower = _load(path, True, tier=tier)
    assert lower.be.tier.name == tier and all(f is not None for f in lower_model.fused)
    _, best = _load(path, True, tier=FUSED_TIERS[0])
    got, want = _logits(lower, np.random.default_rng(4)), _logits(best, np.random.default_rng(4))
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


def test_fallbacks(tmp_path) -> None:
    """An untiled matrix (F16 ffn_down): no fused form; a q8_0 KV cache: the blocks run that step."""
    path = write_tiny_model(tmp_path / "f16.gguf", "llama")  # DEFAULT_QTYPES: ffn_down F16
    model, _ = _load(path, True)
    assert model.fused == [None, None]
    path = write_tiny_model(tmp_path / "q.gguf", "llama", QTYPES, n_embd=128, head_dim=32)
    model, runner = _load(path, True, kv_dtype="q8_0")
    assert all(f is not None for f in model.fused)
    _, plain = _load(path, False, kv_dtype="q8_0")
    for g, w in zip(
        _logits(runner, np.random.default_rng(2)), _logits(plain, np.random.default_rng(2)), strict=True
    ):
        np.testing.assert_array_equal(g, w)


def test_cached_kernels_follow_the_sources_they_embed(tmp_path, monkeypatch) -> None:
    """The kernels whose machine code includes other files' kernels or IR carry a hash of the CPU
    backend's sources in their cache stamp, and an edit to any of those files changes it; their cache
    files are named for the tiers compiled in."""
    from edgellm.backends.cpu import attention, layer, matmul, numba_cache

    tag = "+".join(t.name for t in tiers.compiled_tiers()) or "untiled"
    followed = (layer.decoder_layer_cpu, matmul.matmul_tiles_fused_cpu, vnni.matmul_tiles_at_cpu)
    for fn in (*followed, attention.attention_paged_cpu):
        cache_file = fn._cache._cache_file
        assert cache_file._source_stamp[1] == numba_cache.sources_hash()
        # files of this set of tiers only: a process of other tiers keeps its own entries
        assert cache_file._index_path.endswith(f".{tag}.nbi") and f".{tag}." in cache_file._data_name(1)
    for src in numba_cache._PACKAGE.glob("*.py"):
        (tmp_path / src.name).write_bytes(src.read_bytes())
    monkeypatch.setattr(numba_cache, "_PACKAGE", tmp_path)
    numba_cache.sources_hash.cache_clear()
    try:
        before = numba_cache.sources_hash()
        (tmp_path / "vnni_ir.py").write_text((tmp_path / "vnni_ir.py").read_text() + "\n# edit\n")
        numba_cache.sources_hash.cache_clear()
        assert numba_cache.sources_hash() != before
    finally:
        numba_cache.sources_hash.cache_clear()
