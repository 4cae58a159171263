"""EngineCore, the step loop (vLLM v1's EngineCore): requests in, per-step EngineCoreOutputs out, token ids
only (the front-end detokenizes). `step()` is schedule -> run -> postprocess (nano-vllm)."""

from __future__ import annotations

import itertools

from edgellm.chat.reasoning import forced_token
from edgellm.engine.checks import (
    PromptTooLongError,
    check_embedding_input,
    check_generative,
    check_prompt,
    check_score_input,
)
from edgellm.engine.guidance import GuidedDecoding
from edgellm.engine.inputs import InputRequests
from edgellm.engine.media import check_media, media_rows
from edgellm.engine.model_runner import ModelRunner, RunItem
from edgellm.engine.pooling import Pooler, check_pooling
from edgellm.engine.prompt_cache import PromptCache, restore_prefix, spill_prompt
from edgellm.engine.protocol import EngineCoreOutput, EngineStats, FinishReason, MediaSpan, TokenLogprob
from edgellm.engine.request import FINISH_STATUS, Completion, Request, cut_at_stop
from edgellm.engine.scheduler import Scheduler, SchedulerConfig, SchedulerPlan
from edgellm.engine.scoring import Scorer
from edgellm.engine.sequence import Sequence
from edgellm.engine.spec.speculator import Speculator
from edgellm.engine.spec.verify import Row, sample_row, verify_drafts
from edgellm.lora.choice import resolve_lora
from edgellm.sampling.sampler import Sampler, SamplingParams, TopCandidates, device_candidates, top_logprobs

__all__ = ["EngineCore", "EngineStats", "PromptTooLongError"]

# A completion's tokens of one step: (completion, its sequence, the tokens, why it ends or None).
Moved = tuple[Completion, Sequence, list[int], FinishReason | None]


