"""Iteration-level (continuous batching) scheduler, vLLM v1 style.

Each step gets a token budget. Running sequences are served first (a decode costs 1 token), then waiting
ones in priority-then-FCFS order; prompts are chunked to whatever budget is left, so a long prompt never
stalls the decodes. When the KV pool runs dry for a running sequence, the least important running sequence
(highest priority value, newest arrival) is preempted: its blocks are freed and it recomputes later.

Speculative decoding: a decoding sequence may carry draft tokens (seq.spec_token_ids). They are more
query tokens after its one uncomputed token, cut to the budget left (and dropped before anyone is preempted
for their blocks); the sampler then returns the accepted drafts plus one token, and postprocess advances
num_computed_tokens over the accepted ones only and releases the blocks that held nothing else.

Step protocol: plan = schedule(); the runner applies plan.block_copies, computes the K/V of each
(seq, n) in plan.scheduled (seq.tokens_to_compute(n) at positions c.. where c = seq.num_computed_tokens),
samples tokens for every id in plan.sample_seq_ids (one, or accepted drafts + one), then calls
postprocess(plan, sampled).
"""

from __future__ import annotations

import heapq
from collections import Counter, deque
from collections.abc import Callable
from typing import Any

from edgellm.engine.block_manager import BlockManager, cdiv
from edgellm.engine.scheduler_types import SchedulerConfig, SchedulerPlan, SchedulerStats
from edgellm.engine.sequence import Sequence, SequenceStatus

__all__ = ["Scheduler", "SchedulerConfig", "SchedulerPlan", "SchedulerStats"]


def _importance(seq: Sequence) -> tuple[int, int]:
    return (seq.priority, seq.arrival)  # smaller = served first, preempted last


