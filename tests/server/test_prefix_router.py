"""Prefix-aware replica choice (edgellm/server/replicas/prefix_router.py): pure Python, no Ray."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from edgellm.engine.prefix_cache import HashPrefixCache, block_keys
from edgellm.server.replicas.prefix_router import (
    BusyRule,
    Choice,
    PrefixAffinity,
    power_of_two,
    prefix_block_hashes,
)

BS = 16


def prompt(prefix: int, n_prefix_blocks: int, tail: int) -> list[int]:
    """Tokens: n_prefix_blocks blocks of a prefix family, then `tail` tokens unique to `tail`."""
    head = [(prefix * 7919 + i) % 50_000 for i in range(n_prefix_blocks * BS)]
    return head + [60_000 + tail * 100 + i for i in range(BS + 3)]


def test_hashes_cover_full_blocks_and_identify_the_whole_prefix() -> None:
    a, b = prompt(1, 4, tail=0), prompt(1, 4, tail=1)
    ha, hb = prefix_block_hashes(a, BS), prefix_block_hashes(b, BS)
    assert len(ha) == len(a) // BS == 5  # the partial last block is not hashed
    assert ha[:4] == hb[:4] and ha[4] != hb[4]
    # The same tokens in block 2 after a different block 1 are a different prefix.
    c = a[:BS] + [1] * BS + a[2 * BS :]
    assert prefix_block_hashes(c, BS)[2] != ha[2]
    assert prefix_block_hashes(a[: BS - 1], BS) == []


def test_hashes_are_the_engine_prefix_caches_block_keys() -> None:
    ids = prompt(3, 3, tail=2)
    assert prefix_block_hashes(ids, BS) == [hash(k) for k in block_keys(ids, BS)]
    cache = HashPrefixCache(BS)  # the cache still keys blocks the same way after the refactor
    cache.insert(ids, list(range(10)))
    assert cache.lookup(ids) == list(range(len(ids) // BS))
    assert cache.lookup(ids[:BS] + [9] * BS) == [0]


@pytest.mark.parametrize(
    ("load", "least", "matched", "busier"),
    [
        (1, 0, 1, True),  # a template header's block is worth no imbalance
        (1, 1, 1, False),  # ... but breaks ties
        (4, 0, 62, False),  # a 1,000-token prefix is worth 4 requests more (the cap)
        (5, 0, 62, True),
        (2, 0, 16, False),  # 256 tokens: 2 more
        (3, 0, 16, True),
        (40, 30, 62, False),  # 10 more is not 1.5x as busy on a big batch
        (46, 30, 62, True),
    ],
)
def test_much_busier_weighs_the_load_gap_against_the_prefix(
    load: int, least: int, matched: int, busier: bool
) -> None:
    assert BusyRule(blocks_per_request=8, max_margin=4, ratio=1.5).much_busier(load, least, matched) is busier


def test_power_of_two_never_picks_the_most_loaded_of_three() -> None:
    rng = random.Random(0)
    picks = Counter(power_of_two({"a": 0, "b": 5, "c": 10}, rng) for _ in range(3000))
    assert picks["c"] == 0
    assert 0.6 < picks["a"] / 3000 < 0.73  # a wins both pairs it is drawn in: 2/3
    assert power_of_two({"only": 99}, rng) == "only"
    with pytest.raises(ValueError, match="no replica"):
        power_of_two({}, rng)


def test_a_prefix_goes_back_to_the_replica_that_last_served_it() -> None:
    aff = PrefixAffinity(rng=random.Random(1))
    h = prefix_block_hashes(prompt(1, 62, tail=0), BS)  # a ~1,000-token prefix
    first = aff.choose(h, {"r0": 0, "r1": 0})
    assert first.reason == "balance" and first.matched_blocks == 0
    aff.record(h, first.replica)
    other = "r1" if first.replica == "r0" else "r0"
    again = aff.choose(prefix_block_hashes(prompt(1, 62, tail=9), BS), {first.replica: 3, other: 0})
    assert (again.replica, again.matched_blocks, again.reason) == (first.replica, 62, "prefix")


def test_a_much_busier_owner_loses_the_request_to_the_least_loaded() -> None:
    aff = PrefixAffinity(BusyRule(blocks_per_request=1, max_margin=4), rng=random.Random(2))
    h = prefix_block_hashes(prompt(1, 4, tail=0), BS)
    aff.record(h, "r0")
    assert aff.choose(h, {"r0": 5, "r1": 1}).replica == "r0"
    choice = aff.choose(h, {"r0": 6, "r1": 1})
    assert (choice.replica, choice.reason) == ("r1", "busy")


def test_the_longest_remembered_prefix_wins_and_dead_replicas_are_skipped() -> None:
    aff = PrefixAffinity(rng=random.Random(3))
    system = prompt(5, 2, tail=0)[: 2 * BS]  # a shared system prompt of 2 blocks
    doc = prompt(6, 6, tail=0)
    aff.record(prefix_block_hashes(system + [1] * BS, BS), "r0")  # r0 saw the system prompt only
    aff.record(prefix_block_hashes(system + doc, BS), "r1")  # r1 saw it followed by the document
    h = prefix_block_hashes(system + doc + [2] * BS, BS)
    assert aff.choose(h, {"r0": 0, "r1": 0}).replica == "r1"
    assert aff.longest_match(h, {"r0": 0, "r1": 0}) == (["r1"], len(system + doc) // BS)
    assert aff.longest_match(h[:2], {"r0": 0, "r1": 0}) == (["r1", "r0"], 2)  # most recent first
    for seed in range(10):  # r1 is gone: r0 still holds the system prompt's 2 blocks
        aff.rng = random.Random(seed)
        assert aff.choose(h, {"r0": 0, "r2": 0}) == Choice("r0", 2, "prefix")
    aff.forget("r0")
    aff.forget("r1")
    assert aff.longest_match(h, {"r0": 0, "r1": 0, "r2": 0}) == ([], 0) and len(aff) == 0


def test_a_busy_last_holder_passes_to_an_earlier_holder_before_falling_back() -> None:
    aff = PrefixAffinity(BusyRule(blocks_per_request=1, max_margin=4), rng=random.Random(4))
    h = prefix_block_hashes(prompt(1, 4, tail=0), BS)
    aff.record(h, "r0")
    aff.record(h, "r1")
    assert aff.choose(h, {"r0": 1, "r1": 1, "r2": 0}) == Choice("r1", 5, "prefix")
    assert aff.choose(h, {"r0": 1, "r1": 9, "r2": 0}) == Choice("r0", 5, "prefix")
    assert aff.choose(h, {"r0": 9, "r1": 9, "r2": 0}).reason == "busy"


def test_the_table_is_bounded_least_recently_used_first() -> None:
    aff = PrefixAffinity(max_blocks=8)
    old, new = prefix_block_hashes(prompt(1, 4, 0), BS), prefix_block_hashes(prompt(2, 6, 0), BS)
    aff.record(old, "r0")
    aff.record(new, "r1")
    assert len(aff) == 8
    assert aff.longest_match(new, {"r1": 0}) == (["r1"], 7)
    assert aff.longest_match(old, {"r0": 0}) == (["r0"], 1)  # its deepest blocks were dropped first
    with pytest.raises(ValueError):
        PrefixAffinity(max_blocks=0)


def test_interleaved_prefixes_each_stay_on_one_replica() -> None:
    """The issue's scenario in miniature: 8 + 8 requests on two long prefixes, interleaved and all in
    flight at once; after its first request each prefix stays on one replica, and the two differ."""
    for seed in range(20):
        aff = PrefixAffinity(rng=random.Random(seed))
        loads = {"r0": 0, "r1": 0}
        served: dict[int, list[str]] = {0: [], 1: []}
        for i in range(16):
            family = i % 2
            h = prefix_block_hashes(prompt(family + 1, 62, tail=i), BS)  # ~1,000-token prefixes
            choice = aff.choose(h, loads)
            aff.record(h, choice.replica)
            loads[choice.replica] += 1
            served[family].append(choice.replica)
        assert len(set(served[0])) == 1 and len(set(served[1])) == 1, (seed, served)
        assert served[0][0] != served[1][0]


def test_chats_sharing_only_a_template_header_spread_over_the_replicas() -> None:
    """Every chat starts with the template's fixed header (a block or so): that must not pin them all
    to one replica, which is what the first version of this rule did with 16 concurrent chats."""
    header = list(range(20))
    aff = PrefixAffinity(rng=random.Random(0))
    loads = {"r0": 0, "r1": 0}
    for i in range(16):
        h = prefix_block_hashes(header + [1000 + i] * 20, BS)
        choice = aff.choose(h, loads)
        aff.record(h, choice.replica)
        loads[choice.replica] += 1
    assert loads == {"r0": 8, "r1": 8}
