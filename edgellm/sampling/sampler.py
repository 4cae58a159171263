"""Sampling parameters and the per-request sampler over one logits row (numpy, and
edgellm/sampling/nucleus.py's kernels for top-p / min-p / plain temperature: a few tens of microseconds, far
below a decode step)."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

# The one set of bounds for the sampling knobs, as (low, high, low excluded): SamplingParams checks them,
# and the server's request parser (server/protocol.py) reads them from here for its OpenAI-style errors.
PARAM_BOUNDS: dict[str, tuple[float, float, bool]] = {
    "temperature": (0.0, 2.0, False),
    "top_p": (0.0, 1.0, True),
    "min_p": (0.0, 1.0, False),
    "repetition_penalty": (0.0, 10.0, True),
    "presence_penalty": (-2.0, 2.0, False),
    "frequency_penalty": (-2.0, 2.0, False),
}
# The largest seed a request (server/protocol.py) or `serve --seed` may give: OpenAI's seed is an int64;
# numpy seeds its generators with any non-negative int.
MAX_SEED = 2**63 - 1


def out_of_bounds(name: str, value: float) -> str | None:
    """Why `value` is not allowed for the knob `name` ("in (0.0, 1.0]"), or None when it is."""
    lo, hi, lo_open = PARAM_BOUNDS[name]
    if value > hi or value < lo or (lo_open and value == lo) or value != value:  # NaN fails too
        return f"in {'(' if lo_open else '['}{lo}, {hi}]"
    return None


@dataclass
class SamplingParams:
    max_tokens: int = 256  # generated tokens at most (the context window caps it too)
    temperature: float = 1.0  # 0 = greedy (argmax)
    top_p: float = 1.0  # nucleus: keep the smallest set of tokens whose probability reaches top_p
    top_k: int = 0  # keep the k most likely tokens; 0 = off
    min_p: float = 0.0  # drop tokens below min_p * p(most likely)
    repetition_penalty: float = 1.0  # >1 discourages tokens already in the prompt or output (CTRL/vLLM form)
    presence_penalty: float = 0.0  # OpenAI: subtract once for every token already generated
    frequency_penalty: float = 0.0  # OpenAI: subtract per occurrence in the output
    logit_bias: dict[int, float] | None = None  # token id -> bias added to its logit
    seed: int | None = None  # the same seed gives the same text
    stop: list[str] = field(default_factory=list)  # stop strings (not included in the output)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    # End-of-generation and stop ids cannot be drawn before this many tokens (vLLM's min_tokens)
    min_tokens: int = 0
    n: int = 1  # completions per prompt
    logprobs: int | None = None  # return the chosen token's logprob and this many top alternatives
    # Constrained decoding (at most one; see edgellm.grammar.compile): a JSON Schema (dict or JSON text; True:
    # any JSON object), a Lark or GBNF grammar, or a regular expression the whole output must match.
    json_schema: dict[str, Any] | str | bool | None = None
    grammar: str | None = None
    regex: str | None = None
    # The llguidance grammar compiled from those by __post_init__, in a compile worker process (it crosses
    # to the engine core with the params, so the core never compiles an unchecked grammar), and the key of
    # the vocabulary a worker built its matcher for (edgellm.grammar.compile.check_for_vocabulary).
    compiled_grammar: str | None = field(default=None, init=False, repr=False, compare=False)
    grammar_vocab_key: int | None = field(default=None, init=False, repr=False, compare=False)
    # The reasoning split (edgellm.chat.reasoning): how the front-end splits the text (None, "open", "tag",
    # "harmony"), and the budget of reasoning tokens the engine core closes the think block at (None:
    # unlimited), with the ids it forces then (REASONING_END) and the ids of an open and a close the model
    # writes itself. `set_reasoning` fills them in from the tokenizer.
    reasoning_split: str | None = None
    reasoning_budget: int | None = None
    reasoning_open_ids: list[int] = field(default_factory=list)  # "tag": THINK_OPEN's ids
    reasoning_end_ids: list[int] = field(default_factory=list)
    reasoning_close_ids: list[int] = field(default_factory=list)
    # Rolling window (engine/context_shift.py): a completion that fills the context shifts out its oldest
    # tokens after this many leading ones (the system prompt's) and goes on, to max_tokens. None: the
    # context ends it ("length").
    context_shift_keep: int | None = None
    # LoRA adapters for this request: {adapter id: scale} (llama-server's "lora" list, which this also
    # accepts); an adapter it does not name is at 0. None: the loaded adapters at their global scales.
    lora: dict[int, float] | None = None

    def __post_init__(self) -> None:
        if self.lora is not None:
            from edgellm.lora.choice import request_lora

            self.lora = request_lora(self.lora)
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        for name in PARAM_BOUNDS:
            why = out_of_bounds(name, getattr(self, name))
            if why is not None:
                raise ValueError(f"{name} must be {why}, got {getattr(self, name)}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(
                f"min_tokens must be in [0, max_tokens={self.max_tokens}], got {self.min_tokens}"
            )
        if self.reasoning_split not in (None, "open", "tag", "harmony"):
            raise ValueError(
                f"reasoning_split must be None, 'open', 'tag' or 'harmony', got {self.reasoning_split!r}"
            )
        if self.context_shift_keep is not None and self.context_shift_keep < 0:
            raise ValueError(f"context_shift_keep must be >= 0 or None, got {self.context_shift_keep}")
        if self.reasoning_budget is not None and self.reasoning_budget < 0:
            raise ValueError(f"reasoning_budget must be >= 0 or None, got {self.reasoning_budget}")
        if self.json_schema is not None or self.grammar is not None or self.regex is not None:
            from edgellm.grammar.compile import compile_grammar

            if self.ignore_eos:
                raise ValueError("ignore_eos cannot be combined with a grammar: a grammar ends with EOS")
            if self.min_tokens:
                raise ValueError("min_tokens cannot be combined with a grammar: it ends the output")
            self.compiled_grammar = compile_grammar(self.json_schema, self.grammar, self.regex)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


class TopCandidates(NamedTuple):
    """A logits row's best entries, best first: ids [k], and values [k] (None for greedy: not needed)."""

    ids: np.ndarray
    values: np.ndarray | None = None


