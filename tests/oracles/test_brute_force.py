"""The enumeration reference itself: float32 at large magnitudes agrees with float64 on the same inputs, and
huge scores against exact sums."""

import itertools
import math
from fractions import Fraction

import pytest
import torch

import betheproj as bp

# float64 and float32 with penalties P far beyond 1/eps, where -P + 1 and -P + log 2 round to -P
HUGE = [(torch.float64, 1e17), (torch.float64, 1e20), (torch.float32, 1e4), (torch.float32, 1e9)]
TOL = {torch.float64: 1e-12, torch.float32: 2e-6}


def exact_enumeration(node, edge, parents=None):
    """Marginals [N, C] and [N-1, C, C] (float64), ``log Z``, entropy and the set of best labellings of example 0,
    by enumeration with every score summed exactly (as fractions): the reference for huge scores."""
    _, n, c = node.shape
    par = list(range(-1, n - 1)) if parents is None else list(parents)
    edge = edge.expand(1, n - 1, c, c) if edge.dim() == 2 else edge
    scores = {}
    for y in itertools.product(range(c), repeat=n):
        terms = [float(node[0, t, y[t]]) for t in range(n)] + [float(edge[0, t - 1, y[par[t]], y[t]])
                                                              for t in range(1, n)]
        if -math.inf not in terms:
            scores[y] = sum(map(Fraction, terms))
    best = max(scores.values())
    log_w = {y: float(s - best) for y, s in scores.items()}
    log_sum = math.log(math.fsum(math.exp(v) for v in log_w.values()))
    node_m, edge_m = torch.zeros(n, c, dtype=torch.float64), torch.zeros(max(n - 1, 0), c, c, dtype=torch.float64)
    entropy = 0.0
    for y, v in log_w.items():
        p = math.exp(v - log_sum)
        entropy -= p * (v - log_sum)
        for t in range(n):
            node_m[t, y[t]] += p
            if t:
                edge_m[t - 1, y[par[t]], y[t]] += p
    return dict(node=node_m, edge=edge_m, log_z=float(best) + log_sum, entropy=entropy,
                best={y for y, s in scores.items() if s == best})


def penalised(n, c, big, dtype, seed):
    """One example of O(1) Gaussian scores where a random third of the entries also pay ``-big``."""
    gen = torch.Generator().manual_seed(seed)
    node, edge = torch.randn(1, n, c, generator=gen, dtype=torch.float64), torch.randn(1, n - 1, c, c, generator=gen,
                                                                                      dtype=torch.float64)
    node = torch.where(torch.rand(node.shape, generator=gen) < 0.3, node - big, node)
    edge = torch.where(torch.rand(edge.shape, generator=gen) < 0.4, edge - big, edge)
    return bp.PairwisePotentials(node.to(dtype), edge.to(dtype))


def cancelling(n, c, big, dtype, seed):
    """One example of O(1) Gaussian scores where every position and every edge table is lifted by a random
    multiple of ``big`` (the same for all its entries), the lifts summing to 0: ``log Z`` is O(1), while the
    per-position and per-table maxima that the oracles shift by are huge and carry O(1) parts."""
    gen = torch.Generator().manual_seed(seed)
    node, edge = torch.randn(1, n, c, generator=gen, dtype=torch.float64), torch.randn(1, n - 1, c, c, generator=gen,
                                                                                      dtype=torch.float64)
    lift = torch.randint(-3, 4, (2 * n - 1,), generator=gen).double()
    lift[-1] -= lift.sum()
    node = node + big * lift[:n, None]
    edge = edge + big * lift[n:, None, None]
    return bp.PairwisePotentials(node.to(dtype), edge.to(dtype))


def two_part_atol(dtype, big):
    """What two-part sums leave of an O(1) ``log Z`` beside shifts of order ``big``: their second part rounds at
    ``eps`` times the first's rounding error, ``eps^2 big``."""
    return 10 * TOL[dtype] + 100 * torch.finfo(dtype).eps ** 2 * big


def assert_exact(oracle, pot, parents=None, map_too=True, log_z_atol=None):
    """``oracle``'s marginals, ``log Z``, entropy (and MAP) of example 0 against :func:`exact_enumeration`."""
    ref, tol = exact_enumeration(pot.node, pot.edge, parents), TOL[pot.node.dtype]
    mu = oracle.marginals(pot)
    assert torch.allclose(mu.node[0].double(), ref["node"], atol=tol, rtol=0)
    assert torch.allclose(mu.edge[0].double(), ref["edge"], atol=tol, rtol=0)
    assert abs(float(mu.log_partition[0]) - ref["log_z"]) <= (10 * tol * abs(ref["log_z"]) if log_z_atol is None
                                                              else log_z_atol)
    assert abs(float(oracle.entropy(mu)[0]) - ref["entropy"]) <= tol
    if map_too:
        assert tuple(oracle.map(pot)[0].tolist()) in ref["best"]


