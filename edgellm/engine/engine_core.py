"""EngineCore: requests in, per-step deltas out. `step()` is schedule -> run -> postprocess (nano-vllm)."""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field

from edgellm.engine.checks import PromptTooLongError, check_embedding_input, check_prompt
from edgellm.engine.guidance import GuidedDecoding
from edgellm.engine.model_runner import ModelRunner, RunItem
from edgellm.engine.outputs import (
    CompletionDelta,
    RequestMetrics,
    RequestOutput,
    TokenLogprob,
    check_stop,
    now,
    stop_token_ids,
)
from edgellm.engine.pooling import PooledRequests
from edgellm.engine.scheduler import Scheduler, SchedulerConfig, SchedulerPlan
from edgellm.engine.sequence import Sequence, SequenceStatus
from edgellm.engine.spec.speculator import Speculator
from edgellm.engine.spec.verify import Row, sample_row, verify_drafts
from edgellm.reasoning import forced_token
from edgellm.sampling import Sampler, SamplingParams, TopCandidates, device_candidates, top_logprobs

__all__ = ["EngineStats", "EngineCore", "PromptTooLongError"]


@dataclass
class EngineStats:
    """A snapshot of the engine's gauges and counters (the server's /metrics is built from it)."""

    num_running: int
    num_waiting: int
    kv_blocks_total: int
    kv_blocks_used: int
    kv_usage: float  # fraction of blocks held by live sequences
    prefix_cache_hit_rate: float
    num_preemptions: int
    prompt_tokens_total: int
    cached_tokens_total: int
    generated_tokens_total: int
    requests_finished_total: int
    spec_draft_tokens_total: int = 0  # speculative decoding: drafts verified
    spec_accepted_tokens_total: int = 0  # of those, accepted
    spec_verify_steps_total: int = 0  # (sequence, step) pairs that verified drafts
    spec_pauses_total: int = 0  # times a sequence's speculation paused for low acceptance

    @property
    def spec_acceptance_rate(self) -> float:
        n = self.spec_draft_tokens_total
        return self.spec_accepted_tokens_total / n if n else 0.0

    @property
    def spec_mean_accepted_length(self) -> float:
        """Tokens per verify step of a sequence: accepted drafts + the target's own (0 without any)."""
        n = self.spec_verify_steps_total
        return (self.spec_accepted_tokens_total + n) / n if n else 0.0


@dataclass
class _Request:
    request_id: str
    params: SamplingParams
    prompt_ids: list[int]
    seq_ids: list[int]  # one per completion; [0] is the parent the others fork from
    stop_ids: frozenset[int]
    num_generated: list[int]  # tokens so far, per completion
    samplers: list[Sampler]
    metrics: RequestMetrics
    max_tokens: int
    forked: bool = False
    finished: set[int] = field(default_factory=set)  # completion indexes done


