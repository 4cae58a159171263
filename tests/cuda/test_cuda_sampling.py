"""Sampling where the logits live (the CUDA backend's argmax / top_k), checked without a GPU: the host
sampler's draw from a row's k best entries equals its draw from the whole row, and the engine asks the
backend for ids only when that holds, with the same tokens as the whole-row path.

The engine tests run the CPU backend behind a proxy that claims `samples_on_device` (the base class's
host argmax / top_k, which the CUDA kernels are checked against in test_cuda_engine.py) and logs what each
step brought back to the engine.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from edgellm import SamplingParams
from edgellm.backends import get_backend
from edgellm.engine.config import EngineConfig
from edgellm.engine.core_process import EngineCoreProc
from edgellm.engine.protocol import EngineCoreOutput
from edgellm.sampling.sampler import MAX_DEVICE_TOP_K, Sampler, TopCandidates, device_candidates
from edgellm.testing.synthetic.models import write_tiny_model

CPU = get_backend("cpu")


def top_of(row: np.ndarray, p: SamplingParams) -> TopCandidates:
    """What the engine hands the sampler on the device path, from the backend's host reference."""
    if p.greedy:
        return TopCandidates(CPU.argmax(row[None])[:1])
    vals, ids = CPU.top_k(row[None], device_candidates(p))
    return TopCandidates(ids[0], vals[0])


PARAMS = [
    SamplingParams(temperature=0.0),
    SamplingParams(temperature=0.7, top_k=1, seed=1),
    SamplingParams(temperature=0.7, top_k=5, seed=2),
    SamplingParams(temperature=1.3, top_k=40, top_p=0.8, seed=3),
    SamplingParams(temperature=1.0, top_k=20, min_p=0.1, seed=4),
    SamplingParams(temperature=0.01, top_k=64, top_p=0.95, min_p=0.05, seed=5),
]


@pytest.mark.parametrize("p", PARAMS, ids=lambda p: f"t{p.temperature}-k{p.top_k}-p{p.top_p}-m{p.min_p}")
def test_sample_top_draws_what_sample_draws(p: SamplingParams) -> None:
    rng = np.random.default_rng(7)
    whole, top = Sampler(p), Sampler(p)  # same seed: same random stream
    for i in range(40):
        row = (rng.standard_normal(300) * 3).astype(np.float32)
        if i % 2:
            row = np.round(row, 1)  # many equal values: ties must resolve by lower id on both paths
        row[rng.integers(0, 300, 3)] = row.max()  # a tie at the top
        assert top.sample_top(top_of(row, p)) == whole.sample(row, [5, 6], [7])


def test_greedy_ties_and_nan_follow_numpy() -> None:
    row = np.array([1.0, 3.0, -np.inf, 3.0, 2.0], np.float32)
    assert CPU.argmax(row[None])[0] == 1
    row[4] = np.nan  # np.argmax returns the first NaN; np.argsort(-x) puts NaN last
    assert CPU.argmax(row[None])[0] == 4
    vals, ids = CPU.top_k(row[None], 3)
    assert ids[0].tolist() == [1, 3, 0] and vals[0].tolist() == [3.0, 3.0, 1.0]


@pytest.mark.parametrize(
    "p,k",
    [
        (SamplingParams(temperature=0.0, top_k=7), 1),
        (SamplingParams(temperature=0.8, top_k=7), 7),
        (SamplingParams(temperature=0.8, top_k=0), None),  # whole vocabulary
        (SamplingParams(temperature=0.8, top_k=MAX_DEVICE_TOP_K + 1), None),
        (SamplingParams(temperature=0.0, logprobs=2), None),
        (SamplingParams(temperature=0.0, repetition_penalty=1.1), None),
        (SamplingParams(temperature=0.0, presence_penalty=0.5), None),
        (SamplingParams(temperature=0.0, frequency_penalty=0.5), None),
        (SamplingParams(temperature=0.0, logit_bias={3: 1.0}), None),
        (SamplingParams(temperature=0.0, stop=["x"], seed=3, max_tokens=9), 1),
    ],
)
def test_device_candidates(p: SamplingParams, k: int | None) -> None:
    assert device_candidates(p) == k


class DeviceSampling:
    """The CPU backend as the engine sees a device backend; `log` records what each step returned."""

    samples_on_device = True

    def __init__(self, be: Any) -> None:
        self.be, self.log = be, []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.be, name)

    def to_host(self, x: Any) -> np.ndarray:
        out = self.be.to_host(x)
        self.log.append(("logits", out.shape[0]))
        return out

    def argmax(self, x: Any) -> np.ndarray:
        self.log.append(("argmax", x.shape[0]))
        return self.be.argmax(x)

    def top_k(self, x: Any, k: int) -> tuple[np.ndarray, np.ndarray]:
        self.log.append(("top_k", x.shape[0], k))
        return self.be.top_k(x, k)


