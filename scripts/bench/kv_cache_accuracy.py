"""What a q8_0 KV cache costs in accuracy and gains in capacity, against the f16 cache: prints figures.

For each model: teacher-forced perplexity over 512-token windows of a text with each KV cache type
(LLM.score, the same path as tests/gguf/test_model_vs_llamacpp.py), the top-1 agreement between the two runs,
the mean |logit difference| at the f16 run's top-1 token, and the KV bytes per token and tokens that fit in
the same --kv-cache-memory budget. With --llamacpp, llama.cpp's own f16 vs q8_0 cache on the same tokens
(how much q8_0 moves the model there) and how far each of ours is from llama.cpp's. Not a test.

  python scripts/bench/kv_cache_accuracy.py [--models smollm2-135m gemma3-270m] [--text FILE] [--tokens 512]
                                      [--windows 1] [--kv-cache-memory 64M] [--llamacpp]

The default text is CPython's LICENSE.txt (English licence text that ships with every Python install).
"""

from __future__ import annotations

import argparse
import sys
import sysconfig
from pathlib import Path

import numpy as np

from edgellm import LLM
from edgellm.engine.config import kv_memory
from edgellm.quants.kv_cache import KV_CACHE_TYPES


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def perplexity(logits: np.ndarray, ids: list[int]) -> float:
    lsm = log_softmax(logits)
    return float(np.exp(-np.mean([lsm[t, ids[t + 1]] for t in range(len(ids) - 1)])))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["smollm2-135m", "gemma3-270m"])
    ap.add_argument("--text", default=str(Path(sysconfig.get_paths()["stdlib"]) / "LICENSE.txt"))
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--windows", type=int, default=1, help="consecutive windows of --tokens tokens each")
    ap.add_argument("--kv-cache-memory", type=kv_memory, default=64 * 2**20)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--llamacpp", action="store_true", help="also llama.cpp's f16 vs q8_0 (llama-cpp-python)")
    a = ap.parse_args()
    text = Path(a.text).read_text(encoding="utf-8")
    for name in a.models:
        runs = {}  # dtype -> ([window ids], [window logits], KV bytes per token, tokens in the budget)
        for dtype in KV_CACHE_TYPES:
            kw = {"threads": a.threads, "kv_cache_dtype": dtype, "kv_cache_memory": a.kv_cache_memory}
            with LLM(name, n_ctx=a.tokens + 16, **kw) as llm:
                all_ids = llm.tokenize(text)
                if len(all_ids) < a.tokens * a.windows:
                    sys.exit(f"{a.text}: {len(all_ids)} tokens for {name}, fewer than --tokens x --windows")
                wins = [all_ids[w * a.tokens : (w + 1) * a.tokens] for w in range(a.windows)]
                runs[dtype] = (wins, [llm.score(ids) for ids in wins], llm.kv_bytes_per_token)
                runs[dtype] += (llm.num_kv_blocks * llm.block_size,)
        wins, base, base_bpt, base_tokens = runs["f16"]
        budget = f"KV budget {a.kv_cache_memory / 2**20:.0f} MiB"
        print(f"{name}: {a.windows} x {a.tokens} tokens of {Path(a.text).name}, {budget}")
        print(f"  f16 : KV {base_bpt} B/token, {base_tokens} tokens in the budget")
        for dtype, (_, logits, bpt, tokens) in runs.items():
            if dtype == "f16":
                continue
            print(
                f"  {dtype}: KV {bpt} B/token ({bpt / base_bpt:.3f}x), {tokens} tokens in the budget "
                f"({tokens / base_tokens:.2f}x)"
            )
            totals: dict[str, list[float]] = {"ours": [], "llama.cpp": []}  # per window (ppl f16, ppl q)
            for w, ids in enumerate(wins):
                p16, pq = perplexity(base[w], ids), perplexity(logits[w], ids)
                totals["ours"].append((p16, pq))
                print(
                    f"    window {w}: ppl f16 {p16:.4f}, {dtype} {pq:.4f} ({(pq / p16 - 1) * 100:+.3f}%); "
                    f"{dtype} vs f16: {agreement(base[w], logits[w])}"
                )
                if a.llamacpp:
                    ours = {"f16": base[w], dtype: logits[w]}
                    totals["llama.cpp"].append(llamacpp_kv(name, ids, a.threads or 2, ours))
            for who, pairs in totals.items():
                if pairs:  # equal-length windows: the ppl of all tokens is the geometric mean of the windows'
                    p16, pq = (float(np.exp(np.mean(np.log([p[i] for p in pairs])))) for i in (0, 1))
                    print(
                        f"  {who}, all {len(pairs) * a.tokens} tokens: ppl f16 {p16:.4f}, {dtype} {pq:.4f} "
                        f"({(pq / p16 - 1) * 100:+.3f}%)"
                    )


def agreement(a: np.ndarray, b: np.ndarray) -> str:
    """Top-1 agreement of two logits runs, and the mean |logit difference| at a's top-1 tokens."""
    at, rows = a.argmax(-1), np.arange(len(a))
    top1 = float(np.mean(at == b.argmax(-1)))
    return f"top-1 {top1 * 100:.1f}%, |dlogit| {float(np.mean(np.abs(a[rows, at] - b[rows, at]))):.4f}"


def llamacpp_kv(
    name: str, ids: list[int], threads: int, ours: dict[str, np.ndarray] | None = None
) -> tuple[float, float]:
    """llama.cpp on the same tokens with an f16 and a q8_0 cache (flash attention: llama.cpp quantizes V
    only with it), as the oracle for how much q8_0 moves this model's perplexity. Returns the two ppl."""
    import llama_cpp

    from edgellm.models.catalog import resolve_model

    logits = {}
    for dtype, ggml_type in (("f16", llama_cpp.GGML_TYPE_F16), ("q8_0", llama_cpp.GGML_TYPE_Q8_0)):
        llm = llama_cpp.Llama(
            model_path=str(resolve_model(name)), n_ctx=len(ids) + 16, n_batch=512, n_threads=threads,
            logits_all=True, verbose=False, flash_attn=True, type_k=ggml_type, type_v=ggml_type,
        )  # fmt: skip
        llm.eval(ids)
        logits[dtype] = np.asarray(llm.scores[: len(ids)], dtype=np.float32)
        del llm
    ppl_f16, ppl_q8 = perplexity(logits["f16"], ids), perplexity(logits["q8_0"], ids)
    print(
        f"  llama.cpp (flash attn): f16 ppl {ppl_f16:.4f}, q8_0 ppl {ppl_q8:.4f} "
        f"({(ppl_q8 / ppl_f16 - 1) * 100:+.3f}%); q8_0 vs f16: {agreement(logits['f16'], logits['q8_0'])}"
    )
    for dtype, ours_logits in (ours or {}).items():
        print(f"  edgellm {dtype} vs llama.cpp {dtype}: {agreement(logits[dtype], ours_logits)}")
    return ppl_f16, ppl_q8


if __name__ == "__main__":
    main()
