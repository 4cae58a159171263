"""Speculative decoding pieces without a model: the scheduler with drafts (driven by the token-as-KV fake
runner of test_scheduler), rejection sampling's distribution, the n-gram proposer, adaptive k, the config."""

from __future__ import annotations

import random

import numpy as np
import pytest

from edgellm.engine.scheduler import Scheduler, SchedulerConfig
from edgellm.engine.sequence import Sequence
from edgellm.engine.spec.adaptive import VERIFY_COST, AdaptiveK, break_even
from edgellm.engine.spec.config import parse_speculative
from edgellm.engine.spec.ngram import NgramProposer
from edgellm.engine.spec.verify import verify_drafts
from edgellm.sampling.sampler import Sampler, SamplingParams
from edgellm.testing.engine_fakes import (
    FakeRunner,
    chi2_critical,
    chi2_two_sample,
    next_token,
    reference_output,
)


class SpecFakeRunner(FakeRunner):
    """Proposes drafts that are the true continuation with probability `hit` (else a wrong token), then
    verifies them as a greedy sampler would: every scored position is checked against the KV read back."""

    def __init__(self, sched: Scheduler, k: int, hit: float, seed: int = 0) -> None:
        super().__init__(sched)
        self.k, self.hit, self.rng = k, hit, random.Random(seed)
        self.drafted = self.accepted = 0

    def propose(self) -> None:
        for seq in self.sched.running:
            if seq.num_uncomputed_tokens != 1:
                continue
            room = seq.max_tokens - seq.num_output_tokens - 1
            toks, drafts = list(seq.token_ids), []
            for _ in range(min(self.k, room)):
                t = next_token(toks)
                t = t if self.rng.random() < self.hit else (t + 1) % 997
                drafts.append(t)
                toks.append(t)
            seq.spec_token_ids = drafts

    def step(self):
        self.propose()
        plan = self.sched.schedule()
        bm, bs = self.sched.block_manager, self.sched.config.block_size
        for src, dst in plan.block_copies:
            self.kv[dst * bs : (dst + 1) * bs] = self.kv[src * bs : (src + 1) * bs]
        sampled = {}
        for seq, n in plan.scheduled:
            start = seq.num_computed_tokens
            toks = seq.tokens_to_compute(n)
            for slot, tok in zip(bm.slot_mapping(seq, start, n), toks, strict=True):
                self.kv[slot] = tok
            if seq.seq_id not in plan.sample_seq_ids:
                continue
            full = seq.token_ids + seq.spec_token_ids
            cached = [self.kv[s] for s in bm.slot_mapping(seq, 0, len(full))]
            assert cached == full, f"KV of sequence {seq.seq_id} is corrupt"
            out = []
            for i, d in enumerate([*seq.spec_token_ids, None]):
                t = next_token(cached[: seq.num_tokens + i])
                out.append(t)
                if t != d:
                    break
            self.drafted += len(seq.spec_token_ids)
            self.accepted += len(out) - 1
            sampled[seq.seq_id] = out
        return plan, self.postprocess(plan, sampled)


@pytest.mark.parametrize("hit", [0.0, 0.6, 1.0])
def test_drafts_verify_to_the_reference_and_leave_no_kv_behind(hit: float) -> None:
    """Mixed prompts under a tight pool (chunked prefill, preemption, prefix sharing): every sequence ends
    with exactly the non-speculative tokens, the pool is whole again, and the prefix cache holds only
    accepted tokens (a cached block read back equals the tokens its key names)."""
    cfg = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=12, block_size=4, num_blocks=24)
    sched = Scheduler(cfg)
    runner = SpecFakeRunner(sched, k=5, hit=hit, seed=3)
    rng = random.Random(1)
    shared = [rng.randrange(997) for _ in range(9)]
    prompts = [shared + [rng.randrange(997) for _ in range(rng.randrange(1, 8))] for _ in range(6)]
    seqs = [Sequence(i, p, max_tokens=15) for i, p in enumerate(prompts)]
    for s in seqs:
        sched.add(s)
    done = runner.run()
    assert len(done) == len(seqs)
    for s, p in zip(seqs, prompts, strict=True):
        assert s.output_token_ids == reference_output(p, 15)
    bm = sched.block_manager
    assert bm.num_free_blocks == cfg.num_blocks and all(r == 0 for r in bm.refcounts)
    cache = bm.cache
    for key, block in cache._block_by_key.items():
        assert runner.kv[block * 4 : block * 4 + 4] == list(key[1])
    if hit == 1.0:
        assert runner.accepted == runner.drafted > 0
    if hit == 0.0:
        assert runner.accepted == 0 and runner.drafted > 0


