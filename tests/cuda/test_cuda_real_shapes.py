"""The CUDA kernels at the real models' widths (SmolLM2 576 / 1536, Gemma 3 640 / 2048; edgellm/testing/
real_shapes.py) where the simulator affords it: matmuls with few output rows but the real K, activation
quantization and the fused norm over whole real rows. Attention over more than 128 keys (split-K):
test_cuda_attention.py.

Whole real-shape models cost ~25 s per decode step in the simulator (a 1-layer 576-wide one), and the
argmax's cost there is its blocks (a real vocabulary makes 256): those cases run on a GPU
(EDGELLM_CUDA_TESTS=gpu, scripts/gpu/gpu_check.sh) or with EDGELLM_CUDA_SIM_FULL=1.
Runs where test_cuda_backend.py's cases run (its simulator subprocess, or a GPU).
"""

from __future__ import annotations

import os
import zlib
from pathlib import Path

import numpy as np
import pytest

if not (os.environ.get("NUMBA_ENABLE_CUDASIM") == "1" or os.environ.get("EDGELLM_CUDA_TESTS") == "gpu"):
    pytest.skip("run by tests/cuda/test_cuda_backend.py in a simulator subprocess", allow_module_level=True)

from gguf import GGMLQuantizationType as T

from edgellm.backends.cpu.matmul import matmul_cpu
from edgellm.backends.cuda.matmul import quantize_act, upload_weight
from edgellm.quants.activations import quantize_act_ref
from edgellm.quants.packing import pack_weight
from edgellm.quants.traits import get_traits
from edgellm.testing.cuda.guards import BE, guarded
from edgellm.testing.kernel_refs import nmse, random_raw

FULL = os.environ.get("EDGELLM_CUDA_TESTS") == "gpu" or os.environ.get("EDGELLM_CUDA_SIM_FULL") == "1"
WIDTHS = [(T.Q4_1, 576), (T.Q4_K, 2048), (T.Q6_K, 1536)]


@pytest.mark.parametrize("qtype,k", WIDTHS, ids=lambda v: getattr(v, "name", str(v)))
def test_matmul_at_real_widths(qtype: T, k: int) -> None:
    """GEMV and a 5-row GEMM over a real K: the CPU kernel's values (the same integer sums), and each row's
    bits the same alone as in the batch."""
    rows = 3
    rng = np.random.default_rng(zlib.crc32(f"{qtype.name}-{k}".encode()))
    raw = random_raw(qtype, rows, k, rng)
    w = upload_weight(pack_weight(qtype, raw, rows, k))
    x = rng.standard_normal((5, k)).astype(np.float32)
    batched, single = BE.empty((5, rows)), BE.empty((1, rows))
    BE.matmul(BE.from_host(x), w, batched)
    BE.matmul(BE.from_host(x[3:4]), w, single)
    got = BE.to_host(batched)
    np.testing.assert_array_equal(BE.to_host(single)[0], got[3])
    cpu = np.empty((5, rows), np.float32)
    matmul_cpu(x, pack_weight(qtype, raw, rows, k), cpu)
    assert nmse(got, cpu.astype(np.float64)) < 1e-11


def test_weights_the_16_byte_loads_cannot_read_are_refused() -> None:
    """Groups of 8 weights (no such GGUF type) would split a 16-byte load across two groups' scales."""
    import dataclasses

    rng = np.random.default_rng(0)
    p = pack_weight(T.Q8_0, random_raw(T.Q8_0, 2, 64, rng), 2, 64)
    bad = dataclasses.replace(p, group=8, scale=np.repeat(p.scale, 4, axis=1), minv=None)
    with pytest.raises(ValueError, match="groups of a multiple of 16 weights, got group 8"):
        upload_weight(bad)


@pytest.mark.parametrize("vec_dot,k", [("q8_0", 576), ("q8_1", 640), ("q8_K", 2048)])
def test_activation_quantization_at_real_widths(vec_dot: str, k: int) -> None:
    """The team quantization gives quantize_act_ref's bits over whole real rows, with a largest magnitude
    held by two elements of opposite sign in one block (the first decides q8_K's sign) and a zero block."""
    rng = np.random.default_rng(k)
    x = (rng.standard_normal((2, k)) * 2).astype(np.float32)
    x[0, 40], x[0, 70] = -9.0, 9.0  # the same block for q8_K, the first of them negative
    x[1, 3], x[1, 29] = 7.5, -7.5
    x[1, 64:96] = 0.0
    qtype = {"q8_0": T.Q8_0, "q8_1": T.Q4_1, "q8_K": T.Q6_K}[vec_dot]
    group = get_traits(qtype).group
    w = upload_weight(pack_weight(qtype, random_raw(qtype, 1, k, rng), 1, k))
    xq, xs, xsum = (a.copy_to_host() for a in quantize_act(BE.from_host(x), w, BE.scratch))
    rq, rs, rsum = quantize_act_ref(x, group, vec_dot)
    np.testing.assert_array_equal(xq.view(np.int8), rq)
    np.testing.assert_array_equal(xs, rs)
    np.testing.assert_array_equal(xsum, rsum)