class EngineCore:
    """Token ids in, token ids out: the core's engine knows no text (the front-end detokenizes)."""

    def __init__(
        self,
        runner: ModelRunner,
        eog_ids: frozenset[int],
        n_ctx: int,
        sched: SchedulerConfig,
        speculator: Speculator | None = None,  # speculative decoding (None: off)
        guidance: GuidedDecoding | None = None,  # constrained decoding (None: grammars are refused)
    ) -> None:
        self.runner, self.eog_ids, self.n_ctx = runner, frozenset(eog_ids), n_ctx
        if runner.cfg.recurrent:
            # A sequence's conv state exists only where its last step left it (engine/conv_state.py): a
            # cached prefix's blocks come without the state at that prefix, and rejected drafts would need
            # the state rolled back. Hits are off for such a model; speculation is refused.
            if speculator is not None:
                raise ValueError(
                    f"speculative decoding is not supported for {runner.cfg.arch}: its short-conv layers "
                    "keep a per-sequence state that rejected draft tokens would corrupt"
                )
            sched = dataclasses.replace(sched, enable_prefix_caching=False)
        self.speculator = speculator
        self.guidance = guidance
        self.scheduler = Scheduler(sched)
        self.requests: dict[str, _Request] = {}
        self.pooled = PooledRequests(self.scheduler, runner.cfg.pooling)  # embedding requests
        self._seq_owner: dict[int, tuple[_Request, int]] = {}  # seq_id -> (request, completion index)
        self._seq_ids = itertools.count()
        self._req_ids = itertools.count()
        self._totals = {"prompt": 0, "cached": 0, "generated": 0, "finished": 0}

    # ---- requests ------------------------------------------------------------------------------
    def add_request(
        self,
        prompt: list[int],
        params: SamplingParams,
        request_id: str | None = None,
        priority: int = 0,
        group: str | None = None,
    ) -> str:
        """`group`: the client request this one belongs to, sharing its part of each step (see
        Scheduler._prefill_shares); None: a group of its own."""
        ids = list(prompt)
        check_prompt(ids, self.n_ctx, self.runner.cfg.n_vocab)  # front-ends check first; this guards kernels
        rid = self._new_id(request_id)
        max_tokens = min(params.max_tokens, self.n_ctx - len(ids))  # capped by the context window
        seq_ids = [next(self._seq_ids) for _ in range(params.n)]
        req = _Request(
            request_id=rid,
            params=params,
            prompt_ids=ids,
            seq_ids=seq_ids,
            stop_ids=stop_token_ids(params, self.eog_ids),
            num_generated=[0] * params.n,
            samplers=[Sampler(params, rng_offset=i) for i in range(params.n)],
            metrics=RequestMetrics(arrival_time=now(), num_prompt_tokens=len(ids)),
            max_tokens=max_tokens,
        )
        group = rid if group is None else group  # its n completions share one
        seq = Sequence(
            seq_ids[0], ids, sampling_params=params, priority=priority, max_tokens=max_tokens, group=group
        )
        if params.compiled_grammar is not None:
            if self.guidance is None:
                raise ValueError("this engine has no tokenizer for constrained decoding")
            self.guidance.add(seq_ids[0], params.compiled_grammar)
        try:
            self.scheduler.add(seq)  # raises before anything is registered if it can never fit
        except BaseException:
            if self.guidance is not None:
                self.guidance.free(seq_ids[0])
            raise
        self.requests[rid] = req
        self._seq_owner[seq_ids[0]] = (req, 0)
        self._totals["prompt"] += len(ids)
        return rid

    def add_embedding_request(
        self, ids: list[int], request_id: str | None = None, priority: int = 0, group: str | None = None
    ) -> str:
        """An input to embed: computed like a prompt, its hidden states pooled (pooling.py); its
        RequestOutput carries the vector. `group`: as add_request's (the inputs of one client request)."""
        ids = list(ids)
        check_embedding_input(ids, self.n_ctx, self.runner.cfg.n_vocab)
        rid = self._new_id(request_id)
        self.pooled.add(rid, ids, next(self._seq_ids), priority, group)
        self._totals["prompt"] += len(ids)
        return rid

    def _new_id(self, request_id: str | None) -> str:
        rid = request_id if request_id is not None else f"req-{next(self._req_ids)}"
        if rid in self.requests or rid in self.pooled:
            raise ValueError(f"request id {rid!r} is already in flight")
        return rid

    def abort(self, request_id: str, index: int | None = None) -> RequestOutput | None:
        """Cancel a request, or only its completion `index` (a stop string the front-end matched); the KV
        blocks are freed at once. Returns the request's final output once nothing of it runs any more."""
        req = self.requests.get(request_id)
        if req is None:
            self.pooled.abort(request_id)
            return None
        deltas = []
        for i, sid in enumerate(req.seq_ids):
            if i in req.finished or (index is not None and i != index):
                continue
            if self.scheduler.get(sid) is not None:
                self.scheduler.abort(sid)
            deltas.append(CompletionDelta(i, [], "", "abort"))
            req.finished.add(i)
            if self.guidance is not None:
                self.guidance.free(sid)
        if len(req.finished) < req.params.n:
            return None
        return self._finish_request(req, deltas)

    def has_unfinished(self) -> bool:
        return bool(self.requests) or bool(self.pooled)

    # ---- one step ------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        if self.speculator is not None:
            self.speculator.propose(self._speculable())
        plan = self.scheduler.schedule()
        if self.guidance is not None:  # grammar masks are computed while the forward pass runs
            self.guidance.start(plan.sample_seq_ids)
        rows = self._run(plan)
        if not plan.is_empty:
            self.pooled.collect(plan, self.runner.last_hidden)
        outs = self._postprocess(plan, rows)
        finished = self.pooled.finish(plan)
        self._totals["finished"] += len(finished)
        return outs + finished

    def _speculable(self) -> list[Sequence]:
        """Running sequences drafts may be proposed for: not embeddings (nothing is sampled), not
        constrained ones (a draft token would have to pass the grammar at each position) and not those
        with a reasoning budget (the core may have to force the tokens that close the think block)."""
        constrained = self.guidance.matchers if self.guidance is not None else {}
        return [
            s
            for s in self.scheduler.running
            if not s.pooled and s.seq_id not in constrained and _no_budget(s.sampling_params)
        ]

    def _run(self, plan: SchedulerPlan) -> dict[int, list[Row]]:
        """Each sampled sequence's logits rows (one, or 1 + its drafts when verifying), or only their best
        entries when the backend samples where the logits live (see _device_k)."""
        self.runner.retain_states(self.scheduler.seqs)  # frees finished and aborted sequences' state
        if plan.is_empty:
            return {}
        self.runner.copy_blocks(plan.block_copies)
        items, ids = [], []
        sample = set(plan.sample_seq_ids)
        for seq, n in plan.scheduled:
            c = seq.num_computed_tokens
            items.append(
                RunItem(
                    seq.block_table,
                    seq.tokens_to_compute(n),
                    c,
                    need_logits=seq.seq_id in sample,
                    num_logits=1 + len(seq.spec_token_ids),
                    hidden_rows=self.pooled.rows_for(seq, c, n),
                    seq_id=seq.seq_id,
                )
            )
            ids.append(seq.seq_id)
        k = self._device_k(plan)
        if k is None:
            out = self.runner.run(items)
            return {sid: list(r) for sid, r in zip(ids, out, strict=True) if len(r)}
        if k == 0:
            tops = self.runner.run_argmax(items)
            return {
                sid: [TopCandidates(t[j : j + 1]) for j in range(len(t))]
                for sid, t in zip(ids, tops, strict=True)
                if len(t)
            }
        pairs = self.runner.run_top_k(items, k)
        return {
            sid: [TopCandidates(i[j], v[j]) for j in range(len(i))]
            for sid, (v, i) in zip(ids, pairs, strict=True)
            if len(i)
        }

    def _device_k(self, plan: SchedulerPlan) -> int | None:
        """0 when every sequence sampled this step is greedy, k when all sample from at most their k best
        logits (top-k): the backend then returns only ids (and those k values) instead of [n_vocab] logits
        per row. None (whole rows to the host) on a backend that would copy them anyway, for mixed greedy and
        sampled steps (np.argmax and np.argsort order NaN differently), or when a sequence needs the whole row
        (penalties, biases, logprobs, or the first token of n > 1 completions, which forks from the row)."""
        if not self.runner.be.samples_on_device or not plan.sample_seq_ids:
            return None
        ks = set()
        for sid in plan.sample_seq_ids:
            req = self._seq_owner[sid][0]
            k = device_candidates(req.params)
            if k is None or (req.params.n > 1 and not req.forked):
                return None
            ks.add(0 if req.params.greedy else k)
        if 0 in ks:
            return 0 if len(ks) == 1 else None
        k = max(ks)
        return k if k <= self.runner.cfg.n_vocab else None

    def _postprocess(self, plan: SchedulerPlan, rows: dict[int, list[Row]]) -> list[RequestOutput]:
        t = now()
        sampled: dict[int, list[int]] = {}
        chosen_logprobs: dict[int, list[TokenLogprob]] = {}
        forks: list[tuple[_Request, int]] = []
        fork_rows: dict[int, Row] = {}  # parent seq id -> the row its forks sample from (masked)
        guide = self.guidance
        for sid, seq_rows in rows.items():
            req, idx = self._seq_owner[sid]
            seq = self.scheduler.get(sid)
            sampler = req.samplers[idx]
            prompt, output = seq.prompt_token_ids, seq.output_token_ids
            drafts = seq.spec_token_ids
            if drafts:
                toks = verify_drafts(sampler, seq_rows, drafts, prompt, output)
                self.speculator.record(sid, len(drafts), len(toks) - 1)
            else:
                row = seq_rows[-1]
                allowed = guide.mask(sid, row) if guide is not None else row
                toks = [_next_token(req.params, sampler, allowed, prompt, output)]
                fork_rows[sid] = allowed
            toks = self._cut_at_stop(req, idx, toks)
            sampled[sid] = toks
            if req.params.logprobs is not None:  # the model's own distribution, as OpenAI reports it
                chosen_logprobs[sid] = [
                    TokenLogprob(tok, *top_logprobs(row, tok, req.params.logprobs))
                    for row, tok in zip(seq_rows, toks, strict=False)
                ]
            if req.params.n > 1 and not req.forked:
                forks.append((req, sid))
                if guide is not None:
                    for cid in req.seq_ids[1:]:
                        guide.fork(sid, cid)  # from the state before the parent's token
            if guide is not None:
                for tok in toks:
                    guide.consume(sid, tok)
        fork_logits = {sid: (fork_rows[sid], rows[sid][-1]) for _, sid in forks}
        self.scheduler.postprocess(plan, sampled)
        for req, parent in forks:
            self._fork(req, parent, *fork_logits[parent], sampled, chosen_logprobs)

        deltas: dict[str, list[CompletionDelta]] = {}
        for sid, toks in sampled.items():
            req, idx = self._seq_owner[sid]
            if idx in req.finished:
                continue
            m = req.metrics
            if m.first_token_time is None:
                m.first_token_time = t
                seq = self.scheduler.get(sid)
                m.num_cached_tokens = seq.num_cached_tokens if seq is not None else 0
                self._totals["cached"] += m.num_cached_tokens
            if idx == 0:
                m.token_times.extend([t] * len(toks))
            m.num_generated_tokens += len(toks)
            self._totals["generated"] += len(toks)
            req.num_generated[idx] += len(toks)
            reason = check_stop(toks[-1], req.num_generated[idx], req.max_tokens, req.stop_ids)
            deltas.setdefault(req.request_id, []).append(
                CompletionDelta(idx, toks, "", reason, chosen_logprobs.get(sid))
            )
            if reason is not None:
                req.finished.add(idx)
                if self.scheduler.get(sid) is not None:
                    self.scheduler.finish(sid, SequenceStatus.FINISHED_STOPPED)
        for seq in plan.finished:  # outgrew the whole pool: ends as "length"
            req, idx = self._seq_owner[seq.seq_id]
            if idx not in req.finished:
                req.finished.add(idx)
                delta = CompletionDelta(idx, [], "", "length")
                deltas.setdefault(req.request_id, []).append(delta)
        results = []
        for rid, ds in deltas.items():
            req = self.requests[rid]
            if len(req.finished) == req.params.n:
                results.append(self._finish_request(req, ds))
            else:
                results.append(RequestOutput(rid, ds, False, req.metrics))
        return results

    def _cut_at_stop(self, req: _Request, idx: int, toks: list[int]) -> list[int]:
        """Tokens up to and including the first that ends the completion (a stop id, or max_tokens)."""
        done = req.num_generated[idx]
        for i, tok in enumerate(toks):
            if check_stop(tok, done + i + 1, req.max_tokens, req.stop_ids) is not None:
                return toks[: i + 1]
        return toks

    def _fork(self, req: _Request, parent: int, row: Row, raw: Row, sampled: dict, chosen: dict) -> None:
        """n > 1: the other completions share the parent's prompt blocks (copy-on-write) and sample their
        own first token from the same logits (`row`: after the grammar's mask; `raw`: for logprobs)."""
        req.forked = True
        pseq = self.scheduler.get(parent)
        for i, cid in enumerate(req.seq_ids[1:], start=1):
            tok = _next_token(req.params, req.samplers[i], row, req.prompt_ids, [])
            if self.guidance is not None:
                self.guidance.consume(cid, tok)
            self._seq_owner[cid] = (req, i)
            if pseq is None or not self.scheduler.can_fork():
                # the parent already finished on its first token, or the running set is full: the child
                # waits like a new request (its prompt blocks are prefix-cache hits when it starts)
                child = Sequence(
                    cid,
                    req.prompt_ids + [tok],
                    len(req.prompt_ids),
                    sampling_params=req.params,
                    max_tokens=req.max_tokens,
                    group=pseq.group if pseq is not None else None,
                )
                self.scheduler.add(child)
            else:
                child = self.scheduler.fork(parent, cid)
                self.runner.fork_state(parent, cid)
                child.token_ids[-1] = tok
            sampled[cid] = [tok]
            if req.params.logprobs is not None:
                chosen[cid] = [TokenLogprob(tok, *top_logprobs(raw, tok, req.params.logprobs))]

    def _finish_request(self, req: _Request, deltas: list[CompletionDelta]) -> RequestOutput:
        req.metrics.finished_time = now()
        seq = self.scheduler.get(req.seq_ids[0])
        if seq is not None:
            req.metrics.num_preemptions = seq.num_preemptions
        del self.requests[req.request_id]
        for sid in req.seq_ids:
            self._seq_owner.pop(sid, None)
            if self.guidance is not None:
                self.guidance.free(sid)
            if self.speculator is not None:
                self.speculator.forget(sid)  # the draft model's KV of it, the n-gram index
        self._totals["finished"] += 1
        return RequestOutput(req.request_id, deltas, True, req.metrics)

    def stats(self) -> EngineStats:
        s = self.scheduler
        bm = s.block_manager
        used = bm.num_blocks - bm.num_free_blocks
        return EngineStats(
            num_running=s.num_running,
            num_waiting=s.num_waiting,
            kv_blocks_total=bm.num_blocks,
            kv_blocks_used=used,
            kv_usage=s.kv_usage,
            prefix_cache_hit_rate=s.prefix_cache_hit_rate,
            num_preemptions=s.num_preemptions,
            prompt_tokens_total=self._totals["prompt"],
            cached_tokens_total=self._totals["cached"],
            generated_tokens_total=self._totals["generated"],
            requests_finished_total=self._totals["finished"],
            **self._spec_totals(),
        )

    def _spec_totals(self) -> dict[str, int]:
        if self.speculator is None:
            return {}
        c = self.speculator.counters
        return {
            "spec_draft_tokens_total": c.draft_tokens,
            "spec_accepted_tokens_total": c.accepted_tokens,
            "spec_verify_steps_total": c.verify_steps,
            "spec_pauses_total": c.pauses,
        }


def _no_budget(params: SamplingParams | None) -> bool:
    return params is None or params.reasoning_budget is None


def _next_token(p: SamplingParams, sampler: Sampler, row: Row, prompt: list[int], output: list[int]) -> int:
    """The sampled token, or the one the reasoning budget forces (edgellm.reasoning.forced_token)."""
    forced = forced_token(p, output)
    return sample_row(sampler, row, prompt, output) if forced is None else forced
