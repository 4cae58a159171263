"""Per-sequence recurrent state beside the paged KV cache (cfg.recurrent: LFM2's short-conv layers, Qwen 3.5's
Gated DeltaNet layers).

A sequence's KV blocks say what attention layers need of its past; a conv layer needs the last l_cache - 1
inputs instead (a DeltaNet layer its conv window and matrices), which no block holds. The store keeps one
float32 array of `state_shape` per sequence id, tagged with how many tokens it has consumed:

- a run item starting at position 0 (a new sequence, or a recompute after preemption) starts from zeros;
- one starting at p > 0 continues the state only if the state has consumed exactly p tokens, or resumes
  from a checkpoint after its first p tokens (below), else it is refused: the state of drafts rejected
  after speculative decoding cannot be restored (the engine refuses speculation for such models), and
  silently continuing a wrong state would give wrong logits;
- `fork` copies a parent's state to a child that shares its blocks (parallel sampling);
- `retain` frees the states of sequences that are no longer live (finished, aborted);
- checkpoints make prefix-cache hits possible: whenever a sequence's state has consumed a whole number of
  KV blocks (`checkpoint`), a copy is kept under a hash of those tokens (LRU, at most `max_checkpoints`);
  the block manager caps a prefix hit to the longest such prefix (`resume_point`), and a sequence starting
  there with no state of its own takes a copy of it (`resume`). The state after given tokens is the same
  whichever sequence computed it, as the blocks holding their K/V are.

Run items without a sequence id (warm-up, scripts, tests of the runner) share one anonymous state: they
run one sequence at a time, in order.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Container, Sequence

import numpy as np

ANONYMOUS = None  # the key of items without a sequence id
# Memory for checkpoints (whole states: ~20 MB per Qwen3.5-0.8B sequence, ~1 MB for LFM2-1.2B)
CHECKPOINT_BYTES = 512 << 20


def prefix_key(token_ids: Sequence[int]) -> bytes:
    """A checkpoint's key: a hash of the tokens its state has consumed."""
    return hashlib.blake2b(np.asarray(token_ids, np.int64).tobytes(), digest_size=16).digest()


def state_shape(cfg) -> tuple[int, ...]:  # noqa: ANN001 - gguf.config.ModelConfig
    """One sequence's state, float32: LFM2's [conv layers, l_cache - 1 past inputs, n_embd]; a Gated
    DeltaNet model's [DeltaNet layers, its conv window and matrices flat] (arch/deltanet.py state_size)."""
    if cfg.ssm_d_state:
        from edgellm.arch.deltanet import state_size

        return (sum(cfg.conv_layers), state_size(cfg))
    return (sum(cfg.conv_layers), max(0, cfg.conv_l_cache - 1), cfg.n_embd)


class ConvStates:
    def __init__(self, shape: tuple[int, ...], block_size: int = 0, checkpoint_bytes: int = CHECKPOINT_BYTES):
        self.shape = tuple(shape)
        self._states: dict[int | None, np.ndarray] = {}
        self._consumed: dict[int | None, int] = {}
        self.block_size = block_size  # 0: no checkpoints
        state_bytes = max(1, int(np.prod(self.shape)) * 4)
        self.max_checkpoints = checkpoint_bytes // state_bytes if block_size else 0
        self._checkpoints: OrderedDict[bytes, np.ndarray] = OrderedDict()  # least recently used first

    # ---- checkpoints at block boundaries (prefix-cache hits) ----------------------------------
    def checkpoint(
        self, keys: list[int | None], ends: list[int], histories: list[Sequence[int] | None]
    ) -> None:
        """Keep a copy of each stored state that has consumed a whole number of blocks (history: the
        sequence's tokens, at least its first `end`)."""
        if not self.max_checkpoints:
            return
        for key, end, history in zip(keys, ends, histories, strict=True):
            if history is None or end <= 0 or end % self.block_size or self._consumed.get(key) != end:
                continue
            ck = prefix_key(history[:end])
            self._checkpoints[ck] = self._states[key].copy()
            self._checkpoints.move_to_end(ck)
            while len(self._checkpoints) > self.max_checkpoints:
                self._checkpoints.popitem(last=False)

    def resume_point(self, token_ids: Sequence[int], limit: int) -> int:
        """The longest prefix of token_ids, at most `limit` tokens and a whole number of blocks, whose
        state is checkpointed; 0 if none."""
        if not self._checkpoints:
            return 0
        n = limit - limit % self.block_size
        while n > 0 and prefix_key(token_ids[:n]) not in self._checkpoints:
            n -= self.block_size
        return n

    def resume(self, key: int | None, start: int, history: Sequence[int] | None) -> None:
        """A sequence starting at `start` > 0 without a state of its own (a prefix-cache hit) takes a copy
        of the checkpoint after history[:start], when there is one (gather refuses it otherwise)."""
        if start == 0 or history is None or self._consumed.get(key) == start:
            return
        ck = prefix_key(history[:start])
        state = self._checkpoints.get(ck)
        if state is not None:
            self._checkpoints.move_to_end(ck)
            self._states[key], self._consumed[key] = state.copy(), start

    def __len__(self) -> int:
        return len(self._states)

    def gather(self, keys: list[int | None], starts: list[int]) -> np.ndarray:
        """[S, *shape] float32: the state of each item before its tokens (a copy the forward pass
        advances in place; `store` keeps it)."""
        if len(set(keys)) != len(keys):
            raise ValueError(f"a batch holds one sequence twice (ids {keys}): each has one conv state")
        out = np.zeros((len(keys), *self.shape), np.float32)
        for i, (key, start) in enumerate(zip(keys, starts, strict=True)):
            if start == 0:
                continue
            have = self._consumed.get(key)
            if have != start:
                what = "no state" if have is None else f"a state after {have} tokens"
                raise ValueError(
                    f"sequence {key}: computing from position {start}, but its conv state is {what}: a "
                    "recurrent model continues a sequence only from where its last step ended or from a "
                    "checkpoint at a block boundary (no speculative rollback)"
                )
            out[i] = self._states[key]
        return out

    def store(self, keys: list[int | None], ends: list[int], states: np.ndarray) -> None:
        """Keep each item's advanced state, having consumed `ends[i]` tokens."""
        for i, (key, end) in enumerate(zip(keys, ends, strict=True)):
            self._states[key] = states[i].copy()
            self._consumed[key] = end

    def fork(self, parent: int, child: int) -> None:
        if parent in self._states:
            self._states[child] = self._states[parent].copy()
            self._consumed[child] = self._consumed[parent]

    def retain(self, live: Container[int]) -> None:
        """Free the state of every sequence id not in `live` (the anonymous one stays)."""
        for key in [k for k in self._states if k is not ANONYMOUS and k not in live]:
            del self._states[key], self._consumed[key]
