"""Scheduler plans on tiny configs, driven by a fake model runner that stores tokens as its "KV".

The fake runner keeps one int per KV slot, applies the plan's block copies, writes each scheduled token into
its slot, and before sampling reads the whole sequence back through the block table and checks it. Its next
token is a fixed function of the token prefix, so any schedule (chunked, preempted, prefix-shared, forked)
must reproduce exactly what an unconstrained run produces.
"""

from __future__ import annotations

import random

import pytest

from edgellm.engine.scheduler import Scheduler, SchedulerConfig, SchedulerPlan
from edgellm.engine.sequence import Sequence, SequenceStatus
from edgellm.testing.engine_fakes import FakeRunner, reference_output


def ids(plan: SchedulerPlan) -> list[tuple[int, int]]:
    return [(seq.seq_id, n) for seq, n in plan.scheduled]


def make(num_blocks: int = 16, budget: int = 8, max_seqs: int = 4, **kw: object) -> Scheduler:
    cfg = SchedulerConfig(
        max_num_seqs=max_seqs, max_num_batched_tokens=budget, block_size=4, num_blocks=num_blocks, **kw
    )
    return Scheduler(cfg)


def test_long_prompt_is_chunked_to_the_budget_left_after_decodes() -> None:
    sched = make(budget=8)
    runner = FakeRunner(sched)
    sched.add(Sequence(0, [5, 6, 7], max_tokens=5))
    plan, _ = runner.step()
    assert ids(plan) == [(0, 3)] and plan.sample_seq_ids == [0]
    sched.add(Sequence(1, list(range(20)), max_tokens=1))
    steps = [runner.step() for _ in range(3)]
    plans = [plan for plan, _ in steps]
    assert [ids(p) for p in plans] == [[(0, 1), (1, 7)], [(0, 1), (1, 7)], [(0, 1), (1, 6)]]
    assert [p.sample_seq_ids for p in plans] == [[0], [0], [0, 1]]  # partial chunks sample nothing
    assert [p.num_batched_tokens for p in plans] == [8, 8, 7]
    assert [s.seq_id for s in steps[2][1]] == [1]  # max_tokens=1: done as soon as its prompt is
    done = runner.run()
    assert {s.seq_id: s.output_token_ids for s in done + steps[2][1]} == {
        0: reference_output([5, 6, 7], 5),
        1: reference_output(list(range(20)), 1),
    }


def test_running_prefill_leaves_budget_for_later_decodes() -> None:
    sched = make(budget=8)
    runner = FakeRunner(sched)
    sched.add(Sequence(0, [1, 2]))
    runner.step()
    sched.add(Sequence(1, list(range(20)), priority=-1))  # more important, so it is visited first
    assert ids(runner.step()[0]) == [(0, 1), (1, 7)]
    assert ids(runner.step()[0]) == [(1, 7), (0, 1)]  # 13 left, but 1 token is kept for seq 0's decode


def test_long_prefill_chunk_caps_one_sequence() -> None:
    sched = make(budget=16, long_prefill_chunk=5)
    runner = FakeRunner(sched)
    sched.add(Sequence(0, list(range(12)), max_tokens=2))
    assert [ids(runner.step()[0]) for _ in range(4)] == [[(0, 5)], [(0, 5)], [(0, 2)], [(0, 1)]]


def test_waiting_order_is_priority_then_fcfs_and_respects_max_num_seqs() -> None:
    sched = make(budget=16, max_seqs=2)
    for seq_id, prio in [(0, 0), (1, -1), (2, 0), (3, -1)]:
        sched.add(Sequence(seq_id, [seq_id + 1, 9], priority=prio))
    plan = sched.schedule()
    assert ids(plan) == [(1, 2), (3, 2)]
    assert [s.seq_id for s in sched.waiting] == [0, 2]
    assert (sched.num_running, sched.num_waiting) == (2, 2)


