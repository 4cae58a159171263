"""Prefix cache: maps full KV blocks of token prefixes to physical block ids.

The block manager owns refcounts and the free list; the cache only knows which block holds which
full-block prefix and which cached blocks are unused (refcount 0) and may therefore be evicted, in LRU
order. The manager tells it when a block gains its first user (`acquire`) or loses its last (`release`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Iterator, Sequence

# Key of one full block: (hash of the parent block's key, the block's tokens). Keeping the tokens in the key
# makes a block-content collision impossible; only the 64-bit parent hash could collide (~2**-64).
BlockKey = tuple[int, tuple[int, ...]]
_ROOT_HASH = 0  # parent hash of a prompt's first block


def block_keys(token_ids: Sequence[int], block_size: int, salt: tuple = ()) -> Iterator[BlockKey]:
    """The chained keys of the full blocks of token_ids, in order. The request router (server/) hashes
    prompts with these too, so that "shares a block" means the same there as in the cache. salt: what
    else the KV depends on (a sequence's LoRA adapters and scales): it roots the chain, so blocks computed
    under different salts never match."""
    parent = hash(("salt", salt)) if salt else _ROOT_HASH
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        key = (parent, tuple(token_ids[start : start + block_size]))
        yield key
        parent = hash(key)  # int/tuple hashing is not salted by PYTHONHASHSEED: stable across runs


class PrefixCache(ABC):
    """Longest-prefix lookup over full blocks, plus LRU eviction among unused cached blocks."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.hit_tokens = 0  # tokens served from the cache (counted by the block manager, see record())
        self.queried_tokens = 0  # tokens that were looked up on admission

    @abstractmethod
    def lookup(self, token_ids: Sequence[int], salt: tuple = ()) -> list[int]:
        """Block ids holding the longest cached full-block prefix of `token_ids` (no side effects)."""

    @abstractmethod
    def insert(self, token_ids: Sequence[int], block_ids: Sequence[int], salt: tuple = ()) -> int:
        """Register block_ids[i] as holding full block i of token_ids; returns how many were new.

        Blocks whose content is already cached under another id are skipped (that id stays canonical).
        """

    @abstractmethod
    def evict(self, n: int) -> list[int]:
        """Forget the n least recently released unused blocks and return their ids (now plain free blocks)."""

    @abstractmethod
    def acquire(self, block_id: int) -> None:
        """A block gains its first user: it is no longer evictable."""

    @abstractmethod
    def release(self, block_id: int) -> bool:
        """A block loses its last user. True: the cache keeps it (evictable); False: it is not cached."""

    @abstractmethod
    def contains_block(self, block_id: int) -> bool:
        """Whether the block is registered (its content must not be overwritten in place)."""

    @property
    @abstractmethod
    def num_evictable(self) -> int:
        """Cached blocks with no user, i.e. reclaimable by evict()."""

    def record(self, hit_tokens: int, queried_tokens: int) -> None:
        self.hit_tokens += hit_tokens
        self.queried_tokens += queried_tokens

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0


class HashPrefixCache(PrefixCache):
    """vLLM-style chained block hashes: block i's key is (hash(key of block i-1), tokens of block i)."""

    def __init__(self, block_size: int) -> None:
        super().__init__(block_size)
        self._block_by_key: dict[BlockKey, int] = {}
        self._key_by_block: dict[int, BlockKey] = {}
        # Insertion order = release order, so the first entry is the least recently used.
        self._evictable: OrderedDict[int, None] = OrderedDict()

    def _keys(self, token_ids: Sequence[int], salt: tuple = ()) -> Iterator[BlockKey]:
        return block_keys(token_ids, self.block_size, salt)

    def lookup(self, token_ids: Sequence[int], salt: tuple = ()) -> list[int]:
        blocks: list[int] = []
        for key in self._keys(token_ids, salt):
            block_id = self._block_by_key.get(key)
            if block_id is None:
                break  # chained keys: nothing after a miss can match
            blocks.append(block_id)
        return blocks

    def insert(self, token_ids: Sequence[int], block_ids: Sequence[int], salt: tuple = ()) -> int:
        num_new = 0
        for key, block_id in zip(self._keys(token_ids, salt), block_ids, strict=False):
            if key in self._block_by_key or block_id in self._key_by_block:
                continue
            self._block_by_key[key] = block_id
            self._key_by_block[block_id] = key
            num_new += 1
        return num_new

    def evict(self, n: int) -> list[int]:
        if n > len(self._evictable):
            raise RuntimeError(f"cannot evict {n} blocks: only {len(self._evictable)} are unused")
        evicted: list[int] = []
        for _ in range(n):
            block_id, _ = self._evictable.popitem(last=False)
            del self._block_by_key[self._key_by_block.pop(block_id)]
            evicted.append(block_id)
        return evicted

    def acquire(self, block_id: int) -> None:
        self._evictable.pop(block_id, None)

    def release(self, block_id: int) -> bool:
        if block_id not in self._key_by_block:
            return False
        self._evictable[block_id] = None
        return True

    def contains_block(self, block_id: int) -> bool:
        return block_id in self._key_by_block

    @property
    def num_evictable(self) -> int:
        return len(self._evictable)

    @property
    def num_cached_blocks(self) -> int:
        return len(self._key_by_block)

    def evictable_blocks(self) -> list[int]:
        """Unused cached blocks, least recently used first (for tests and debugging)."""
        return list(self._evictable)
