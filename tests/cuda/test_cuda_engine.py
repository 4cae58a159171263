"""CUDA backend under the engine: sampling on the device (only ids cross the bus), the logits-row gather,
the engine's choice between device sampling and whole rows on the host, and the fused kernels (the same
bits as the plain kernels, with fewer launches).

Runs where test_cuda_backend.py's cases run: in its simulator subprocess (NUMBA_ENABLE_CUDASIM=1) or on a
GPU with EDGELLM_CUDA_TESTS=gpu. Shapes are tiny and the models have one layer: every forward pass in the
simulator costs seconds.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

if not (os.environ.get("NUMBA_ENABLE_CUDASIM") == "1" or os.environ.get("EDGELLM_CUDA_TESTS") == "gpu"):
    pytest.skip("run by tests/cuda/test_cuda_backend.py in a simulator subprocess", allow_module_level=True)

from edgellm import SamplingParams
from edgellm.backends.base import Backend
from edgellm.engine.config import EngineConfig
from edgellm.engine.core_process import EngineCoreProc
from edgellm.gguf.rope import RopeParams
from edgellm.testing.cuda_guards import BE, guarded, guards_intact
from edgellm.testing.kernel_refs import nmse
from edgellm.testing.synthetic import write_tiny_model


def logits_rows(rng: np.random.Generator, n: int) -> np.ndarray:
    x = (rng.standard_normal((4, n)) * 2).astype(np.float32)
    x[0] = np.round(x[0])  # many ties: equal values rank by lower id
    x[1, [3, n - 1]] = x[1].max() + 1  # a tie at the top, one of them in the last (partial) stride
    x[2, [5, 9]] = np.nan  # np.argmax: the first NaN; np.argsort(-x): NaN last
    x[3, :] = -np.inf
    x[3, n // 2] = -1.0
    return x


@pytest.mark.parametrize("k", [1, 3, 8])
def test_top_k_and_argmax_match_numpy(k: int) -> None:
    rng = np.random.default_rng(k)
    x = logits_rows(rng, 37)  # not a multiple of the block's threads
    _, view = guarded(x)  # a strided view inside a bigger buffer
    np.testing.assert_array_equal(BE.argmax(view), np.argmax(x, axis=1))
    vals, ids = BE.top_k(view, k)
    ref_vals, ref_ids = Backend.top_k(BE, view, k)  # the host definition: np.argsort(-x, kind="stable")
    np.testing.assert_array_equal(ids, ref_ids)
    np.testing.assert_array_equal(vals, ref_vals)
    assert ids.shape == (4, k) and vals.dtype == np.float32
    with pytest.raises(ValueError, match="top-k on the device"):
        BE.top_k(view, 38)


def test_argmax_across_many_blocks() -> None:
    """Rows long enough for many blocks of the one-launch argmax: ties and NaNs in different blocks resolve
    as np.argmax does (first maximum, first NaN), and the completion counters reset between launches."""
    x = np.zeros((3, 203), np.float32)
    x[0, [7, 150, 202]] = 5.0  # a three-way tie at the top, in the first, a middle and the last block
    x[1, [190, 40]] = np.nan  # the first NaN wins wherever the larger values are
    x[1, 3] = 1e30
    x[2] = -np.arange(203, dtype=np.float32)
    x[2, 100] = np.float32(np.inf)
    _, view = guarded(x)
    for _ in range(2):  # the second launch reuses the counters the first one's last blocks reset
        np.testing.assert_array_equal(BE.argmax(view), np.argmax(x, axis=1))
    np.testing.assert_array_equal(BE.argmax(view[1:2]), [40])


@pytest.mark.skipif(os.environ.get("EDGELLM_CUDA_TESTS") == "gpu", reason="a GPU has graphs: gpu_check.py")
def test_cuda_graphs_are_refused_by_the_simulator() -> None:
    with pytest.raises(RuntimeError, match="the Numba CUDA simulator has none"):
        BE.argmax_graph(None, None)


def test_decode_steps_of_one_shape_launch_alike(tiny: Path) -> None:
    """What a CUDA graph replay relies on (graphs.py): two decode steps of the same shape at different
    positions, tokens and block tables launch the same kernels with the same scalar arguments and array
    shapes, so everything that changes per step reaches the kernels through device arrays."""
    from edgellm.arch import ARCHITECTURES
    from edgellm.backends.cuda import config
    from edgellm.engine.model_runner import ModelRunner, RunItem
    from edgellm.gguf.config import config_from_gguf
    from edgellm.gguf.load import load_gguf

    g = load_gguf(tiny)
    cfg = config_from_gguf(g)
    runner = ModelRunner(ARCHITECTURES[cfg.arch](cfg, g, BE), cfg, BE, num_blocks=6, block_size=4)

    def step(items: list) -> list:
        args: list = []
        config.CAPTURE_REFS.append(args)
        try:
            runner.run_argmax(items)
        finally:
            config.CAPTURE_REFS.remove(args)
        return [
            [(a.shape, a.dtype.str) if hasattr(a, "shape") else a for a in launch_args]
            for launch_args in args
        ]

    first = step([RunItem([0, 1], [7], 3)])  # (the cache holds zeros: its values do not matter here)
    second = step([RunItem([4, 5], [9], 6)])  # other blocks, position, token
    assert len(first) > 5 and first == second


def test_take_rows_and_softcap() -> None:
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((5, 12)) * 40).astype(np.float32)
    whole, view = guarded(x)
    rows = np.array([4, 0, 2], np.int32)
    got = BE.take_rows(view, rows)
    np.testing.assert_array_equal(BE.to_host(got), x[rows])
    assert guards_intact(whole, x.shape)
    capped = BE.to_host(BE.softcap(got, 30.0))
    assert nmse(capped, np.tanh(x[rows].astype(np.float64) / 30.0) * 30.0) < 1e-12


# ---- the engine on the CUDA backend ------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(
        tmp_path_factory.mktemp("cuda") / "llama1.gguf", "llama", n_layers=1, n_embd=32, n_ff=64, head_dim=8
    )


@pytest.fixture(scope="module")
def llms(tiny: Path) -> dict[str, EngineCoreProc]:
    """Engine cores built in this process, to drive their engines step by step."""
    return {
        be: EngineCoreProc(EngineConfig(str(tiny), backend=be, n_ctx=64, kv_cache_memory=1 << 20))
        for be in ("cpu", "cuda")
    }


def run_steps(
    llm: EngineCoreProc, prompts: list[list[int]], params: SamplingParams
) -> tuple[list[list[int]], list, list]:
    """Drive the engine step by step: (tokens per prompt, logprobs, per step (copies, bytes) to the host)."""
    eng = llm.engine_core
    rids = [eng.add_request(p, params) for p in prompts]
    toks: dict[str, list[int]] = {r: [] for r in rids}
    lps, moved = [], []
    stats = getattr(llm.backend, "stats", None)
    while eng.has_unfinished():
        if stats:
            stats.reset()
        for out in eng.step():
            toks[out.request_id] += out.new_token_ids
            lps += out.logprobs or []
        if stats:
            moved.append((stats.to_host_copies, stats.to_host_bytes))
    return [toks[r] for r in rids], lps, moved


def test_engine_greedy_on_device_moves_only_ids(llms: dict[str, EngineCoreProc]) -> None:
    prompts = [[1, 17, 42, 99], [5, 6, 7]]
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    cpu_tokens, _, _ = run_steps(llms["cpu"], prompts, params)
    cuda_tokens, _, moved = run_steps(llms["cuda"], prompts, params)
    assert cuda_tokens == cpu_tokens and all(len(t) == 3 for t in cuda_tokens)
    # prefill of both prompts, then two decode steps: one copy of two int32 ids each
    assert moved == [(1, 8)] * 3


def test_engine_speculative_greedy_verifies_on_device(llms: dict[str, EngineCoreProc], tiny: Path) -> None:
    """Drafts verified with the device argmax of every scored row: plain decoding's tokens, ids only to
    the host. The drafts are the plain tokens with one wrong, so one verify step accepts and one rejects."""
    from edgellm.engine.spec.config import SpeculativeConfig

    prompts = [[5, 6, 7, 5, 6]]
    params = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    [want], _, _ = run_steps(llms["cpu"], prompts, params)
    guesses = want[:2] + [(want[2] + 1) % 64] + want[3:]

    class Replay:
        def propose(self, requests):
            return [guesses[s.num_output_tokens : s.num_output_tokens + k] for s, k in requests]

        def drop(self, seq_id: int) -> None:
            pass

    spec = SpeculativeConfig("ngram", num_tokens=2, adaptive=False)
    core = EngineCoreProc(
        EngineConfig(str(tiny), backend="cuda", n_ctx=64, kv_cache_memory=1 << 20, speculative=spec)
    )
    core.engine_core.speculator.proposer = Replay()
    [got], _, moved = run_steps(core, prompts, params)
    stats = core.engine_core.stats()
    assert got == want
    # prefill -> t0; drafts [t1, wrong] -> t1 t2; one draft left within max_tokens: [t3] -> t3 t4
    assert (stats.spec_draft_tokens_total, stats.spec_accepted_tokens_total) == (3, 2)
    assert moved == [(1, 4), (1, 12), (1, 8)]  # one id per scored row


def test_engine_logprobs_take_the_host_path(llms: dict[str, EngineCoreProc]) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True, logprobs=2)
    cpu_tokens, cpu_lps, _ = run_steps(llms["cpu"], [[9, 8, 7]], params)
    cuda_tokens, cuda_lps, moved = run_steps(llms["cuda"], [[9, 8, 7]], params)
    n_vocab = llms["cuda"].config.n_vocab
    assert cuda_tokens == cpu_tokens
    assert moved == [(1, 4 * n_vocab)] * 2  # the whole logits row, as before device sampling
    for a, b in zip(cuda_lps, cpu_lps, strict=True):
        assert a.token_id == b.token_id and abs(a.logprob - b.logprob) < 1e-4
        assert [t for t, _ in a.top] == [t for t, _ in b.top]


# ---- fused kernels: the same bits as the plain ones, fewer launches ------------------------------------
def forward_twice(
    path: Path, fuse: bool, kv_dtype: str = "f16"
) -> tuple[list[np.ndarray], list[np.ndarray], dict[str, int], tuple]:
    """Prefill 3 tokens then decode 1 on a fresh CUDA model: (host logits, KV caches, decode launches,
    decode copies (to the device, to the host))."""
    from edgellm.arch import ARCHITECTURES
    from edgellm.backends.cuda import get_cuda_backend
    from edgellm.engine.model_runner import ModelRunner, RunItem
    from edgellm.gguf.config import config_from_gguf
    from edgellm.gguf.load import load_gguf

    g = load_gguf(path)
    cfg = config_from_gguf(g)
    be = get_cuda_backend()
    be.fuse = fuse
    model = ARCHITECTURES[cfg.arch](cfg, g, be)
    runner = ModelRunner(model, cfg, be, num_blocks=4, block_size=4, kv_dtype=kv_dtype)
    logits = runner.run([RunItem([2, 3], [1, 17, 42], 0)])
    be.stats.reset()
    logits += runner.run([RunItem([2, 3], [5], 3)])
    launches = dict(be.stats.launches)
    copies = (be.stats.from_host_copies, be.stats.to_host_copies)
    return logits, [be.to_host(c) for lay in runner.kv.layers for c in lay.blocks], launches, copies


FUSION_CASES = {  # name: (arch, matrix type, head_dim, launches unfused, launches fused, KV cache type)
    # mixed types: Q/K/V parts quantized three ways (the norm's quantization serves the first), F16 down;
    # head_dim 8 < the 32-wide activation block: the attention output is quantized on its own
    "llama-mixed": (
        "llama",
        None,
        8,
        24,
        {
            "gather_rows_cuda": 1,
            "add_rmsnorm_quant_cuda": 3,
            "quantize_act_cuda": 3,
            "matmul_grouped_cuda": 6,
            "heads_rope_kv_cuda": 1,
            "attention_paged_cuda": 1,
            "gated_act_quant_cuda": 1,
            "matmul_dense_cuda": 1,
        },
        "f16",
    ),
    # Gemma 3: post-norms folded into the residual kernel, Q/K norms into the RoPE + KV kernel, the attention
    # output quantized by the attention kernel; with a q8_0 KV cache the same kernels quantize K and V
    **{
        f"gemma3-q4_1-kv{kv}": (
            "gemma3",
            "Q4_1",
            32,
            25,
            {
                "gather_rows_cuda": 1,
                "add_rmsnorm_quant_cuda": 3,
                "matmul_grouped_cuda": 5,
                "heads_rope_kv_cuda": 1,
                "attention_paged_cuda": 1,
                "gated_act_quant_cuda": 1,
            },
            kv,
        )
        for kv in ("f16", "q8_0")
    },
}


# The q8_0 case costs ~15 s more in the simulator (its kernels: test_cuda_backend.py): on a GPU, or with
# EDGELLM_CUDA_SIM_FULL=1.
FULL = os.environ.get("EDGELLM_CUDA_TESTS") == "gpu" or os.environ.get("EDGELLM_CUDA_SIM_FULL") == "1"


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(c, marks=pytest.mark.skipif(not FULL and "q8_0" in c, reason="slow in the simulator"))
        for c in FUSION_CASES
    ],
)
def test_fused_kernels_give_the_unfused_bits(case: str, tmp_path: Path) -> None:
    arch, qtype, head_dim, plain_total, fused_launches, kv_dtype = FUSION_CASES[case]
    qtypes = {"*": qtype, "output": "Q8_0"} if qtype else None
    path = write_tiny_model(
        tmp_path / f"{case}.gguf", arch, qtypes, n_layers=1, n_embd=32, n_ff=64, head_dim=head_dim
    )
    plain_logits, plain_kv, plain, _ = forward_twice(path, fuse=False, kv_dtype=kv_dtype)
    fused_logits, fused_kv, fused, copies = forward_twice(path, fuse=True, kv_dtype=kv_dtype)
    for a, b in zip(fused_logits, plain_logits, strict=True):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(fused_kv, plain_kv, strict=True):
        np.testing.assert_array_equal(a, b)
    # a 1-layer decode step, logits to the host: the kernels launched, and how many without fusion
    assert fused == fused_launches and sum(plain.values()) == plain_total
    # the step's index arrays go up in one copy (step_inputs.py), the logits row comes back in one
    assert copies == (1, 1)


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K"])  # q8_K activations (256-wide), groups of 32 and 16
def test_fused_chains_with_k_quant_weights(qtype: str) -> None:
    """The chains of a layer, issued as the model does, on rows as wide as one q8_K block: fused and plain
    give the same bits everywhere (x, the post-normed y, h, the K/V cache, every matmul output)."""
    from gguf import GGMLQuantizationType

    from edgellm.backends.cuda.matmul import upload_weight
    from edgellm.quants.packing import pack_weight
    from edgellm.testing.kernel_refs import random_raw

    qt = GGMLQuantizationType[qtype]
    n, rng = 256, np.random.default_rng(9)
    w = upload_weight(pack_weight(qt, random_raw(qt, 4, n, rng), 4, n))
    host = {
        k: rng.standard_normal(s).astype(np.float32)
        for k, s in {
            "x": (2, n),
            "y": (2, n),
            "gu": (2, 2 * n),
            "qkv": (2, 3 * n),
            "wn": (n,),
            "wy": (n,),
        }.items()
    }
    pos, slots = BE.from_host(np.array([0, 1], np.int32)), BE.from_host(np.array([0, 1], np.int64))
    tables, seq = BE.from_host(np.zeros((1, 1), np.int32)), BE.from_host(np.zeros(2, np.int32))

    def chains(fuse: bool) -> tuple[list[np.ndarray], int]:
        BE.fuse = fuse
        BE.stats.reset()
        d = {k: BE.from_host(v) for k, v in host.items()}
        x, y, h, outs = d["x"], d["y"], BE.empty((2, n)), [BE.empty((2, 4)) for _ in range(3)]
        BE.rmsnorm(y, d["wy"], 1e-6, y)  # post-norm, residual add, next norm, matmul
        BE.add(x, y)
        BE.rmsnorm(x, d["wn"], 1e-5, h)
        BE.matmul(h, w, outs[0])
        act = BE.empty((2, n))
        BE.gated_act(d["gu"], act, "gelu")
        BE.matmul(act, w, outs[1])
        qkv = d["qkv"].reshape(2, 3, 1, n)
        q, k, v = (BE.contiguous(qkv[:, i]) for i in range(3))
        kv = BE.alloc_kv(1, 1, 4, 1, n, n)
        BE.rmsnorm_heads(q, d["wn"], 1e-6)
        BE.rmsnorm_heads(k, d["wn"], 1e-6)
        rope = RopeParams(n_rot=n, neox=True)
        BE.rope(q, pos, rope)
        BE.rope(k, pos, rope)
        BE.write_kv(kv, 0, k, v, slots)
        attn = BE.empty((2, 1, n))
        BE.attention(q, kv, 0, tables, seq, pos, 0, 0.0625, attn)
        BE.matmul(attn.reshape(2, n), w, outs[2])
        got = [BE.to_host(t) for t in (x, y, h, act, q, attn, *outs)]
        got += [BE.to_host(c) for c in kv.layers[0].blocks]
        return got, BE.stats.total_launches

    try:
        plain, n_plain = chains(False)
        fused, n_fused = chains(True)
    finally:
        BE.fuse = True
    for a, b in zip(fused, plain, strict=True):
        np.testing.assert_array_equal(a, b)
    assert (n_plain, n_fused) == (19, 10)  # 3 of them the contiguous copies of Q, K, V


def test_engine_embeddings_match_the_cpu(llms: dict[str, EngineCoreProc]) -> None:
    """The final hidden states come back from the device (forward_hidden) and pool as on the CPU."""
    vectors = {}
    for be, core in llms.items():
        eng = core.engine_core
        eng.add_embedding_request([3, 1, 4, 1, 5])
        while eng.has_unfinished():
            for out in eng.step():
                if out.embedding is not None:
                    vectors[be] = out.embedding
    assert vectors["cuda"].shape == (32,) and abs(np.linalg.norm(vectors["cuda"]) - 1) < 1e-5
    # 3e-8 apart in the simulator; 1e-4 as the logprobs above, for a GPU's other summation order
    np.testing.assert_allclose(vectors["cuda"], vectors["cpu"], atol=1e-4)


# Each ~12 s in the simulator: one case per architecture and path runs by default, the rest on a GPU or
# with EDGELLM_CUDA_SIM_FULL=1.
DEFAULT_ARCH_CASES = {("gemma2", "f16", False), ("gemma2", "q8_0", True), ("granite", "f16", True),
                      ("olmo2", "f16", False), ("starcoder2", "f16", True),
                      ("gpt2", "f16", True)}  # fmt: skip


@pytest.mark.parametrize(
    "arch, kv_dtype, fuse",
    [
        pytest.param(
            arch, kv, fuse, id=f"{'fused' if fuse else 'plain'}-{arch}-{kv}",
            marks=pytest.mark.skipif(
                not FULL and (arch, kv, fuse) not in DEFAULT_ARCH_CASES, reason="slow in the simulator"
            ),
        )
        for arch, kv in [("gemma2", "f16"), ("gemma2", "q8_0"), ("granite", "f16"), ("olmo2", "f16"),
                         ("starcoder2", "f16"), ("gpt2", "f16")]
        for fuse in (False, True)
    ],
)  # fmt: skip
def test_gemma2_granite_olmo2_logits_match_the_cpu(
    arch: str, kv_dtype: str, fuse: bool, tmp_path: Path
) -> None:
    """Gemma 2's attention soft-capping (caps small enough to bind), Granite's multipliers (Backend.scale)
    and OLMo 2's norm placement through the CUDA backend's kernels and its fused chains (which must not
    drop the cap, the extra scale or the missing pre-norms), StarCoder 2's and GPT-2's LayerNorm, GELU MLP
    and (GPT-2) learned positions: the CPU backend's logits."""
    from edgellm.arch import ARCHITECTURES
    from edgellm.backends.cpu.backend import CpuBackend
    from edgellm.engine.model_runner import ModelRunner, RunItem
    from edgellm.gguf.config import config_from_gguf
    from edgellm.gguf.load import load_gguf
    from edgellm.testing.oracle_cases import GEMMA2_CAPS

    caps = GEMMA2_CAPS if arch == "gemma2" else {}
    path = write_tiny_model(
        tmp_path / f"{arch}.gguf",
        arch,
        "F32",
        n_layers=1,
        n_embd=32,
        n_ff=64,
        head_dim=32 if kv_dtype == "q8_0" else 8,  # q8_0 blocks of 32 along the head
        metadata_overrides=caps,
    )
    cuda_logits, *_ = forward_twice(path, fuse=fuse, kv_dtype=kv_dtype)
    g = load_gguf(path)
    cfg = config_from_gguf(g)
    be = CpuBackend()
    runner = ModelRunner(
        ARCHITECTURES[arch](cfg, g, be), cfg, be, num_blocks=4, block_size=4, kv_dtype=kv_dtype
    )
    cpu_logits = runner.run([RunItem([2, 3], [1, 17, 42], 0)]) + runner.run([RunItem([2, 3], [5], 3)])
    for got, want in zip(cuda_logits, cpu_logits, strict=True):
        assert nmse(got, want) < 1e-6


