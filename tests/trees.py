"""Test helper shared by the dependency-tree tests: the plain root walk that brute-force references build on."""

from __future__ import annotations

from collections.abc import Sequence


def reaches_root(heads: Sequence[int]) -> bool:
    """Whether every word ``m = 1..n`` reaches the root 0 by following ``heads[m - 1]`` (its head) within ``n``
    steps, i.e. the heads have no cycle.  Heads must lie in ``0..n``; self-loops, ranges and the number of root
    children are the caller's to check."""
    n = len(heads)
    for m in range(1, n + 1):
        v, steps = m, 0
        while v != 0 and steps <= n:
            v, steps = heads[v - 1], steps + 1
        if v != 0:
            return False
    return True
