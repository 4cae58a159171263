"""Exact bookkeeping of the paged KV block manager and the hashed prefix cache (block_size 4, tiny pools)."""

from __future__ import annotations

import pytest

from edgellm.engine.block_manager import BlockManager, PrefixMatch
from edgellm.engine.prefix_cache import HashPrefixCache
from edgellm.engine.sequence import Sequence


def computed(bm: BlockManager, seq: Sequence, num_new: int) -> list[tuple[int, int]]:
    """Allocate, then pretend the step ran: advance the computed count and cache full blocks."""
    copies = bm.allocate(seq, num_new)
    seq.num_computed_tokens += num_new
    bm.cache_full_blocks(seq)
    return copies


def cache_of(bm: BlockManager) -> HashPrefixCache:
    assert isinstance(bm.cache, HashPrefixCache)
    return bm.cache


def test_allocate_grows_block_table_and_free_returns_blocks_in_reverse() -> None:
    bm = BlockManager(num_blocks=6, block_size=4, enable_prefix_caching=False)
    a = Sequence(0, list(range(10)))
    assert bm.num_blocks_needed(a, 10) == 3
    assert bm.can_allocate(a, 10)
    assert bm.allocate(a, 10) == []
    assert a.block_table == [0, 1, 2]
    assert bm.refcounts == [1, 1, 1, 0, 0, 0]
    assert bm.num_free_blocks == 3
    assert bm.usage == pytest.approx(0.5)

    a.num_computed_tokens = 10
    assert bm.num_blocks_needed(a, 2) == 0  # positions 10, 11 still fit block 2
    bm.allocate(a, 2)
    a.num_computed_tokens = 12
    bm.allocate(a, 1)  # position 12 opens logical block 3
    assert a.block_table == [0, 1, 2, 3]
    assert list(bm.free_list) == [4, 5]

    bm.free(a)
    assert a.block_table == []
    assert bm.refcounts == [0] * 6
    assert list(bm.free_list) == [4, 5, 3, 2, 1, 0]
    b = Sequence(1, list(range(9)))
    bm.allocate(b, 9)
    assert b.block_table == [4, 5, 3]


def test_allocate_refuses_beyond_pool() -> None:
    bm = BlockManager(num_blocks=2, block_size=4, enable_prefix_caching=False)
    a = Sequence(0, list(range(9)))
    assert not bm.can_allocate(a, 9)
    with pytest.raises(RuntimeError, match="3 blocks needed, 2 free"):
        bm.allocate(a, 9)
    assert a.block_table == [] and bm.num_free_blocks == 2


def test_prefix_hit_shares_full_blocks_and_computes_only_the_suffix() -> None:
    bm = BlockManager(num_blocks=6, block_size=4)
    a = Sequence(0, list(range(10)))
    computed(bm, a, 10)
    assert a.block_table == [0, 1, 2]
    assert cache_of(bm).num_cached_blocks == 2  # blocks 0, 1 are full; block 2 holds 2 tokens

    b = Sequence(1, list(range(8)) + [100, 101, 102])
    match = bm.lookup_prefix(b)
    assert match == PrefixMatch((0, 1), 8)
    assert bm.refcounts[:2] == [1, 1]  # lookup has no side effects
    assert bm.match_prefix(b, match) == 8
    assert (b.num_computed_tokens, b.num_cached_tokens) == (8, 8)
    assert bm.refcounts[:3] == [2, 2, 1]
    assert bm.allocate(b, 3) == []
    assert b.block_table == [0, 1, 3]
    assert bm.slot_mapping(b, 8, 3) == [12, 13, 14]
    assert (cache_of(bm).hit_tokens, cache_of(bm).queried_tokens) == (8, 11)


def test_whole_prompt_hit_recomputes_last_token_into_a_copy() -> None:
    bm = BlockManager(num_blocks=6, block_size=4)
    a = Sequence(0, list(range(10)))
    computed(bm, a, 10)
    c = Sequence(2, list(range(8)))
    assert bm.lookup_prefix(c) == PrefixMatch((0, 1), 7)  # never the whole prompt: logits need a token
    # 1 copy-on-write block for the write into cached block 1; nothing to reclaim (both blocks in use).
    assert bm.num_blocks_needed(c, 1, bm.lookup_prefix(c)) == 1
    bm.match_prefix(c)
    assert bm.allocate(c, 1) == [(1, 3)]
    assert c.block_table == [0, 3]
    assert bm.refcounts[:4] == [2, 1, 1, 1]
    c.num_computed_tokens = 8
    assert bm.cache_full_blocks(c) == 0  # block 3 duplicates cached block 1: not registered twice
    bm.free(c)
    assert list(bm.free_list) == [4, 5, 3]
    assert bm.refcounts[:4] == [1, 1, 1, 0]


