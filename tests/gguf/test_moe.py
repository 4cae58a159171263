"""Mixture-of-experts models (arch/moe.py) beyond their llama.cpp logits (tests/gguf/test_oracle_cases.py):
a sequence's logits do not depend on what else is in the step, only the experts tokens select are read,
the expert tensors stay in the file's mapping, the routing rule per architecture, the bytes per token
the engine reports, and the refusals."""

from __future__ import annotations

import json
import mmap
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edgellm.arch import ARCHITECTURES
from edgellm.arch.common import weight_bytes_per_token
from edgellm.arch.moe import group_by_expert, route_softmax_weight, route_top_k
from edgellm.backends.cpu.backend import CpuBackend
from edgellm.engine.model_runner import ModelRunner, RunItem
from edgellm.gguf.config import config_from_gguf
from edgellm.gguf.load import load_gguf
from edgellm.gguf.reader import GGUFError
from edgellm.gguf.validation import validate_model
from edgellm.testing.limits import HANG_S
from edgellm.testing.oracle.cases import GPT_OSS_QTYPES, MOE, MOE_QTYPES, QWEN2MOE, QWEN3MOE
from edgellm.testing.paths import SCRIPTS
from edgellm.testing.synthetic.models import write_tiny_model

BS = 16


def _runner(path: Path) -> ModelRunner:
    g = load_gguf(str(path))
    cfg = config_from_gguf(g)
    validate_model(g, cfg)
    be = CpuBackend()
    return ModelRunner(ARCHITECTURES[cfg.arch](cfg, g, be), cfg, be, num_blocks=16, block_size=BS)


@pytest.mark.parametrize(
    ("arch", "qtypes", "writer"),
    [
        ("qwen3moe", MOE_QTYPES, QWEN3MOE),
        ("llama", "F32", MOE),
        ("qwen2moe", "Q8_0", QWEN2MOE),
        ("gpt-oss", GPT_OSS_QTYPES, {**MOE, "n_ff_exp": 64}),
    ],  # gpt-oss: its sinks, window 4 on even layers
    ids=["qwen3moe_mix", "llama_moe_f32", "qwen2moe_q8_0", "gpt_oss_mxfp4"],
)
def test_logits_do_not_depend_on_the_rest_of_the_batch(tmp_path: Path, arch: str, qtypes, writer) -> None:
    """Sequence A scored alone, then beside B and C (whose tokens route to other experts and share A's),
    in prefill and in batched decode: A's logits are the same bits."""
    path = write_tiny_model(tmp_path / "m.gguf", arch, qtypes, **writer)
    rng = np.random.default_rng(5)
    v = load_gguf(str(path)).tensors["token_embd.weight"].shape[0]
    a, b, c = (rng.integers(0, v, n).tolist() for n in (19, 23, 7))
    steps = rng.integers(0, v, (3, 3)).tolist()
    tables = [[0, 1], [2, 3], [4, 5]]

    alone = _runner(path)
    want = list(alone.run([RunItem(tables[0], a, 0, all_logits=True)])[0])  # [V] rows
    want += [alone.run([RunItem(tables[0], [s[0]], len(a) + i)])[0][0] for i, s in enumerate(steps)]

    together = _runner(path)
    out = together.run(
        [RunItem(tables[1], b, 0, all_logits=True), RunItem(tables[0], a, 0, all_logits=True),
         RunItem(tables[2], c, 0, all_logits=True)]
    )  # fmt: skip
    got = list(out[1])
    for i, s in enumerate(steps):
        rows = together.run(
            [RunItem(tables[2], [s[2]], len(c) + i), RunItem(tables[0], [s[0]], len(a) + i),
             RunItem(tables[1], [s[1]], len(b) + i)]
        )  # fmt: skip
        got.append(rows[1][0])
    assert len(got) == len(want) == len(a) + 3
    for g_row, w_row in zip(got, want, strict=True):
        np.testing.assert_array_equal(g_row, w_row)


