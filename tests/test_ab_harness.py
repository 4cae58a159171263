"""The benchmark scripts' A/B loop (edgellm/testing/ab.py): each round's order and the medians."""

import pytest

from edgellm.testing.ab import alternate, medians, round_order


@pytest.mark.parametrize(
    ("order", "want"),
    [
        ("fixed", ["abc", "abc", "abc", "abc"]),
        ("reverse", ["abc", "cba", "abc", "cba"]),
        ("rotate", ["abc", "bca", "cab", "abc"]),
    ],
)
def test_each_variant_runs_once_a_round_in_the_rounds_order(order: str, want: list[str]) -> None:
    ran: list[str] = []
    rows: list[dict[str, int]] = []
    variants = {name: (lambda name=name: ran.append(name) or len(ran)) for name in "abc"}
    results = alternate(variants, 4, order=order, end_round=lambda r, row: rows.append(row))
    assert ["".join(ran[i : i + 3]) for i in range(0, 12, 3)] == want
    assert [round_order("abc", r, order) for r in range(4)] == [list(w) for w in want]
    assert list(results) == ["a", "b", "c"] and all(len(v) == 4 for v in results.values())
    assert [list(row) for row in rows] == [["a", "b", "c"]] * 4  # each row keyed as the variants are
    assert sorted(x for v in results.values() for x in v) == list(range(1, 13))


def test_report_sees_every_run_and_medians_take_a_key() -> None:
    seen: list[tuple[int, str, dict]] = []
    values = iter([{"x": 1.0}, {"x": 10.0}, {"x": 3.0}, {"x": 30.0}, {"x": 2.0}, {"x": 20.0}])
    results = alternate(
        {"old": lambda: next(values), "new": lambda: next(values)}, 3, report=lambda *a: seen.append(a)
    )
    assert [(r, name) for r, name, _ in seen] == [
        (0, "old"),
        (0, "new"),
        (1, "old"),
        (1, "new"),
        (2, "old"),
        (2, "new"),
    ]
    assert medians(results, key=lambda res: res["x"]) == {"old": 2.0, "new": 20.0}
    assert medians({"a": [5, 1, 3]}) == {"a": 3}


def test_bad_order_and_rounds_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown order 'random'"):
        round_order("ab", 0, "random")
    with pytest.raises(ValueError, match="rounds must be at least 1"):
        alternate({"a": lambda: 1}, 0)


def test_warmup_rounds_run_first_and_are_dropped_and_keys_may_be_tuples() -> None:
    ran: list[tuple[str, int]] = []
    seen: list[int] = []
    calls = {("old", 1): 0, ("new", 1): 0}

    def run(key: tuple[str, int]) -> int:
        calls[key] += 1
        ran.append(key)
        return calls[key]

    variants = {key: (lambda key=key: run(key)) for key in calls}
    results = alternate(variants, 2, order="reverse", warmup=2, report=lambda r, k, res: seen.append(res))
    # two warm-ups in round 0's order, then round 0 as given and round 1 reversed
    assert [name for name, _ in ran] == ["old", "new", "old", "new", "old", "new", "new", "old"]
    assert results == {("old", 1): [3, 4], ("new", 1): [3, 4]}  # the warm-ups' 1 and 2 dropped
    assert seen == [3, 3, 4, 4]  # report sees the counted rounds only
    assert medians(results) == {("old", 1): 3.5, ("new", 1): 3.5}
    with pytest.raises(ValueError, match="warmup must not be negative"):
        alternate(variants, 1, warmup=-1)
