"""What a speculative step costs, in-process on the engine core: the verify-cost curve (one forward pass of
1 + k query tokens at batch 1, k = 0, 1, 2, 4, 8, 12, 16, after a prompt of --context tokens) and where a
speculative decode step's time goes (proposer, scheduler, forward, verification/bookkeeping) against a plain
one, on a copy-heavy prompt. CPU seconds (time.process_time: every thread of the process) are printed beside
wall seconds: on a shared machine they depend far less on what else runs.

    python scripts/spec_costs.py smollm2-135m [--threads 2] [--reps 15] [--context 256]
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
from edgellm.engine.spec.config import SpeculativeConfig  # noqa: E402
from edgellm.sampling import SamplingParams  # noqa: E402

KS = (0, 1, 2, 4, 8, 12, 16)
# A prompt whose answer copies most of it (the engine sees token ids; this is only text to tokenize).
COPY_TEXT = (
    "def compute_total(items, tax_rate, discount=None):\n    subtotal = 0\n    for item in items:\n"
    '        if item.quantity <= 0:\n            raise ValueError(f"bad quantity for {item.name}")\n'
    "        subtotal += item.price * item.quantity\n    if discount is not None:\n"
    "        subtotal -= subtotal * discount\n    tax = subtotal * tax_rate\n"
    "    return round(subtotal + tax, 2)\n"
)


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


PHASES = {  # LLMEngine method -> the phase of a step it is
    "_run": "forward",
    "_postprocess": "verify+bookkeeping",
}


def step_profile(core: EngineCore, prompt: list[int], tokens: int) -> dict[str, float]:
    """Per decode step of one greedy request: median wall and CPU ms of the whole step and the CPU ms of
    each phase (proposer, scheduler, forward, post-processing), plus tokens per step."""
    eng = core.engine
    spent: dict[str, float] = defaultdict(float)

    def timed(obj, name: str, label: str):  # noqa: ANN001, ANN202
        f = getattr(obj, name)

        def wrapper(*a, **k):  # noqa: ANN002, ANN003, ANN202
            c = time.process_time()
            r = f(*a, **k)
            spent[label] += time.process_time() - c
            return r

        setattr(obj, name, wrapper)

    for name, label in PHASES.items():
        timed(eng, name, label)
    timed(eng.scheduler, "schedule", "scheduler")
    if eng.speculator is not None:
        timed(eng.speculator, "propose", "proposer")
    eng.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True))
    eng.step()  # the prompt
    per_step: dict[str, list[float]] = defaultdict(list)
    n_out = 0
    while eng.has_unfinished():
        spent.clear()
        w, c = clocks()
        outs = eng.step()
        w2, c2 = clocks()
        per_step["wall"].append(w2 - w)
        per_step["cpu"].append(c2 - c)
        for label in ("proposer", "scheduler", "forward", "verify+bookkeeping"):
            per_step[label].append(spent[label])
        n_out += sum(len(d.token_ids) for o in outs for d in o.deltas)
    steps = len(per_step["wall"])
    res = {f"{k}_ms": statistics.median(v) * 1e3 for k, v in per_step.items()}
    res.update(
        steps=steps,
        tokens_per_step=n_out / steps,
        cpu_ms_per_token=sum(per_step["cpu"]) * 1e3 / max(n_out, 1),
        wall_ms_per_token=sum(per_step["wall"]) * 1e3 / max(n_out, 1),
    )
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--k", type=int, default=None, help="speculative num_tokens for the step profile")
    ap.add_argument("--skip", default="", help="comma list of parts to skip: curve,steps")
    a = ap.parse_args()
    skip = set(filter(None, a.skip.split(",")))
    path = str(resolve_model(a.model))
    spec = CoreSpec(path, n_ctx=2048, threads=a.threads, kv_cache_memory=64 << 20)
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
    if "steps" not in skip:
        prompt = plain_prompt(plain)
        kw = {} if a.k is None else {"num_tokens": a.k}
        specd = EngineCore(
            CoreSpec(
                path,
                n_ctx=2048,
                threads=a.threads,
                kv_cache_memory=64 << 20,
                speculative=SpeculativeConfig("ngram", **kw),
            )
        )
        for name, c in (("plain", plain), ("ngram", specd)):
            report[f"steps_{name}"] = r = step_profile(c, prompt, a.tokens)
            print(f"{name} step: " + json.dumps({k: round(v, 3) for k, v in r.items()}), flush=True)
    print(json.dumps(report))


def plain_prompt(core: EngineCore) -> list[int]:
    """The copy prompt twice over (the second copy is what the n-gram proposer can follow)."""
    from edgellm.gguf.reader import load_gguf
    from edgellm.tokenizer import Tokenizer

    tok = Tokenizer.from_metadata(load_gguf(core.path).metadata)
    ids = tok.encode(COPY_TEXT)
    return ids + ids[: len(ids) // 4]


if __name__ == "__main__":
    main()
