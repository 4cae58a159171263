"""The prompt cache across a restart (issue 61's target: cached_tokens >= 1,900 of a 2,000-token shared
prefix, the cold run's output, time to first token <= 0.3x the cold one). Runs the engine with
--prompt-cache in a fresh directory: one cold request (a --prefix-token prefix and a short question), the
engine closed and started again, the same request; each run warms its kernels on an unrelated short
prompt of the same length first, so compiling is not timed. Prints one JSON line.

    python scripts/bench/prompt_cache_restart.py smollm2-135m --prefix 2000
"""

from __future__ import annotations

import argparse
import json
import tempfile

from edgellm import LLM, SamplingParams
from edgellm.cli.bench import synthetic_prompt


def timed(
    model: str, cache: str, prompt: list[int], args: argparse.Namespace
) -> tuple[list[int], int, float]:
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    with LLM(model, n_ctx=args.ctx, threads=args.threads, prompt_cache=cache) as llm:
        # compiled and warm at every prefill chunk size and context length the timed prompt meets; it shares
        # no block with `prompt`
        llm.generate([synthetic_prompt(len(prompt), salt=99)], params)
        [out] = llm.generate([prompt], params)
    return out.outputs[0].token_ids, out.metrics.num_cached_tokens, out.metrics.ttft


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", nargs="?", default="smollm2-135m")
    ap.add_argument("--prefix", type=int, default=2000)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    prompt = synthetic_prompt(args.prefix, salt=7) + synthetic_prompt(16, salt=8)
    with tempfile.TemporaryDirectory(prefix="edgellm-prompt-cache-") as cache:
        cold, cold_cached, cold_ttft = timed(args.model, cache, prompt, args)
        warm, warm_cached, warm_ttft = timed(args.model, cache, prompt, args)
    print(json.dumps({
        "prefix_tokens": args.prefix,
        "cold_cached_tokens": cold_cached,
        "restart_cached_tokens": warm_cached,
        "same_output": warm == cold,
        "ttft_cold_ms": round(cold_ttft * 1e3, 1),
        "ttft_restart_ms": round(warm_ttft * 1e3, 1),
        "ttft_ratio": round(warm_ttft / cold_ttft, 3),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
