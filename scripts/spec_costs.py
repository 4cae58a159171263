"""What speculative decoding costs, in-process on one engine core: the verify-cost curve (one forward pass
of 1 + k query tokens at batch 1, k = 0, 1, 2, 4, 8, 12, 16, after --context tokens), and greedy decoding of
bench_speculative.py's copy-heavy prompts plain and with n-gram speculation at each k: CPU ms per token,
tokens per step, and where a step's CPU goes (proposer, scheduler, forward, verification and bookkeeping).
CPU seconds (time.process_time, all threads of the process) are printed beside wall seconds: on a shared
machine they depend far less on what else runs (--threads 1 least: no thread waits on another).

    python scripts/spec_costs.py smollm2-135m [--threads 2] [--reps 15] [--ks 4,8,16] [--draft D.gguf]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from edgellm.bench import synthetic_prompt  # noqa: E402
from edgellm.catalog import resolve_model  # noqa: E402
from edgellm.engine.core import CoreSpec, EngineCore  # noqa: E402
from edgellm.engine.model_runner import RunItem  # noqa: E402
from edgellm.engine.spec.build import build_speculator  # noqa: E402
from edgellm.engine.spec.config import SpeculativeConfig  # noqa: E402
from edgellm.engine.spec.speculator import Speculator  # noqa: E402
from edgellm.sampling import SamplingParams  # noqa: E402

KS = (0, 1, 2, 4, 8, 12, 16)


def clocks() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def verify_curve(core: EngineCore, context: int, reps: int) -> dict[int, dict[str, float]]:
    """Median wall and CPU milliseconds of one forward pass scoring 1 + k tokens after `context` tokens
    (every row's logits to the host, as the CPU engine's verification reads them)."""
    runner = core.runner
    bs = runner.block_size
    total = context + 1 + max(KS)
    table = list(range(-(-total // bs)))  # [blocks] the first blocks of the pool; nothing else runs
    prompt = synthetic_prompt(total)
    runner.run([RunItem(table, prompt[:context], 0)])
    items = {k: RunItem(table, prompt[context : context + 1 + k], context, num_logits=1 + k) for k in KS}
    walls: dict[int, list[float]] = defaultdict(list)
    cpus: dict[int, list[float]] = defaultdict(list)
    for rep in range(reps + 1):  # round-robin over k, so a busy spell of the machine hits every k alike
        for k, item in items.items():
            w, c = clocks()
            runner.run([item])
            w2, c2 = clocks()
            if rep:  # the first round compiles and warms each shape
                walls[k].append(w2 - w)
                cpus[k].append(c2 - c)
    curve = {
        k: {"wall_ms": statistics.median(walls[k]) * 1e3, "cpu_ms": statistics.median(cpus[k]) * 1e3}
        for k in KS
    }
    return curve


PHASES = ("proposer", "scheduler", "forward", "verify+bookkeeping")


class StepClock:
    """CPU seconds of each phase of an engine's steps: LLMEngine._run (forward), LLMEngine._postprocess
    (sampling, verification, bookkeeping), Scheduler.schedule and the speculator's propose."""

    def __init__(self, core: EngineCore) -> None:
        self.spent: dict[str, float] = defaultdict(float)
        eng = core.engine
        self._wrap(eng, "_run", "forward")
        self._wrap(eng, "_postprocess", "verify+bookkeeping")
        self._wrap(eng.scheduler, "schedule", "scheduler")

    def _wrap(self, obj: object, name: str, label: str) -> None:
        f = getattr(obj, name)

        def timed(*a, **k):  # noqa: ANN002, ANN003, ANN202
            c = time.process_time()
            try:
                return f(*a, **k)
            finally:
                self.spent[label] += time.process_time() - c

        setattr(obj, name, timed)

    def use(self, core: EngineCore, speculator: Speculator | None) -> None:
        if speculator is not None:
            self._wrap(speculator, "propose", "proposer")
        core.engine.speculator = speculator


Workload = list[tuple[list[int], SamplingParams]]


def decode_cost(core: EngineCore, clock: StepClock, work: Workload, together: bool) -> dict:
    """Decode the work's requests one after another (together=False: batch 1) or all at once: CPU and wall
    seconds of the steps after the first token (prompt steps excluded), tokens, steps, CPU seconds per phase
    and the speculator's counters."""
    eng = core.engine
    tot: dict[str, float] = defaultdict(float)
    before = eng.stats()
    for batch in [work] if together else [[w] for w in work]:
        for prompt, params in batch:
            eng.add_request(prompt, params)
        started = False
        while eng.has_unfinished():
            clock.spent.clear()
            w, c = clocks()
            outs = eng.step()
            w2, c2 = clocks()
            n = sum(len(d.token_ids) for o in outs for d in o.deltas)
            started = started or n > 0
            if started:
                tot["cpu"] += c2 - c
                tot["wall"] += w2 - w
                tot["tokens"] += n
                tot["steps"] += 1
                for label in PHASES:
                    tot[label] += clock.spent[label]
    after = eng.stats()
    for name in ("draft_tokens", "accepted_tokens", "pauses"):
        key = f"spec_{name}_total"
        tot[name] = getattr(after, key) - getattr(before, key)
    return tot


