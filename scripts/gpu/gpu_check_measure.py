"""The measuring steps of scripts/gpu/gpu_check.py (compare, bench, splitk, graphs: the CUDA backend against
the CPU's logits, and its speed) and the sizes every step runs at, real or in the simulator (--sim)."""

from __future__ import annotations

import argparse
import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
BLOCK = 16
HBM_BYTES_PER_S = 4.3e12  # H200 device-to-device copy rate measured here (KINDS.md): the bandwidth bound
MODELS = ("smollm2", "gemma3")
# Per step and mode: how much each measures. Real: the figures; sim: every code path once, in seconds.
# cmp_prompt on a GPU: past the split-K threshold (ATTN_SPLIT_KEYS = 256), so the comparison covers it;
# long_ctx: the context of the split-K step (split into 16 on a GPU; in the simulator 6 keys split in two
# by a split_keys of 4, every forward there costing seconds).
SIZES = {
    False: dict(cmp_prompt=300, cmp_steps=16, prefill=128, decode=64, in_flight=(16, 64), flight_prompt=32,
                flight_steps=16, profile_steps=16, bench_models=MODELS, profile_models=MODELS, warm=True,
                long_ctx=4096, long_steps=32, long_rounds=3, split_keys=None, graph_batches=(1, 16),
                graph_steps=32, graph_rounds=3),
    True: dict(cmp_prompt=2, cmp_steps=1, prefill=3, decode=1, in_flight=(2,), flight_prompt=1,
               flight_steps=1, profile_steps=1, bench_models=("smollm2",), profile_models=("smollm2",),
               warm=False, long_ctx=6, long_steps=1, long_rounds=1, split_keys=4, graph_batches=(1,),
               graph_steps=1, graph_rounds=1),
}  # fmt: skip
NEAR_TIE = 1e-3  # a top-2 logit margin below this fraction of the top logit is a tie: comparison ends


def model_path(work: Path, name: str) -> Path:
    return work / f"{name}.gguf"


class Loaded:
    """A model on one backend, with a runner over n_blocks KV blocks."""

    def __init__(self, path: Path, backend: str, n_blocks: int) -> None:
        from edgellm.arch import ARCHITECTURES
        from edgellm.backends import get_backend
        from edgellm.engine.model_runner import ModelRunner
        from edgellm.gguf.config import config_from_gguf
        from edgellm.gguf.load import load_gguf

        t0 = time.perf_counter()
        g = load_gguf(path)
        self.cfg = config_from_gguf(g)
        self.be = get_backend(backend)
        self.model = ARCHITECTURES[self.cfg.arch](self.cfg, g, self.be)
        self.runner = ModelRunner(self.model, self.cfg, self.be, n_blocks, BLOCK)
        self.load_s = time.perf_counter() - t0

    def forward(self, items: list) -> Any:
        batch, _ = self.runner.build_batch(items)
        return self.model.forward(batch, self.runner.kv)


