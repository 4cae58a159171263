"""Per-sequence recurrent state beside the paged KV cache (cfg.recurrent: LFM2's short-conv layers, Qwen 3.5's
Gated DeltaNet layers).

A sequence's KV blocks say what attention layers need of its past; a conv layer needs the last l_cache - 1
inputs instead, which no block holds. The store keeps one [conv layers, l_cache - 1, n_embd] float32 array
per sequence id, tagged with how many tokens it has consumed:

- a run item starting at position 0 (a new sequence, or a recompute after preemption) starts from zeros;
- one starting at p > 0 continues the state only if the state has consumed exactly p tokens, else it is
  refused: the state of a prefix-cache hit, or of drafts rejected after speculative decoding, cannot be
  restored (the engine turns both off for such models), and silently continuing a wrong state would give
  wrong logits;
- `fork` copies a parent's state to a child that shares its blocks (parallel sampling);
- `retain` frees the states of sequences that are no longer live (finished, aborted).

Run items without a sequence id (warm-up, scripts, tests of the runner) share one anonymous state: they
run one sequence at a time, in order.
"""

from __future__ import annotations

from collections.abc import Container

import numpy as np

ANONYMOUS = None  # the key of items without a sequence id


def state_shape(cfg) -> tuple[int, ...]:  # noqa: ANN001 - gguf.config.ModelConfig
    """One sequence's state, float32: LFM2's [conv layers, l_cache - 1 past inputs, n_embd]; a Gated
    DeltaNet model's [DeltaNet layers, its conv window and matrices flat] (arch/deltanet.py state_size)."""
    if cfg.ssm_d_state:
        from edgellm.arch.deltanet import state_size

        return (sum(cfg.conv_layers), state_size(cfg))
    return (sum(cfg.conv_layers), max(0, cfg.conv_l_cache - 1), cfg.n_embd)


class ConvStates:
    def __init__(self, shape: tuple[int, ...]) -> None:
        self.shape = tuple(shape)
        self._states: dict[int | None, np.ndarray] = {}
        self._consumed: dict[int | None, int] = {}

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
                    "recurrent model continues a sequence only from where its last step ended (no "
                    "prefix-cache hits or speculative rollback)"
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
