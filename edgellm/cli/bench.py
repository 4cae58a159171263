"""`edgellm bench`: batch-1 prefill/decode (same JSON fields as scripts/bench/llamacpp_bench.py), and N
requests in flight through the engine (aggregate throughput, TTFT and inter-token latency percentiles,
prefix-cache hits, a long prompt arriving mid-run). Both go through LLM, so through the engine core
process as every front-end does."""

from __future__ import annotations

import argparse
import asyncio
import math
import resource
import statistics
import time

import numpy as np
from numba import njit, prange

from edgellm.sampling.sampler import SamplingParams


def synthetic_prompt(n: int, salt: int = 0) -> list[int]:
    """Token ids like llamacpp_bench.py's; `salt` makes distinct prompts (no accidental prefix hits)."""
    return [(i * 7919 + salt * 104729) % 1000 + 100 for i in range(n)]


@njit(parallel=True, cache=True, nogil=True)
def _stream_sum(a: np.ndarray) -> float:
    acc = 0
    for i in prange(a.shape[0]):
        acc += a[i]
    return acc


def memory_bandwidth_gbs() -> float:
    """Read bandwidth of a parallel pass over 256 MiB (the bound for memory-bound decode)."""
    a = np.ones(2**25, dtype=np.int64)
    _stream_sum(a)
    best = 0.0
    for _ in range(3):
        t = time.perf_counter()
        _stream_sum(a)
        best = max(best, a.nbytes / (time.perf_counter() - t) / 1e9)
    return best


def _pct(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q)) if xs else float("nan")


def batch1_run(llm, n_prompt: int, n_gen: int, salt: int = 1) -> tuple[float, float]:
    """One batch-1 request, greedy: (prefill tok/s, decode tok/s after the first token)."""
    params = SamplingParams(temperature=0.0, max_tokens=n_gen, ignore_eos=True)
    [res] = llm.generate([synthetic_prompt(n_prompt, salt=salt)], params)
    m = res.metrics
    t = m.token_times
    return n_prompt / m.ttft, (len(t) - 1) / (t[-1] - t[0]) if len(t) > 1 else float("nan")


def batch1(llm, n_prompt: int, n_gen: int, repeat: int) -> dict:
    runs = [batch1_run(llm, n_prompt, n_gen, salt=r + 1) for r in range(repeat + 1)][1:]  # run 0: warm-up
    return {
        "prefill_tok_s": statistics.median(r[0] for r in runs),
        "decode_tok_s": statistics.median(r[1] for r in runs if not math.isnan(r[1])),
    }


def concurrent(llm, args: argparse.Namespace) -> dict:
    """N requests kept in flight through LLM.stream (the front-end every app uses), from one event loop."""
    return asyncio.run(_concurrent(llm, args))


async def _concurrent(llm, args: argparse.Namespace) -> dict:
    n_req = args.requests or args.concurrency
    prefix = synthetic_prompt(args.shared_prefix, salt=999) if args.shared_prefix else []
    prompts = [prefix + synthetic_prompt(args.prompt_tokens, salt=i + 1) for i in range(n_req)]
    params = SamplingParams(temperature=0.0, max_tokens=args.gen_tokens, ignore_eos=True)
    slots = asyncio.Semaphore(args.concurrency)
    done = []

    async def one(prompt: list[int], request_id: str | None = None, record: bool = True) -> None:
        async with slots:
            async for out in llm.stream(prompt, params, request_id=request_id):
                if out.finished and record:
                    done.append(out.metrics)

    async def long_one() -> None:  # a long prompt arriving mid-run
        await asyncio.sleep(1.0)
        await one(synthetic_prompt(args.long_prompt, salt=4242), "long", record=False)

    t0 = time.perf_counter()
    jobs = [one(p) for p in prompts] + ([long_one()] if args.long_prompt else [])
    await asyncio.gather(*jobs)
    wall = time.perf_counter() - t0
    gen = sum(m.num_generated_tokens for m in done)
    ttft = [m.ttft for m in done]
    itl = [x for m in done for x in m.inter_token_latencies]
    stats = llm.stats()
    return {
        "concurrency": args.concurrency,
        "requests": len(done),
        "output_tok_s": gen / wall,
        "ttft_p50_ms": _pct(ttft, 50) * 1e3,
        "ttft_p99_ms": _pct(ttft, 99) * 1e3,
        "itl_p50_ms": _pct(itl, 50) * 1e3,
        "itl_p99_ms": _pct(itl, 99) * 1e3,
        "prefix_cache_hit_rate": stats.prefix_cache_hit_rate,
        "preemptions": stats.num_preemptions,
    }


