"""scripts/fixtures/make_bench_model.py's random-block writer (--shape 8b, --random-blocks) at a tiny width:
the Q4_K_M mix llama.cpp gives a llama, blocks whose weights are small and finite, a file edgellm runs."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import gguf
import numpy as np
from gguf.quants import dequantize

from edgellm.arch import ARCHITECTURES
from edgellm.backends.cpu.backend import CpuBackend
from edgellm.engine.model_runner import ModelRunner, RunItem
from edgellm.gguf.config import config_from_gguf
from edgellm.gguf.load import load_gguf
from edgellm.gguf.validation import validate_model
from edgellm.testing.paths import SCRIPTS


def _script():
    spec = importlib.util.spec_from_file_location(
        "make_bench_model", SCRIPTS / "fixtures" / "make_bench_model.py"
    )
    mbm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mbm)
    return mbm


def test_random_q4_k_m_blocks_make_an_8b_shaped_file_edgellm_runs(tmp_path: Path, smollm2_path: Path) -> None:
    """One layer of SHAPE_8B's layout at width 256: untied Q6_K output, Q4_K token_embd, attn_v and ffn_down
    Q6_K (use_more_bits picks layer 0 of 1), the rest Q4_K, norms F32 = 1; weights of std ~0.02-0.04."""
    mbm = _script()
    tiny = {"n_embd": 256, "n_heads": 2, "n_kv_heads": 1, "head_dim": 128, "n_ff": 512}
    path = tmp_path / "bench-8b.gguf"
    mbm.write_random_q4_k_m(path, 1, 0, {**mbm.SHAPE_8B, **tiny})
    g = load_gguf(str(path))
    cfg = config_from_gguf(g)
    assert (cfg.arch, cfg.n_layers, cfg.n_embd, cfg.n_vocab) == ("llama", 1, 256, 49152)
    types = {name: t.qtype.name for name, t in g.tensors.items()}
    assert types == {
        "token_embd.weight": "Q4_K",
        "blk.0.attn_norm.weight": "F32",
        "blk.0.attn_q.weight": "Q4_K",
        "blk.0.attn_k.weight": "Q4_K",
        "blk.0.attn_v.weight": "Q6_K",
        "blk.0.attn_output.weight": "Q4_K",
        "blk.0.ffn_norm.weight": "F32",
        "blk.0.ffn_gate.weight": "Q4_K",
        "blk.0.ffn_up.weight": "Q4_K",
        "blk.0.ffn_down.weight": "Q6_K",
        "output_norm.weight": "F32",
        "output.weight": "Q6_K",
    }
    for t in gguf.GGUFReader(path).tensors:
        w = dequantize(t.data, t.tensor_type)
        assert np.isfinite(w).all(), t.name
        if t.name.endswith("norm.weight"):
            assert (w == 1).all(), t.name
        else:
            assert 0.015 < w.std() < 0.06 and abs(w.mean()) < 0.005, (t.name, w.mean(), w.std())
    validate_model(g, cfg)
    be = CpuBackend()
    runner = ModelRunner(ARCHITECTURES[cfg.arch](cfg, g, be), cfg, be, num_blocks=16, block_size=16)
    logits = runner.run([RunItem([0], [1, 2, 3], 0, all_logits=True)])[0]
    assert logits.shape == (3, cfg.n_vocab) and np.isfinite(logits).all()


def test_use_more_bits_matches_the_mix_llama_cpp_gave_the_16_layer_file() -> None:
    """The 1B file llama.cpp's quantizer wrote had attn_v and ffn_down at Q6_K on layers 0, 1, 4, 7, 10,
    13, 14, 15; the tied shape's token_embd is Q6_K, as llama.cpp makes a tied output."""
    mbm = _script()
    got = [i for i in range(16) if mbm.q4_k_m_type(f"blk.{i}.ffn_down.weight", 16, True).name == "Q6_K"]
    assert got == [0, 1, 4, 7, 10, 13, 14, 15]
    assert mbm.q4_k_m_type("token_embd.weight", 16, True).name == "Q6_K"
    assert mbm.q4_k_m_type("token_embd.weight", 32, False).name == "Q4_K"


def test_random_q4_k_m_blocks_make_a_qwen3moe_file_edgellm_runs(tmp_path: Path, smollm2_path: Path) -> None:
    """--shape moe --random-blocks at width 256: the experts as 3-D tensors of random blocks (ffn_down_exps
    Q6_K on the layer use_more_bits picks), the router F32 of std 0.02, norms 1; it loads and scores."""
    mbm = _script()
    tiny = {"n_embd": 256, "n_heads": 2, "n_kv_heads": 1, "head_dim": 128, "n_ff": 512, "n_expert": 8}
    path = tmp_path / "bench-moe.gguf"
    mbm.write_random_q4_k_m(path, 1, 0, {**mbm.MOE_SHAPE, **tiny, "n_ff_exp": 256})
    g = load_gguf(str(path))
    cfg = config_from_gguf(g)
    assert (cfg.arch, cfg.n_expert, cfg.n_ff_exp) == ("qwen3moe", 8, 256)
    types = {name: t.qtype.name for name, t in g.tensors.items() if "exps" in name or "gate_inp" in name}
    assert types == {
        "blk.0.ffn_gate_inp.weight": "F32",
        "blk.0.ffn_gate_exps.weight": "Q4_K",
        "blk.0.ffn_up_exps.weight": "Q4_K",
        "blk.0.ffn_down_exps.weight": "Q6_K",
    }
    assert g.tensors["blk.0.ffn_down_exps.weight"].shape == (8, 256, 256)
    for t in gguf.GGUFReader(path).tensors:
        if "exps" in t.name or "gate_inp" in t.name:
            w = dequantize(t.data, t.tensor_type)
            assert np.isfinite(w).all() and 0.015 < w.std() < 0.06, (t.name, w.std())
    validate_model(g, cfg)
    be = CpuBackend()
    runner = ModelRunner(ARCHITECTURES[cfg.arch](cfg, g, be), cfg, be, num_blocks=16, block_size=16)
    logits = runner.run([RunItem([0], [1, 2, 3], 0, all_logits=True)])[0]
    assert logits.shape == (3, cfg.n_vocab) and np.isfinite(logits).all()
