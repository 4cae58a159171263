"""What speculative decoding costs, in-process on one engine core. Parts:

- curve: the verify-cost curve (one forward pass of 1 + k query tokens at batch 1, k = 0, 1, 2, 4, 8, 12, 16,
  after --context tokens); with --draft, the draft model's one-token forward too, and from both the
  acceptance a draft model needs to break even (and to give 1.5x) at k = 1, 2, 4, 8;
- copy / sampled / flight16: bench_speculative.py's copy-heavy prompts greedy at batch 1, its free-form
  prompts sampled at temperature 1 (seeded) at batch 1, and 16 of the mixed set greedy in flight, decoded
  plain, with n-gram speculation at each k (and the --draft model, adaptive and fixed k): CPU ms per token
  and its ratio to plain, tokens per step, acceptance, pauses, and where a step's CPU goes (proposer,
  scheduler, forward, verification and bookkeeping).

CPU seconds (time.process_time, all threads of the process) are printed beside wall seconds: on a shared
machine they depend far less on what else runs (--threads 1 least: no thread waits on another).

    python scripts/profile/spec_costs.py smollm2-135m [--threads 1] [--ks 4,8] [--draft D.gguf]
        [--skip flight16]
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from functools import partial
from pathlib import Path
from typing import Any

from edgellm.cli.bench import synthetic_prompt
from edgellm.engine.config import EngineConfig
from edgellm.engine.core_process import EngineCoreProc
from edgellm.engine.model_runner import RunItem
from edgellm.engine.spec.build import build_speculator
from edgellm.engine.spec.config import SpeculativeConfig
from edgellm.engine.spec.speculator import Speculator
from edgellm.models.catalog import resolve_model
from edgellm.sampling.sampler import SamplingParams
from edgellm.testing.ab import alternate, medians
from edgellm.testing.spec_prompts import COPY, FREE, chat_ids

KS = (0, 1, 2, 4, 8, 12, 16)


def clocks() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def verify_curve(
    core: EngineCoreProc, context: int, reps: int, draft: Any = None
) -> dict[str, dict[str, float]]:
    """Median wall and CPU milliseconds of one forward pass scoring 1 + k tokens after `context` tokens
    (every row's logits to the host, as the CPU engine's verification reads them), keyed by k; with a draft
    ModelRunner, also its one-token forward ("draft")."""
    runners = {str(k): (core.runner, k) for k in KS} | ({"draft": (draft, 0)} if draft is not None else {})
    prompt = synthetic_prompt(context + 1 + max(KS))
    items = {}
    for label, (runner, k) in runners.items():
        table = list(
            range(-(-len(prompt) // runner.block_size))
        )  # [blocks] the pool's first: nothing else runs
        if label in ("0", "draft"):
            runner.run([RunItem(table, prompt[:context], 0)])
        items[label] = (runner, RunItem(table, prompt[context : context + 1 + k], context, num_logits=1 + k))

    def forward(runner: Any, item: RunItem) -> tuple[float, float]:  # noqa: ANN401
        w, c = clocks()
        runner.run([item])
        w2, c2 = clocks()
        return w2 - w, c2 - c

    # round-robin, so a busy spell of the machine hits every shape alike; the warm-up compiles each shape
    runs = alternate({label: partial(forward, *it) for label, it in items.items()}, reps, warmup=1)
    wall, cpu = medians(runs, key=lambda t: t[0]), medians(runs, key=lambda t: t[1])
    return {label: {"wall_ms": wall[label] * 1e3, "cpu_ms": cpu[label] * 1e3} for label in items}


def chain_tokens(chance: float, k: int) -> float:
    """Expected tokens of a verify step with k drafts each accepted with `chance` after the ones before:
    the accepted run plus the target's own token."""
    return float(k + 1) if chance >= 1.0 else (1 - chance ** (k + 1)) / (1 - chance)


