"""Counterbalanced visit order: ABBA for two arms, Williams Latin squares for more."""

from __future__ import annotations

from collections import Counter

import pytest

from weightsmith.bench.schedule import counterbalanced_order, is_fully_balanced, williams_rows


def test_two_arms_alternate_abba() -> None:
    order = counterbalanced_order(["A", "B"], 4)
    assert "".join(v.arm for v in order) == "ABBAABBA"
    assert [v.repeat for v in order] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert [v.position for v in order] == list(range(8))


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6])
def test_williams_design_balances_positions_and_successors(n: int) -> None:
    rows = williams_rows(n)
    assert len(rows) == (n if n % 2 == 0 else 2 * n)
    for row in rows:
        assert sorted(row) == list(range(n))
    # every arm takes every position equally often
    for position in range(n):
        counts = Counter(row[position] for row in rows)
        assert set(counts.values()) == {len(rows) // n}
    # every arm is directly followed by every other arm equally often (first-order carryover)
    pairs = Counter((row[i], row[i + 1]) for row in rows for i in range(n - 1))
    assert len(pairs) == n * (n - 1)
    assert len(set(pairs.values())) == 1


def test_balance_needs_whole_designs() -> None:
    assert is_fully_balanced(2, 2) and not is_fully_balanced(2, 3)
    assert is_fully_balanced(3, 6) and not is_fully_balanced(3, 3)
    assert is_fully_balanced(1, 1)