def test_lru_eviction_only_when_free_list_is_empty() -> None:
    bm = BlockManager(num_blocks=4, block_size=4)
    cache = cache_of(bm)
    a = Sequence(0, list(range(8)))
    b = Sequence(1, list(range(100, 108)))
    computed(bm, a, 8)
    computed(bm, b, 8)
    assert (a.block_table, b.block_table) == ([0, 1], [2, 3])
    bm.free(a)
    bm.free(b)
    # Released tail-first, so each sequence's last block is evicted before its first.
    assert cache.evictable_blocks() == [1, 0, 3, 2]
    assert list(bm.free_list) == [] and bm.num_free_blocks == 4 and bm.usage == 0.0

    # Reusing A's prefix takes its blocks off the LRU list; the new block comes from eviction (LRU: 3).
    e = Sequence(2, list(range(8)) + [9])
    assert bm.num_blocks_needed(e, 1, bm.lookup_prefix(e)) == 3  # 1 new + 2 reclaimed evictable blocks
    assert bm.match_prefix(e) == 8
    assert cache.evictable_blocks() == [3, 2]
    bm.allocate(e, 1)
    assert e.block_table == [0, 1, 3]
    assert cache.evictable_blocks() == [2]
    # B's prompt lost its second block (3) but its first (2) is still cached.
    assert bm.lookup_prefix(Sequence(3, list(range(100, 108)) + [1])) == PrefixMatch((2,), 4)

    bm.free(e)  # block 3 is not cached any more: plain free list; 1, 0 become most recently used
    assert list(bm.free_list) == [3]
    assert cache.evictable_blocks() == [2, 1, 0]
    f = Sequence(4, list(range(200, 212)))
    bm.allocate(f, 12)
    assert f.block_table == [3, 2, 1]  # free list first, then LRU eviction
    assert cache.evictable_blocks() == [0]
    assert cache.lookup(list(range(8))) == [0]


def test_duplicate_content_keeps_first_block_canonical() -> None:
    bm = BlockManager(num_blocks=6, block_size=4)
    a = Sequence(0, list(range(5)))
    b = Sequence(1, list(range(5)))
    bm.allocate(a, 5)  # both prefills in the same step: nothing cached yet, no sharing
    bm.allocate(b, 5)
    a.num_computed_tokens = b.num_computed_tokens = 5
    assert bm.cache_full_blocks(a) == 1
    assert bm.cache_full_blocks(b) == 0
    bm.free(a)
    bm.free(b)
    assert cache_of(bm).evictable_blocks() == [0]
    assert list(bm.free_list) == [4, 5, 1, 3, 2]


def test_fork_shares_blocks_and_copies_on_write() -> None:
    bm = BlockManager(num_blocks=8, block_size=4)
    parent = Sequence(0, list(range(6)))
    computed(bm, parent, 6)
    parent.append_token(6)
    child = Sequence(1, parent.token_ids)
    child.token_ids[-1] = 99  # parallel sampling: the child drew a different token
    bm.fork(parent, child)
    assert child.block_table == [0, 1] and child.num_computed_tokens == 6
    assert bm.refcounts[:2] == [2, 2]

    assert bm.allocate(parent, 1) == [(1, 2)]  # shared partial block: parent writes into a copy
    assert parent.block_table == [0, 2]
    assert bm.allocate(child, 1) == []  # now the child is block 1's only user: writes in place
    assert child.block_table == [0, 1]
    assert bm.refcounts[:3] == [2, 1, 1]
    assert bm.num_free_blocks == 5

    bm.free(parent)
    bm.free(child)
    assert bm.refcounts == [0] * 8
    assert bm.num_free_blocks == 8
    assert cache_of(bm).evictable_blocks() == [0]  # the only full block, cached by the first prefill


def test_fork_rejects_mismatched_child() -> None:
    bm = BlockManager(num_blocks=4, block_size=4)
    parent = Sequence(0, [1, 2, 3])
    computed(bm, parent, 3)
    with pytest.raises(ValueError, match="computed tokens"):
        bm.fork(parent, Sequence(1, [1, 2, 4]))


def test_prefix_cache_chains_hashes() -> None:
    cache = HashPrefixCache(block_size=2)
    assert cache.insert([1, 2, 3, 4, 5], [7, 8]) == 2  # the trailing partial block is ignored
    assert cache.lookup([1, 2, 3, 4, 9]) == [7, 8]
    assert cache.lookup([1, 2, 3, 5]) == [7]
    assert cache.lookup([0, 2, 3, 4]) == []  # same second block after a different first: no hit
    assert not cache.release(9)  # never cached
    assert cache.release(8) and cache.release(7)
    assert cache.evict(1) == [8]
    assert cache.lookup([1, 2, 3, 4]) == [7]
    with pytest.raises(RuntimeError):
        cache.evict(2)