def decode_costs(core: EngineCore, work: Workload, together: bool, ks: list[int], rounds: int) -> dict:
    """Per engine (plain, n-gram with each k): medians over rounds (the engines' order rotates each round)
    of CPU ms per token, tokens per step, each phase's CPU ms per step, acceptance and pauses; cpu_ratio:
    plain's CPU per token over the engine's."""
    clock = StepClock(core)
    engines = {"plain": None} | {f"ngram_k{k}": SpeculativeConfig("ngram", num_tokens=k) for k in ks}
    runs: dict[str, list[dict]] = defaultdict(list)
    names = list(engines)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            clock.use(core, build_speculator(engines[name], core))
            runs[name].append(decode_cost(core, clock, work, together))
    core.engine.speculator = None
    res = {}
    for name, rs in runs.items():

        def med(f, rs=rs):  # noqa: ANN001, ANN202
            return statistics.median(f(t) for t in rs)

        res[name] = {
            "cpu_ms_per_token": med(lambda t: t["cpu"] * 1e3 / t["tokens"]),
            "wall_ms_per_token": med(lambda t: t["wall"] * 1e3 / t["tokens"]),
            "tokens_per_step": med(lambda t: t["tokens"] / t["steps"]),
        } | {f"{p}_ms_per_step": med(lambda t, p=p: t[p] * 1e3 / t["steps"]) for p in PHASES}
        res[name]["cpu_ms_per_token_rounds"] = [round(t["cpu"] * 1e3 / t["tokens"], 3) for t in rs]
        if name != "plain":
            res[name]["acceptance"] = med(lambda t: t["accepted_tokens"] / max(1, t["draft_tokens"]))
            res[name]["pauses"] = med(lambda t: t["pauses"])
    for v in res.values():
        v["cpu_ratio"] = res["plain"]["cpu_ms_per_token"] / v["cpu_ms_per_token"]
    return res


def workloads(path: str, max_tokens: int, parts: set[str]) -> dict[str, tuple[Workload, bool]]:
    """bench_speculative.py's prompts: copy-heavy greedy at batch 1, free-form sampled at temperature 1
    (seeded) at batch 1, and 16 of the mixed set greedy in flight together."""
    from bench_speculative import COPY, FREE, chat_ids

    from edgellm import LLM

    llm = LLM(path, n_ctx=2048, kv_cache_memory=16 << 20)
    copy, free = [chat_ids(llm, t) for t in COPY], [chat_ids(llm, t) for t in FREE]
    llm.shutdown()
    greedy = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    out = {
        "copy": ([(p, greedy) for p in copy], False),
        "sampled": (
            [
                (p, SamplingParams(temperature=1.0, max_tokens=max_tokens, seed=i))
                for i, p in enumerate(free * 2)
            ],
            False,
        ),
        "flight16": ([((copy + free)[i % 6], greedy) for i in range(16)], True),
    }
    return {k: v for k, v in out.items() if k in parts}


def _fmt(v: object) -> str:
    return f"{v:.3f}" if isinstance(v, float) else str(v)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--tokens", type=int, default=160, help="max tokens per request")
    ap.add_argument("--ks", default="4,8", help="n-gram k values to decode with")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--skip", default="", help="comma list of parts to skip: curve,copy,sampled,flight16")
    a = ap.parse_args()
    skip = set(filter(None, a.skip.split(",")))
    path = str(resolve_model(a.model))
    spec = CoreSpec(path, n_ctx=2048, threads=a.threads, kv_cache_memory=256 << 20)
    plain = EngineCore(spec)
    report: dict = {"model": Path(path).name, "threads": plain.threads}
    if "curve" not in skip:
        curve = verify_curve(plain, a.context, a.reps)
        report["verify_curve"] = curve
        base = curve[0]["cpu_ms"]
        print(f"verify forward, batch 1 after {a.context} tokens (median of {a.reps}):")
        for k, c in curve.items():
            print(
                f"  1+{k:<2d} tokens: {c['wall_ms']:7.2f} ms wall  {c['cpu_ms']:7.2f} ms CPU  "
                f"{c['cpu_ms'] / base:5.2f}x the 1-token CPU",
                flush=True,
            )
    ks = [int(k) for k in a.ks.split(",")]
    for part, (work, together) in workloads(path, a.tokens, {"copy", "sampled", "flight16"} - skip).items():
        report[part] = costs = decode_costs(plain, work, together, ks, a.rounds)
        print(f"{part}: CPU per token, plain vs n-gram speculation (medians of {a.rounds} rounds):")
        for name, c in costs.items():
            print(f"  {name:9s} " + "  ".join(f"{k} {_fmt(v)}" for k, v in c.items()), flush=True)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
