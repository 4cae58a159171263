"""Verification of draft tokens against the target model's rows: the longest accepted prefix plus one token.

Drafts are deterministic (n-gram lookup, or the draft model's argmax), i.e. a one-hot draft distribution q.
Rejection sampling with such a q accepts draft d with probability p(d) and otherwise draws from the residual
max(0, p - q) / Z = p with d removed, renormalised; when all drafts pass, one more token is drawn from the
last row. The emitted tokens are then distributed exactly as sampling from p one token at a time. Greedy is
the special case p = one-hot(argmax): a draft passes iff it is the argmax, and every emitted token is the one
non-speculative decoding would pick from the same (batch-invariant, so bit-identical) row.

p is the sampler's final distribution for each position: penalties, biases, temperature, top-k/p, min-p, with
the output history extended by the drafts before it (Sampler.distribution). Any per-sequence change made to
a row before sampling (a logits mask) must be applied to every row here as it is for the single row.
"""

from __future__ import annotations

import numpy as np

from edgellm.sampling.sampler import Sampler, TopCandidates

Row = np.ndarray | TopCandidates  # one position's logits [n_vocab], or its best entries (device sampling)


def sample_row(sampler: Sampler, row: Row, prompt: list[int], output: list[int]) -> int:
    """The token non-speculative decoding samples from `row` (the one sampling path both share)."""
    if isinstance(row, TopCandidates):
        return sampler.sample_top(row)
    return sampler.sample(row, prompt, output)


def verify_drafts(
    sampler: Sampler, rows: list[Row], drafts: list[int], prompt: list[int], output: list[int]
) -> list[int]:
    """rows[i] scores the position after output + drafts[:i] (len(rows) == len(drafts) + 1). Returns the
    accepted drafts followed by one token drawn by the target (a correction, or the bonus after them all)."""
    if len(rows) != len(drafts) + 1:
        raise ValueError(f"{len(drafts)} drafts need {len(drafts) + 1} rows, got {len(rows)}")
    out: list[int] = []
    greedy = sampler.params.greedy
    for row, d in zip(rows, drafts, strict=False):
        if greedy:
            tok = sample_row(sampler, row, prompt, output + out)
            out.append(tok)
            if tok != d:
                return out
            continue
        ids, probs = sampler.distribution(row, prompt, output + out)
        hit = ids == d
        if sampler.rng.random() < probs[hit].sum():
            out.append(d)
            continue
        out.append(sampler.draw(ids, np.where(hit, 0.0, probs)))  # the residual p - one_hot(d), renormalised
        return out
    out.append(sample_row(sampler, rows[-1], prompt, output + out))
    return out