def prefix_hit(llm, args: argparse.Namespace) -> dict:
    """TTFT of a request whose shared prefix is not cached (miss) vs one that finds it cached (hit)."""
    prefix = synthetic_prompt(args.shared_prefix, salt=777)
    params = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    misses, hits = [], []
    for r in range(args.repeat):
        pre = [t + r for t in prefix]  # a fresh prefix per repeat, so the first request misses
        [a] = llm.generate([pre + synthetic_prompt(args.prompt_tokens, salt=2 * r + 1)], params)
        [b] = llm.generate([pre + synthetic_prompt(args.prompt_tokens, salt=2 * r + 2)], params)
        misses.append(a.metrics.ttft)
        hits.append(b.metrics.ttft)
    miss, hit = statistics.median(misses), statistics.median(hits)
    return {
        "shared_prefix": args.shared_prefix,
        "ttft_miss_ms": miss * 1e3,
        "ttft_hit_ms": hit * 1e3,
        "ttft_speedup": miss / hit,
    }


def _core_rss_kb(pid: int) -> int:
    """Peak RSS of the live core process (VmHWM), kB; 0 where /proc cannot tell."""
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def gguf_matrix_bytes(path: str) -> int:
    """The file's bytes of the matrices the model multiplies by: every 2-D tensor and every 3-D one (a
    mixture of experts' expert matrices), except the token embedding when the file has a separate output
    matrix (the embedding is then only looked up)."""
    from edgellm.gguf.load import load_gguf

    tensors = load_gguf(path).tensors
    skip = {"token_embd.weight"} if "output.weight" in tensors else set()
    return sum(t.n_bytes for name, t in tensors.items() if len(t.shape) in (2, 3) and name not in skip)


def cpu_tier() -> str:
    """The CPU kernel tier the engine runs (its process reads the same environment)."""
    from edgellm.backends.cpu.tiers import active_tier

    return active_tier().name


def run_bench(args: argparse.Namespace) -> dict:
    from edgellm import LLM, EngineConfig

    n_ctx = args.n_ctx or max(
        2048, args.prompt_tokens + args.gen_tokens + args.shared_prefix + args.long_prompt + 16
    )
    prefix_caching = args.concurrency > 1 or args.shared_prefix > 0
    llm = LLM(config=EngineConfig.from_cli_args(args, n_ctx=n_ctx, enable_prefix_caching=prefix_caching))
    result: dict = {
        "model": llm.path.name,
        "threads": llm.threads,
        "backend": llm.engine_config.backend,
        "cpu_tier": cpu_tier() if llm.engine_config.backend == "cpu" else None,
        "kv_cache_dtype": llm.kv_cache_dtype,
        "kv_bytes_per_token": llm.kv_bytes_per_token,
        "kv_cache_tokens": llm.num_kv_blocks * llm.block_size,
    }
    result["load_s"] = llm.load_time  # reading and repacking the weights, KV cache allocation
    result["huge_pages"] = llm.huge_pages
    # peak RSS, MB: the engine core's process (the model, KV cache and kernels live there) and this one
    rss = lambda: (
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss + _core_rss_kb(llm.core.pid)
    ) / 1024
    if args.concurrency > 1:
        result.update(concurrent(llm, args))
        result["peak_rss_mb"] = rss()
    elif args.shared_prefix:
        result.update(prefix_hit(llm, args))
        result["peak_rss_mb"] = rss()
    else:
        result.update(batch1(llm, args.prompt_tokens, args.gen_tokens, args.repeat))
        result["peak_rss_mb"] = rss()  # before the bandwidth test allocates its 256 MiB
        wb = llm.weight_bytes_per_token
        bw = memory_bandwidth_gbs()
        result["weight_mb_per_token"] = wb / 1e6  # active: a mixture of experts' selected experts only
        result["weight_mb_total"] = llm.weight_bytes_total / 1e6
        result["weight_bytes_vs_gguf"] = llm.weight_bytes_total / gguf_matrix_bytes(str(llm.path))
        result["mem_bandwidth_gb_s"] = bw
        result["decode_ceiling_tok_s"] = bw * 1e9 / wb
        result["decode_vs_ceiling"] = result["decode_tok_s"] / result["decode_ceiling_tok_s"]
    if llm.speculative is not None:
        result.update(speculation_figures(llm))
    return result


def speculation_figures(llm) -> dict:
    """Speculative decoding over the whole run: drafts accepted, and tokens gained per verify step."""
    s = llm.stats()
    return {
        "speculative": llm.speculative.method,
        "spec_num_tokens": llm.speculative.num_tokens,
        "spec_acceptance_rate": s.spec_acceptance_rate,
        "spec_mean_accepted_length": s.spec_mean_accepted_length,
        "spec_draft_tokens": s.spec_draft_tokens_total,
    }
