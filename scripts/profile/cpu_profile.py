"""Where a CPU decode step's time goes: the engine core in this process, every backend call timed.

Runs a prompt, then decodes N tokens at batch 1, and prints per backend method (decoder_layer: a whole
layer in one call where the backend fuses it; matmul, attention, rmsnorm, ...) the calls per step, the
median-step time and its share, the step time not spent in backend calls (Python: scheduling, sampling,
the model's own code), and the step's CPU time (all threads, OpenMP's spin-waits included: compare it
at --threads 1, where it does not depend on what else the machine runs). Used to decide whether per-call
overheads (parallel-region launches, argument unboxing) matter next to the streaming of the weights.

    python scripts/profile/cpu_profile.py MODEL [--threads 2] [--tokens 64] [--prompt 32] [--batch 1]
    python scripts/profile/cpu_profile.py MODEL --prefill 128 [--rounds 3]

--batch B decodes B requests at once (each its own prompt), so a step is B tokens: for mixture-of-experts
models, what a step of tokens that route apart costs (one prompt's tokens route alike, so --prefill
reaches fewer experts). --prefill N times prompts of N tokens instead (each distinct, so no prefix-cache
hit; one warm-up prompt first): the same table per prompt, all of its prefill steps together. With
EngineConfig's lazy_experts the first prompts also pay the preparation of the experts they reach first.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict

from edgellm.backends.cpu.backend import CpuBackend
from edgellm.cli.bench import synthetic_prompt
from edgellm.engine.config import EngineConfig
from edgellm.engine.core_process import EngineCoreProc
from edgellm.models.catalog import resolve_model
from edgellm.sampling.sampler import SamplingParams

METHODS = [
    "decoder_layer",
    "moe_block",
    "moe_route",
    "moe_experts",
    "moe_combine",
    "matmul",
    "attention",
    "rmsnorm",
    "rmsnorm_heads",
    "rope",
    "gated_act",
    "add",
    "embed",
    "write_kv",
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--batch", type=int, default=1, help="requests decoding at once")
    ap.add_argument("--prefill", type=int, default=0, help="time prompts of this many tokens instead")
    ap.add_argument("--rounds", type=int, default=3, help="prompts timed with --prefill")
    args = ap.parse_args()
    step_times: dict[str, list[float]] = defaultdict(list)
    counts: dict[str, int] = defaultdict(int)
    for name in METHODS:
        original = getattr(CpuBackend, name, None)
        if original is None:  # a backend without that method (an older tree)
            continue

        def timed(self, *a, _f=original, _n=name, **k):  # noqa: ANN001, ANN002, ANN003, ANN202
            t0 = time.perf_counter()
            r = _f(self, *a, **k)
            if step_times[_n]:  # only while decode steps are recorded
                step_times[_n][-1] += time.perf_counter() - t0
                counts[_n] += 1
            return r

        setattr(CpuBackend, name, timed)
    core = EngineCoreProc(EngineConfig(str(resolve_model(args.model)), n_ctx=2048, threads=args.threads))
    engine = core.engine_core
    params = SamplingParams(max_tokens=args.tokens, temperature=0.0, ignore_eos=True)
    walls, cpus = [], []

    if args.prefill:
        one = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
        for salt in range(args.rounds + 1):  # the first prompt warms up
            engine.add_request(synthetic_prompt(args.prefill, salt=salt + 1), one)
            if salt == 0:
                while engine.has_unfinished():
                    engine.step()
                continue
            for name in METHODS:
                step_times[name].append(0.0)
            t0, c0 = time.perf_counter(), time.process_time()
            while engine.has_unfinished():  # every chunk of the prompt
                engine.step()
            walls.append(time.perf_counter() - t0)
            cpus.append(time.process_time() - c0)
    else:
        for salt in range(args.batch):
            engine.add_request(synthetic_prompt(args.prompt, salt=salt), params)
        sched = engine.scheduler
        while any(s.num_computed_tokens < s.num_prompt_tokens for s in sched.waiting + sched.running):
            engine.step()  # the prompts (and their first tokens)
        for name in METHODS:
            step_times[name].clear()
        counts.clear()
        while engine.has_unfinished():
            for name in METHODS:
                step_times[name].append(0.0)
            t0, c0 = time.perf_counter(), time.process_time()
            engine.step()
            walls.append(time.perf_counter() - t0)
            cpus.append(time.process_time() - c0)
    n = len(walls)
    wall = statistics.median(walls)
    cpu = statistics.median(cpus)
    per, tokens, what = ("prompt", args.prefill, "prompts") if args.prefill else ("step", args.batch, "steps")
    print(
        f"{args.model}: {n} {what}, median {wall * 1e3:.2f} ms/{per} "
        f"({tokens / wall:.1f} tok/s), CPU {cpu * 1e3:.2f} ms/{per}"
    )
    in_backend = 0.0
    for name in METHODS:
        t = statistics.median(step_times[name]) if step_times[name] else 0.0
        in_backend += t
        if counts[name]:
            calls = counts[name] / n
            share = f"{t * 1e3:7.3f} ms  {t / wall:6.1%}"
            print(f"  {name:14s} {calls:6.1f} calls  {share}  {t / calls * 1e6:8.1f} us/call")
    rest = wall - in_backend
    print(f"  {'outside':14s} {'':12s} {rest * 1e3:7.3f} ms  {rest / wall:6.1%}")


if __name__ == "__main__":
    main()
