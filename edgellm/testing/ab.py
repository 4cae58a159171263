"""The A/B loop of the benchmark scripts: every variant once per round, N rounds, then medians.

On a shared machine the other load moves every figure; running the variants alternately spreads it over
all of them alike, and the median of each variant's rounds is the figure to compare. A round's order is
one of ORDERS: the same each round, reversed every other round (two variants: each goes first as often),
or rotated by one each round (a variant's place in the round, right after another's, is not its cost).

    results = alternate({"old": run_old, "new": run_new}, rounds=3, report=print_one)
    med = medians(results, key=lambda r: r["decode_tok_s"])

A variant is any callable returning its round's figures (a subprocess's JSON, a timing, a dict); its key
any hashable (a name, a (setting, load) pair). `warmup` rounds run first and are dropped: the first call
of a kernel compiles it, of a server loads it.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any, TypeVar

R = TypeVar("R")
K = TypeVar("K", bound=Hashable)


def _fixed(names: list, r: int) -> list:
    return names


def _reverse(names: list, r: int) -> list:
    return names if r % 2 == 0 else names[::-1]


def _rotate(names: list, r: int) -> list:
    k = r % len(names)
    return names[k:] + names[:k]


ORDERS: dict[str, Callable[[list, int], list]] = {
    "fixed": _fixed,
    "reverse": _reverse,
    "rotate": _rotate,
}


def round_order(names: Iterable[K], r: int, order: str = "fixed") -> list[K]:
    """The variants' order in round `r` (0-based)."""
    if order not in ORDERS:
        raise ValueError(f"unknown order {order!r}: one of {', '.join(ORDERS)}")
    return ORDERS[order](list(names), r)


def alternate(
    variants: Mapping[K, Callable[[], R]],
    rounds: int,
    order: str = "fixed",
    report: Callable[[int, K, R], None] | None = None,
    end_round: Callable[[int, dict[K, R]], None] | None = None,
    warmup: int = 0,
) -> dict[K, list[R]]:
    """Run each variant once per round, `rounds` rounds, in the round's order. `report(round, name,
    result)` after each run, `end_round(round, {name: result})` after each round (rounds count from 0).
    First `warmup` rounds in round 0's order, unreported and dropped. Returns each variant's results in
    round order, keyed as `variants` is."""
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    if warmup < 0:
        raise ValueError(f"warmup must not be negative, got {warmup}")
    for _ in range(warmup):
        for name in round_order(variants, 0, order):
            variants[name]()
    results: dict[K, list[R]] = {name: [] for name in variants}
    for r in range(rounds):
        row: dict[K, R] = {}
        for name in round_order(variants, r, order):
            row[name] = variants[name]()
            results[name].append(row[name])
            if report is not None:
                report(r, name, row[name])
        if end_round is not None:
            end_round(r, {name: row[name] for name in variants})
    return results


def medians(
    results: Mapping[K, Iterable[Any]], key: Callable[[Any], float] | None = None
) -> dict[K, float]:
    """The median of each variant's results (of `key(result)` when given)."""
    return {
        name: statistics.median(key(x) for x in rs) if key else statistics.median(rs)
        for name, rs in results.items()
    }