@pytest.mark.parametrize("n", [576, 640])
def test_fused_norm_quantization_at_real_widths(n: int) -> None:
    """Residual add + RMSNorm + quantization for the next matmul in one kernel over a real row: the bits
    of the plain kernels."""
    rng = np.random.default_rng(n)
    host = [rng.standard_normal((1, n)).astype(np.float32) for _ in range(2)]
    wn = (rng.standard_normal(n) * 0.3 + 1).astype(np.float32)
    w = upload_weight(pack_weight(T.Q8_0, random_raw(T.Q8_0, 2, n, rng), 2, n))
    results = []
    for fuse in (False, True):
        BE.fuse = fuse
        BE.stats.reset()
        x, y, h, out = BE.from_host(host[0]), BE.from_host(host[1]), BE.empty((1, n)), BE.empty((1, 2))
        BE.add(x, y)
        BE.rmsnorm(x, BE.from_host(wn), 1e-5, h)
        BE.matmul(h, w, out)
        results.append([BE.to_host(t) for t in (x, h, out)] + [BE.stats.total_launches])
    BE.fuse = True
    (*plain, n_plain), (*fused, n_fused) = results
    assert (n_plain, n_fused) == (4, 2)
    for a, b in zip(fused, plain, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.skipif(not FULL, reason="the simulator's cost is its blocks: test_cuda_engine.py has 13 of them")
def test_argmax_over_a_real_vocabulary() -> None:
    """SmolLM2's 49,152 logits, one row with three tied maxima in three of its blocks and one with a NaN:
    the first index wins, a NaN first, as np.argmax. (Top-k reads a whole row in one block.)"""
    n = 49152
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, n)).astype(np.float32)
    x[0, [n - 1, n // 2, 9]] = 6.0
    x[1, n - 100] = np.nan
    x[1, 5] = 9.0
    _, view = guarded(x)
    np.testing.assert_array_equal(BE.argmax(view), np.argmax(x, axis=1))


@pytest.mark.skipif(
    not FULL, reason="~25 s per decode step in the simulator: on a GPU or EDGELLM_CUDA_SIM_FULL=1"
)
@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_real_shape_layers_match_the_cpu(name: str, tmp_path: Path) -> None:
    """Two layers at the real width, heads and vocabulary: a prompt longer than the split-K threshold, then
    greedy decode steps: the CPU's tokens, logits close."""
    from edgellm.arch import ARCHITECTURES
    from edgellm.backends import get_backend
    from edgellm.backends.cuda.config import ATTN_SPLIT_KEYS
    from edgellm.engine.model_runner import ModelRunner, RunItem
    from edgellm.gguf.config import config_from_gguf
    from edgellm.gguf.load import load_gguf
    from edgellm.testing.real_shapes import SHAPES
    from edgellm.testing.synthetic.models import write_tiny_model

    spec = dict(SHAPES[name], n_layers=2)
    arch, qtypes = spec.pop("arch"), spec.pop("qtypes")
    path = write_tiny_model(tmp_path / "m.gguf", arch, qtypes, tied=True, quantize_kquants=True, **spec)
    g = load_gguf(path)
    cfg = config_from_gguf(g)
    prompt = [int(t) for t in np.random.default_rng(3).integers(0, cfg.n_vocab, ATTN_SPLIT_KEYS + 40)]
    bs = 16
    table = list(range(-(-(len(prompt) + 4) // bs)))
    runs = {}
    for backend in ("cpu", "cuda"):
        be = get_backend(backend)
        runner = ModelRunner(ARCHITECTURES[cfg.arch](cfg, g, be), cfg, be, len(table), bs)
        logits = [runner.run([RunItem(table, prompt, 0)])[0][-1]]
        toks = [int(logits[0].argmax())]
        for _ in range(2):
            logits.append(runner.run([RunItem(table, [toks[-1]], len(prompt) + len(toks) - 1)])[0][-1])
            toks.append(int(logits[-1].argmax()))
        runs[backend] = (toks, logits)
    assert runs["cuda"][0] == runs["cpu"][0]
    for a, b in zip(runs["cuda"][1], runs["cpu"][1], strict=True):
        assert nmse(a, b.astype(np.float64)) < 1e-4