class Scheduler:
    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self.block_manager = BlockManager(
            config.num_blocks, config.block_size, enable_prefix_caching=config.enable_prefix_caching
        )
        self.waiting: list[Sequence] = []  # kept sorted by (priority, arrival)
        self.running: list[Sequence] = []
        self.seqs: dict[int, Sequence] = {}  # unfinished sequences by id
        self.num_preemptions = 0
        self._next_arrival = 0
        # Called with a sequence about to be admitted (prompt_cache.restore_prefix; None: no prompt cache)
        self.restore: Callable[[Sequence], None] | None = None
        # A model with a recurrent state checkpoints it only where a step ends on a block boundary
        # (engine/conv_state.py): a prefill that would end past the last one stops there first, so that
        # a later prompt sharing the whole prefix resumes from it (the tail follows the next step).
        self.align_prefill_ends = False

    # ---- requests ------------------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        """Queue a new request. Raises ValueError for a request that could never fit the KV pool."""
        if seq.seq_id in self.seqs:
            raise ValueError(f"sequence id {seq.seq_id} is already in the scheduler")
        max_len = seq.num_tokens + (seq.max_tokens or 0)
        if self.config.max_model_len is not None and max_len > self.config.max_model_len:
            raise ValueError(
                f"sequence {seq.seq_id}: {seq.num_tokens} prompt + {seq.max_tokens or 0} max new tokens "
                f"exceed max_model_len={self.config.max_model_len}"
            )
        need = cdiv(max_len, self.config.block_size)
        if need > self.config.num_blocks:
            raise ValueError(
                f"sequence {seq.seq_id}: {max_len} tokens need {need} KV blocks of {self.config.block_size} "
                f"tokens but the pool has only {self.config.num_blocks}; it could never be scheduled"
            )
        step = min(self.config.max_num_batched_tokens, self.config.long_prefill_chunk or 1 << 62)
        for m in seq.media:  # a non-causal image is computed in one step (Sequence.media_cut)
            if m.non_causal and m.end - m.start > step:
                raise ValueError(
                    f"an image of {m.end - m.start} tokens does not fit one step of {step} tokens "
                    "(raise max_num_batched_tokens)"
                )
        seq.arrival = self._next_arrival
        self._next_arrival += 1
        seq.status = SequenceStatus.WAITING
        self.seqs[seq.seq_id] = seq
        self._enqueue(seq)

    def abort(self, seq_id: int) -> Sequence | None:
        """Cancel a waiting or running request; its blocks are freed at once. None if unknown/finished."""
        if seq_id not in self.seqs:
            return None
        return self.finish(seq_id, SequenceStatus.FINISHED_ABORTED)

    def finish(self, seq_id: int, status: SequenceStatus = SequenceStatus.FINISHED_STOPPED) -> Sequence:
        """Stop a sequence (the engine's stop rule, engine/request.py check_stop, or an abort) and free
        its blocks."""
        if not status.is_finished:
            raise ValueError(f"{status} is not a finished status")
        seq = self.seqs.pop(seq_id)
        if seq in self.running:
            self.running.remove(seq)
        else:
            self.waiting.remove(seq)
        self.block_manager.free(seq)
        seq.status = status
        return seq

    def can_fork(self) -> bool:
        return len(self.running) < self.config.max_num_seqs

    def fork(self, parent_id: int, child_id: int) -> Sequence:
        """Clone a running sequence (parallel sampling): the child shares every KV block copy-on-write."""
        parent = self.seqs[parent_id]
        if parent.status != SequenceStatus.RUNNING:
            raise ValueError(f"sequence {parent_id} is not running")
        if child_id in self.seqs:
            raise ValueError(f"sequence id {child_id} is already in the scheduler")
        if len(self.running) >= self.config.max_num_seqs:
            raise RuntimeError("running set is full (max_num_seqs)")
        child = Sequence(
            child_id,
            parent.token_ids,
            parent.num_prompt_tokens,
            priority=parent.priority,
            max_tokens=parent.max_tokens,
            group=parent.group,
            lora=parent.lora,
            media=parent.media,  # its images: a recompute after preemption and its cache keys need them
        )
        self.block_manager.fork(parent, child)
        child.num_cached_tokens = parent.num_cached_tokens
        child.arrival = self._next_arrival
        self._next_arrival += 1
        child.status = SequenceStatus.RUNNING
        self.seqs[child_id] = child
        self.running.append(child)
        return child

    def get(self, seq_id: int) -> Sequence | None:
        return self.seqs.get(seq_id)

    def has_unfinished(self) -> bool:
        return bool(self.seqs)

    # ---- one step ------------------------------------------------------------------------------
    def schedule(self) -> SchedulerPlan:
        plan = SchedulerPlan()
        budget = self.config.max_num_batched_tokens
        bm = self.block_manager

        order = sorted(self.running, key=_importance)
        # Decodes not yet visited: prefill chunks of running sequences leave this much budget for them.
        pending_decodes = sum(1 for s in order if s.num_uncomputed_tokens == 1)
        queued: dict[Any, list[Sequence]] = {}  # waiting sequences by group, in (priority, arrival) order
        for seq in self.waiting:
            queued.setdefault(seq.group_key, []).append(seq)
        shares = self._prefill_shares(budget - pending_decodes, queued)  # prefill tokens left per group
        i, end = 0, len(order)  # order[end:] were preempted this step (taken from the tail)
        while i < end:
            seq = order[i]
            i += 1
            remaining = seq.num_uncomputed_tokens
            group = seq.group_key
            if remaining == 1:
                pending_decodes -= 1
                cap = budget
            else:
                seq.spec_token_ids = []  # drafts ride on a decode only
                cap = shares.get(group, 0)  # a prefill chunk: within its request's share
            if self.config.whole_inputs:
                cap = budget  # a whole input or nothing (_chunk)
            num_new = self._chunk(remaining + len(seq.spec_token_ids), min(cap, budget - pending_decodes))
            num_new = self._aligned(seq, seq.num_computed_tokens, num_new)
            if seq.media:
                num_new = seq.media_cut(seq.num_computed_tokens, num_new)
            del seq.spec_token_ids[max(0, num_new - remaining) :]  # drafts past the budget are dropped
            if num_new <= 0:
                continue
            # Speculation never costs anyone their blocks: drafts only take blocks that the decodes still
            # to come (at most one new block each) leave free.
            need = bm.num_blocks_needed(seq, num_new) if seq.spec_token_ids else 0
            if seq.spec_token_ids and need + pending_decodes > bm.num_free_blocks:
                num_new -= len(seq.spec_token_ids)
                seq.spec_token_ids = []
            while not bm.can_allocate(seq, num_new):
                if end > i:  # preempt the least important sequence not yet scheduled
                    end -= 1
                    victim = order[end]
                    if victim.num_uncomputed_tokens == 1:
                        pending_decodes -= 1
                    self._preempt(victim, plan)
                    continue
                if cdiv(seq.num_computed_tokens + num_new, bm.block_size) > bm.num_blocks:
                    # Alone it outgrows the whole pool: recomputing could never help. End it (keeps its
                    # output) rather than loop forever.
                    plan.finished.append(self.finish(seq.seq_id, SequenceStatus.FINISHED_LENGTH))
                else:
                    self._preempt(seq, plan)
                num_new = 0
                break
            if num_new:
                self._schedule_seq(seq, num_new, plan)
                budget -= num_new
                if remaining > 1:
                    shares[group] -= num_new
            else:
                break  # seq itself lost its blocks; everything after it was already preempted

        # Admitting new work right after a preemption would just thrash the pool.
        if not plan.preempted:
            self._admit(plan, budget, shares, queued)
        return plan

    def _prefill_shares(self, budget: int, queued: dict[Any, list[Sequence]]) -> dict[Any, int]:
        """Tokens of prefill each group may compute this step, out of the budget the decodes leave: shared
        max-min fairly (a group that needs less than an even split leaves the rest to the others) among
        the groups with prompt or embedding-input tokens to compute, the more important priority first.
        So one request with a long prompt or thousands of inputs leaves every other its part of each
        step. Waiting groups count as far as the running set has free slots, in the order _admit takes
        them. Embedding inputs yield to prompts (someone waits for a prompt's first token; an embedding
        is wanted only whole) and take at most max_pooled_tokens_per_step together. A scoring's input
        is shared out as a prompt is (its caller waits on it alone, in chunks of the step's budget)."""
        demand: Counter = Counter()
        priority: dict[Any, int] = {}
        pooled: set[Any] = set()
        for seq in self.running:
            if seq.num_uncomputed_tokens > 1:
                demand[seq.group_key] += seq.num_uncomputed_tokens
                priority[seq.group_key] = min(seq.priority, priority.get(seq.group_key, seq.priority))
                if seq.pooled:
                    pooled.add(seq.group_key)
        slots = max(0, self.config.max_num_seqs - len(self.running))
        cap = self._slot_cap(queued)
        running = Counter(s.group_key for s in self.running)
        for g in self._turns(queued)[:slots]:
            fits = min(slots, cap - running[g])
            demand[g] += sum(q.num_tokens - q.num_computed_tokens for q in queued[g][: max(0, fits)])
            priority[g] = min(queued[g][0].priority, priority.get(g, queued[g][0].priority))
            if queued[g][0].pooled:
                pooled.add(g)
        self._cap_pooled(demand, pooled)
        shares: dict[Any, int] = {}
        for level in sorted(set(priority.values())):
            groups = sorted(((d, g) for g, d in demand.items() if priority[g] == level), key=lambda dg: dg[0])
            for n, (d, g) in enumerate(groups):
                shares[g] = min(d, budget // (len(groups) - n))
                budget -= shares[g]
        return shares

    def _cap_pooled(self, demand: Counter, pooled: set[Any]) -> None:
        """Embedding groups' demand this step: none while a prompt has tokens to prefill, else at most
        max_pooled_tokens_per_step split max-min fairly among them."""
        prompts = any(d > 0 for g, d in demand.items() if g not in pooled)
        limit = 0 if prompts else self.config.max_pooled_tokens_per_step
        if limit is None:
            return
        groups = sorted((g for g in pooled if demand[g] > 0), key=lambda g: demand[g])
        for n, g in enumerate(groups):
            demand[g] = min(demand[g], limit // (len(groups) - n))
            limit -= demand[g]

    def _slot_cap(self, queued: dict[Any, list[Sequence]]) -> int:
        """Running sequences one group may start more up to: an even split of the running set over the
        groups with work, so that a request of many short inputs leaves the others room every step."""
        groups = {s.group_key for s in self.running} | queued.keys()
        return max(1, self.config.max_num_seqs // max(1, len(groups)))

    def _turns(self, queued: dict[Any, list[Sequence]]) -> list[Any]:
        """Waiting groups in the order they are admitted: priority, fewest running sequences, arrival."""
        running = Counter(s.group_key for s in self.running)
        return sorted(queued, key=lambda g: (queued[g][0].priority, running[g], queued[g][0].arrival))

    def _admit(
        self, plan: SchedulerPlan, budget: int, shares: dict[Any, int], queued: dict[Any, list[Sequence]]
    ) -> None:
        """Start waiting sequences: by priority, then round-robin over their groups (the group with the
        fewest running sequences first), then first come first served; each group within its share of
        the tokens and of the running set's slots."""
        bm = self.block_manager
        queues = {g: deque(q) for g, q in queued.items()}
        running = Counter(s.group_key for s in self.running)
        heads = [(q[0].priority, running[g], q[0].arrival, g) for g, q in queues.items()]
        heapq.heapify(heads)
        cap = self._slot_cap(queued)
        while heads and budget > 0 and len(self.running) < self.config.max_num_seqs:
            *_, group = heapq.heappop(heads)
            if running[group] >= cap:
                continue  # its part of the running set is taken: the slots left are for the others
            seq = queues[group][0]
            if self.restore is not None and not seq.block_table:
                self.restore(seq)  # blocks of a prompt cache beyond the pool join the prefix cache
            match = bm.lookup_prefix(seq)
            computed = match.num_tokens if match.block_ids else seq.num_computed_tokens
            share = budget if self.config.whole_inputs else shares.get(group, 0)
            num_new = self._aligned(seq, computed, self._chunk(seq.num_tokens - computed, min(budget, share)))
            if seq.media:
                num_new = seq.media_cut(computed, num_new)
            if num_new <= 0:
                continue  # this group had its share of the step
            if not bm.can_allocate(seq, num_new, match if match.block_ids else None):
                break  # strict priority/FCFS: do not let later requests overtake the head
            queues[group].popleft()
            self.waiting.remove(seq)
            if not seq.block_table:
                bm.match_prefix(seq, match)  # also records the lookup in the hit-rate counters
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            self._schedule_seq(seq, num_new, plan)
            budget -= num_new
            shares[group] = shares.get(group, 0) - num_new
            running[group] += 1
            if queues[group]:
                nxt = queues[group][0]
                heapq.heappush(heads, (nxt.priority, running[group], nxt.arrival, group))

    def _chunk(self, remaining: int, budget: int) -> int:
        cap = self.config.long_prefill_chunk
        n = min(remaining, budget, cap) if cap is not None else min(remaining, budget)
        return 0 if self.config.whole_inputs and n < remaining else n

    def _aligned(self, seq: Sequence, computed: int, num_new: int) -> int:
        """num_new, or less so that a chunk finishing the sequence's tokens ends first on the last block
        boundary before its last token (align_prefill_ends): a prefix hit always leaves the last token to
        compute, so the same prompt sent again resumes there."""
        if not self.align_prefill_ends or num_new <= 1 or computed + num_new != seq.num_tokens:
            return num_new
        boundary = (seq.num_tokens - 1) // self.config.block_size * self.config.block_size
        return boundary - computed if boundary > computed else num_new

    def _schedule_seq(self, seq: Sequence, num_new: int, plan: SchedulerPlan) -> None:
        plan.block_copies.extend(self.block_manager.allocate(seq, num_new))
        plan.scheduled.append((seq, num_new))
        plan.num_batched_tokens += num_new
        if seq.num_computed_tokens + num_new == seq.num_tokens_with_spec and seq.samples:
            plan.sample_seq_ids.append(seq.seq_id)

    def _preempt(self, seq: Sequence, plan: SchedulerPlan) -> None:
        self.running.remove(seq)
        self.block_manager.free(seq)
        seq.num_computed_tokens = 0  # recompute prompt + generated tokens later (prefix cache may help)
        seq.num_cached_tokens = 0
        seq.spec_token_ids = []
        seq.num_preemptions += 1
        seq.status = SequenceStatus.PREEMPTED
        self.num_preemptions += 1
        plan.preempted.append(seq)
        self._enqueue(seq)

    def shift_context(self, seq: Sequence, keep: int) -> int:
        """Rolling window (SamplingParams.context_shift_keep): drop half the tokens after the first `keep`
        (the oldest; llama.cpp's context shift: n_discard = n_left / 2), prompt tokens before generated
        ones, and queue the sequence to recompute the kept window from scratch. llama.cpp keeps the kept
        tokens' KV and re-applies rope to their keys; here the window is re-prefilled (the paged, shared
        KV blocks are position-bound; the kept head is served from the prefix cache), which is correct and
        costs a prefill of the window per shift. The head kept is at most half the tokens, so that a shift
        drops at least a quarter of them. Returns how many tokens were dropped."""
        keep = max(0, min(keep, seq.num_tokens // 2))
        n_discard = (seq.num_tokens - keep) // 2
        from_prompt = min(n_discard, max(0, seq.num_prompt_tokens - keep))
        del seq.token_ids[keep : keep + n_discard]
        seq.num_prompt_tokens -= from_prompt
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.block_manager.free(seq)
        seq.num_computed_tokens = seq.num_cached_tokens = 0
        seq.spec_token_ids = []
        seq.status = SequenceStatus.PREEMPTED
        self._enqueue(seq)
        return n_discard

    def _enqueue(self, seq: Sequence) -> None:
        key = _importance(seq)
        pos = len(self.waiting)
        while pos > 0 and _importance(self.waiting[pos - 1]) > key:
            pos -= 1
        self.waiting.insert(pos, seq)

    def postprocess(self, plan: SchedulerPlan, sampled: dict[int, list[int]]) -> list[Sequence]:
        """Advance the plan's sequences, append sampled tokens and cache full blocks.

        sampled maps seq_id -> new tokens for the ids in plan.sample_seq_ids (others are ignored): one
        token, or with drafts the accepted ones followed by one more, already cut at the engine's stop
        rule (engine/request.py check_stop); the engine then finishes the sequences that stopped. Only
        positions whose token was accepted count as computed; blocks past them are released. Returns the
        sequences the scheduler itself finished this step (plan.finished).
        """
        bm = self.block_manager
        for seq, num_new in plan.scheduled:
            if seq.status != SequenceStatus.RUNNING:
                continue  # aborted between schedule() and postprocess()
            computed = seq.num_computed_tokens + num_new
            seq.spec_token_ids = []
            tokens = sampled.get(seq.seq_id) if computed >= seq.num_tokens else None
            for token in tokens or ():
                seq.append_token(token)
            # The last appended token is never computed yet; before it, every position the step scored
            # holds the token now in token_ids (a rejected draft's position is past it).
            seq.num_computed_tokens = min(computed, seq.num_tokens - 1 if tokens else seq.num_tokens)
            if computed > seq.num_computed_tokens:
                bm.trim(seq)
            bm.cache_full_blocks(seq)
        return list(plan.finished)

    # ---- gauges --------------------------------------------------------------------------------
    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def kv_usage(self) -> float:
        return self.block_manager.usage

    @property
    def prefix_cache_hit_rate(self) -> float:
        cache = self.block_manager.cache
        return cache.hit_rate if cache is not None else 0.0

    def stats(self) -> SchedulerStats:
        return SchedulerStats(
            num_running=self.num_running,
            num_waiting=self.num_waiting,
            kv_usage=self.kv_usage,
            num_preemptions=self.num_preemptions,
            prefix_cache_hit_rate=self.prefix_cache_hit_rate,
        )