def test_prefix_hit_computes_only_the_suffix_and_whole_prompt_hit_one_token() -> None:
    sched = make(budget=32)
    runner = FakeRunner(sched)
    shared = list(range(30, 38))  # two full blocks
    sched.add(Sequence(0, shared + [1, 2], max_tokens=4))
    runner.step()
    sched.add(Sequence(1, shared + [3, 4, 5], max_tokens=4))
    sched.add(Sequence(2, list(shared), max_tokens=4))
    plan, _ = runner.step()
    a, b, c = (sched.get(i) for i in range(3))
    assert a is not None and b is not None and c is not None
    assert ids(plan) == [(0, 1), (1, 3), (2, 1)]
    assert (b.num_cached_tokens, c.num_cached_tokens) == (8, 7)
    assert b.block_table[:2] == a.block_table[:2] == c.block_table[:1] + [a.block_table[1]]
    assert plan.block_copies == [(a.block_table[1], c.block_table[1])]  # c writes token 7 into a copy
    assert sched.prefix_cache_hit_rate == pytest.approx((8 + 7) / (10 + 11 + 8))
    done = runner.run()
    assert {s.seq_id: s.output_token_ids for s in done} == {
        0: reference_output(shared + [1, 2], 4),
        1: reference_output(shared + [3, 4, 5], 4),
        2: reference_output(shared, 4),
    }


def test_preemption_under_tiny_pool_then_recompute_completes() -> None:
    sched = make(num_blocks=4, budget=16)
    runner = FakeRunner(sched)
    prompt_a, prompt_b = [1, 2, 3, 4, 5, 6], [11, 12, 13, 14, 15, 16]
    sched.add(Sequence(0, prompt_a, max_tokens=6))
    sched.add(Sequence(1, prompt_b, max_tokens=6))
    a, b = sched.get(0), sched.get(1)
    assert a is not None and b is not None
    for _ in range(3):
        plan, _ = runner.step()
        assert not plan.preempted
    assert (a.block_table, b.block_table) == ([0, 1], [2, 3])
    assert sched.kv_usage == 1.0

    plan, _ = runner.step()  # a needs a 3rd block: b (newest) is preempted
    assert [s.seq_id for s in plan.preempted] == [1] and ids(plan) == [(0, 1)]
    assert (b.status, b.num_computed_tokens, b.block_table, b.num_output_tokens) == (
        SequenceStatus.PREEMPTED,
        0,
        [],
        3,
    )
    assert a.block_table == [0, 1, 3]  # b's blocks went to the cache; its last one was evicted first
    assert sched.num_preemptions == 1 and sched.stats().num_waiting == 1

    steps = 0
    while a.status == SequenceStatus.RUNNING:
        plan, _ = runner.step()
        assert ids(plan) == [(0, 1)]  # b's recompute does not fit until a is done
        steps += 1
    assert a.status == SequenceStatus.FINISHED_LENGTH and steps == 2
    plan, _ = runner.step()
    # b recomputes prompt + its 3 outputs; its first block was still cached, so 5 of 9 tokens are computed.
    assert ids(plan) == [(1, 5)] and b.num_cached_tokens == 4 and plan.sample_seq_ids == [1]
    runner.run()
    assert a.output_token_ids == reference_output(prompt_a, 6)
    assert b.output_token_ids == reference_output(prompt_b, 6)
    assert sched.block_manager.num_free_blocks == 4


def test_lone_sequence_outgrowing_the_pool_is_finished_not_looped() -> None:
    sched = make(num_blocks=2, budget=8)
    runner = FakeRunner(sched)
    sched.add(Sequence(0, [1, 2, 3]))  # no max_tokens: only the prompt is checked at add()
    done = runner.run()
    assert [s.seq_id for s in done] == [0]
    assert done[0].status == SequenceStatus.FINISHED_LENGTH
    assert done[0].num_tokens == 2 * 4 + 1  # every slot computed, plus the last sampled token
    assert done[0].output_token_ids == reference_output([1, 2, 3], 6)


def test_add_rejects_requests_that_can_never_fit() -> None:
    sched = make(num_blocks=8)
    with pytest.raises(ValueError, match="need 10 KV blocks .* only 8"):
        sched.add(Sequence(0, list(range(20)), max_tokens=20))
    sched = Scheduler(SchedulerConfig(4, 8, 4, 8, max_model_len=16))
    with pytest.raises(ValueError, match="max_model_len=16"):
        sched.add(Sequence(0, list(range(10)), max_tokens=7))
    sched.add(Sequence(1, [1]))
    with pytest.raises(ValueError, match="already"):
        sched.add(Sequence(1, [2]))
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=4)


