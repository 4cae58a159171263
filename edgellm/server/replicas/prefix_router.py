"""Prefix-aware replica choice for `edgellm serve --replicas N` (no Ray here:
server/replicas/request_router.py adapts it).

A prompt is a chain of full KV blocks, hashed exactly as the engine's prefix cache keys them
(engine/prefix_cache.block_keys), so "shares a block" means here what it means to the cache. The router
remembers, per block hash, the replica that was last sent a prompt containing that block; a request goes
to the replica holding its longest remembered prefix unless that replica is much busier than the
least-loaded one (then, and when nothing matches, power of two choices on load). This is the policy of
SGLang's cache-aware router, on blocks instead of characters.
"""

from __future__ import annotations

import random
from collections import Counter, OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from edgellm.engine.prefix_cache import block_keys

# Replica choices made by the request router in this process, by Choice.reason (and "no_prompt"): the
# ingress, in whose process the router runs, exports them on /metrics.
DECISIONS: Counter[str] = Counter()


def prefix_block_hashes(token_ids: Sequence[int], block_size: int) -> list[int]:
    """One hash per full block of token_ids; hash i identifies the whole prefix up to block i's end."""
    return [hash(key) for key in block_keys(token_ids, block_size)]


@dataclass(frozen=True)
class BusyRule:
    """The replica holding a prefix is much busier than the least-loaded one when it has more requests in
    flight than the prefix is worth: one more per `blocks_per_request` blocks matched (the prefill a hit
    saves pays for that much waiting), at most `max_margin` more; and at least `ratio` times as many, so
    that 40 vs 30 on a big batch is no imbalance. A match of a block or two (a chat template's fixed
    header, shared by every chat) is worth nothing: it breaks ties only."""

    blocks_per_request: int = 8  # 128 tokens at the engine's 16-token blocks
    max_margin: int = 4
    ratio: float = 1.5

    def much_busier(self, load: int, least: int, matched_blocks: int) -> bool:
        margin = min(self.max_margin, matched_blocks // self.blocks_per_request)
        return load - least > margin and load >= self.ratio * least


def power_of_two(loads: Mapping[str, int], rng: random.Random) -> str:
    """The less loaded of two distinct replicas drawn at random (the only one when there is one)."""
    if not loads:
        raise ValueError("no replica to choose from")
    ids = list(loads)
    if len(ids) == 1:
        return ids[0]
    a, b = rng.sample(ids, 2)
    return b if loads[b] < loads[a] else a


@dataclass
class Choice:
    replica: str
    matched_blocks: int  # leading blocks of the prompt last sent to `replica` (0: no affinity used)
    reason: str  # "prefix", "busy" (prefix owner much busier), "balance" (no prefix owner alive)


class PrefixAffinity:
    """Block hash -> the replicas that were sent a prompt containing that block, most recent last;
    LRU-bounded in blocks."""

    def __init__(
        self, busy: BusyRule | None = None, max_blocks: int = 1 << 20, rng: random.Random | None = None
    ) -> None:
        if max_blocks < 1:
            raise ValueError("max_blocks must be >= 1")
        self.busy = busy or BusyRule()
        self.max_blocks = max_blocks
        self.rng = rng or random.Random()
        self._holders: OrderedDict[int, dict[str, None]] = OrderedDict()

    def longest_match(self, hashes: Sequence[int], alive: Mapping[str, int]) -> tuple[list[str], int]:
        """The replicas in `alive` that were sent the longest prefix of `hashes` any live replica was
        sent, most recent first, and that prefix's length in blocks."""
        for i in range(len(hashes) - 1, -1, -1):  # chained hashes: the deepest hit is the longest prefix
            holders = [r for r in reversed(self._holders.get(hashes[i], ())) if r in alive]
            if holders:
                return holders, i + 1
        return [], 0

    def choose(self, hashes: Sequence[int], loads: Mapping[str, int]) -> Choice:
        """The replica for a prompt with these block hashes, given each live replica's requests in flight."""
        holders, matched = self.longest_match(hashes, loads)
        if not holders:
            return Choice(power_of_two(loads, self.rng), 0, "balance")
        least = min(loads.values())
        for replica in holders:
            if not self.busy.much_busier(loads[replica], least, matched):
                return Choice(replica, matched, "prefix")
        return Choice(power_of_two(loads, self.rng), 0, "busy")

    def record(self, hashes: Sequence[int], replica: str) -> None:
        """`replica` was sent this prompt: it now holds (or is computing) all of its blocks."""
        for h in reversed(hashes):  # the shared leading blocks end most recent: tails are evicted first
            holders = self._holders.setdefault(h, {})
            holders.pop(replica, None)
            holders[replica] = None
            self._holders.move_to_end(h)
        while len(self._holders) > self.max_blocks:
            self._holders.popitem(last=False)

    def forget(self, replica: str) -> None:
        """A replica is gone: its cache went with it."""
        for h in list(self._holders):
            holders = self._holders[h]
            if holders.pop(replica, False) is None and not holders:
                del self._holders[h]

    def __len__(self) -> int:
        return len(self._holders)