@pytest.fixture(scope="module")
def llm(tmp_path_factory: pytest.TempPathFactory) -> EngineCoreProc:
    """An engine core built in this process, to drive its engine step by step."""
    path = write_tiny_model(tmp_path_factory.mktemp("tiny") / "llama.gguf", "llama")
    return EngineCoreProc(EngineConfig(str(path), n_ctx=128, kv_cache_memory=1 << 20))


def run_both(
    llm: EngineCoreProc, prompts: list[list[int]], params: list[SamplingParams]
) -> tuple[list, list, list]:
    """(outputs with whole rows on the host, outputs through the device-sampling proxy, the proxy's log)."""

    def run() -> list[list[EngineCoreOutput]]:
        eng = llm.engine_core
        rids = [eng.add_request(p, sp) for p, sp in zip(prompts, params, strict=True)]
        deltas: dict[str, list[EngineCoreOutput]] = {r: [] for r in rids}
        while eng.has_unfinished():
            for out in eng.step():
                deltas[out.request_id].append(out)
        return [deltas[r] for r in rids]

    runner = llm.engine_core.runner
    host = run()
    proxy = DeviceSampling(runner.be)
    runner.be = proxy
    try:
        dev = run()
    finally:
        runner.be = proxy.be
    return host, dev, proxy.log


def tokens(outs: list[list[EngineCoreOutput]], index: int = 0) -> list[list[int]]:
    return [[t for d in ds if d.index == index for t in d.new_token_ids] for ds in outs]


PROMPTS = [[1, 17, 42, 99], [5, 6, 7], [200, 3, 3, 3, 9, 11]]


def test_engine_greedy_asks_only_for_ids(llm: EngineCoreProc) -> None:
    params = [SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)] * 3
    host, dev, log = run_both(llm, PROMPTS, params)
    assert tokens(dev) == tokens(host) and all(len(t) == 6 for t in tokens(dev))
    assert log and {e[0] for e in log} == {"argmax"}


def test_engine_top_k_sampling_asks_only_for_k_best(llm: EngineCoreProc) -> None:
    params = [
        SamplingParams(temperature=0.9, top_k=8, top_p=0.9, seed=11, max_tokens=6, ignore_eos=True),
        SamplingParams(temperature=1.5, top_k=3, seed=12, max_tokens=6, ignore_eos=True),
        SamplingParams(temperature=0.5, top_k=20, min_p=0.2, seed=13, max_tokens=6, ignore_eos=True),
    ]
    host, dev, log = run_both(llm, PROMPTS, params)
    assert tokens(dev) == tokens(host)
    assert log and {e[0] for e in log} == {"top_k"} and {e[2] for e in log} == {20}  # the largest k


@pytest.mark.parametrize(
    "params",
    [
        [SamplingParams(temperature=0.0, logprobs=3, max_tokens=4, ignore_eos=True)],
        [
            SamplingParams(
                temperature=0.8, top_k=5, repetition_penalty=1.3, seed=1, max_tokens=4, ignore_eos=True
            )
        ],
        [  # greedy next to top-k sampling: one whole-row step for both (NaN orders differ)
            SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True),
            SamplingParams(temperature=0.8, top_k=5, seed=2, max_tokens=4, ignore_eos=True),
        ],
    ],
    ids=["logprobs", "penalty", "mixed"],
)
def test_engine_whole_row_requests_take_the_host_path(
    llm: EngineCoreProc, params: list[SamplingParams]
) -> None:
    host, dev, log = run_both(llm, PROMPTS[: len(params)], params)
    assert tokens(dev) == tokens(host)
    assert log and {e[0] for e in log} == {"logits"}
    if params[0].logprobs:
        lp = [d.logprobs for ds in dev for d in ds if d.new_token_ids]
        assert lp == [d.logprobs for ds in host for d in ds if d.new_token_ids] and all(lp)


def test_engine_parallel_sampling_forks_from_the_row_then_samples_on_device(llm: EngineCoreProc) -> None:
    params = [SamplingParams(temperature=0.9, top_k=10, n=3, seed=21, max_tokens=4, ignore_eos=True)]
    host, dev, log = run_both(llm, PROMPTS[:1], params)
    for i in range(3):
        assert tokens(dev, i) == tokens(host, i) and len(tokens(dev, i)[0]) == 4
    assert log[0] == ("logits", 1)  # the parent's first token: its row seeds the other completions
    assert {e[0] for e in log[1:]} == {"top_k"}


def test_score_still_returns_whole_rows(llm: EngineCoreProc) -> None:
    runner = llm.engine_core.runner
    runner.be = DeviceSampling(runner.be)
    try:
        rows = llm.score([1, 17, 42, 99])
    finally:
        runner.be = runner.be.be
    assert rows.shape == (4, llm.config.n_vocab) and np.isfinite(rows).all()