@pytest.mark.parametrize("prefix_caching", [False, True])
def test_abort_running_and_waiting_returns_the_pool(prefix_caching: bool) -> None:
    sched = make(num_blocks=8, budget=8, max_seqs=2, enable_prefix_caching=prefix_caching)
    runner = FakeRunner(sched)
    for i in range(3):
        sched.add(Sequence(i, [i] * 6))
    plan, _ = runner.step()
    assert ids(plan) == [(0, 4), (1, 4)]  # the two prompts the running set has room for share the budget
    assert sched.block_manager.num_free_blocks == 8 - 1 - 1
    assert sched.abort(2) is not None and sched.block_manager.num_free_blocks == 6  # waiting: held nothing
    aborted = sched.abort(0)
    assert aborted is not None and aborted.status == SequenceStatus.FINISHED_ABORTED
    assert sched.block_manager.num_free_blocks == 7
    plan = sched.schedule()
    assert ids(plan) == [(1, 2)] and sched.block_manager.num_free_blocks == 6
    sched.abort(1)  # aborted between schedule() and postprocess(): the step's result is dropped
    assert sched.postprocess(plan, {1: [5]}) == []
    assert sched.block_manager.num_free_blocks == 8
    assert sched.block_manager.refcounts == [0] * 8
    assert sched.abort(1) is None and not sched.has_unfinished()


def test_stop_token_and_explicit_finish() -> None:
    cfg = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=8, block_size=4, num_blocks=8)
    sched = Scheduler(cfg)
    runner = FakeRunner(sched, stop_ids=frozenset({reference_output([1, 2, 3], 2)[1]}))  # its 2nd token
    sched.add(Sequence(0, [1, 2, 3], max_tokens=10))
    sched.add(Sequence(1, [4, 5, 6], max_tokens=10))
    runner.step()
    sched.finish(1, SequenceStatus.FINISHED_STOPPED)
    _, done = runner.step()
    assert [(s.seq_id, s.status, s.num_output_tokens) for s in done] == [
        (0, SequenceStatus.FINISHED_STOPPED, 2)
    ]
    assert sched.block_manager.num_free_blocks == 8


def test_fork_copy_on_write_through_the_scheduler() -> None:
    sched = make(num_blocks=8, budget=8)
    runner = FakeRunner(sched)
    sched.add(Sequence(0, [1, 2, 3, 4, 5, 6], max_tokens=4))
    runner.step()
    child = sched.fork(0, 1)
    parent = sched.get(0)
    assert parent is not None
    child.token_ids[-1] = (parent.token_ids[-1] + 1) % 997  # the child sampled a different token
    assert child.block_table == parent.block_table == [0, 1]
    plan, _ = runner.step()
    assert ids(plan) == [(0, 1), (1, 1)]
    assert plan.block_copies == [(1, 2)] and parent.block_table == [0, 2] and child.block_table == [0, 1]
    runner.run()
    assert parent.output_token_ids == reference_output([1, 2, 3, 4, 5, 6], 4)
    child_prompt = [1, 2, 3, 4, 5, 6, child.token_ids[6]]
    assert child.output_token_ids[1:] == reference_output(child_prompt, 3)
    assert sched.block_manager.num_free_blocks == 8


def test_random_workload_matches_reference_and_drains() -> None:
    rng = random.Random(1234)
    sched = make(num_blocks=12, budget=10, max_seqs=4, long_prefill_chunk=6)
    runner = FakeRunner(sched)
    stems = [[rng.randrange(997) for _ in range(rng.randrange(4, 13))] for _ in range(3)]
    expected: dict[int, list[int]] = {}
    aborted: set[int] = set()
    done: list[Sequence] = []
    next_id = 0
    for step in range(400):
        if next_id < 24 and rng.random() < 0.4:
            prompt = rng.choice(stems) + [rng.randrange(997) for _ in range(rng.randrange(0, 6))]
            max_tokens = rng.randrange(1, 10)
            sched.add(Sequence(next_id, prompt, max_tokens=max_tokens, priority=rng.randrange(2)))
            expected[next_id] = reference_output(prompt, max_tokens)
            next_id += 1
        if step % 37 == 5 and sched.running:
            victim = rng.choice(sched.running + sched.waiting).seq_id
            sched.abort(victim)
            aborted.add(victim)
        plan, finished = runner.step()
        assert plan.num_batched_tokens == sum(n for _, n in plan.scheduled) <= 10
        assert len(plan.scheduled) <= 4
        done.extend(finished)
        if next_id == 24 and not sched.has_unfinished():
            break
    assert not sched.has_unfinished()
    assert sorted(s.seq_id for s in done) == sorted(set(range(24)) - aborted)
    for seq in done:
        assert seq.output_token_ids == expected[seq.seq_id]
    assert sched.num_preemptions > 0 and sched.prefix_cache_hit_rate > 0
    assert sched.block_manager.num_free_blocks == 12 and sched.block_manager.refcounts == [0] * 12
