"""Model runner: owns the model and the paged KV storage; turns "compute these tokens of these sequences"
into one ForwardBatch and one forward pass. It knows nothing of scheduling."""

from __future__ import annotations

from collections.abc import Container, Sequence
from dataclasses import dataclass

import numpy as np

from edgellm.arch import ForwardBatch
from edgellm.backends.base import Backend
from edgellm.engine.conv_state import ConvStates, state_shape
from edgellm.engine.media import StepMedia
from edgellm.gguf.config import ModelConfig
from edgellm.lora.apply import step_for_batch
from edgellm.quants.kv_cache import get_kv_cache_type


@dataclass
class RunItem:
    """One sequence's share of a forward pass."""

    block_table: list[int]  # KV blocks of the sequence, in order (must cover start_pos + len(token_ids))
    token_ids: list[int]  # the tokens to compute now (a prefill chunk, or one decode token)
    start_pos: int  # position of token_ids[0] (= tokens already in the KV cache)
    all_logits: bool = False  # logits at every token (teacher-forced scoring) rather than the last only
    need_logits: bool = True  # False for a prefill chunk that does not reach the end of the prompt
    hidden_rows: np.ndarray | None = None  # [H] offsets into token_ids whose final hidden states to return
    num_logits: int = 1  # with need_logits: rows for this many last tokens (1 + drafts when verifying)
    # the scheduler's sequence id: a recurrent model's conv state is kept per id (engine/conv_state.py);
    # None: the one anonymous state (one sequence at a time: warm-up, scripts)
    seq_id: int | None = None
    # the LoRA adapters this item's tokens run with: ((index into runner.lora_adapters, scale), ...)
    lora: tuple[tuple[int, float], ...] = ()
    # the sequence's tokens (at least start_pos + len(token_ids) of them): a recurrent model checkpoints
    # its state at block boundaries under their hash, and resumes a prefix-cache hit from one
    history: Sequence[int] | None = None
    media: StepMedia | None = None  # image rows among token_ids (engine/media.py)


