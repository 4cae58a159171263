"""One engine core (its own process), many callers: LLM from several threads and from asyncio gets the
same tokens as alone, and a core that dies fails its requests loudly instead of leaving them waiting."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from edgellm import LLM, SamplingParams
from edgellm.engine.core_client import EngineDeadError
from edgellm.testing.engine_fakes import PROMPTS as ENGINE_PROMPTS
from edgellm.testing.engine_fakes import wait_idle
from edgellm.testing.limits import HANG_S
from edgellm.testing.paths import ROOT

PROMPTS = ENGINE_PROMPTS + ["Water boils at", "The first president of"]
GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)


@pytest.fixture(scope="module")
def llm() -> LLM:
    llm = LLM("smollm2-135m", n_ctx=256, max_num_seqs=8)
    yield llm
    llm.shutdown()


@pytest.fixture(scope="module")
def alone(llm: LLM) -> list[list[int]]:
    return [llm.generate([p], GREEDY)[0].token_ids for p in PROMPTS]


def test_two_threads_three_generate_calls_each_equal_single_threaded(llm: LLM, alone) -> None:
    results: dict[tuple[int, int], list[list[int]]] = {}
    errors: list[BaseException] = []

    def worker(t: int) -> None:
        try:
            for call in range(3):
                mine = PROMPTS[t * 4 + call : t * 4 + call + 2]  # two prompts per call, overlapping
                results[t, call] = [o.token_ids for o in llm.generate(mine, GREEDY)]
        except BaseException as e:  # noqa: BLE001 - reported by the assertion below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,), daemon=True) for t in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=HANG_S)
    assert not any(th.is_alive() for th in threads), "a generate call never returned"
    assert not errors, errors
    for (t, call), outs in results.items():
        assert outs == alone[t * 4 + call : t * 4 + call + 2]
    assert len(results) == 6


def test_asyncio_streams_and_executor_calls_get_generate_tokens(llm: LLM, alone) -> None:
    """An asyncio app: 8 concurrent streams, agenerate, and generate from executor threads (which hung on
    main) get the tokens generate gives alone, and the event loop keeps running meanwhile."""
    async def one(prompt: str) -> list[int]:
        ids: list[int] = []
        async for out in llm.stream(prompt, GREEDY):
            for d in out.deltas:
                ids.extend(d.token_ids)
        return ids

    async def main() -> tuple[list[list[int]], list[list[int]], int]:
        ticks = 0

        async def heartbeat() -> None:  # the event loop keeps running while the core works
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        hb = asyncio.ensure_future(heartbeat())
        loop = asyncio.get_running_loop()
        try:
            streamed = await asyncio.gather(*[one(p) for p in PROMPTS])
            gathered = await llm.agenerate(PROMPTS[:3], GREEDY)
            # the blocking API from executor threads (what desktop apps do) alongside a stream
            pooled = await asyncio.gather(
                *[loop.run_in_executor(None, llm.generate, [p], GREEDY) for p in PROMPTS[3:7]],
                one(PROMPTS[7]),
            )
        finally:
            hb.cancel()
        executor = [out[0].token_ids for out in pooled[:4]] + [pooled[4]]
        return streamed, [g.token_ids for g in gathered] + executor, ticks

    streamed, gathered, ticks = asyncio.run(main())
    assert streamed == alone
    assert gathered == alone[:3] + alone[3:8]
    assert ticks > 0


def test_stream_interval_batches_the_cores_messages_not_the_tokens(smollm2_path: Path) -> None:
    """With stream_interval the core sends a request's first and last outputs at once and the tokens in
    between in batches: far fewer messages for the front-end to wake for, the same tokens, and each
    token keeps the time its step ended (the speeds the UI shows stay right). The front-end hands its
    caller one output per message, the batch's tokens and text in one delta."""
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    got = {}
    for interval in (0.0, 1.0):
        with LLM(smollm2_path, n_ctx=256, stream_interval=interval) as llm:
            before, t0 = llm.core.step_messages, time.monotonic()
            outputs: list = []
            [out] = llm.generate(["Once upon a time"], params, on_output=outputs.append)
            messages, elapsed = llm.core.step_messages - before, time.monotonic() - t0
            times = out.metrics.token_times
            got[interval] = out.token_ids
            assert len(times) == 48 and all(a < b for a, b in zip(times, times[1:], strict=False))
            deltas = [d for o in outputs for d in o.deltas]
            assert [t for d in deltas for t in d.token_ids] == out.token_ids
            assert "".join(d.text for d in deltas) == out.text
        if interval == 0:
            assert messages >= 48 and len(outputs) >= 48  # one per step
        else:  # the first token, the last, and one batch per elapsed second at most
            assert messages <= 3 + elapsed
            assert len(outputs) <= messages
    assert got[0.0] == got[1.0]
    with pytest.raises(ValueError, match="stream_interval"):
        LLM(smollm2_path, stream_interval=-1)


