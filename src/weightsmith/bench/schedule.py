"""Counterbalanced order of arm visits over repeats.

A machine drifts (thermals, page cache, a neighbour's build), so the arm measured first in every
round would be systematically favoured or penalised. Two arms alternate ABBA...; more arms follow
the rows of a Williams Latin square, in which every arm takes every position, and follows every
other arm, equally often once all rows have been used.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Visit:
    """One measured visit: an arm in one repeat, at a position in the overall run."""

    arm: str
    repeat: int
    position: int


def williams_rows(n: int) -> list[list[int]]:
    """Rows of a Williams design for `n` treatments (n rows if n is even, 2n if odd)."""
    if n < 1:
        raise ValueError("need at least one arm")
    if n == 1:
        return [[0]]
    first = [0]
    low, high = 1, n - 1
    take_low = True
    while len(first) < n:
        if take_low:
            first.append(low)
            low += 1
        else:
            first.append(high)
            high -= 1
        take_low = not take_low
    rows = [[(x + shift) % n for x in first] for shift in range(n)]
    if n % 2 == 1:
        rows += [list(reversed(row)) for row in rows]
    return rows


def counterbalanced_order(arms: list[str], repeats: int) -> list[Visit]:
    """The visits of a run: repeat r uses row r (cyclically) of the Williams design."""
    rows = williams_rows(len(arms))
    visits: list[Visit] = []
    for repeat in range(repeats):
        for index in rows[repeat % len(rows)]:
            visits.append(Visit(arm=arms[index], repeat=repeat, position=len(visits)))
    return visits


def is_fully_balanced(n_arms: int, repeats: int) -> bool:
    """True when the repeats use every row of the design equally often."""
    return repeats % len(williams_rows(n_arms)) == 0