def test_rejected_drafts_release_their_blocks() -> None:
    sched = Scheduler(SchedulerConfig(max_num_seqs=1, max_num_batched_tokens=16, block_size=4, num_blocks=8))
    seq = Sequence(0, [1, 2, 3], max_tokens=20)
    sched.add(seq)
    plan = sched.schedule()
    sched.postprocess(plan, {0: [9]})  # 4 tokens, 3 computed: one block
    assert len(seq.block_table) == 1
    seq.spec_token_ids = [5, 6, 7, 8, 9, 10]
    plan = sched.schedule()
    assert plan.scheduled == [(seq, 7)] and len(seq.block_table) == 3  # positions 3..9
    sched.postprocess(plan, {0: [5, 11]})  # draft 5 accepted, 6 rejected -> 11
    assert seq.token_ids == [1, 2, 3, 9, 5, 11] and seq.num_computed_tokens == 5
    assert len(seq.block_table) == 2 and sched.block_manager.num_free_blocks == 6
    assert seq.spec_token_ids == []


def test_drafts_are_cut_to_the_budget_and_never_preempt() -> None:
    sched = Scheduler(SchedulerConfig(max_num_seqs=2, max_num_batched_tokens=4, block_size=4, num_blocks=4))
    # one client request's two prompts: first come, first served within it (no fair split of the prefill)
    a, b = Sequence(0, [1, 2, 3], max_tokens=8, group="g"), Sequence(1, [4, 5, 6], max_tokens=8, group="g")
    sched.add(a)
    sched.add(b)
    plan = sched.schedule()  # a's prompt (3) + 1 of b's
    sched.postprocess(plan, {0: [7]})
    plan = sched.schedule()  # a's decode + the rest of b's prompt
    sched.postprocess(plan, {0: [7], 1: [8]})
    a.spec_token_ids = [1, 1, 1, 1, 1]
    b.spec_token_ids = [2, 2]
    plan = sched.schedule()  # budget 4: a gets 1 + 2 drafts, b keeps its decode token
    assert {s.seq_id: n for s, n in plan.scheduled} == {0: 3, 1: 1}
    assert a.spec_token_ids == [1, 1] and b.spec_token_ids == [] and not plan.preempted
    sched.postprocess(plan, {0: [1, 2], 1: [3]})
    # a holds 2 of the 4 blocks, b 1; a's drafts would take the last one, which b's decode needs
    a.spec_token_ids = [4, 4, 4]
    plan = sched.schedule()
    assert {s.seq_id: n for s, n in plan.scheduled} == {0: 1, 1: 1} and not plan.preempted


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.9),
        SamplingParams(temperature=0.7, top_k=5),
        SamplingParams(temperature=1.0, top_p=0.8),
        SamplingParams(temperature=1.1, min_p=0.1, repetition_penalty=1.3),
    ],
    ids=["plain", "top_k", "top_p", "min_p_penalty"],
)
def test_rejection_sampling_keeps_the_target_distribution(params: SamplingParams) -> None:
    """Two positions of a fixed 12-token model, drafts [likely, unlikely]: the emitted (first, second)
    pairs are distributed as two plain draws from the target (chi-square over 6,000 samples each)."""
    rng = np.random.default_rng(0)
    v = 12
    row0 = (rng.standard_normal(v) * 1.5).astype(np.float32)
    rows1 = (rng.standard_normal((v, v)) * 1.5).astype(np.float32)  # row after each first token
    drafts = [int(np.argmax(row0)), int(np.argmin(rows1[np.argmax(row0)]))]
    spec, plain = Sampler(params, rng_offset=1), Sampler(params, rng_offset=2)
    spec.rng, plain.rng = np.random.default_rng(5), np.random.default_rng(6)
    n = 6000
    got, want = np.zeros(v * v, int), np.zeros(v * v, int)
    for _ in range(n):
        out = verify_drafts(spec, [row0, rows1[drafts[0]], row0], drafts, [3], [])
        if len(out) == 1:  # first draft rejected: the second token is drawn as usual
            out.append(spec.sample(rows1[out[0]], [3], out))
        got[out[0] * v + out[1]] += 1
        first = plain.sample(row0, [3], [])
        want[first * v + plain.sample(rows1[first], [3], [first])] += 1
    stat, df = chi2_two_sample(got, want)
    assert stat < chi2_critical(df), (stat, df)


