"""Random pairwise MRFs and brute-force MAP for the tests of betheproj.mrf."""

import itertools

import numpy as np

from betheproj.mrf import PairwiseMRF


def random_mrf(rng, cards, edges, scale=1.0):
    node = [rng.normal(size=c) * scale for c in cards]
    edge = [rng.normal(size=(cards[i], cards[j])) * scale for i, j in edges]
    return PairwiseMRF(list(cards), edges, node, edge)


def ising_mrf(rng, n, edges, coupling=2.0, field=0.3):
    """Binary MRF with weak random fields and strong couplings of random sign, +-J on (dis)agreement: the loops
    are often frustrated, where the LP relaxation has fractional vertices."""
    node = [rng.normal(size=2) * field for _ in range(n)]
    edge = [j * np.array([[1.0, -1.0], [-1.0, 1.0]]) for j in rng.normal(size=len(edges)) * coupling]
    return PairwiseMRF([2] * n, edges, node, edge)


def brute_force(mrf):
    best, arg = -np.inf, None
    for y in itertools.product(*[range(c) for c in mrf.cardinalities]):
        s = mrf.score(np.array(y))
        if s > best:
            best, arg = s, np.array(y)
    return best, arg