class ModelRunner:
    def __init__(
        self, model, cfg: ModelConfig, be: Backend, num_blocks: int, block_size: int, kv_dtype: str = "f16"
    ) -> None:
        self.model, self.cfg, self.be = model, cfg, be
        self.num_blocks, self.block_size, self.kv_dtype = num_blocks, block_size, kv_dtype
        self.kv = be.alloc_kv(
            cfg.n_kv_layers, num_blocks, block_size, cfg.n_kv_heads, cfg.head_dim, cfg.head_dim_v, kv_dtype
        )
        # Each item's requested hidden states from the latest forward pass ([H, n_embd] float32, host), in
        # item order: the run methods return logits, embeddings read these.
        self.last_hidden: list[np.ndarray] = []
        # each sequence's state beside its KV blocks, for models that have one (LFM2's short convolutions)
        self.conv_states = ConvStates(state_shape(cfg), block_size) if cfg.recurrent else None
        # the loaded LoRA adapters (edgellm/lora/), bound to this model; RunItem.lora indexes them
        self.lora_adapters: list = []

    @staticmethod
    def kv_bytes_per_token(cfg: ModelConfig, kv_dtype: str = "f16") -> int:
        """KV bytes one token takes (all layers, K and V) in cache type kv_dtype; ValueError for an unknown
        type or head sizes it cannot hold."""
        kvt = get_kv_cache_type(kv_dtype)
        kvt.check_head_dims(cfg.head_dim, cfg.head_dim_v)
        return kvt.bytes_per_token(cfg.n_kv_layers, cfg.n_kv_heads, cfg.head_dim, cfg.head_dim_v)

    @staticmethod
    def kv_bytes_per_block(cfg: ModelConfig, block_size: int, kv_dtype: str = "f16") -> int:
        return block_size * ModelRunner.kv_bytes_per_token(cfg, kv_dtype)

    def build_batch(self, items: list[RunItem]) -> tuple[ForwardBatch, list[slice]]:
        bs = self.block_size
        max_blocks = max(len(it.block_table) for it in items)
        tables = np.zeros((len(items), max_blocks), dtype=np.int32)
        tok, pos, seq, slots, logit_rows, out_slices, hidden = [], [], [], [], [], [], []
        media_rows, media_embeds, attn_pos = [], [], []
        t0 = 0
        for s, it in enumerate(items):
            n = len(it.token_ids)
            if (it.start_pos + n + bs - 1) // bs > len(it.block_table):
                raise ValueError(
                    f"block table of {len(it.block_table)} blocks cannot hold {it.start_pos + n} tokens"
                )
            tables[s, : len(it.block_table)] = it.block_table
            p = np.arange(it.start_pos, it.start_pos + n, dtype=np.int64)
            tok.extend(it.token_ids)
            pos.append(p)
            seq.append(np.full(n, s, dtype=np.int32))
            slots.append(tables[s, p // bs].astype(np.int64) * bs + p % bs)
            first = len(logit_rows)
            if it.all_logits:
                logit_rows.extend(range(t0, t0 + n))
            elif it.need_logits:
                if not 0 < it.num_logits <= n:
                    raise ValueError(f"num_logits={it.num_logits} for {n} tokens")
                logit_rows.extend(range(t0 + n - it.num_logits, t0 + n))
            out_slices.append(slice(first, len(logit_rows)))
            if it.hidden_rows is not None and len(it.hidden_rows):
                if it.hidden_rows.min() < 0 or it.hidden_rows.max() >= n:
                    raise ValueError(f"hidden rows {it.hidden_rows} outside a chunk of {n} tokens")
                hidden.append(t0 + it.hidden_rows.astype(np.int32))
            m = it.media
            if m is not None:
                if len(m.rows) and (m.rows.min() < 0 or m.rows.max() >= n or len(m.embeds) != len(m.rows)):
                    raise ValueError(f"image rows {m.rows} do not fit a chunk of {n} tokens")
                media_rows.append(t0 + m.rows)
                media_embeds.append(m.embeds)
            limits = m.attn_positions if m is not None else None
            # the kernels read the block table up to each limit unchecked: inside this chunk's tokens
            if limits is not None and (
                limits.shape != (n,) or (limits < p).any() or (limits >= it.start_pos + n).any()
            ):
                raise ValueError(f"causal limits {limits} outside a chunk at {it.start_pos} of {n} tokens")
            attn_pos.append(p.astype(np.int32) if limits is None else limits)
            t0 += n
        batch = ForwardBatch(
            token_ids=np.asarray(tok, dtype=np.int32),
            positions=np.concatenate(pos).astype(np.int32),
            seq_index=np.concatenate(seq),
            block_tables=tables,
            slots=np.concatenate(slots),
            logits_index=np.asarray(logit_rows, dtype=np.int32),
            hidden_index=np.concatenate(hidden) if hidden else np.empty(0, np.int32),
        )
        if any(it.lora for it in items):
            for it in items:
                if any(not 0 <= k < len(self.lora_adapters) for k, _ in it.lora):
                    raise ValueError(f"LoRA choice {it.lora} names an adapter not loaded")
            counts = [len(it.token_ids) for it in items]
            choices = [it.lora for it in items]
            batch.lora = step_for_batch(self.lora_adapters, choices, counts, batch.logits_index, self.be)
        if media_rows:
            batch.embed_rows = np.concatenate(media_rows).astype(np.int32)
            batch.embeds = np.concatenate(media_embeds)
            if any(it.media is not None and it.media.attn_positions is not None for it in items):
                batch.attn_positions = np.concatenate(attn_pos).astype(np.int32)
        if self.conv_states is not None:
            keys, starts = [it.seq_id for it in items], [it.start_pos for it in items]
            for it in items:  # a prefix-cache hit starts from the checkpoint at its first uncached token
                self.conv_states.resume(it.seq_id, it.start_pos, it.history)
            batch.conv_state = self.conv_states.gather(keys, starts)
        return batch, out_slices

    def _forward(self, items: list[RunItem], batch: ForwardBatch):  # noqa: ANN202 - a backend array
        """model.forward's logits; with the hidden states items asked for, split per item into
        last_hidden. Keeps the conv states the pass advanced."""
        if not len(batch.hidden_index):
            self.last_hidden = [np.empty((0, self.cfg.n_embd), np.float32)] * len(items)
            logits = self.model.forward(batch, self.kv)
            self._keep_states(items, batch)
            return logits
        logits, hidden = self.model.forward_hidden(batch, self.kv)
        self._keep_states(items, batch)
        rows = self.be.to_host(hidden)  # [H, n_embd]
        counts = [0 if it.hidden_rows is None else len(it.hidden_rows) for it in items]
        self.last_hidden = np.split(rows, np.cumsum(counts)[:-1])
        return logits

    def _keep_states(self, items: list[RunItem], batch: ForwardBatch) -> None:
        if self.conv_states is not None:
            keys, ends = [it.seq_id for it in items], [it.start_pos + len(it.token_ids) for it in items]
            self.conv_states.store(keys, ends, batch.conv_state)
            self.conv_states.checkpoint(keys, ends, [it.history for it in items])

    def resume_point(self, token_ids: Sequence[int], limit: int) -> int:
        """How much of a prefix-cache hit of `limit` tokens a recurrent model can resume (a checkpointed
        prefix of whole blocks); limit itself for a model without state."""
        return limit if self.conv_states is None else self.conv_states.resume_point(token_ids, limit)

    def fork_state(self, parent_id: int, child_id: int) -> None:
        """A child sharing its parent's blocks (parallel sampling) continues from the parent's state."""
        if self.conv_states is not None:
            self.conv_states.fork(parent_id, child_id)

    def retain_states(self, live_ids: Container[int]) -> None:
        """Free the per-sequence state of every sequence not in live_ids (finished or aborted)."""
        if self.conv_states is not None:
            self.conv_states.retain(live_ids)

    def run(self, items: list[RunItem]) -> list[np.ndarray]:
        """One forward pass over every item; returns each item's logits rows ([0|1|n, n_vocab])."""
        batch, out_slices = self.build_batch(items)
        logits = self.be.to_host(self._forward(items, batch))  # [L, n_vocab]; L may be 0
        return [logits[sl] for sl in out_slices]

    def run_argmax(self, items: list[RunItem]) -> list[np.ndarray]:
        """As run(), but each logits row comes back as its argmax only, computed by the backend (on the
        device for CUDA: the logits never cross the bus)."""
        batch, out_slices = self.build_batch(items)
        logits = self._forward(items, batch)
        ids = self.be.argmax(logits) if len(batch.logits_index) else np.empty(0, np.int32)
        return [ids[sl] for sl in out_slices]

    def run_top_k(self, items: list[RunItem], k: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """As run(), but each logits row comes back as its k best (values, ids), best first (see top_k)."""
        batch, out_slices = self.build_batch(items)
        logits = self._forward(items, batch)
        if len(batch.logits_index):
            vals, ids = self.be.top_k(logits, k)
        else:
            vals, ids = np.empty((0, k), np.float32), np.empty((0, k), np.int32)
        return [(vals[sl], ids[sl]) for sl in out_slices]

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        if pairs:
            self.be.copy_blocks(self.kv, pairs)
