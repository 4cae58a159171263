"""Speculative decoding against plain decoding on one model: batch-1 greedy decode tok/s on copy-heavy and
free-form chat prompts (with a token-identity check), free-form prompts sampled at temperature 1 (seeded:
acceptance is low, so adaptive k's pause must keep speculation from costing), 16 requests in flight on a mixed
set, and a draft model. Every figure alternates the two engines (spec first on odd rounds) and reports medians
of tok/s, their ratio, and the median of the per-prompt ratios.

    python scripts/bench/bench_speculative.py smollm2-135m --rounds 3 [--draft /tmp/drafts/smol-l8.gguf]

What a step costs (the verify-cost curve, the acceptance a draft model needs): scripts/profile/spec_costs.py.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from functools import partial

from edgellm import LLM, SamplingParams
from edgellm.testing.ab import alternate, medians, round_order
from edgellm.testing.spec_prompts import COPY, FREE, chat_ids


def decode_rate(out) -> float:
    t = out.metrics.token_times
    return (len(t) - 1) / (t[-1] - t[0]) if len(t) > 1 and t[-1] > t[0] else float("nan")


def batch1(
    base: LLM, spec: LLM, prompts: list[str], rounds: int, max_tokens: int, temperature: float = 0.0
) -> dict:
    """Decode tok/s of each prompt alone. Greedy: the two outputs must be the same tokens. Sampled: each
    (round, prompt) has its own seed, the same for both engines (their texts still differ: speculation draws
    its random numbers differently)."""
    rates: dict[str, list[float]] = {"base": [], "spec": []}
    spans: dict[str, list[list[tuple[int, float]]]] = {"base": [], "spec": []}  # per round: (tokens, seconds)
    per_prompt: dict[int, list[float]] = {i: [] for i in range(len(prompts))}  # spec / base, per round
    identical = True
    n_tokens = []
    for r in range(rounds):
        spans["base"].append([])
        spans["spec"].append([])
        for i, text in enumerate(prompts):
            ids = chat_ids(base, text)
            params = SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=1000 * r + i)
            engines = {"base": base, "spec": spec}
            toks, rate = {}, {}
            for name, llm in ((name, engines[name]) for name in round_order(engines, r, "reverse")):
                [out] = llm.generate([ids], params)
                rate[name] = decode_rate(out)
                rates[name].append(rate[name])
                t = out.metrics.token_times
                spans[name][r].append((len(t) - 1, t[-1] - t[0]))
                toks[name] = out.token_ids
            per_prompt[i].append(rate["spec"] / rate["base"])
            identical &= toks["base"] == toks["spec"]
            n_tokens.append(len(toks["spec"]))
    b, s = statistics.median(rates["base"]), statistics.median(rates["spec"])
    res = {"base_tok_s": b, "spec_tok_s": s, "ratio": s / b}
    res["aggregate_ratio"] = statistics.median(  # per round: the set's decoded tokens over its decode time
        (sum(n for n, _ in spans["spec"][r]) / sum(t for _, t in spans["spec"][r]))
        / (sum(n for n, _ in spans["base"][r]) / sum(t for _, t in spans["base"][r]))
        for r in range(rounds)
    )
    res["prompt_ratios"] = [round(statistics.median(v), 3) for v in per_prompt.values()]
    res["median_prompt_ratio"] = statistics.median(x for v in per_prompt.values() for x in v)
    if temperature == 0.0:
        res["identical"] = identical
    res["tokens"] = n_tokens
    res["rates_base"] = [round(x, 1) for x in rates["base"]]
    res["rates_spec"] = [round(x, 1) for x in rates["spec"]]
    return res


def in_flight(base: LLM, spec: LLM, rounds: int, max_tokens: int, n: int = 16) -> dict:
    greedy = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    prompts = [chat_ids(base, (COPY + FREE)[i % 6]) for i in range(n)]

    def rate(llm: LLM) -> float:
        t = time.perf_counter()
        outs = llm.generate(prompts, greedy)
        return sum(len(o.token_ids) for o in outs) / (time.perf_counter() - t)

    rates = alternate({"base": partial(rate, base), "spec": partial(rate, spec)}, rounds, order="reverse")
    b, s = medians(rates).values()
    return {"base_tok_s": b, "spec_tok_s": s, "ratio": s / b}


def spec_stats(llm: LLM, before) -> dict:
    after = llm.stats()
    drafts = after.spec_draft_tokens_total - before.spec_draft_tokens_total
    acc = after.spec_accepted_tokens_total - before.spec_accepted_tokens_total
    steps = after.spec_verify_steps_total - before.spec_verify_steps_total
    return {
        "acceptance": acc / drafts if drafts else 0.0,
        "tokens_per_verify": (acc + steps) / steps if steps else 0.0,
        "drafts": drafts,
        "pauses": after.spec_pauses_total - before.spec_pauses_total,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--k", type=int, default=None, help="--num-speculative-tokens")
    ap.add_argument("--draft", default=None, help="also benchmark this draft model (same vocabulary)")
    ap.add_argument(
        "--draft-fixed-k", action="store_true", help="the draft model proposes k every step (no adaptive k)"
    )
    ap.add_argument("--skip", default="", help="comma list of parts to skip: copy,free,sampled,flight")
    a = ap.parse_args()
    skip = set(filter(None, a.skip.split(",")))
    kw = {"n_ctx": 2048, "kv_cache_memory": 128 << 20}
    base = LLM(a.model, **kw)
    spec = LLM(a.model, speculative="ngram", num_speculative_tokens=a.k, **kw)
    report = {"model": base.path.name, "threads": base.threads, "k": spec.speculative.num_tokens}
    for part, prompts, temp in (("copy", COPY, 0.0), ("free", FREE, 0.0), ("sampled", FREE, 1.0)):
        if part in skip:
            continue
        before = spec.stats()
        report[part] = batch1(base, spec, prompts, a.rounds, a.max_tokens, temp)
        report[part].update(spec_stats(spec, before))
        print(part, json.dumps(report[part]), flush=True)
    if "flight" not in skip:
        before = spec.stats()
        report["in_flight_16"] = in_flight(base, spec, a.rounds, a.max_tokens)
        report["in_flight_16"].update(spec_stats(spec, before))
        print("in_flight_16", json.dumps(report["in_flight_16"]), flush=True)
    spec.shutdown()
    if a.draft:
        draft_spec = {"method": "draft", "model": a.draft, "adaptive": not a.draft_fixed_k}
        draft = LLM(a.model, speculative=draft_spec, num_speculative_tokens=a.k, **kw)
        for part, prompts in (("draft_copy", COPY), ("draft_free", FREE)):
            before = draft.stats()
            report[part] = batch1(base, draft, prompts, a.rounds, a.max_tokens)
            report[part].update(spec_stats(draft, before))
            print(part, json.dumps(report[part]), flush=True)
        draft.shutdown()
    base.shutdown()
    print(json.dumps(report))


if __name__ == "__main__":
    main()
