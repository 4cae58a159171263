"""One client request cannot monopolise the engine: a step's prefill tokens and running slots are shared
per client request (the inputs of one embed call, the prompts of one HTTP request), so a chat sent while a
big embedding batch runs is served alongside it; an abandoned call stops being computed at the next step.
Ordering and step counts only: no timings."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from edgellm import LLM
from edgellm.engine.protocol import AbortRequests
from edgellm.engine.scheduler import Scheduler, SchedulerConfig
from edgellm.engine.sequence import Sequence, SequenceStatus
from edgellm.sampling.sampler import SamplingParams


def _scheduler(**config: int | None) -> Scheduler:
    return Scheduler(
        SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, block_size=4, num_blocks=512, **config)
    )


def test_a_request_of_many_inputs_leaves_a_later_one_its_part_of_the_first_step() -> None:
    """200 inputs of one group, then one prompt of another: the prompt is scheduled in full in the first
    step, not after the 200; the inputs yield that step to it (someone waits for its first token)."""
    sched = _scheduler()
    for i in range(200):
        sched.add(Sequence(i, [1, 2, 3, 4, 5], max_tokens=0, pooled=True, group="batch"))
    sched.add(Sequence(999, list(range(1, 13)), max_tokens=4, group="chat"))
    plan = sched.schedule()
    got = {seq.seq_id: n for seq, n in plan.scheduled}
    assert got == {999: 12} and 999 in plan.sample_seq_ids


def test_embedding_inputs_yield_to_a_prompt_and_keep_their_steps_short() -> None:
    """Embedding work takes at most max_pooled_tokens_per_step a step, none while a prompt has tokens to
    prefill: a prompt that arrives waits for one short step, then has its step to itself."""
    sched = _scheduler(max_pooled_tokens_per_step=16)
    for i in range(200):
        sched.add(Sequence(i, [1, 2, 3, 4, 5], max_tokens=0, pooled=True, group="batch"))
    alone = sched.schedule()
    assert sum(n for _, n in alone.scheduled) == 16  # inputs are chunked like prompts
    _postprocess(sched, alone, {})
    sched.add(Sequence(999, list(range(100, 112)), max_tokens=4, group="chat"))  # no prefix in common
    first = sched.schedule()
    assert [(s.seq_id, n) for s, n in first.scheduled] == [(999, 12)]
    _postprocess(sched, first, {999: [7]})
    beside = sched.schedule()  # the chat decodes; the batch has its 16 tokens again
    got = {s.seq_id: n for s, n in beside.scheduled}
    assert (
        got.pop(999) == 1
        and sum(got.values()) == 16
        and all(s.pooled for s, _ in beside.scheduled if s.seq_id != 999)
    )


def _postprocess(sched: Scheduler, plan, sampled: dict) -> None:
    """postprocess, then what the engine does with the embedding inputs it computed in full: pool them and
    end them."""
    sched.postprocess(plan, sampled)
    for seq in [s for s in sched.running if s.pooled and s.num_uncomputed_tokens == 0]:
        sched.finish(seq.seq_id, SequenceStatus.FINISHED_STOPPED)


def test_a_long_prompt_shares_each_step_with_a_short_one() -> None:
    """A 1,000-token prompt already prefilling does not take the whole budget from a short prompt that
    arrives: the short one needs less than half and gets all it needs, the long one the rest."""
    sched = Scheduler(
        SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, block_size=4, num_blocks=512)
    )
    sched.add(Sequence(0, list(range(1, 1001)), max_tokens=4))
    first = sched.schedule()
    sched.postprocess(first, {})
    sched.add(Sequence(1, list(range(2000, 2010)), max_tokens=4))  # no prefix in common
    plan = sched.schedule()
    assert [(s.seq_id, n) for s, n in plan.scheduled] == [(0, 54), (1, 10)]


@pytest.fixture(scope="module")
def llm(smollm2_path: Path) -> LLM:
    with LLM(smollm2_path, n_ctx=256, max_num_seqs=8) as llm:
        yield llm


def test_chat_sent_during_an_embedding_batch_finishes_first(llm: LLM) -> None:
    """A 4-token chat sent while 300 inputs of one embed call run finishes while the batch still runs
    (it used to wait behind every input), gets its first token within two steps of arriving, and the
    batch's vectors are the same as without the chat."""
    texts = [f"short string number {i}" for i in range(300)]
    ids = [llm.embedding_ids(t) for t in texts]
    alone = llm.embed(texts[:8])
    chat = llm.prompt_ids("Say hi.")
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)

    async def run() -> tuple[np.ndarray, list, bool]:
        batch = asyncio.ensure_future(llm.aembed(ids))
        while llm.stats().num_waiting == 0:  # the batch is queued and stepping
            await asyncio.sleep(0.01)
        sent = llm.core.step_messages
        firsts = []
        async for _ in llm.stream(chat, params):
            firsts.append(llm.core.step_messages - sent)
        chat_first = not batch.done()
        return await batch, firsts, chat_first

    vectors, steps, chat_first = asyncio.run(run())
    assert chat_first and len(steps) == 4
    assert steps[0] <= 2  # the step in flight when it came, then its prefill and first token
    np.testing.assert_array_equal(vectors[:8], alone)


