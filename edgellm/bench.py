"""`edgellm bench`: batch-1 prefill/decode (same JSON fields as shared/bench/llamacpp_bench.py), and N
requests in flight through the engine (aggregate throughput, TTFT and inter-token latency percentiles,
prefix-cache hits, a long prompt arriving mid-run)."""

from __future__ import annotations

import argparse
import resource
import statistics
import time

import numpy as np
from numba import njit, prange

from edgellm.sampling import SamplingParams


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


def weight_bytes_per_token(llm) -> int:
    """Bytes of weights one decode step streams: every matmul once (tied output counted once)."""
    seen, total = set(), 0
    m = llm.model
    mats = [m.output]
    for attn, ffn in m.layers:
        mats += [attn.wqkv, attn.wo, ffn.w_gate_up, ffn.w_down]
    for w in mats:
        if id(w) in seen:
            continue
        seen.add(id(w))
        parts = getattr(w, "parts", [w])
        total += sum(p.nbytes for p in parts)
    return total


def _pct(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q)) if xs else float("nan")


def batch1(llm, n_prompt: int, n_gen: int, repeat: int) -> dict:
    prefill, decode = [], []
    params = SamplingParams(temperature=0.0, max_tokens=n_gen, ignore_eos=True)
    for r in range(repeat + 1):  # run 0 is a warm-up
        [res] = llm.generate([synthetic_prompt(n_prompt, salt=r + 1)], params)
        m = res.metrics
        if r == 0:
            continue
        prefill.append(n_prompt / m.ttft)
        if len(m.token_times) > 1:
            decode.append((len(m.token_times) - 1) / (m.token_times[-1] - m.token_times[0]))
    return {"prefill_tok_s": statistics.median(prefill), "decode_tok_s": statistics.median(decode)}


def concurrent(llm, args: argparse.Namespace) -> dict:
    n_req = args.requests or args.concurrency
    prefix = synthetic_prompt(args.shared_prefix, salt=999) if args.shared_prefix else []
    prompts = [prefix + synthetic_prompt(args.prompt_tokens, salt=i + 1) for i in range(n_req)]
    params = SamplingParams(temperature=0.0, max_tokens=args.gen_tokens, ignore_eos=True)
    eng = llm.engine
    pending = list(prompts)
    live: set[str] = set()
    done = []
    long_sent = args.long_prompt == 0
    t0 = time.perf_counter()
    while pending or live:
        while pending and len(live) < args.concurrency:
            live.add(eng.add_request(pending.pop(0), params))
        if (
            not long_sent
            and sum(len(d) for d in done) + sum(1 for _ in live)
            and time.perf_counter() - t0 > 1.0
        ):
            live.add(
                eng.add_request(synthetic_prompt(args.long_prompt, salt=4242), params, request_id="long")
            )
            long_sent = True
        for out in eng.step():
            if out.finished:
                live.discard(out.request_id)
                if out.request_id != "long":
                    done.append(out.metrics)
    wall = time.perf_counter() - t0
    gen = sum(m.num_generated_tokens for m in done)
    ttft = [m.ttft for m in done]
    itl = [x for m in done for x in m.inter_token_latencies]
    return {
        "concurrency": args.concurrency,
        "requests": len(done),
        "output_tok_s": gen / wall,
        "ttft_p50_ms": _pct(ttft, 50) * 1e3,
        "ttft_p99_ms": _pct(ttft, 99) * 1e3,
        "itl_p50_ms": _pct(itl, 50) * 1e3,
        "itl_p99_ms": _pct(itl, 99) * 1e3,
        "prefix_cache_hit_rate": eng.stats().prefix_cache_hit_rate,
        "preemptions": eng.stats().num_preemptions,
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


def run_bench(args: argparse.Namespace) -> dict:
    from edgellm import LLM

    n_ctx = args.ctx or max(
        2048, args.prompt_tokens + args.gen_tokens + args.shared_prefix + args.long_prompt + 16
    )
    llm = LLM(
        args.model,
        backend=args.backend,
        n_ctx=n_ctx,
        threads=args.threads,
        enable_prefix_caching=args.concurrency > 1 or args.shared_prefix > 0,
    )
    result: dict = {"model": llm.path.name, "threads": llm.threads, "backend": args.backend}
    rss = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # peak RSS, MB
    if args.concurrency > 1:
        result.update(concurrent(llm, args))
        result["peak_rss_mb"] = rss()
    elif args.shared_prefix:
        result.update(prefix_hit(llm, args))
        result["peak_rss_mb"] = rss()
    else:
        result.update(batch1(llm, args.prompt_tokens, args.gen_tokens, args.repeat))
        result["peak_rss_mb"] = rss()  # before the bandwidth test allocates its 256 MiB
        wb = weight_bytes_per_token(llm)
        bw = memory_bandwidth_gbs()
        result["weight_mb_per_token"] = wb / 1e6
        result["mem_bandwidth_gb_s"] = bw
        result["decode_ceiling_tok_s"] = bw * 1e9 / wb
        result["decode_vs_ceiling"] = result["decode_tok_s"] / result["decode_ceiling_tok_s"]
    return result
