"""Draft-model proposer: a smaller GGUF with the target's vocabulary, run by the same engine core on its
own paged KV cache (its own block manager, no prefix caching), proposing its greedy continuation.

Per target sequence the draft keeps a shadow Sequence whose computed tokens are what its KV holds. Before
proposing, the KV is kept over the longest prefix that still matches the target's tokens (accepted drafts
stay, rejected ones are rolled back), the rest of the target's tokens are computed in one batched forward
(with every other sequence's), and k - 1 more one-token forwards extend the argmax chain to k drafts.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from edgellm.engine.block_manager import BlockManager
from edgellm.engine.model_runner import ModelRunner, RunItem
from edgellm.engine.sequence import Sequence


def _common_prefix(a: list[int], b: list[int], limit: int) -> int:
    n = min(len(a), len(b), limit)
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class DraftProposer:
    def __init__(self, runner: ModelRunner, cost: float) -> None:
        self.runner = runner
        self.cost = cost  # one draft token's forward, in target decode steps (the weight bytes they stream)
        self.bm = BlockManager(runner.num_blocks, runner.block_size, enable_prefix_caching=False)
        self._shadow: dict[int, Sequence] = {}  # target seq_id -> the draft's view of it

    @classmethod
    def load(cls, path: str, core: Any, log: Callable[[str], None] | None = None) -> DraftProposer:
        """Load the draft next to the target of `core` (an EngineCoreProc being built): same backend, the same
        number of KV tokens as the target's cache."""
        from edgellm.arch import ARCHITECTURES
        from edgellm.arch.common import weight_bytes_per_token
        from edgellm.gguf.config import config_from_gguf
        from edgellm.gguf.load import load_gguf
        from edgellm.gguf.validation import validate_model

        target = core.runner
        if os.path.samefile(path, core.path):  # the target drafting for itself (tests, benchmarks)
            cfg, model = target.cfg, target.model  # shared weights; the KV cache is still its own
        else:
            gguf = load_gguf(path)
            cfg = config_from_gguf(gguf)
            validate_model(gguf, cfg)
            cfg.set_context(core.n_ctx)  # the target's window (LongRoPE's factors depend on it)
            if cfg.recurrent:  # its runner drafts with rollback, which a conv state cannot take
                raise ValueError(f"a {cfg.arch} model cannot be a draft model (per-sequence conv state)")
            if cfg.n_vocab != core.config.n_vocab:
                raise ValueError(f"draft model has {cfg.n_vocab} tokens, the target {core.config.n_vocab}")
            model = ARCHITECTURES[cfg.arch](cfg, gguf, core.backend, None)
        runner = ModelRunner(model, cfg, core.backend, target.num_blocks, target.block_size)
        if log:
            per_block = ModelRunner.kv_bytes_per_block(cfg, target.block_size)
            log(
                f"draft model {os.path.basename(path)}: {cfg.arch}, {cfg.n_layers} layers; its KV cache "
                f"{target.num_blocks * per_block / 2**20:.0f} MiB"
            )
        return cls(runner, weight_bytes_per_token(model) / weight_bytes_per_token(target.model))

    def propose(self, requests: list[tuple[Sequence, int]]) -> list[list[int]]:
        drafts: list[list[int]] = [[] for _ in requests]
        live: list[tuple[int, Sequence, int]] = []  # (request index, shadow, k)
        for i, (seq, k) in enumerate(requests):
            shadow = self._sync(seq)
            if shadow is not None and k > 0:
                live.append((i, shadow, k))
        for step in range(max((k for _, _, k in live), default=0)):
            batch = []
            for i, shadow, k in live:
                if step >= k:
                    continue
                n = shadow.num_uncomputed_tokens
                if not self.bm.can_allocate(shadow, n):
                    self.forget_shadow(shadow)  # the draft's pool is full: this one goes without drafts
                    continue
                self.bm.allocate(shadow, n)
                batch.append((i, shadow))
            if not batch:
                break
            items = [
                RunItem(s.block_table, s.token_ids[s.num_computed_tokens :], s.num_computed_tokens)
                for _, s in batch
            ]
            for (i, shadow), ids in zip(batch, self.runner.run_argmax(items), strict=True):
                shadow.num_computed_tokens = shadow.num_tokens
                tok = int(ids[-1])
                drafts[i].append(tok)
                shadow.append_token(tok)
            live = [(i, s, k) for i, s, k in live if self._shadow.get(s.seq_id) is s]
        return drafts

    def _sync(self, seq: Sequence) -> Sequence | None:
        """The shadow of seq with its KV rolled back to the prefix still shared with seq.token_ids and its
        tokens set to seq's (the uncomputed rest is computed by the first forward)."""
        shadow = self._shadow.get(seq.seq_id)
        if shadow is None:
            shadow = self._shadow[seq.seq_id] = Sequence(seq.seq_id, [seq.token_ids[0]])
        valid = _common_prefix(shadow.token_ids, seq.token_ids, shadow.num_computed_tokens)
        shadow.num_computed_tokens = min(valid, seq.num_tokens - 1)
        self.bm.trim(shadow)
        shadow.token_ids = list(seq.token_ids)
        return shadow

    def forget_shadow(self, shadow: Sequence) -> None:
        self.bm.free(shadow)
        self._shadow.pop(shadow.seq_id, None)

    def drop(self, seq_id: int) -> None:
        shadow = self._shadow.get(seq_id)
        if shadow is not None:
            self.forget_shadow(shadow)
