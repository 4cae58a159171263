"""Paged KV-cache bookkeeping over plain ints: block tables, refcounts, free list, copy-on-write.

Never touches an array: the model runner owns the KV tensors and applies the (src, dst) block copies that
`allocate` reports before it runs the step that writes into dst.

Free-block accounting: a block is either in use (refcount > 0), on the free list, or cached with
refcount 0 ("evictable"). Allocation takes the free list first and evicts cached blocks (LRU) only when the
free list is empty, so an idle prefix stays reusable as long as possible. `num_free_blocks` counts both
free-list and evictable blocks, because both can be handed out.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from edgellm.engine.prefix_cache import HashPrefixCache, PrefixCache
from edgellm.engine.sequence import Sequence

BlockCopy = tuple[int, int]  # (src_block, dst_block)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class PrefixMatch:
    """Result of a side-effect-free prefix lookup: blocks to share and tokens they make computed."""

    block_ids: tuple[int, ...]
    num_tokens: int  # < len(seq.token_ids): the last token is always recomputed so logits exist


_NO_MATCH = PrefixMatch((), 0)


class BlockManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int = 16,
        enable_prefix_caching: bool = True,
        prefix_cache: PrefixCache | None = None,
    ) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.free_list: deque[int] = deque(range(num_blocks))  # pop left, freed blocks go right
        self.refcounts: list[int] = [0] * num_blocks
        if prefix_cache is None and enable_prefix_caching:
            prefix_cache = HashPrefixCache(block_size)
        self.cache: PrefixCache | None = prefix_cache
        # A model with a recurrent state resumes only where its state was checkpointed: (tokens, cached
        # tokens) -> the longest resumable prefix (ModelRunner.resume_point); None: any block boundary
        self.resume_point: Callable[[list[int], int], int] | None = None
        # seq_id -> how many leading full blocks of that sequence were already offered to the cache.
        self._num_registered: dict[int, int] = {}

    # ---- gauges -------------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation can get right now: free list plus unused cached blocks."""
        return len(self.free_list) + (self.cache.num_evictable if self.cache else 0)

    @property
    def usage(self) -> float:
        """Fraction of the pool held by live sequences (evictable cached blocks count as free)."""
        return 1.0 - self.num_free_blocks / self.num_blocks

    # ---- prefix caching ------------------------------------------------------------------------
    def lookup_prefix(self, seq: Sequence) -> PrefixMatch:
        """Longest cached full-block prefix of seq, capped to leave the last token to compute."""
        if self.cache is None or seq.block_table or seq.num_computed_tokens or not seq.samples:
            return _NO_MATCH  # (an embedding or a scoring needs every token's row: it computes them all)
        blocks = self.cache.lookup(seq.cache_ids, seq.lora)
        num_tokens = min(len(blocks) * self.block_size, seq.num_tokens - 1)
        if self.resume_point is not None and num_tokens > 0:
            num_tokens = self.resume_point(seq.token_ids, num_tokens)
        if num_tokens <= 0:
            return _NO_MATCH
        # A whole-prompt hit keeps the last (full) block: it is shared and gets copied on write, so only
        # one token is recomputed instead of a whole block.
        return PrefixMatch(tuple(blocks[: cdiv(num_tokens, self.block_size)]), num_tokens)

    def match_prefix(self, seq: Sequence, match: PrefixMatch | None = None) -> int:
        """Commit a prefix hit (lookup_prefix's, or a fresh one): share the blocks and mark tokens computed.

        Call once, on a sequence with no blocks, before allocate(). Returns the number of cached tokens.
        """
        if match is None:
            match = self.lookup_prefix(seq)
        if seq.block_table or seq.num_computed_tokens:
            raise ValueError(f"sequence {seq.seq_id}: prefix matching needs a sequence with no KV yet")
        for block_id in match.block_ids:
            self._incref(block_id)
        seq.block_table = list(match.block_ids)
        seq.num_computed_tokens = seq.num_cached_tokens = match.num_tokens
        self._num_registered[seq.seq_id] = match.num_tokens // self.block_size
        if self.cache is not None:
            self.cache.record(match.num_tokens, seq.num_tokens)
        return match.num_tokens

    def restore_blocks(self, token_ids: list[int], first: int, count: int, salt: tuple = ()) -> list[int]:
        """Take `count` blocks for full blocks first .. first+count-1 of token_ids (whose first `first`
        blocks the prefix cache holds under `salt`, the LoRA choice) and register them in the prefix cache
        as unused cached blocks. The caller writes their KV before any step reads them
        (engine/prompt_cache.py's restore)."""
        if self.cache is None or count <= 0:
            return []
        held = self.cache.lookup(token_ids, salt)[:first]
        if len(held) != first:
            raise ValueError(f"restore_blocks: the cache holds {len(held)} leading blocks, not {first}")
        for block_id in held:  # not evictable while new blocks are taken
            self._incref(block_id)
        taken = [self._take_block() for _ in range(count)]
        self.cache.insert(token_ids[: (first + count) * self.block_size], held + taken, salt)
        for block_id in [*held, *taken]:
            self._decref(block_id)
        return taken

    def cache_full_blocks(self, seq: Sequence) -> int:
        """Offer the sequence's newly completed full blocks to the prefix cache; returns how many were new."""
        if self.cache is None:
            return 0
        num_full = min(seq.num_computed_tokens // self.block_size, len(seq.block_table))
        if num_full <= self._num_registered.get(seq.seq_id, 0):
            return 0
        self._num_registered[seq.seq_id] = num_full
        return self.cache.insert(
            seq.cache_ids[: num_full * self.block_size], seq.block_table[:num_full], seq.lora
        )

    # ---- allocation ----------------------------------------------------------------------------
    def _is_writable(self, block_id: int) -> bool:
        # Shared blocks and cached blocks hold content someone else may read: write to a copy instead.
        return self.refcounts[block_id] == 1 and not (self.cache and self.cache.contains_block(block_id))

    def num_blocks_needed(self, seq: Sequence, num_new_tokens: int, match: PrefixMatch | None = None) -> int:
        """Blocks allocate() would take from the pool: new table entries plus copy-on-write copies, plus
        (with `match`) matched blocks that are currently evictable and would stop being free."""
        table = list(match.block_ids) if match else seq.block_table
        computed = match.num_tokens if match else seq.num_computed_tokens
        end_block = cdiv(computed + num_new_tokens, self.block_size)
        if num_new_tokens <= 0:
            end_block = 0
        copies = sum(
            1
            for i in range(computed // self.block_size, min(len(table), end_block))
            if match is not None or not self._is_writable(table[i])  # matched blocks are all cached
        )
        reclaimed = sum(1 for b in table if self.refcounts[b] == 0) if match else 0
        return max(0, end_block - len(table)) + copies + reclaimed

    def can_allocate(self, seq: Sequence, num_new_tokens: int, match: PrefixMatch | None = None) -> bool:
        """Whether seq can grow to cover (its computed tokens, or match's) + num_new_tokens right now."""
        return self.num_blocks_needed(seq, num_new_tokens, match) <= self.num_free_blocks

    def allocate(self, seq: Sequence, num_new_tokens: int) -> list[BlockCopy]:
        """Make seq's block table cover num_computed_tokens + num_new_tokens and make the blocks those new
        tokens are written into private. Returns the (src, dst) copies to apply, in order, before the step."""
        if not self.can_allocate(seq, num_new_tokens):
            raise RuntimeError(
                f"sequence {seq.seq_id}: {self.num_blocks_needed(seq, num_new_tokens)} blocks needed, "
                f"{self.num_free_blocks} free"
            )
        if num_new_tokens <= 0:
            return []
        table = seq.block_table
        end_block = cdiv(seq.num_computed_tokens + num_new_tokens, self.block_size)
        copies: list[BlockCopy] = []
        for i in range(seq.num_computed_tokens // self.block_size, min(len(table), end_block)):
            src = table[i]
            if not self._is_writable(src):
                dst = self._take_block()
                copies.append((src, dst))
                table[i] = dst
                self._decref(src)
        while len(table) < end_block:
            table.append(self._take_block())
        return copies

    def free(self, seq: Sequence) -> None:
        """Drop seq's references. Tail blocks are released first so that, among one sequence's cached
        blocks, the least shareable (last) ones are evicted first."""
        for block_id in reversed(seq.block_table):
            self._decref(block_id)
        seq.block_table = []
        self._num_registered.pop(seq.seq_id, None)

    def trim(self, seq: Sequence) -> int:
        """Release the blocks past seq's computed tokens (KV of rejected draft tokens): the table keeps
        cdiv(num_computed_tokens, block_size) blocks. Returns how many were released."""
        keep = cdiv(seq.num_computed_tokens, self.block_size)
        extra = seq.block_table[keep:]
        for block_id in reversed(extra):
            self._decref(block_id)
        del seq.block_table[keep:]
        return len(extra)

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """Child shares all of parent's blocks (refcount+1 each); writes later trigger copy-on-write."""
        if child.block_table:
            raise ValueError(f"sequence {child.seq_id} already owns blocks")
        if child.token_ids[: parent.num_computed_tokens] != parent.token_ids[: parent.num_computed_tokens]:
            raise ValueError("fork: child must start with the parent's computed tokens")
        for block_id in parent.block_table:
            self._incref(block_id)
        child.block_table = list(parent.block_table)
        child.num_computed_tokens = parent.num_computed_tokens
        self._num_registered[child.seq_id] = self._num_registered.get(parent.seq_id, 0)

    def slot_mapping(self, seq: Sequence, start: int, num_tokens: int) -> list[int]:
        """Flat KV slot (block_id * block_size + offset) of token positions start..start+num_tokens-1."""
        bs = self.block_size
        return [seq.block_table[p // bs] * bs + p % bs for p in range(start, start + num_tokens)]

    # ---- refcounting ---------------------------------------------------------------------------
    def _take_block(self) -> int:
        if self.free_list:
            block_id = self.free_list.popleft()
        elif self.cache is not None and self.cache.num_evictable:
            block_id = self.cache.evict(1)[0]
        else:
            raise RuntimeError("KV block pool exhausted")
        self.refcounts[block_id] = 1
        return block_id

    def _incref(self, block_id: int) -> None:
        if self.refcounts[block_id] == 0:
            if self.cache is None or not self.cache.contains_block(block_id):
                raise RuntimeError(f"block {block_id} is free; it cannot be shared")
            self.cache.acquire(block_id)  # an evictable cached block is reused: no longer evictable
        self.refcounts[block_id] += 1

    def _decref(self, block_id: int) -> None:
        if self.refcounts[block_id] <= 0:
            raise RuntimeError(f"block {block_id} freed twice")
        self.refcounts[block_id] -= 1
        if self.refcounts[block_id] == 0 and not (self.cache and self.cache.release(block_id)):
            self.free_list.append(block_id)