def needed_acceptance(verify: float, draft: float, k: int, speedup: float = 1.0) -> float:
    """The per-draft acceptance at which k drafts give `speedup` over plain decoding, when verifying them
    costs `verify` one-token forwards and proposing each costs `draft` (a draft model's forward, relative)."""
    cost = verify + k * draft
    if chain_tokens(1.0, k) < speedup * cost:
        return float("nan")  # not even every draft accepted pays
    lo, hi = 0.0, 1.0
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if chain_tokens(mid, k) < speedup * cost else (lo, mid)
    return hi


def print_needed_acceptance(curve: dict[str, dict[str, float]], measured_draft: float | None) -> dict:
    """For k = 1, 2, 4, 8: the acceptance a draft model costing r of the target's forward needs to break
    even (and to give 1.5x), from the verify curve; r = the measured draft and a few smaller ones."""
    base = curve["0"]["cpu_ms"]
    rs = ([measured_draft] if measured_draft is not None else []) + [0.02, 0.05, 0.1, 0.2]
    table = {}
    print("acceptance a draft model needs (break-even / 1.5x), k drafts, draft forward = r x the target's:")
    for r in rs:
        row = {}
        for k in (1, 2, 4, 8):
            verify = curve[str(k)]["cpu_ms"] / base
            row[k] = (needed_acceptance(verify, r, k), needed_acceptance(verify, r, k, 1.5))
        table[f"{r:.3f}"] = row
        cells = "  ".join(f"k={k}: {a:.2f} / {b:.2f}" for k, (a, b) in row.items())
        print(f"  r={r:.3f}{' (measured)' if r is measured_draft else ''}  {cells}", flush=True)
    return table


PHASES = ("proposer", "scheduler", "forward", "verify+bookkeeping")


class StepClock:
    """CPU seconds of each phase of an engine's steps: EngineCore._run (forward), EngineCore._postprocess
    (sampling, verification, bookkeeping), Scheduler.schedule and the speculator's propose."""

    def __init__(self, core: EngineCoreProc) -> None:
        self.spent: dict[str, float] = defaultdict(float)
        eng = core.engine_core
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

    def wrap_proposer(self, speculator: Speculator | None) -> None:
        if speculator is not None:
            self._wrap(speculator, "propose", "proposer")


Workload = list[tuple[list[int], SamplingParams]]


def decode_cost(core: EngineCoreProc, clock: StepClock, work: Workload, together: bool) -> dict:
    """Decode the work's requests one after another (together=False: batch 1) or all at once: CPU and wall
    seconds of the steps after the first token (prompt steps excluded), tokens, steps, CPU seconds per phase
    and the speculator's counters."""
    eng = core.engine_core
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
            n = sum(len(o.new_token_ids) for o in outs)
            started = started or n > 0
            if started:
                tot["cpu"] += c2 - c
                tot["wall"] += w2 - w
                tot["tokens"] += n
                tot["steps"] += 1
                for label in PHASES:
                    tot[label] += clock.spent[label]
    after = eng.stats()
    for name in ("draft_tokens", "accepted_tokens", "verify_steps", "pauses"):
        key = f"spec_{name}_total"
        tot[name] = getattr(after, key) - getattr(before, key)
    return tot


