"""llama.cpp's batch-1 prefill and decode speed on a GGUF, through llama-cpp-python (the oracle's
package: `pip install llama-cpp-python==0.3.36`; on an AMX host build it with AMX off, see
../shared/notes/amx-and-oracle-builds.md). The same JSON fields as `edgellm bench --json`, so the two
can run alternately in one session (scripts/bench/compare_llamacpp.sh) and be compared as ratios.

Usage: python scripts/bench/llamacpp_bench.py MODEL.gguf PROMPT_TOKENS GEN_TOKENS THREADS
Prints one JSON object: {"prefill_tok_s": ..., "decode_tok_s": ...}.
"""

from __future__ import annotations

import json
import sys
import time


def main() -> None:
    from llama_cpp import Llama

    path, n_p, n_g, th = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    llm = Llama(
        model_path=path, n_ctx=n_p + n_g + 8, n_threads=th, n_threads_batch=th, n_batch=512, verbose=False
    )
    prompt = [(i * 7919) % 1000 + 100 for i in range(n_p)]
    llm.reset()
    llm.eval(prompt[:8])  # warm-up
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(prompt)
    t1 = time.perf_counter()
    tok = 100
    for _ in range(n_g):
        llm.eval([tok])
        tok = (tok * 31 + 7) % 1000 + 100
    t2 = time.perf_counter()
    print(json.dumps({"prefill_tok_s": n_p / (t1 - t0), "decode_tok_s": n_g / (t2 - t1)}))


if __name__ == "__main__":
    main()