def test_an_abandoned_embed_call_stops_at_the_next_step(llm: LLM, monkeypatch: pytest.MonkeyPatch) -> None:
    """Cancelling aembed of 2,000 inputs drops all of them in one message, handled before the engine's
    next step: at most one step (the one in flight) ends after the abort reaches the pipe, and the engine
    has nothing left. Steps are told apart by the time the core stamps on each (perf_counter: one clock
    for both processes), against the time the client's sender thread finished writing the abort: on a
    busy machine the messages the front-end reads after cancel() include steps that ended before it, and
    the sender thread itself may wait for a core."""
    ids = [llm.embedding_ids(f"input {i} to drop") for i in range(2000)]
    step_ends: list[float] = []
    deliver = llm.core._deliver

    def record(msg):  # noqa: ANN001, ANN202
        step_ends.extend(t for t, _ in msg.steps)
        return deliver(msg)

    monkeypatch.setattr(llm.core, "_deliver", record)
    conn_send = llm.core._conn.send
    abort_sent: list[float] = []

    def send(msg):  # noqa: ANN001, ANN202
        conn_send(msg)
        if isinstance(msg, AbortRequests):
            abort_sent.append(time.perf_counter())

    monkeypatch.setattr(llm.core._conn, "send", send)

    async def run() -> int:
        batch = asyncio.ensure_future(llm.aembed(ids))
        while llm.stats().num_waiting == 0:  # queued and stepping (each short input ends in its step)
            await asyncio.sleep(0.01)
        batch.cancel()
        with pytest.raises(asyncio.CancelledError):
            await batch  # aembed's finally has queued the abort for the sender thread
        deadline = time.monotonic() + 30
        while (llm.stats().num_running or llm.stats().num_waiting) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert llm.stats().num_running == llm.stats().num_waiting == 0
        assert step_ends and len(abort_sent) == 1  # it was stepping; one abort message for all inputs
        return sum(t > abort_sent[0] for t in step_ends)

    assert asyncio.run(run()) <= 1


def test_requests_aborted_before_they_are_sent_never_reach_the_core(
    llm: LLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client's sender thread writes requests to the core in order; one a caller aborts while it still
    waits in the outbox is dropped there (no add, no abort for the core to handle), one the sender already
    took is aborted in the core after it, and the others are served. The sender is held on the first
    request's write, as a busy machine would hold it."""
    gate, taken = threading.Event(), threading.Event()
    sent: list = []
    conn_send = llm.core._conn.send

    def send(msg):  # noqa: ANN001, ANN202
        sent.append(msg)
        if len(sent) == 1:
            taken.set()
            assert gate.wait(30)
        conn_send(msg)

    monkeypatch.setattr(llm.core._conn, "send", send)
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    done: dict[str, threading.Event] = {}
    outputs: dict[str, list] = {}

    def submit(name: str) -> str:
        done[name], outputs[name] = threading.Event(), []

        def deliver(item):  # noqa: ANN001, ANN202
            outputs[name].append(item)
            if isinstance(item, Exception) or item.finished:
                done[name].set()

        return llm.submit(f"Count to three, {name}.", params, deliver, request_id=f"unsent-{name}")[0]

    a = submit("a")
    assert taken.wait(30)  # the sender holds a's request
    b, c, d, e = (submit(n) for n in "bcde")
    llm.abort(b)
    llm.abort_all([c, d])
    llm.abort(a)  # taken already: its abort follows it
    gate.set()
    assert done["e"].wait(60) and outputs["e"][-1].deltas[-1].finish_reason == "length"
    deadline = time.monotonic() + 30
    while llm.stats().num_running + llm.stats().num_waiting and time.monotonic() < deadline:
        time.sleep(0.01)
    kinds = [(type(m).__name__, getattr(m, "request_id", None) or getattr(m, "request_ids", None))
             for m in sent]  # fmt: skip
    assert kinds == [("EngineCoreRequest", a), ("EngineCoreRequest", e), ("AbortRequests", [a])]
    assert not outputs["b"] and not outputs["c"] and not outputs["d"]  # dropped: nothing delivered
    assert llm.stats().num_running == llm.stats().num_waiting == 0