class EngineCore:
    """Token ids in, token ids out: the core knows no text (the front-end detokenizes)."""

    def __init__(
        self,
        runner: ModelRunner,
        eog_ids: frozenset[int],
        n_ctx: int,
        sched: SchedulerConfig,
        speculator: Speculator | None = None,  # speculative decoding (None: off)
        guidance: GuidedDecoding | None = None,  # constrained decoding (None: grammars are refused)
        prompt_cache: PromptCache | None = None,  # KV blocks beyond the pool (engine/prompt_cache.py)
    ) -> None:
        self.runner, self.eog_ids, self.n_ctx = runner, frozenset(eog_ids), n_ctx
        if runner.cfg.recurrent and speculator is not None:
            # A sequence's recurrent state exists only where its last step left it or at a checkpoint
            # (engine/conv_state.py): rejected drafts would need it rolled back.
            raise ValueError(
                f"speculative decoding is not supported for {runner.cfg.arch}: its recurrent layers keep a "
                "per-sequence state that rejected draft tokens would corrupt"
            )
        self.speculator = speculator
        self.guidance = guidance
        self.scheduler = Scheduler(sched)
        self.prompt_cache = prompt_cache if self.scheduler.block_manager.cache is not None else None
        if self.prompt_cache is not None:
            cache, bm = self.prompt_cache, self.scheduler.block_manager
            self.scheduler.restore = lambda seq: restore_prefix(cache, bm, runner, seq)
        if runner.cfg.recurrent:  # prefix hits only as far as a checkpointed state reaches
            self.scheduler.block_manager.resume_point = runner.resume_point
            self.scheduler.align_prefill_ends = self.scheduler.block_manager.cache is not None
        self.requests: dict[str, Request] = {}
        self.inputs = InputRequests(self.scheduler)  # embeddings and scorings
        self._seq_ids = itertools.count()
        self._req_ids = itertools.count()
        self._totals = {"prompt": 0, "cached": 0, "generated": 0, "finished": 0}
        self.lora_scales: list[float] = []  # the global scale of each of runner.lora_adapters

    # ---- LoRA adapters -------------------------------------------------------------------------
    def set_lora_adapters(self, adapters: list, scales: list[float]) -> None:
        """The adapters (edgellm/lora/adapter.py's, bound to this model) and their global scales."""
        if len(adapters) != len(scales):
            raise ValueError(f"{len(adapters)} LoRA adapters but {len(scales)} scales")
        self.runner.lora_adapters = list(adapters)
        self.lora_scales = [float(s) for s in scales]

    def set_lora_scales(self, scales: dict[int, float]) -> None:
        """POST /lora-adapters: new global scales ({id: scale}; an adapter not named is at 0). Requests
        already admitted keep the choice they were admitted with."""
        resolve_lora(scales, self.lora_scales)  # unknown ids raise before anything changes
        self.lora_scales = [float(scales.get(k, 0.0)) for k in range(len(self.lora_scales))]

    def _lora_choice(self, requested: dict[int, float] | None) -> tuple[tuple[int, float], ...]:
        return resolve_lora(requested, self.lora_scales)

    # ---- requests ------------------------------------------------------------------------------
    def add_request(
        self,
        prompt: list[int],
        params: SamplingParams,
        request_id: str | None = None,
        priority: int = 0,
        group: str | None = None,
        media: list[MediaSpan] | None = None,
    ) -> str:
        """`group`: the client request this one belongs to, sharing its part of each step (see
        Scheduler._prefill_shares); None: a group of its own. `media`: images whose embeddings replace
        those prompt positions (vision/prompt.py)."""
        ids = list(prompt)
        check_generative(self.runner.cfg)
        check_prompt(ids, self.n_ctx, self.runner.cfg.n_vocab)  # the front-end checked; this guards kernels
        media = check_media(media or [], len(ids), self.runner.cfg)
        rid = self._new_id(request_id)
        seq_ids = [next(self._seq_ids) for _ in range(params.n)]
        req = Request.new(rid, ids, params, self.eog_ids, self.n_ctx, seq_ids)
        parent = req.completions[0]
        if params.compiled_grammar is not None:
            if self.guidance is None:
                raise ValueError("this engine has no tokenizer for constrained decoding")
            parent.matcher = self.guidance.matcher(params.compiled_grammar)
        group = rid if group is None else group  # its n completions share one
        lora = self._lora_choice(params.lora)
        seq = Sequence(
            seq_ids[0], ids, priority=priority, max_tokens=req.seq_max_tokens, group=group, owner=parent,
            media=media,
        )  # fmt: skip
        seq.lora = lora
        req.has_media = bool(media)  # its KV is keyed by its images too: not for the prompt cache's files
        self.scheduler.add(seq)  # raises before anything is registered if it can never fit
        self.requests[rid] = req
        self._totals["prompt"] += len(ids)
        return rid

    def add_embedding_request(
        self, ids: list[int], request_id: str | None = None, priority: int = 0, group: str | None = None
    ) -> str:
        """An input to embed: computed like a prompt, its hidden states pooled (pooling.py); its
        EngineCoreOutput carries the vector. `group`: as add_request's (the inputs of one client request)."""
        check_pooling(self.runner.cfg.pooling, head=self.runner.cfg.rank_head)
        return self._add_input(ids, check_embedding_input, request_id, priority, group, pooled=True)

    def add_score_request(
        self,
        ids: list[int],
        request_id: str | None = None,
        priority: int = 0,
        group: str | None = None,
        lora: dict[int, float] | None = None,
    ) -> str:
        """A sequence to score: computed like a prompt, the logits of every position kept (scoring.py);
        its EngineCoreOutput carries them ([len(ids), n_vocab], row t predicting token t+1). lora: as
        SamplingParams.lora."""
        check_generative(self.runner.cfg)
        choice = self._lora_choice(lora)
        return self._add_input(ids, check_score_input, request_id, priority, group, scored=True, lora=choice)

    def _add_input(self, ids, check, request_id, priority, group, **kind) -> str:  # noqa: ANN001
        ids = list(ids)
        check(ids, self.n_ctx, self.runner.cfg.n_vocab)  # the front-end checked; this guards the kernels
        rid = self._new_id(request_id)
        kind.setdefault("lora", self._lora_choice(None))
        seq = Sequence(next(self._seq_ids), ids, priority=priority, max_tokens=0, group=group, **kind)
        cfg = self.runner.cfg
        self.inputs.add(Pooler(rid, seq, cfg.pooling, cfg.causal) if seq.pooled else Scorer(rid, seq))
        self._totals["prompt"] += len(ids)
        return rid

    def _new_id(self, request_id: str | None) -> str:
        rid = request_id if request_id is not None else f"req-{next(self._req_ids)}"
        if rid in self.requests or rid in self.inputs:
            raise ValueError(f"request id {rid!r} is already in flight")
        return rid

    def abort(self, request_id: str, index: int | None = None) -> list[EngineCoreOutput]:
        """Cancel a request, or only its completion `index` (a stop string the front-end matched); the KV
        blocks are freed at once. Returns the ABORT outputs of the completions it ended."""
        req = self.requests.get(request_id)
        if req is None:
            self.inputs.abort(request_id)
            return []
        outs = []
        for c in req.completions:
            if c.finished or (index is not None and c.index != index):
                continue
            seq = self.scheduler.abort(c.seq_id)
            self._end_completion(c, seq)
            outs.append(EngineCoreOutput(req.request_id, [], FinishReason.ABORT, None, c.index))
        if req.finished:
            self._finish_request(req, outs)
        return outs

    def has_unfinished(self) -> bool:
        return bool(self.requests) or bool(self.inputs)

    # ---- one step ------------------------------------------------------------------------------
    def step(self) -> list[EngineCoreOutput]:
        if self.speculator is not None:
            self.speculator.propose(self._speculable())
        plan = self.scheduler.schedule()
        if self.guidance is not None:  # grammar masks are computed while the forward pass runs
            sample = set(plan.sample_seq_ids)
            self.guidance.start(
                {
                    seq.seq_id: seq.owner.matcher
                    for seq, _ in plan.scheduled
                    if seq.seq_id in sample and seq.owner.matcher is not None
                }
            )
        rows = self._run(plan)
        outs = self._postprocess(plan, rows)
        finished = self.inputs.finish(plan)
        self._totals["finished"] += len(finished)
        return outs + finished

    def _speculable(self) -> list[Sequence]:
        """Running sequences drafts may be proposed for: not embeddings or scorings (nothing is sampled), not
        constrained ones (a draft token would have to pass the grammar at each position) and not those
        with a reasoning budget (the core may have to force the tokens that close the think block), nor
        rolling windows."""
        return [
            s
            for s in self.scheduler.running
            if s.samples
            and s.owner.matcher is None
            and s.owner.request.params.reasoning_budget is None
            and s.owner.request.params.context_shift_keep is None  # drafts must not run past the context
        ]

    def _run(self, plan: SchedulerPlan) -> dict[int, list[Row]]:
        """Each sampled sequence's logits rows (one, or 1 + its drafts when verifying), or only their best
        entries when the backend samples where the logits live (see _device_k). Embeddings and scorings
        get their hidden rows and logits rows (self.inputs)."""
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
                    all_logits=seq.scored,
                    need_logits=seq.seq_id in sample,
                    num_logits=1 + len(seq.spec_token_ids),
                    hidden_rows=self.inputs.hidden_rows(seq, c, n),
                    seq_id=seq.seq_id,
                    lora=seq.lora,
                    history=seq.token_ids,
                    media=media_rows(seq.media, c, n) if seq.media else None,
                )
            )
            ids.append(seq.seq_id)
        k = self._device_k(plan)
        if k is None:
            out = self.runner.run(items)
            self.inputs.collect(plan, self.runner.last_hidden, out)
            return {sid: list(r) for sid, r in zip(ids, out, strict=True) if sid in sample}
        no_logits = [None] * len(items)  # no scoring in the step (_device_k)
        if k == 0:
            tops = self.runner.run_argmax(items)
            self.inputs.collect(plan, self.runner.last_hidden, no_logits)
            return {
                sid: [TopCandidates(t[j : j + 1]) for j in range(len(t))]
                for sid, t in zip(ids, tops, strict=True)
                if len(t)
            }
        pairs = self.runner.run_top_k(items, k)
        self.inputs.collect(plan, self.runner.last_hidden, no_logits)
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
        (penalties, biases, logprobs, or the first token of n > 1 completions, which forks from the row), and
        for a step that computes a scoring (it returns every row whole)."""
        if not self.runner.be.samples_on_device or not plan.sample_seq_ids:
            return None
        if any(seq.scored for seq, _ in plan.scheduled):
            return None
        ks = set()
        for sid in plan.sample_seq_ids:
            req = self.scheduler.seqs[sid].owner.request
            k = device_candidates(req.params)
            if k is None or (req.params.n > 1 and not req.forked):
                return None
            ks.add(0 if req.params.greedy else k)
        if 0 in ks:
            return 0 if len(ks) == 1 else None
        k = max(ks)
        return k if k <= self.runner.cfg.n_vocab else None

    def _postprocess(self, plan: SchedulerPlan, rows: dict[int, list[Row]]) -> list[EngineCoreOutput]:
        chosen_logprobs: dict[int, list[TokenLogprob]] = {}
        moved: list[Moved] = []
        forks: list[Sequence] = []  # parents whose other completions start this step
        fork_rows: dict[int, Row] = {}  # parent seq id -> the row its forks sample from (masked)
        guide = self.guidance
        seqs = {seq.seq_id: seq for seq, _ in plan.scheduled}
        for sid, seq_rows in rows.items():
            seq = seqs[sid]
            c: Completion = seq.owner
            req = c.request
            prompt, output = seq.prompt_token_ids, seq.output_token_ids
            drafts = seq.spec_token_ids
            if drafts:
                toks = verify_drafts(c.sampler, seq_rows, drafts, prompt, output)
                self.speculator.record(sid, len(drafts), len(toks) - 1)
            else:
                row = seq_rows[-1]
                allowed = guide.mask(sid, row) if guide is not None else row
                toks = [_next_token(req.params, c.sampler, allowed, prompt, output)]
                fork_rows[sid] = allowed
            toks, reason = cut_at_stop(c, toks)
            moved.append((c, seq, toks, reason))
            if req.params.logprobs is not None:  # the model's own distribution, as OpenAI reports it
                chosen_logprobs[sid] = [
                    TokenLogprob(tok, *top_logprobs(row, tok, req.params.logprobs))
                    for row, tok in zip(seq_rows, toks, strict=False)
                ]
            if req.params.n > 1 and not req.forked:
                forks.append(seq)
                if c.matcher is not None:
                    for child in req.completions[1:]:
                        child.matcher = c.matcher.deep_copy()  # from the state before the parent's token
            for tok in toks:
                c.consume(tok)
        fork_logits = {seq.seq_id: (fork_rows[seq.seq_id], rows[seq.seq_id][-1]) for seq in forks}
        self.scheduler.postprocess(plan, {seq.seq_id: toks for _, seq, toks, _ in moved})
        for c, seq, _, reason in moved:  # a rolling window that filled the context shifts (its next token
            keep = c.request.params.context_shift_keep  # would be past it)
            if keep is not None and reason is None and seq.num_tokens >= self.n_ctx and not c.finished:
                c.request.num_shifted += self.scheduler.shift_context(seq, keep)
        for seq in forks:
            moved += self._fork(seq, *fork_logits[seq.seq_id], chosen_logprobs)

        outs: dict[str, list[EngineCoreOutput]] = {}
        for c, seq, toks, reason in moved:
            if c.finished:
                continue
            req = c.request
            if req.num_cached_tokens is None:  # its first token
                req.num_cached_tokens = seq.num_cached_tokens
                self._totals["cached"] += req.num_cached_tokens
            c.num_generated += len(toks)
            req.num_generated += len(toks)
            self._totals["generated"] += len(toks)
            if reason is not None:
                if self.scheduler.get(c.seq_id) is not None:
                    self.scheduler.finish(c.seq_id, FINISH_STATUS[reason])
                self._end_completion(c, seq)
            out = EngineCoreOutput(
                req.request_id, toks, reason, chosen_logprobs.get(c.seq_id), c.index, req.num_cached_tokens
            )
            outs.setdefault(req.request_id, []).append(out)
        for seq in plan.finished:  # outgrew the whole pool: ends as "length"
            c = seq.owner
            if not c.finished:
                self._end_completion(c, seq)
                req = c.request
                out = EngineCoreOutput(
                    req.request_id, [], FinishReason.LENGTH, None, c.index, req.num_cached_tokens or 0
                )
                outs.setdefault(req.request_id, []).append(out)
        results = []
        for rid, req_outs in outs.items():
            req = self.requests[rid]
            if req.num_generated == sum(len(o.new_token_ids) for o in req_outs):  # all it has generated
                for o in req_outs:
                    o.first = True
            if req.finished:
                self._finish_request(req, req_outs)
            results += req_outs
        return results

    def _fork(self, parent: Sequence, row: Row, raw: Row, chosen: dict) -> list[Moved]:
        """n > 1: the other completions share the parent's prompt blocks (copy-on-write) and sample their
        own first token from the same logits (`row`: after the grammar's mask; `raw`: for logprobs)."""
        req: Request = parent.owner.request
        req.forked = True
        moved: list[Moved] = []
        for c in req.completions[1:]:
            tok = _next_token(req.params, c.sampler, row, req.prompt_ids, [])
            c.consume(tok)
            if not self.scheduler.can_fork():
                # the running set is full: the child waits like a new request (its prompt blocks are
                # prefix-cache hits when it starts)
                child = Sequence(
                    c.seq_id,
                    req.prompt_ids + [tok],
                    len(req.prompt_ids),
                    max_tokens=req.seq_max_tokens,
                    group=parent.group,
                    owner=c,
                    lora=parent.lora,
                    media=parent.media,
                )
                self.scheduler.add(child)
            else:
                child = self.scheduler.fork(parent.seq_id, c.seq_id)
                self.runner.fork_state(parent.seq_id, c.seq_id)
                child.owner = c
                child.token_ids[-1] = tok
            toks, reason = cut_at_stop(c, [tok])
            moved.append((c, child, toks, reason))
            if req.params.logprobs is not None:
                chosen[c.seq_id] = [TokenLogprob(tok, *top_logprobs(raw, tok, req.params.logprobs))]
        return moved

    def _end_completion(self, c: Completion, seq: Sequence | None) -> None:
        c.finished = True
        c.matcher = None
        if c.index == 0 and seq is not None:
            c.request.num_preemptions = seq.num_preemptions

    def _finish_request(self, req: Request, outs: list[EngineCoreOutput]) -> None:
        if self.prompt_cache is not None and not req.has_media:  # (the LoRA choice may now resolve
            # otherwise: then nothing is found)
            salt = self._lora_choice(req.params.lora)
            spill_prompt(self.prompt_cache, self.scheduler.block_manager, self.runner, req.prompt_ids, salt)
        del self.requests[req.request_id]
        if self.speculator is not None:
            for c in req.completions:
                self.speculator.forget(c.seq_id)  # the draft model's KV of it, the n-gram index
        self._totals["finished"] += 1
        for o in outs:
            o.request_finished = True
            o.num_preemptions = req.num_preemptions
            o.num_shifted_tokens = req.num_shifted

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


def _next_token(p: SamplingParams, sampler: Sampler, row: Row, prompt: list[int], output: list[int]) -> int:
    """The sampled token, or the one the reasoning budget forces (edgellm.chat.reasoning.forced_token)."""
    forced = forced_token(p, output)
    return sample_row(sampler, row, prompt, output) if forced is None else forced