def _compare_one(path: Path, sz: dict) -> dict:
    from edgellm.engine.model_runner import RunItem

    n_blocks = -(-(sz["cmp_prompt"] + sz["cmp_steps"] + 1) // BLOCK)
    table = list(range(n_blocks))
    cpu, gpu = Loaded(path, "cpu", n_blocks), Loaded(path, "cuda", n_blocks)
    rng = np.random.default_rng(1)
    tokens = [int(t) for t in rng.integers(0, cpu.cfg.n_vocab, sz["cmp_prompt"])]
    pos, nmses, cpu_ids, gpu_ids, device_ids, tie_at = 0, [], [], [], [], None
    for step in range(sz["cmp_steps"] + 1):
        item = RunItem(table, tokens, pos)
        lc = cpu.be.to_host(cpu.forward([item]))[-1].astype(np.float64)
        logits = gpu.forward([item])
        lg = gpu.be.to_host(logits)[-1].astype(np.float64)
        device_ids.append(int(gpu.be.argmax(logits)[-1]))  # the on-device argmax of the same logits
        nmses.append(float(np.sum((lg - lc) ** 2) / max(np.sum(lc**2), 1e-30)))
        top2 = np.sort(lc)[-2:]
        if tie_at is None and top2[1] - top2[0] < NEAR_TIE * max(abs(top2[1]), 1e-6):
            tie_at = step
        cpu_ids.append(int(np.argmax(lc)))
        gpu_ids.append(int(np.argmax(lg)))
        pos += len(tokens)
        tokens = [cpu_ids[-1]]  # both backends continue from the CPU's greedy token
    upto = len(cpu_ids) if tie_at is None else tie_at
    same = [a == b for a, b in zip(cpu_ids[:upto], gpu_ids[:upto], strict=True)]
    return {
        "n_vocab": cpu.cfg.n_vocab,
        "load_s": {"cpu": cpu.load_s, "cuda": gpu.load_s},
        "logits_nmse_max": max(nmses),
        "logits_nmse_median": float(np.median(nmses)),
        "tokens_compared": upto,
        "near_tie_at": tie_at,
        "greedy_equal": all(same),
        "first_difference": None if all(same) else same.index(False),
        "device_argmax_equal_host_argmax": device_ids == gpu_ids,
        "cpu_tokens": cpu_ids,
        "cuda_tokens": gpu_ids,
    }


def step_compare(args: argparse.Namespace) -> dict:
    sz = SIZES[args.sim]
    return {name: _compare_one(model_path(args.work, name), sz) for name in args.models or MODELS}


def _timed(fn: Any, n: int = 1) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n


def _bench_one(path: Path, sz: dict) -> dict:
    from edgellm.backends.cuda.config import STATS
    from edgellm.engine.model_runner import RunItem

    flights = sz["in_flight"]
    per_seq = -(-(max(sz["prefill"], sz["flight_prompt"]) + sz["decode"] + sz["flight_steps"] + 2) // BLOCK)
    m = Loaded(path, "cuda", per_seq * max(flights))
    run = m.runner.run_argmax
    tables = [list(range(s * per_seq, (s + 1) * per_seq)) for s in range(max(flights))]
    prompt = [int(t) for t in np.random.default_rng(2).integers(0, m.cfg.n_vocab, sz["prefill"])]
    res: dict[str, Any] = {"n_vocab": m.cfg.n_vocab, "load_s": m.load_s, "weight_bytes": m.be.weight_bytes}
    if sz["warm"]:
        run([RunItem(tables[0], prompt, 0)])  # compiles the prefill shapes
    res["prefill_tokens"] = len(prompt)
    res["prefill_tok_s"] = len(prompt) / _timed(lambda: run([RunItem(tables[0], prompt, 0)]))
    state = {"pos": len(prompt), "tok": 1}

    def decode_one() -> None:
        [ids] = run([RunItem(tables[0], [state["tok"]], state["pos"])])
        state["pos"] += 1
        state["tok"] = int(ids[-1])

    if sz["warm"]:
        decode_one()  # compiles the decode shapes
    STATS.reset()
    dt = _timed(decode_one, sz["decode"])
    n = sz["decode"]
    res["decode_b1"] = {
        "tok_s": 1 / dt,
        "ms_per_token": dt * 1e3,
        "launches_per_token": STATS.total_launches / n,
        "host_to_device_copies_per_token": STATS.from_host_copies / n,
        "device_to_host_copies_per_token": STATS.to_host_copies / n,
        "bytes_moved_per_token": (STATS.from_host_bytes + STATS.to_host_bytes) / n,
    }
    ctx = state["pos"]
    kv_bytes = m.cfg.n_layers * ctx * m.cfg.n_kv_heads * (m.cfg.head_dim + m.cfg.head_dim_v) * 2
    res["bytes_per_token_b1"] = m.be.weight_bytes + kv_bytes  # every weight read once per step at batch 1
    res["bandwidth_bound_tok_s_b1"] = HBM_BYTES_PER_S / res["bytes_per_token_b1"]
    for b in flights:
        fp = sz["flight_prompt"]
        first = run([RunItem(tables[s], prompt[:fp], 0) for s in range(b)])  # untimed prefill of b sequences
        toks = [int(ids[-1]) for ids in first]
        pos = fp

        def step(b: int = b) -> None:
            nonlocal toks, pos
            out = run([RunItem(tables[s], [toks[s]], pos) for s in range(b)])
            toks, pos = [int(ids[-1]) for ids in out], pos + 1

        if sz["warm"]:
            step()  # compiles this batch size's shapes
        dt = _timed(step, sz["flight_steps"])
        res[f"in_flight_{b}"] = {"aggregate_tok_s": b / dt, "ms_per_step": dt * 1e3}
    return res


def step_bench(args: argparse.Namespace) -> dict:
    sz = SIZES[args.sim]
    return {name: _bench_one(model_path(args.work, name), sz) for name in args.models or sz["bench_models"]}


def _splitk_one(path: Path, sz: dict) -> dict:
    """Batch-1 greedy decode from a long prompt with split-K attention on and off (rounds alternate; each
    decodes the same positions from the same first token): tok/s, the attention kernel's GPU time per
    token (CUDA events; none in the simulator), the first step's logits NMSE between the modes, and whether
    both gave the same tokens."""
    from edgellm.backends.cuda.config import STATS
    from edgellm.engine.model_runner import RunItem
    from edgellm.testing.ab import alternate, medians

    ctx, steps = sz["long_ctx"], sz["long_steps"]
    m = Loaded(path, "cuda", -(-(ctx + steps + 1) // BLOCK))
    table = list(range(-(-(ctx + steps + 1) // BLOCK)))
    prompt = [int(t) for t in np.random.default_rng(4).integers(0, m.cfg.n_vocab, ctx)]
    [first] = m.runner.run_argmax([RunItem(table, prompt, 0)])
    original = m.be.split_keys
    default = sz["split_keys"] or original

    def decode(split_keys: int) -> tuple[list[int], float]:
        m.be.split_keys = split_keys
        toks = [int(first[-1])]
        t0 = time.perf_counter()
        for i in range(steps):
            [ids] = m.runner.run_argmax([RunItem(table, [toks[-1]], ctx + i)])
            toks.append(int(ids[-1]))
        return toks, time.perf_counter() - t0

    modes = {"split": partial(decode, default), "unsplit": partial(decode, 0)}
    runs = alternate(modes, sz["long_rounds"], warmup=int(sz["warm"]))  # the warm-up compiles both grids
    tok_s = {mode: [steps / dt for _, dt in rs] for mode, rs in runs.items()}
    res: dict[str, Any] = {"context": ctx, "split_keys": default, "tok_s": tok_s}
    tokens = {mode: rs[-1][0] for mode, rs in runs.items()}
    for mode, keys in (("split", default), ("unsplit", 0)):
        res[f"attention_gpu_us_per_token_{mode}"] = 0.0
        if sz["warm"]:  # the simulator has no GPU clock
            STATS.reset()
            STATS.timing = "events"
            decode(keys)
            STATS.collect_events()
            STATS.timing = None
            gpu_s = STATS.gpu_seconds["attention_paged_cuda"]
            res[f"attention_gpu_us_per_token_{mode}"] = gpu_s / steps * 1e6
    logits = {}
    for mode, keys in (("split", default), ("unsplit", 0)):  # the first decode step's logits
        m.be.split_keys = keys
        logits[mode] = m.be.to_host(m.forward([RunItem(table, [int(first[-1])], ctx)]))[-1].astype(np.float64)
    m.be.split_keys = original
    diff = logits["split"] - logits["unsplit"]
    res["logits_nmse"] = float(np.sum(diff**2) / max(np.sum(logits["unsplit"] ** 2), 1e-30))
    res["same_tokens"] = tokens["split"] == tokens["unsplit"]  # a figure: a near-tie may flip a token
    res["tokens"] = tokens
    med = medians(tok_s)
    res["speedup"] = med["split"] / med["unsplit"]
    return res


def step_splitk(args: argparse.Namespace) -> dict:
    sz = SIZES[args.sim]
    return {name: _splitk_one(model_path(args.work, name), sz) for name in args.models or sz["bench_models"]}


def _graphs_one(path: Path, sz: dict) -> dict:
    """Greedy decode replayed from CUDA graphs (CudaBackend.argmax_graph, one capture per batch size)
    against plain launches, at each batch size of graph_batches: rounds alternate, each decoding the same
    positions from the same first tokens; tok/s, launches per step, and whether the tokens are the same
    (they must be: the same kernels on the same inputs)."""
    from edgellm.backends.cuda.config import STATS
    from edgellm.engine.model_runner import RunItem

    steps, prompt_len = sz["graph_steps"], sz["flight_prompt"]
    per_seq = -(-(prompt_len + steps + 1) // BLOCK)
    m = Loaded(path, "cuda", per_seq * max(sz["graph_batches"]))
    fwd = lambda batch: m.model.forward(batch, m.runner.kv)  # noqa: E731
    prompt = [int(t) for t in np.random.default_rng(5).integers(0, m.cfg.n_vocab, prompt_len)]
    res: dict[str, Any] = {}
    for b in sz["graph_batches"]:
        tables = [list(range(s * per_seq, (s + 1) * per_seq)) for s in range(b)]
        first = [int(ids[-1]) for ids in m.runner.run_argmax([RunItem(t, prompt, 0) for t in tables])]

        def decode(
            graph: bool, b: int = b, tables: list = tables, first: list = first
        ) -> tuple[list, float, float]:
            toks = [[t] for t in first]
            STATS.reset()
            t0 = time.perf_counter()
            for i in range(steps):
                items = [RunItem(tables[s], [toks[s][-1]], prompt_len + i) for s in range(b)]
                if graph:
                    batch, slices = m.runner.build_batch(items)
                    ids = m.be.argmax_graph(batch, fwd)
                    out = [ids[sl] for sl in slices]
                else:
                    out = m.runner.run_argmax(items)
                for s in range(b):
                    toks[s].append(int(out[s][-1]))
            return toks, time.perf_counter() - t0, STATS.total_launches / steps

        try:
            decode(True)  # captures this batch size's graph (after one plain step of its shape)
        except Exception as e:  # noqa: BLE001 - the report says what failed; the shell marks it failed
            res[f"batch_{b}"] = {"error": f"{type(e).__name__}: {e}", "same_tokens": False, "speedup": 0.0,
                                 "launches_per_step": {"plain": 0.0}}  # fmt: skip
            continue
        if sz["warm"]:
            decode(False)
        r: dict[str, Any] = {"tok_s": {"plain": [], "graph": []}, "launches_per_step": {}}
        tokens = {}
        for _ in range(sz["graph_rounds"]):
            for mode in ("plain", "graph"):
                tokens[mode], dt, launches = decode(mode == "graph")
                r["tok_s"][mode].append(b * steps / dt)
                r["launches_per_step"][mode] = launches
        r["same_tokens"] = tokens["plain"] == tokens["graph"]
        r["speedup"] = float(np.median(r["tok_s"]["graph"]) / np.median(r["tok_s"]["plain"]))
        res[f"batch_{b}"] = r
    res["graphs_captured"] = len(m.be._graphs)
    return res


def step_graphs(args: argparse.Namespace) -> dict:
    from edgellm.backends.cuda.config import SIMULATOR

    sz = SIZES[args.sim]
    if SIMULATOR:  # nothing to run: say so in the report
        return {
            name: {"skipped": "the Numba CUDA simulator has no CUDA graphs"} for name in sz["bench_models"]
        }
    return {name: _graphs_one(model_path(args.work, name), sz) for name in args.models or sz["bench_models"]}