def test_stop_string_with_n2_stops_each_completion_and_frees_the_request(llm: LLM) -> None:
    [full] = llm.generate(["1, 2, 3,"], SamplingParams(temperature=0, max_tokens=20))
    assert ", 6" in full.text
    params = SamplingParams(temperature=0, max_tokens=20, stop=[", 6"], n=2)
    [out] = llm.generate(["1, 2, 3,"], params)
    want = full.text[: full.text.index(", 6")]
    assert [c.text for c in out.outputs] == [want, want]
    assert [c.finish_reason for c in out.outputs] == ["stop", "stop"]
    wait_idle(llm)


def test_core_load_error_reaches_the_caller(smollm2_path: Path) -> None:
    with pytest.raises(ValueError, match="no-such-backend"):
        LLM(smollm2_path, n_ctx=128, backend="no-such-backend")


def test_script_without_main_guard_can_use_llm(tmp_path: Path, smollm2_path: Path) -> None:
    """The core process must not re-run the caller's __main__ (spawn would, and start a core per core)."""
    script = tmp_path / "unguarded.py"
    script.write_text(
        "from edgellm import LLM, SamplingParams\n"
        f"llm = LLM({str(smollm2_path)!r}, n_ctx=128)\n"
        "out = llm.generate('1, 2, 3,', SamplingParams(temperature=0, max_tokens=4))[0]\n"
        "print('OUT', len(out.token_ids))\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=HANG_S, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "OUT 4" in r.stdout


def test_killed_core_fails_in_flight_requests_and_restarts(smollm2_path: Path) -> None:
    llm = LLM(smollm2_path, n_ctx=256)
    deaths: list[str] = []
    llm.on_core_death = deaths.append
    long = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
    errors: list[BaseException] = []

    def call() -> None:
        try:
            llm.generate(PROMPTS[:2], long)
        except BaseException as e:  # noqa: BLE001 - checked below
            errors.append(e)

    th = threading.Thread(target=call, daemon=True)
    th.start()
    deadline = time.monotonic() + HANG_S
    while llm.stats().generated_tokens_total < 4:  # under load: tokens are being generated
        assert time.monotonic() < deadline
        time.sleep(0.01)
    os.kill(llm.core.pid, signal.SIGKILL)
    th.join(timeout=HANG_S)
    assert not th.is_alive(), "the in-flight generate call was left waiting on a dead core"
    assert len(errors) == 1 and isinstance(errors[0], EngineDeadError)
    assert "SIGKILL" in str(errors[0])
    assert not llm.healthy and "SIGKILL" in (llm.error or "")
    assert deaths and "SIGKILL" in deaths[0]
    with pytest.raises(EngineDeadError):  # a new request fails at once rather than waiting
        llm.generate(PROMPTS[0], GREEDY)
    llm.restart()
    assert llm.healthy
    assert len(llm.generate(PROMPTS[0], GREEDY)[0].token_ids) == GREEDY.max_tokens
    llm.shutdown()