def test_only_selected_experts_are_prepared_and_experts_stay_mapped(tmp_path: Path) -> None:
    path = write_tiny_model(tmp_path / "m.gguf", "qwen3moe", "Q8_0", n_expert=16, n_expert_used=2)
    runner = _runner(path)
    model = runner.model
    experts = [ffn.experts for _, ffn in model.layers]
    assert [e.n_prepared for e in experts] == [0, 0]  # nothing is read at load
    for e in experts:  # the 3-D tensors are views of the file's mapping, not copies
        for t in (e.gate, e.up, e.down):
            base = t.data
            while isinstance(base, np.ndarray):
                base = base.base
            assert isinstance(base.obj if isinstance(base, memoryview) else base, mmap.mmap)
    runner.run([RunItem([0], [5], 0)])  # one token: its 2 experts per layer
    assert [e.n_prepared for e in experts] == [2, 2]
    runner.run([RunItem([1, 2], list(range(20, 40)), 0)])
    assert all(2 <= e.n_prepared <= 16 for e in experts)


def test_routing_renormalises_per_architecture() -> None:
    logits = np.array([[0.0, 2.0, 1.0, 2.0], [3.0, -1.0, 0.5, 0.0]], np.float32)
    p = np.exp(logits.astype(np.float64))
    p /= p.sum(1, keepdims=True)
    ids, w = route_top_k(logits, 2, renormalise=False)
    np.testing.assert_array_equal(ids, [[1, 3], [0, 2]])  # equal logits: the lower id first
    np.testing.assert_allclose(w, np.take_along_axis(p, ids, 1), rtol=1e-6)
    ids_n, w_n = route_top_k(logits, 2, renormalise=True)
    np.testing.assert_array_equal(ids_n, ids)
    np.testing.assert_allclose(w_n.sum(1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(w_n, w / w.sum(1, keepdims=True), rtol=1e-6)


def test_group_by_expert_sorts_pairs_and_finds_them_again() -> None:
    experts = np.array([[3, 0], [0, 2], [3, 1]], np.int64)  # [T=3, k=2]
    weights = np.arange(6, dtype=np.float32).reshape(3, 2)
    route = group_by_expert(experts, weights)
    assert route.runs == [(0, 0, 2), (1, 2, 3), (2, 3, 4), (3, 4, 6)]
    np.testing.assert_array_equal(route.ids, [0, 1, 2, 3])
    np.testing.assert_array_equal(route.bounds, [0, 2, 3, 4, 6])
    np.testing.assert_array_equal(route.tokens, [0, 1, 2, 1, 0, 2])
    assert route.weights is weights and route.experts is experts
    for t in range(3):
        for s in range(2):  # the pair's row holds its token, inside its expert's run
            row = route.where[t, s]
            assert route.tokens[row] == t
            e, start, end = next(r for r in route.runs if r[1] <= row < r[2])
            assert e == experts[t, s]


def test_bytes_per_token_count_the_selected_experts(tmp_path: Path) -> None:
    path = write_tiny_model(tmp_path / "m.gguf", "qwen3moe", "Q8_0", n_expert=8, n_expert_used=2)
    model = _runner(path).model
    g = load_gguf(str(path))
    expert_bytes = sum(t.n_bytes for n, t in g.tensors.items() if "_exps" in n)
    active, total = weight_bytes_per_token(model), weight_bytes_per_token(model, all_experts=True)
    assert total - active == expert_bytes * 6 // 8  # 6 of 8 experts not read per token
    assert active > expert_bytes * 2 // 8


def test_bench_json_reports_active_and_total_weight_bytes(tmp_path: Path) -> None:
    path = write_tiny_model(  # the bench's prompts use ids up to 1,100
        tmp_path / "m.gguf", "qwen3moe", "Q8_0", n_expert=8, n_expert_used=2, n_vocab=1104
    )
    proc = subprocess.run(
        [sys.executable, "-m", "edgellm", "bench", str(path), "--prompt-tokens", "8", "--gen-tokens", "4",
         "--repeat", "1", "--json"],
        capture_output=True, text=True, timeout=HANG_S,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert 0 < result["weight_mb_per_token"] < result["weight_mb_total"]
    assert 0.9 < result["weight_bytes_vs_gguf"] < 1.1  # every expert counted once, at the file's width


def test_gpt_oss_loads_and_refuses_a_file_without_its_sinks(tmp_path: Path) -> None:
    """gpt-oss loads and runs (its logits: tests/gguf/test_oracle_cases.py, gpt_oss_*); llama.cpp requires its
    attention sinks and its biases, so a file without them is refused naming the tensor."""
    path = write_tiny_model(tmp_path / "m.gguf", "gpt-oss", "F32", n_expert=8, n_expert_used=2)
    runner = _runner(path)
    assert np.isfinite(runner.run([RunItem([0, 1], list(range(3, 30)), 0, all_logits=True)])[0]).all()
    for name in ("blk.1.attn_sinks.weight", "blk.0.ffn_down_exps.bias", "output.weight"):
        path = write_tiny_model(tmp_path / "s.gguf", "gpt-oss", "F32", skip_tensors=[name])
        with pytest.raises(GGUFError, match=rf"missing tensor '{re.escape(name)}'"):
            _runner(path)


def test_softmax_weight_routing_weights_the_selected_logits() -> None:
    """gpt-oss (llama.cpp's SOFTMAX_WEIGHT): the top k logits, then a softmax over those k only."""
    logits = np.array([[0.0, 2.0, 1.0, 2.0], [3.0, -1.0, 0.5, 0.0]], np.float32)
    ids, w = route_softmax_weight(logits, 2)
    np.testing.assert_array_equal(ids, [[1, 3], [0, 2]])  # ties: the lower id first
    np.testing.assert_allclose(w[0], [0.5, 0.5], rtol=1e-6)
    e = np.exp([3.0, 0.5])
    np.testing.assert_allclose(w[1], e / e.sum(), rtol=1e-6)
    _, w_all = route_top_k(logits, 2, renormalise=False)  # olmoe's rule: the probabilities over all four
    assert not np.allclose(w[1], w_all[1], rtol=1e-3)


def test_expert_metadata_errors_name_the_key(tmp_path: Path) -> None:
    path = write_tiny_model(
        tmp_path / "a.gguf", "qwen3moe", "F32", metadata_overrides={"qwen3moe.expert_used_count": 9}
    )
    with pytest.raises(GGUFError, match=r"qwen3moe.expert_used_count = 9 is out of range: must be 1..4"):
        config_from_gguf(load_gguf(str(path)))
    path = write_tiny_model(
        tmp_path / "b.gguf", "llama", "F32", metadata_overrides={"llama.expert_used_count": 2}
    )
    with pytest.raises(GGUFError, match=r"llama.expert_used_count is set but llama.expert_count is 0"):
        config_from_gguf(load_gguf(str(path)))
    # a Mixtral file without its experts: the router is missing, named
    path = write_tiny_model(
        tmp_path / "c.gguf", "llama", "F32", n_expert=4, skip_tensors=["blk.1.ffn_gate_inp.weight"]
    )
    g = load_gguf(str(path))
    with pytest.raises(GGUFError, match=r"missing tensor 'blk.1.ffn_gate_inp.weight'"):
        validate_model(g, config_from_gguf(g))


def test_make_bench_model_writes_a_qwen3moe_file_edgellm_runs(tmp_path: Path, smollm2_path: Path) -> None:
    """scripts/fixtures/make_bench_model.py --moe's writer at a tiny width: a qwen3moe file with the tokenizer
    of the catalog model, F32 router, F16 experts of the shape's count and width, that loads and scores."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "make_bench_model", SCRIPTS / "fixtures" / "make_bench_model.py"
    )
    mbm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mbm)
    tiny = {"n_embd": 64, "n_heads": 4, "n_kv_heads": 2, "head_dim": 32, "n_ff": 96, "n_expert": 16}
    path = tmp_path / "bench-moe.gguf"
    mbm.write_f16(path, 2, 0, {**mbm.MOE_SHAPE, **tiny, "n_ff_exp": 64})
    g = load_gguf(str(path))
    cfg = config_from_gguf(g)
    got = (cfg.arch, cfg.n_expert, cfg.n_expert_used, cfg.n_ff_exp, cfg.n_layers)
    assert got == ("qwen3moe", 16, 8, 64, 2)
    assert g.tensors["blk.1.ffn_gate_inp.weight"].qtype.name == "F32"
    assert g.tensors["blk.1.ffn_down_exps.weight"].shape == (16, 64, 64)
    logits = _runner(path).run([RunItem([0], [1, 2, 3], 0, all_logits=True)])[0]
    assert logits.shape == (3, cfg.n_vocab) and np.isfinite(logits).all()


def test_bytes_per_token_count_a_shared_expert(tmp_path: Path) -> None:
    """Qwen 2 MoE: the shared expert every token runs is active weight, beside the selected experts."""
    path = write_tiny_model(tmp_path / "m.gguf", "qwen2moe", "Q8_0", **QWEN2MOE)
    with_shared = weight_bytes_per_token(_runner(path).model)
    model = _runner(path).model
    for _, ffn in model.layers:
        ffn.shared_gate_up = ffn.shared_down = None
    shared = sum(t.n_bytes for n, t in load_gguf(str(path)).tensors.items() if n.endswith("shexp.weight"))
    # the matrices are repacked at the file's width (VNNI) or wider (int8 rows)
    assert with_shared - weight_bytes_per_token(model) >= shared * 0.95


def test_old_per_expert_mixtral_layout_is_refused_naming_the_tensor(tmp_path: Path) -> None:
    """Early Mixtral GGUFs held each expert as 2-D tensors (blk.N.ffn_gate.E.weight); llama.cpp now reads
    the 3-D ffn_*_exps only, and so does edgellm: the file is refused, the tensor named."""
    path = write_tiny_model(
        tmp_path / "m.gguf", "llama", "F32", n_expert=4, extra_tensors={"blk.0.ffn_gate.0.weight": (128, 64)}
    )
    g = load_gguf(str(path))
    with pytest.raises(GGUFError, match=r"tensor 'blk.0.ffn_gate.0.weight' \(ffn_gate.0.weight\) is not one"):
        validate_model(g, config_from_gguf(g))


@pytest.mark.parametrize("qtypes", ["Q8_0", MOE_QTYPES], ids=["one_type", "gate_up_of_two_types"])
def test_experts_prepared_at_load_score_what_lazily_prepared_ones_do(tmp_path: Path, qtypes) -> None:
    """The engine prepares every expert at load unless EngineConfig.lazy_experts; both score the same
    bits. Q8_0: one pack over all experts (Backend.load_matrices); the mix: gate and up of two types, one
    matrix at a time."""
    from edgellm.engine.config import EngineConfig
    from edgellm.engine.core_process import EngineCoreProc

    path = write_tiny_model(tmp_path / "m.gguf", "qwen3moe", qtypes, **QWEN3MOE)
    spec = {"n_ctx": 64, "kv_cache_memory": 1 << 20, "threads": 2}
    eager = EngineCoreProc(EngineConfig(str(path), **spec))
    lazy = EngineCoreProc(EngineConfig(str(path), lazy_experts=True, **spec))
    n = QWEN3MOE["n_expert"]
    assert [ffn.experts.n_prepared for _, ffn in eager.model.layers] == [n, n]
    assert all(ffn.experts.n_prepared < n for _, ffn in lazy.model.layers)
    ids = np.random.default_rng(3).integers(0, 200, 12).tolist()
    np.testing.assert_array_equal(eager.score(ids), lazy.score(ids))


def test_load_matrices_gives_each_group_the_tiles_its_own_load_matrix_gives(tmp_path: Path) -> None:
    from edgellm.arch.moe import expert_slice

    path = write_tiny_model(tmp_path / "m.gguf", "qwen3moe", "Q8_0", **QWEN3MOE)
    g, be = load_gguf(str(path)), CpuBackend()
    gate, up = (g.tensors[f"blk.1.ffn_{p}_exps.weight"] for p in ("gate", "up"))
    groups = [[expert_slice(gate, e), expert_slice(up, e)] for e in range(QWEN3MOE["n_expert"])]
    for got, group in zip(be.load_matrices(groups), groups, strict=True):
        want = be.load_matrix(group)
        assert got.rows == want.rows == 2 * QWEN3MOE["n_ff_exp"]
        if want.tiles is not None:  # a tier with tile kernels
            for p, q in zip(got.tiles.planes, want.tiles.planes, strict=True):
                np.testing.assert_array_equal(p, q)