def test_greedy_verification_is_the_argmax_path() -> None:
    s = Sampler(SamplingParams(temperature=0.0))
    rows = [np.eye(5, dtype=np.float32)[i] for i in (2, 4, 1)]
    assert verify_drafts(s, rows[:3], [2, 4], [0], []) == [2, 4, 1]  # both accepted + bonus
    assert verify_drafts(s, rows[:3], [2, 3], [0], []) == [2, 4]  # second rejected: the argmax instead
    assert verify_drafts(s, rows[:3], [0, 4], [0], []) == [2]
    with pytest.raises(ValueError, match="rows"):
        verify_drafts(s, rows[:2], [2, 4], [0], [])


def test_ngram_proposer_looks_up_the_latest_longest_match() -> None:
    prop = NgramProposer(2, 3)
    seq = Sequence(0, [5, 1, 2, 3, 4, 9, 1, 2, 7, 8, 1, 2])
    assert prop.propose([(seq, 3)]) == [[7, 8, 1]]  # "1 2" last seen before 7 8
    seq.token_ids += [7]  # "1 2 7": the 3-gram wins
    assert prop.propose([(seq, 5)]) == [[8, 1, 2, 7]]  # only what exists after the match
    seq.token_ids += [6, 6]
    assert prop.propose([(seq, 3)]) == [[]]
    assert prop.propose([(Sequence(1, [4]), 3)]) == [[]]
    prop.drop(0)
    with pytest.raises(ValueError, match="n_min"):
        NgramProposer(3, 2)


def test_adaptive_k_shrinks_pauses_and_recovers() -> None:
    ak = AdaptiveK(4)
    assert ak.k_for(0) == 4
    ak.update(0, 4, 1)
    assert ak.k_for(0) == 2
    for _ in range(3):
        ak.update(0, 2, 0)
    paused = [ak.k_for(0) for _ in range(4)]
    assert paused == [0, 0, 0, 0] and ak.k_for(0) >= 1
    ak.update(0, 1, 1)
    ak.update(0, 2, 2)
    assert ak.k_for(0) == 4
    assert AdaptiveK(3, enabled=False).k_for(7) == 3


def test_adaptive_k_weighs_a_drafts_chance_against_its_cost_in_the_batch() -> None:
    assert break_even(1) == pytest.approx(VERIFY_COST)
    assert break_even(16) > 0.7  # 16 sequences already share the weights: a draft must be likely
    assert break_even(1, propose_cost=1.0) == 1.0  # a draft model as big as the target never pays
    ak = AdaptiveK(8)
    for _ in range(3):
        ak.update(0, 8, 8)  # a copied run: the whole k at batch 1; in a batch, a share of k
    assert (ak.k_for(0, batch=1), ak.k_for(0, batch=2), ak.k_for(0, batch=16)) == (8, 4, 1)
    ak.update(0, 8, 2)
    ak.update(0, 3, 1)  # two rejections after the run: the chance of a draft is now about 0.8
    assert 1 <= ak.k_for(0, batch=16) < ak.k_for(0, batch=1) == 2
    ak.update(0, 2, 1, batch=16)  # about 0.7: under the break-even of a batch of 16, so paused
    assert ak.pauses == 1 and ak.k_for(0, batch=1) == 0
    assert ak.k_for(1) == 8  # n-gram: a new sequence starts drafting whatever the others did


