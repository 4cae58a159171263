"""Logits far into the context against llama.cpp on the same file, beside llama.cpp against itself.

    PYTHONPATH=/opt/ll_avx512 python scripts/bench/logits_vs_llamacpp.py FILE [--prompt 1024] [--gen 64]
        [--tail 256] [--threads 2]

Needs llama-cpp-python (never part of the default test run). A prompt of --prompt token ids
(bench.synthetic_prompt), then --gen greedy tokens by llama.cpp; compared over the last --tail prompt
positions and every generated one (rows predicting the next token):
- llama.cpp token by token (n_batch 1) against llama.cpp batched (n_batch 512): how far llama.cpp is from
  itself, the yardstick (the project's rule: be no further from llama.cpp than that, measured the same way);
- edgellm teacher-forced on the same tokens (LLM.score) against llama.cpp batched;
- edgellm's own greedy tokens from the prompt against llama.cpp's: where they first differ, and llama.cpp's
  top-2 gap there (a near-tie flips either way).
Prints NMSE (sum of squared differences over the sum of squares of the reference), top-1 agreement, and
the largest llama.cpp top-2 gap among the rows whose top-1 differs.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from edgellm.cli.bench import synthetic_prompt


def llamacpp_logits(
    path: str, ids: list[int], n_batch: int, threads: int, gen: int
) -> tuple[np.ndarray, list]:
    """llama.cpp's logits [len(ids) + gen, n_vocab] for ids then `gen` greedy tokens (the last row predicts
    past them), and those tokens."""
    from llama_cpp import Llama

    from edgellm.testing.oracle.llamacpp import without_extra_buffer_types

    without_extra_buffer_types()
    n_ctx = len(ids) + gen + 16
    llm = Llama(
        path,
        n_ctx=n_ctx,
        n_batch=n_batch,
        n_ubatch=n_batch,
        n_threads=threads,
        logits_all=True,
        verbose=False,
    )
    llm.eval(ids)
    out = []
    for _ in range(gen):
        tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        out.append(tok)
        llm.eval([tok])
    scores = np.array(llm.scores[: llm.n_tokens], np.float32)
    llm.close()
    return scores, out


def nmse(ref: np.ndarray, got: np.ndarray) -> float:
    return float(((got.astype(np.float64) - ref) ** 2).sum() / (ref.astype(np.float64) ** 2).sum())


def compare(name: str, ref: np.ndarray, got: np.ndarray, first: int, segment: int) -> None:
    """NMSE, top-1 agreement, the largest top-2 gap of ref among the rows whose top-1 differ; then NMSE and
    top-1 per `segment` rows (row 0 at position `first`), to show drift with position."""
    top_ref, top_got = ref.argmax(1), got.argmax(1)
    flips = np.flatnonzero(top_ref != top_got)
    two = np.sort(ref, axis=1)[:, -2:]
    gaps = two[:, 1] - two[:, 0]  # ref's top-2 gap per row
    worst = f", largest top-2 gap at a flip {gaps[flips].max():.4f}" if flips.size else ""
    print(
        f"  {name}: NMSE {nmse(ref, got):.2e}, top-1 {len(ref) - flips.size}/{len(ref)}{worst}; "
        f"ref top-2 gaps: median {np.median(gaps):.3f}"
    )
    parts = []
    for s in range(0, len(ref), segment):
        e = min(s + segment, len(ref))
        agree = int((top_ref[s:e] == top_got[s:e]).sum())
        parts.append(f"{first + s}-{first + e - 1}: {nmse(ref[s:e], got[s:e]):.1e} {agree}/{e - s}")
    print("    per positions: " + ", ".join(parts))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", help="a GGUF file")
    ap.add_argument("--prompt", type=int, default=1024, help="prompt tokens")
    ap.add_argument("--gen", type=int, default=64, help="greedy tokens after it")
    ap.add_argument("--tail", type=int, default=256, help="prompt positions compared (the last ones)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--segment", type=int, default=128, help="positions per line of the drift table")
    a = ap.parse_args()
    ids = synthetic_prompt(a.prompt, salt=7)
    t = time.perf_counter()
    batched, greedy = llamacpp_logits(a.model, ids, 512, a.threads, a.gen)
    print(f"llama.cpp batched: {time.perf_counter() - t:.1f} s")
    t = time.perf_counter()
    single, _ = llamacpp_logits(a.model, ids + greedy, 1, a.threads, 0)
    print(f"llama.cpp token by token: {time.perf_counter() - t:.1f} s")

    from edgellm import LLM

    with LLM(a.model, n_ctx=a.prompt + a.gen + 16, threads=a.threads) as llm:
        t = time.perf_counter()
        ours = llm.score(ids + greedy)  # [P + G, n_vocab]
        print(f"edgellm score: {time.perf_counter() - t:.1f} s")
        from edgellm.sampling.sampler import SamplingParams

        [res] = llm.generate([ids], SamplingParams(temperature=0.0, max_tokens=a.gen, ignore_eos=True))
        own = list(res.token_ids)
    rows = slice(a.prompt - a.tail, a.prompt + a.gen - 1)  # rows predicting a known next token
    ref = batched[rows]
    print(f"{a.model}: prompt {a.prompt}, {a.gen} greedy tokens; positions {rows.start}..{rows.stop - 1}")
    compare("llama.cpp token by token vs batched", ref, single[rows], rows.start, a.segment)
    compare("edgellm vs llama.cpp batched", ref, ours[rows], rows.start, a.segment)
    first = next((i for i, (x, y) in enumerate(zip(own, greedy, strict=True)) if x != y), None)
    if first is None:
        print(f"  greedy: all {a.gen} tokens identical")
    else:
        two = np.sort(batched[a.prompt - 1 + first])[-2:]
        gap = two[1] - two[0]
        print(f"  greedy: identical for {first} tokens, then differ at a llama.cpp top-2 gap {gap:.4f}")


if __name__ == "__main__":
    main()
