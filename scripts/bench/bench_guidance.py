"""What constrained decoding costs: decode tok/s with 16 requests in flight, all unconstrained against half
of them constrained by a JSON schema, in alternating runs on one engine core (built in this process, as
the core process runs it: its steps are timed without the pipe). On a shared machine read the medians,
their ratio and the CPU time per step.

Every request generates exactly --max-tokens tokens in both runs (the unconstrained ones ignore EOS; the
schema, a list of at least 1000 integers, cannot close before that), so both runs decode the same batch
shape and only the grammar work differs.

    python scripts/bench/bench_guidance.py [--model smollm2-135m] [--rounds 5] [--max-tokens 32] [--threads N]
"""

from __future__ import annotations

import argparse
import time
from functools import partial

from edgellm.engine.config import EngineConfig
from edgellm.engine.core_process import EngineCoreProc
from edgellm.engine.engine_core import EngineCore
from edgellm.models.catalog import resolve_model
from edgellm.sampling.sampler import SamplingParams
from edgellm.testing.ab import alternate, medians

SCHEMA = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 999}, "minItems": 1000}


def run(engine: EngineCore, prompts: list[list[int]], params: list[SamplingParams]) -> tuple[float, float]:
    """(decode tok/s, CPU ms per decode step) of one batch: the steps after the one that prefilled every
    prompt. CPU time counts every thread of this process (kernels, llguidance's, the mask worker): on a
    shared machine it moves far less than wall time."""
    for p, sp in zip(prompts, params, strict=True):
        engine.add_request(p, sp)
    engine.step()  # the prompts (short: one step) and every first token
    tokens = steps = 0
    wall, cpu = time.perf_counter(), time.process_time()
    while engine.has_unfinished():
        tokens += sum(len(out.new_token_ids) for out in engine.step())
        steps += 1
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return tokens / wall, 1000 * cpu / steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--in-flight", type=int, default=16)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    n = args.in_flight
    core = EngineCoreProc(
        EngineConfig(str(resolve_model(args.model)), n_ctx=512, max_num_seqs=n, threads=args.threads)
    )
    engine, tok = core.engine_core, core.engine_core.guidance.tokenizer
    prompts = [
        tok.encode(f"Request {i}: list some numbers between 0 and 999.", add_special=True) for i in range(n)
    ]
    free = SamplingParams(temperature=0.8, max_tokens=args.max_tokens, ignore_eos=True, seed=0)
    json_list = SamplingParams(temperature=0.8, max_tokens=args.max_tokens, json_schema=SCHEMA, seed=0)
    modes = {"unconstrained": [free] * n, "half constrained": [free, json_list] * (n // 2)}
    for mode in modes.values():  # warm-up: kernels, llguidance's tokenizer
        run(engine, prompts, mode)

    def report(r: int, mode: str, res: tuple[float, float]) -> None:
        print(f"round {r} {mode:17s} {res[0]:7.1f} decode tok/s {res[1]:7.1f} CPU ms/step", flush=True)

    runs = {m: partial(run, engine, prompts, params) for m, params in modes.items()}
    results = alternate(runs, args.rounds, order="reverse", report=report)
    med = medians(results, key=lambda res: res[0])
    med_cpu = medians(results, key=lambda res: res[1])
    for m in modes:
        print(f"median {m:17s} {med[m]:7.1f} decode tok/s {med_cpu[m]:7.1f} CPU ms/step ({args.rounds} runs)")
    cpu_ratio = med_cpu["half constrained"] / med_cpu["unconstrained"]
    print(f"CPU per step: half constrained / unconstrained = {cpu_ratio:.3f}")
    ratio = med["half constrained"] / med["unconstrained"]
    print(f"decode tok/s: half constrained / unconstrained = {ratio:.3f} (cost {100 * (1 - ratio):.1f}%)")


if __name__ == "__main__":
    main()