def test_adaptive_k_with_a_draft_model_starts_new_sequences_from_the_latest_pause() -> None:
    ak = AdaptiveK(4, propose_cost=0.3)  # break-even 0.45 at batch 1
    assert ak.k_for(0) == 3  # a chance of 0.8 to start with: 0.8 ** 3 > 0.45 > 0.8 ** 4
    ak.update(0, 3, 0)  # none accepted: the chance falls under the break-even
    assert ak.pauses == 1
    assert [ak.k_for(1) for _ in range(5)] == [0, 0, 0, 0, 3]  # the next request does not relearn it
    ak.update(1, 3, 3)  # a whole draft accepted: drafts pay again
    assert ak.k_for(2) == 3


def test_speculative_config_parsing_and_errors() -> None:
    assert parse_speculative(None) is None
    assert parse_speculative("ngram").method == "ngram"
    assert parse_speculative("ngram").num_tokens == 8
    cfg = parse_speculative("draft:/x/y.gguf", num_tokens=6)
    assert (cfg.method, cfg.model, cfg.num_tokens) == ("draft", "/x/y.gguf", 6)
    assert parse_speculative({"method": "draft", "model": "m.gguf", "num_tokens": 3}).num_tokens == 3
    for bad, match in [
        ("medusa", "method"),
        ("draft", "draft:PATH"),
        ("ngram:x", "only 'draft'"),
        ({"method": "ngram", "k": 3}, "unknown speculative option"),
        ({"num_tokens": 3}, "method"),
        ({"method": "ngram", "num_tokens": 0}, "num_tokens"),
        ({"method": "ngram", "ngram_min": 3, "ngram_max": 2}, "ngram"),
        (5, "must be"),
    ]:
        with pytest.raises(ValueError, match=match):
            parse_speculative(bad)
    with pytest.raises(ValueError, match="needs --speculative"):
        parse_speculative(None, num_tokens=3)


def test_surfaces_report_speculation(capsys: pytest.CaptureFixture[str]) -> None:
    """/metrics carries the acceptance figures; a bad --speculative is an error before any model loads."""
    from edgellm.cli.commands import main
    from edgellm.engine.protocol import EngineStats
    from edgellm.server.metrics import ServerMetrics

    zero = {f: 0 for f in EngineStats.__dataclass_fields__}
    stats = EngineStats(**{**zero, "spec_draft_tokens_total": 8, "spec_accepted_tokens_total": 6})
    stats.spec_verify_steps_total, stats.spec_pauses_total = 2, 3
    assert (stats.spec_acceptance_rate, stats.spec_mean_accepted_length) == (0.75, 4.0)
    text = ServerMetrics("m").render(stats)
    assert 'edgellm_spec_acceptance_rate{model_name="m"} 0.75' in text
    assert 'edgellm_spec_mean_accepted_length{model_name="m"} 4.0' in text
    assert 'edgellm_spec_pauses_total{model_name="m"} 3' in text
    assert main(["bench", "/nonexistent.gguf", "--speculative", "medusa"]) == 1
    assert "speculative method must be one of" in capsys.readouterr().err
    assert main(["bench", "/nonexistent.gguf", "--num-speculative-tokens", "3"]) == 1
    assert "needs --speculative" in capsys.readouterr().err


@pytest.mark.asyncio
async def test_tui_status_bar_shows_speculation(tmp_path) -> None:
    from tests.tui.pilot import SIZE, make_app, ready, send, status_text

    app, backends = make_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        assert "spec" not in status_text(app)  # a backend without speculation shows nothing of it
        backends[0].speculation = lambda: (0.75, 3.0)
        await send(pilot, "hello")
        assert "spec 75% accepted, 3.0 tok/step" in status_text(app)