MAX_DEVICE_TOP_K = 64  # the CUDA top-k kernel's limit (config.MAX_TOP_K)


def device_candidates(p: SamplingParams) -> int | None:
    """How many of a row's best logits Sampler.sample_top needs to draw exactly what sample() draws from
    the whole row: 1 for greedy, top_k for top-k sampling. None when the whole row is needed: penalties,
    biases or a grammar's mask change the logits, logprobs are asked for, or sampling is not limited to a
    few top tokens."""
    if p.logprobs is not None or p.logit_bias or p.repetition_penalty != 1.0 or p.compiled_grammar:
        return None
    if p.min_tokens:  # stop ids masked early: adjust() changes the row
        return None
    if p.presence_penalty or p.frequency_penalty:
        return None
    if p.greedy:
        return 1
    return p.top_k if 0 < p.top_k <= MAX_DEVICE_TOP_K else None


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    m = x.max()
    return x - m - np.log(np.exp(x - m).sum())


class Sampler:
    """Picks the next token of one sequence. Holds the request's random generator so a seed reproduces
    the same text whatever else runs in the batch."""

    def __init__(
        self, params: SamplingParams, rng_offset: int = 0, stop_ids: Collection[int] = ()
    ) -> None:
        self.params = params
        seed = None if params.seed is None else params.seed + rng_offset
        self.rng = np.random.default_rng(seed)
        # what min_tokens keeps from being drawn early: the request's stop and end-of-generation ids
        self.early_banned = np.array(sorted(stop_ids), dtype=np.int64) if params.min_tokens else None

    def adjust(self, logits: np.ndarray, prompt: list[int], output: list[int]) -> np.ndarray:
        """Penalties and biases applied to a copy of the raw logits."""
        p = self.params
        x = logits.astype(np.float32, copy=True)
        if p.repetition_penalty != 1.0 and (prompt or output):
            seen = np.unique(np.asarray(prompt + output, dtype=np.int64))
            vals = x[seen]
            x[seen] = np.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
        if (p.presence_penalty or p.frequency_penalty) and output:
            ids, counts = np.unique(np.asarray(output, dtype=np.int64), return_counts=True)
            x[ids] -= p.presence_penalty + p.frequency_penalty * counts
        if p.logit_bias:
            for tok, bias in p.logit_bias.items():
                if 0 <= tok < len(x):
                    x[tok] += bias
        if self.early_banned is not None and len(output) < p.min_tokens:
            banned = self.early_banned[self.early_banned < len(x)]
            x[banned] = -np.inf
        return x

    def sample(self, logits: np.ndarray, prompt: list[int], output: list[int]) -> int:
        p = self.params
        x = self.adjust(logits, prompt, output)
        if p.greedy:
            return int(np.argmax(x))
        if 0 < p.top_k < len(x):
            x = x.astype(np.float64) / p.temperature
            order = top_k_stable(x, p.top_k)
            return self._draw(x[order], order)
        # No sort of the vocabulary (it cost as much as a decode step): see edgellm/sampling/nucleus.py.
        # Imported here, in the engine core only: front-ends import this module for SamplingParams and load no
        # Numba.
        from edgellm.sampling import nucleus

        z, e = nucleus.scaled_row(x, p.temperature)
        r = self.rng.random()
        if p.top_p >= 1.0 and p.min_p <= 0.0:
            return int(nucleus.draw_from_row(e, r))
        return int(nucleus.draw_in_id_order(e, nucleus.kept_tokens(z, e, p.top_p, p.min_p), r))

    def sample_top(self, top: TopCandidates) -> int:
        """The token sample() would draw from the whole row, from the row's best entries only (computed
        where the logits are). Valid when device_candidates(params) is not None and `top` holds at least that
        many: adjust() is then the identity, and the entries are the first of sample()'s stable sort."""
        p = self.params
        if p.greedy:
            return int(top.ids[0])
        k = p.top_k
        return self._draw(top.values[:k].astype(np.float64) / p.temperature, top.ids[:k])

    def _draw(self, xs: np.ndarray, order: np.ndarray, total: float | None = None) -> int:
        """xs: the candidates' scaled logits in order (best first); total: sum of exp(x - xs[0]) over the
        whole row when the candidates are only its best-first prefix (None: they are all there is)."""
        ids, probs = self._truncate(xs, order, total)
        return int(ids[self.rng.choice(len(ids), p=probs)])

    def _truncate(
        self, xs: np.ndarray, order: np.ndarray, total: float | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """The top-p / min-p cut of best-first candidates (see _draw): (kept ids, their probabilities)."""
        p = self.params
        probs = np.exp(xs - xs[0])
        probs /= probs.sum() if total is None else total
        keep = len(order)
        if p.top_p < 1.0:
            # smallest prefix whose cumulative probability reaches top_p (at least one token)
            keep = min(keep, int(np.searchsorted(np.cumsum(probs), p.top_p)) + 1)
        if p.min_p > 0.0:
            keep = min(keep, max(1, int(np.count_nonzero(probs >= p.min_p * probs[0]))))
        return order[:keep], probs[:keep] / probs[:keep].sum()

    def distribution(
        self, row: np.ndarray | TopCandidates, prompt: list[int], output: list[int]
    ) -> tuple[np.ndarray, np.ndarray]:
        """The distribution sample() / sample_top() draw the next token from, as (ids [m], probs [m]) over
        the tokens it can pick (m = n_vocab for plain temperature sampling). Speculative decoding's
        rejection sampling reads it; a one-hot (the argmax) for greedy."""
        p = self.params
        if isinstance(row, TopCandidates):
            if p.greedy:
                return row.ids[:1].astype(np.int64), np.ones(1)
            k = p.top_k
            return self._truncate(row.values[:k].astype(np.float64) / p.temperature, row.ids[:k])
        x = self.adjust(row, prompt, output)
        if p.greedy:
            return np.array([int(np.argmax(x))]), np.ones(1)
        if 0 < p.top_k < len(x):
            x = x.astype(np.float64) / p.temperature
            order = top_k_stable(x, p.top_k)
            return self._truncate(x[order], order)
        from edgellm.sampling import nucleus

        z, e = nucleus.scaled_row(x, p.temperature)
        if p.top_p >= 1.0 and p.min_p <= 0.0:
            ids = np.arange(len(x))
        else:
            ids = nucleus.kept_tokens(z, e, p.top_p, p.min_p)
        w = e[ids].astype(np.float64)
        return ids, w / w.sum()

    def draw(self, ids: np.ndarray, probs: np.ndarray) -> int:
        """One token from a distribution (ids, probs), with this request's generator."""
        cdf = np.cumsum(probs)
        return int(ids[min(np.searchsorted(cdf, self.rng.random() * cdf[-1], side="right"), len(ids) - 1)])


def top_k_stable(x: np.ndarray, k: int) -> np.ndarray:
    """np.argsort(-x, kind="stable")[:k] (larger first, equal values by lower id, NaN last) without
    sorting the whole row: the k-th largest value bounds the candidates, and only they are sorted."""
    n = len(x)
    if k >= n:
        return np.argsort(-x, kind="stable")
    thr = np.partition(x, n - k)[n - k]
    cand = np.flatnonzero(x >= thr)  # in id order, so the stable sort keeps ties by lower id
    if len(cand) < k:  # NaN among the k best: argsort's own order
        return np.argsort(-x, kind="stable")[:k]
    return cand[np.argsort(-x[cand], kind="stable")[:k]]


def top_logprobs(logits: np.ndarray, chosen: int, k: int) -> tuple[float, list[tuple[int, float]]]:
    """The chosen token's logprob under the raw logits, and the k most likely tokens with theirs."""
    lp = log_softmax(logits)
    top = top_k_stable(lp, k) if k > 0 else []
    return float(lp[chosen]), [(int(i), float(lp[i])) for i in top]