@pytest.mark.parametrize("arch", ["phi3", "smollm3"])
def test_phi3_smollm3_logits_match_the_cpu(arch: str, tmp_path: Path) -> None:
    """Phi-3's fused Q|K|V and gate|up with LongRoPE's factors and attention factor, SmolLM3's layer without
    rope (4 layers: the fused chain of the last has no rope step), through the CUDA backend's fused chains:
    the CPU backend's logits."""
    from edgellm.arch import ARCHITECTURES
    from edgellm.backends.cpu.backend import CpuBackend
    from edgellm.engine.model_runner import ModelRunner, RunItem
    from edgellm.gguf.config import config_from_gguf
    from edgellm.gguf.load import load_gguf

    n_rot = 8
    phi3 = {
        "metadata_overrides": {"phi3.rope.scaling.attn_factor": 1.19},
        "extra_tensors": {f"rope_factors_{s}.weight": np.geomspace(1.0, f, n_rot // 2).astype(np.float32)
                          for s, f in (("short", 2.0), ("long", 40.0))},
    }  # fmt: skip
    path = write_tiny_model(
        tmp_path / f"{arch}.gguf",
        arch,
        "F32",
        n_layers=4 if arch == "smollm3" else 1,
        n_embd=32,
        n_ff=64,
        head_dim=8,
        **(phi3 if arch == "phi3" else {}),
    )
    cuda_logits, *_ = forward_twice(path, fuse=True)
    g = load_gguf(path)
    cfg = config_from_gguf(g)
    assert cfg.rope.freq_factors and cfg.rope.attn_factor != 1.0 if arch == "phi3" else cfg.no_rope_layers[3]
    be = CpuBackend()
    runner = ModelRunner(ARCHITECTURES[arch](cfg, g, be), cfg, be, num_blocks=4, block_size=4)
    cpu_logits = runner.run([RunItem([2, 3], [1, 17, 42], 0)]) + runner.run([RunItem([2, 3], [5], 3)])
    for got, want in zip(cuda_logits, cpu_logits, strict=True):
        assert nmse(got, want) < 1e-6


def test_moe_logits_match_the_cpu(tmp_path: Path) -> None:
    """A mixture of experts (qwen3moe: 4 experts, top 2) through the CUDA backend's ops: the same
    expert-grouped matmuls, router and weighted sum (arch/moe.py) give the CPU backend's logits, in a
    3-token prefill (tokens sharing experts) and a decode step."""
    from edgellm.arch import ARCHITECTURES
    from edgellm.backends.cpu.backend import CpuBackend
    from edgellm.engine.model_runner import ModelRunner, RunItem
    from edgellm.gguf.config import config_from_gguf
    from edgellm.gguf.load import load_gguf

    path = write_tiny_model(
        tmp_path / "moe.gguf", "qwen3moe", "Q8_0", n_layers=1, n_embd=32, n_ff=64, head_dim=8,
        n_expert=4, n_expert_used=2, n_ff_exp=32,
    )  # fmt: skip
    cuda_logits, _, launches, _ = forward_twice(path, fuse=True)
    assert launches["moe_combine_cuda"] == 1  # the weighted sum on the device (one layer)
    g = load_gguf(path)
    cfg = config_from_gguf(g)
    be = CpuBackend()
    runner = ModelRunner(ARCHITECTURES[cfg.arch](cfg, g, be), cfg, be, num_blocks=4, block_size=4)
    cpu_logits = runner.run([RunItem([2, 3], [1, 17, 42], 0)]) + runner.run([RunItem([2, 3], [5], 3)])
    for got, want in zip(cuda_logits, cpu_logits, strict=True):
        assert nmse(got, want) < 1e-6


def test_gpt_oss_is_refused_at_load_naming_the_backend(tmp_path: Path) -> None:
    """The CUDA attention kernel has no attention sinks: a gpt-oss file is refused when the model is built,
    naming the architecture and the backend, before any weight goes to the device."""
    from edgellm.arch import ARCHITECTURES
    from edgellm.gguf.config import UnsupportedArchitectureError, config_from_gguf
    from edgellm.gguf.load import load_gguf

    path = write_tiny_model(tmp_path / "oss.gguf", "gpt-oss", "F32", n_layers=1, n_expert=4)
    g = load_gguf(path)
    cfg = config_from_gguf(g)
    refused = r"'gpt-oss' is not implemented on the cuda backend"
    with pytest.raises(UnsupportedArchitectureError, match=refused):
        ARCHITECTURES[cfg.arch](cfg, g, BE)
