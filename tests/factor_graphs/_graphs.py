"""Tree-shaped factor graphs shared by the BP and LP tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from betheproj.factor_graphs import IMPLY, NAND, OR, XOR, FactorGraph, OROut, Tree, XOROut


def mixed_graph(seed: int = 0, rnd: Callable[..., Any] | None = None) -> FactorGraph:
    """A tree-shaped factor graph chaining Dense (pairwise and ternary) and hard factors of every kind; ``rnd(*shape)``
    draws its potentials (default: NumPy normals from ``seed``; the CUDA tests pass tensors on a device)."""
    if rnd is None:
        rng = np.random.default_rng(seed)

        def rnd(*shape: int) -> np.ndarray:
            return rng.normal(size=shape)
    cards = [2, 2, 2, 3, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2]
    g = FactorGraph(cards)
    for v, c in enumerate(cards):
        g.set_unary(v, rnd(c))
    g.add_factor(XOR([0, 1, 2]))
    g.add_dense((2, 3), rnd(2, 3))
    t = rnd(3, 2, 2)
    t[0, 1, 0] = -np.inf
    g.add_dense((3, 4, 12), t)
    g.add_factor(OR([4, 5, 6], negated=[False, True, False]))
    g.add_factor(OROut([6, 7, 8]))
    g.add_factor(IMPLY([8, 9]))
    g.add_factor(XOROut([9, 10, 11]))
    g.add_factor(NAND([11, 13]))
    return g


def tree_factor_graph(seed: int = 0, single_root: bool = False) -> FactorGraph:
    """A TREE factor on the 9 arcs of a 3-word sentence, arc unaries, and two Dense factors hanging off arcs."""
    rng = np.random.default_rng(seed)
    arcs = Tree.all_arcs(3)
    g = FactorGraph([2] * len(arcs) + [2, 3])
    for v in range(len(arcs)):
        g.set_unary(v, [0.0, rng.normal()])
    g.add_factor(Tree(range(len(arcs)), arcs, single_root=single_root))
    g.add_dense((arcs.index((0, 1)), 9), rng.normal(size=(2, 2)))
    g.add_dense((arcs.index((2, 3)), 10), rng.normal(size=(2, 3)))
    return g