def decode_costs(
    core: EngineCoreProc, work: Workload, together: bool, ks: list[int], rounds: int, draft: str | None = None
) -> dict:
    """Per engine (plain, n-gram with each k, and the draft model with each k, adaptive and fixed): medians
    over rounds (the engines' order rotates each round) of CPU ms per token, tokens per step, each phase's
    CPU ms per step, acceptance, tokens per verify step and pauses; cpu_ratio: plain's CPU per token over the
    engine's."""
    clock = StepClock(core)
    configs = {"plain": None} | {f"ngram_k{k}": SpeculativeConfig("ngram", num_tokens=k) for k in ks}
    for k in ks if draft else []:
        configs[f"draft_k{k}"] = SpeculativeConfig("draft", num_tokens=k, model=draft)
        configs[f"draft_fixed_k{k}"] = SpeculativeConfig("draft", num_tokens=k, model=draft, adaptive=False)
    engines = {name: build_speculator(cfg, core) for name, cfg in configs.items()}
    for speculator in engines.values():
        clock.wrap_proposer(speculator)

    def run(name: str) -> dict:
        core.engine_core.speculator = engines[name]
        return decode_cost(core, clock, work, together)

    runs = alternate({name: partial(run, name) for name in engines}, rounds, order="rotate")
    core.engine_core.speculator = None
    figures = {  # name: the figure of one round's totals t
        "cpu_ms_per_token": lambda t: t["cpu"] * 1e3 / t["tokens"],
        "wall_ms_per_token": lambda t: t["wall"] * 1e3 / t["tokens"],
        "tokens_per_step": lambda t: t["tokens"] / t["steps"],
    } | {f"{p}_ms_per_step": (lambda t, p=p: t[p] * 1e3 / t["steps"]) for p in PHASES}
    spec_figures = {
        "acceptance": lambda t: t["accepted_tokens"] / max(1, t["draft_tokens"]),
        "tokens_per_verify": lambda t: (t["accepted_tokens"] + t["verify_steps"]) / max(1, t["verify_steps"]),
        "pauses": lambda t: t["pauses"],
    }
    res: dict[str, dict] = {name: {} for name in runs}
    for fig, f in figures.items():
        for name, v in medians(runs, key=f).items():
            res[name][fig] = v
    for name, rs in runs.items():
        res[name]["cpu_ms_per_token_rounds"] = [round(figures["cpu_ms_per_token"](t), 3) for t in rs]
    speculating = {name: rs for name, rs in runs.items() if name != "plain"}
    for fig, f in spec_figures.items():
        for name, v in medians(speculating, key=f).items():
            res[name][fig] = v
    for v in res.values():
        v["cpu_ratio"] = res["plain"]["cpu_ms_per_token"] / v["cpu_ms_per_token"]
    return res


def workloads(path: str, max_tokens: int, parts: set[str]) -> dict[str, tuple[Workload, bool]]:
    """bench_speculative.py's prompts (edgellm/testing/spec_prompts.py): copy-heavy greedy at batch 1,
    free-form sampled at temperature 1 (seeded) at batch 1, and 16 of the mixed set greedy in flight
    together."""
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
    ap.add_argument(
        "--draft", default=None, help="a draft model (.gguf, same vocabulary) to cost and run too"
    )
    ap.add_argument("--skip", default="", help="comma list of parts to skip: curve,copy,sampled,flight16")
    a = ap.parse_args()
    skip = set(filter(None, a.skip.split(",")))
    path = str(resolve_model(a.model))
    spec = EngineConfig(path, n_ctx=2048, threads=a.threads, kv_cache_memory=256 << 20)
    plain = EngineCoreProc(spec)
    report: dict = {"model": Path(path).name, "threads": plain.threads}
    draft_runner = None
    if a.draft:
        from edgellm.engine.spec.draft import DraftProposer

        draft_runner = DraftProposer.load(a.draft, plain).runner
    if "curve" not in skip:
        curve = verify_curve(plain, a.context, a.reps, draft_runner)
        report["verify_curve"] = curve
        base = curve["0"]["cpu_ms"]
        print(f"forward passes at batch 1 after {a.context} tokens (median of {a.reps}):")
        for label, c in curve.items():
            name = "draft 1 token" if label == "draft" else f"1+{label:<2s} tokens"
            print(
                f"  {name:14s} {c['wall_ms']:7.2f} ms wall  {c['cpu_ms']:7.2f} ms CPU  "
                f"{c['cpu_ms'] / base:5.2f}x the target's 1-token CPU",
                flush=True,
            )
        r = curve["draft"]["cpu_ms"] / base if "draft" in curve else None
        report["needed_acceptance"] = print_needed_acceptance(curve, r)
    ks = [int(k) for k in a.ks.split(",")]
    for part, (work, together) in workloads(path, a.tokens, {"copy", "sampled", "flight16"} - skip).items():
        report[part] = costs = decode_costs(plain, work, together, ks, a.rounds, a.draft)
        print(f"{part}: CPU per token, plain vs n-gram speculation (medians of {a.rounds} rounds):")
        for name, c in costs.items():
            print(f"  {name:9s} " + "  ".join(f"{k} {_fmt(v)}" for k, v in c.items()), flush=True)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