@pytest.mark.parametrize("parents", [None, [-1, 0, 0, 1, 1]], ids=["chain", "tree"])
def test_float32_at_magnitude_1e4_matches_float64(parents):
    # each labelling's raw score is about 9e4, where float32's spacing is 0.008: scores are summed after the
    # per-position maximum is taken out, as the exact oracles do
    gen = torch.Generator().manual_seed(0)
    node = (torch.randn(2, 5, 3, generator=gen, dtype=torch.float64) + 1e4).float()
    edge = (torch.randn(3, 3, generator=gen, dtype=torch.float64) + 1e4).float()
    lengths = torch.tensor([5, 3])
    p32, p64 = bp.ChainPotentials(node, edge, lengths), bp.ChainPotentials(node.double(), edge.double(), lengths)
    oracle = bp.BruteForce(parents)
    m32, m64 = oracle.marginals(p32), oracle.marginals(p64)
    assert m32.node.dtype == torch.float32
    assert torch.allclose(m32.node.double(), m64.node, atol=2e-6)
    assert torch.allclose(m32.edge.double(), m64.edge, atol=2e-6)
    assert torch.allclose(m32.log_partition.double(), m64.log_partition, rtol=1e-7)
    assert torch.allclose(oracle.exact_entropy(p32).double(), oracle.exact_entropy(p64), atol=2e-6)
    assert torch.equal(oracle.map(p32), oracle.map(p64))


def test_bad_max_states_and_marginals_of_another_size_are_clear_errors():
    with pytest.raises(TypeError, match="max_states"):
        bp.oracles.BruteForce(max_states="x")
    with pytest.raises(ValueError, match="max_states"):
        bp.oracles.BruteForce(max_states=0)
    oracle = bp.oracles.BruteForce(parents=[-1, 0, 0])
    pot = bp.oracles.PairwisePotentials(torch.randn(1, 4, 2, dtype=torch.float64),
                                        torch.randn(1, 3, 2, 2, dtype=torch.float64))
    marginals = bp.oracles.BruteForce().marginals(pot)
    with pytest.raises(ValueError, match="marginals have N=4 positions but the tree has 3 nodes"):
        oracle.entropy(marginals)


def test_two_tied_optima_at_1e300_share_the_mass():
    # two labellings (0, 1, 1) and (1, 1, 1) score 3e300, the others far less: exp(score - log Z) with a rounded
    # log Z gave each probability 1 (node rows summing to 2, entropy 0)
    node = torch.tensor([[[1e300, -1e300], [0.0, 1e300], [-1e300, 1e300]]], dtype=torch.float64)
    pot = bp.ChainPotentials(node, torch.tensor([[1e300, -1e300], [-1e300, 1e300]], dtype=torch.float64))
    brute = bp.BruteForce()
    mu = brute.marginals(pot)
    assert torch.allclose(mu.node[0], torch.tensor([[0.5, 0.5], [0.0, 1.0], [0.0, 1.0]], dtype=torch.float64))
    assert math.isclose(float(brute.exact_entropy(pot)[0]), math.log(2))
    assert math.isclose(float(brute.entropy(mu)[0]), math.log(2))
    assert brute.map(pot)[0, 1:].tolist() == [1, 1] and float(mu.log_partition[0]) == 3e300


@pytest.mark.parametrize("dtype, big", HUGE)
@pytest.mark.parametrize("parents", [None, [-1, 0, 0, 0, 0], [-1, 0, 0, 1, 1]], ids=["chain", "star", "tree"])
def test_o1_scores_beside_huge_penalties_against_exact_sums(parents, dtype, big):
    # -P + 0.3 + 0.2 summed in floats loses the 0.5 that tells labellings which all pay P apart
    for seed in range(10):
        assert_exact(bp.BruteForce(parents), penalised(5, 2 + seed % 2, big, dtype, seed), parents)


@pytest.mark.parametrize("dtype, big", HUGE)
def test_huge_shifts_that_cancel_leave_log_z_its_o1_part(dtype, big):
    # the per-position and per-table maxima were summed plainly: 1e15 + 0.3 rounds to a multiple of 0.125 before
    # -1e15 comes in, and log Z (O(1) here) was off by up to the spacing of the shifts
    for seed in range(10):
        pot = cancelling(4, 2 + seed % 2, big, dtype, seed)
        assert_exact(bp.BruteForce(), pot, log_z_atol=two_part_atol(dtype, big))
