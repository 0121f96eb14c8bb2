"""Tree oracle against brute force; a chain-shaped tree equals LinearChain."""

import math

import pytest
import torch

import betheproj as bp

from ._spy import record_shapes
from .test_brute_force import HUGE, TOL, assert_exact, cancelling, penalised, two_part_atol

DT = torch.float64
INF = float("inf")
TREES = [[-1, 0, 0, 1, 1, 2], [-1, 0, 1, 2, 3], [-1, 0, 0, 0, 0], [-1]]


def _pot(n, c=3, b=3, scale=1.0, lengths=None):
    return bp.PairwisePotentials(torch.randn(b, n, c, dtype=DT) * scale,
                                 torch.randn(b, max(n - 1, 0), c, c, dtype=DT) * scale, lengths)


def _check(parents, pot, atol=1e-6):
    tree, brute = bp.Tree(parents), bp.BruteForce(parents)
    m, ref = tree.marginals(pot), brute.marginals(pot)
    assert torch.allclose(m.node, ref.node, atol=atol, rtol=0)
    assert torch.allclose(m.edge, ref.edge, atol=atol, rtol=0)
    assert ((m.log_partition - ref.log_partition).abs() / ref.log_partition.abs().clamp_min(1)).max() < atol
    assert torch.allclose(tree.entropy(m), brute.exact_entropy(pot), atol=atol, rtol=0)
    assert torch.equal(tree.map(pot), brute.map(pot))


@pytest.mark.parametrize("parents", TREES)
@pytest.mark.parametrize("scale", [1.0, 1e3])
def test_trees_match_brute_force(parents, scale):
    n = len(parents)
    lengths = torch.tensor([n, max(1, n - 2), 1])
    for _ in range(3):
        _check(parents, _pot(n, scale=scale, lengths=lengths), atol=1e-6 if scale == 1 else 1e-9)


def test_tree_with_forbidden_entries():
    parents = [-1, 0, 0, 1, 1, 2]
    pot = _pot(6, lengths=torch.tensor([6, 5, 3]))
    pot.edge[:, 0, 1, :] = -INF      # node 1 forbids parent state 1 entirely: a -inf upward message
    pot.edge[:, 0, 1, 0] = -INF
    pot.edge[0, 2, :, 2] = -INF
    pot.node[1, 4, 0] = -INF
    _check(parents, pot)


def test_chain_shaped_tree_equals_linear_chain():
    pot = _pot(6, c=4, b=5, lengths=torch.tensor([6, 3, 1, 5, 2]))
    a, b = bp.Tree(list(range(-1, 5))).marginals(pot), bp.LinearChain().marginals(pot)
    assert torch.allclose(a.node, b.node, atol=1e-12) and torch.allclose(a.edge, b.edge, atol=1e-12)
    assert torch.allclose(a.log_partition, b.log_partition, atol=1e-12)


@pytest.mark.parametrize("parents, msg", [([0, 0], r"parents\[0\] must be -1"), ([-1, 1], r"parents\[1\] = 1"),
                                          ([-1, 0, 3, 1], r"parents\[2\] = 3"), ([], "non-empty")])
def test_bad_parent_arrays(parents, msg):
    with pytest.raises(ValueError, match=msg):
        bp.Tree(parents)


def test_size_mismatch():
    with pytest.raises(ValueError, match="tree has 3 nodes"):
        bp.Tree([-1, 0, 0]).marginals(_pot(4))


def test_small_scores_survive_a_huge_constant_edge_table():
    node = torch.tensor([[[0.0, 1.0], [0.0, 0.0], [0.0, 2.0]]], dtype=torch.float64)
    edge = torch.zeros(1, 2, 2, 2, dtype=torch.float64)
    ref = bp.Tree([-1, 0, 1]).marginals(bp.PairwisePotentials(node, edge))
    edge[0, 1] += 1e20                                       # a constant table only rescales Z
    mu = bp.Tree([-1, 0, 1]).marginals(bp.PairwisePotentials(node, edge))
    assert torch.allclose(mu.node, ref.node) and torch.allclose(mu.edge, ref.edge)
    assert torch.allclose(mu.log_partition, ref.log_partition + 1e20)


def test_potentials_with_no_finite_labelling_are_an_error_naming_the_examples():
    pot = _pot(4, b=3)
    pot.edge[1, 2] = -INF                         # example 1: no pair of labels on the edge into node 3
    tree = bp.Tree([-1, 0, 1, 1])
    for run in (tree.marginals, tree.map):
        with pytest.raises(ValueError, match=r"no labelling of finite score .* for examples \[1\]"):
            run(pot)


def test_argument_types():
    with pytest.raises(TypeError, match="parents must hold integers"):
        bp.Tree(torch.tensor([-1.0, 0.0]))
    with pytest.raises(TypeError, match="potentials must be PairwisePotentials/ChainPotentials, got Tensor"):
        bp.Tree([-1, 0]).marginals(torch.zeros(1, 2, 2))
    for parents in (None, "ab", [-1, "a"], torch.tensor([True, False])):
        with pytest.raises(TypeError, match="parents must"):
            bp.Tree(parents)
    with pytest.raises(TypeError, match="marginals must be Marginals"):
        bp.Tree([-1, 0]).entropy(torch.zeros(1, 2, 2))
    assert repr(bp.Tree([-1, 0, 0])) == "Tree(parents=[-1, 0, 0])"


def test_entropy_of_marginals_of_another_size_is_an_error_naming_them():
    # Tree.marginals and Tree.map check N; entropy and degree ran into an index_add_ RuntimeError instead
    mu = bp.LinearChain().marginals(_pot(4))
    for parents in ([-1, 0, 0], [-1, 0, 0, 1, 1]):
        with pytest.raises(ValueError, match=rf"marginals have N=4 positions but the tree has {len(parents)} nodes"):
            bp.Tree(parents).entropy(mu)
        with pytest.raises(ValueError, match=rf"n=4 positions but the tree has {len(parents)} nodes"):
            bp.Tree(parents).degree(mu.lengths, 4)


@pytest.mark.parametrize("dtype, big", HUGE)
def test_a_star_whose_children_all_pay_one_huge_penalty(dtype, big):
    # (the chain-shaped case is tests/oracles/test_chain.py's, for both oracles)
    e = math.e
    # a star: child 1's message to the root is [-P, -P], child 2 prefers root label 1 by 1; summed unshifted,
    # -P + 1 rounded to -P and the MAP took root label 0.  Exact: 4 labellings at -P, 2 at -P + 1
    node = torch.tensor([[[0.0, 0.0], [0.0, -big], [0.0, 0.0]]], dtype=dtype)
    edge = torch.tensor([[[[-big, 0.0], [-big, -big]], [[0.0, 0.0], [1.0, 1.0]]]], dtype=dtype)
    pot = bp.PairwisePotentials(node, edge)
    star = bp.Tree([-1, 0, 0])
    assert star.map(pot)[0, :2].tolist() == [1, 0]
    closed = torch.tensor([2 / (2 + e), e / (2 + e)], dtype=torch.float64)
    assert torch.allclose(star.marginals(pot).node[0, 0].double(), closed, atol=TOL[dtype], rtol=0)
    assert_exact(star, pot, [-1, 0, 0])


@pytest.mark.parametrize("dtype, big", HUGE)
@pytest.mark.parametrize("parents", [[-1, 0, 1, 2, 3], [-1, 0, 0, 0, 0], [-1, 0, 0, 1, 1]],
                         ids=["chain", "star", "tree"])
def test_o1_scores_beside_huge_penalties(parents, dtype, big):
    # -P + 0.3 rounds to -P (also in the sum of a node's children's messages): the O(1) scores of a label that
    # trails the best one by P were lost, and they count once the best one pays P too.  The MAP's running sums
    # still round them (not checked here)
    for seed in range(10):
        assert_exact(bp.Tree(parents), penalised(5, 2 + seed % 2, big, dtype, seed), parents, map_too=False)


@pytest.mark.parametrize("dtype, big", HUGE + [(torch.float64, 1e15)])
@pytest.mark.parametrize("parents", [[-1, 0, 0, 0, 0], [-1, 0, 0, 1, 1]], ids=["star", "tree"])
def test_huge_shifts_that_cancel_leave_log_z_its_o1_part(parents, dtype, big):
    # the per-position and per-table maxima were summed plainly (fast pass and exact pass): 1e15 + 0.3 rounds to a
    # multiple of 0.125 before -1e15 comes in, and log Z (O(1) here) was off by up to the spacing of the shifts
    tree = bp.Tree(parents)
    for seed in range(10):
        pot = cancelling(5, 2 + seed % 2, big, dtype, seed)
        assert_exact(tree, pot, parents, map_too=False, log_z_atol=two_part_atol(dtype, big))
        ref = bp.BruteForce(parents).marginals(pot).log_partition
        assert abs(float(tree._exact(pot).log_partition[0] - ref[0])) <= two_part_atol(dtype, big)


def test_max_product_shifts_the_scores_without_their_rounding_errors(monkeypatch):
    # MAP shifts node scores and edge tables by their maxima as the sum-product recursions do, but has no use for
    # the TwoSum errors of the shifts, two more passes over every [C, C] table (1.7x the MAP at N = 60, C = 20)
    import betheproj.oracles.base as base_module

    calls = record_shapes(monkeypatch, base_module, "_two_sum")
    gen = torch.Generator().manual_seed(0)
    parents = [-1, 0, 0, 1, 1, 2]
    node = 1e4 * torch.randn(2, 6, 3, generator=gen, dtype=torch.float64)
    edge = 1e4 * torch.randn(2, 5, 3, 3, generator=gen, dtype=torch.float64)
    pot = bp.PairwisePotentials(node, edge, torch.tensor([6, 4]))
    labels = bp.Tree(parents).map(pot)
    assert calls == []
    assert torch.equal(labels, bp.BruteForce(parents).map(pot))


def _random_tree(n, gen):
    return [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, n)]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_the_scaled_recursion_agrees_with_the_exact_one_and_hands_it_what_it_cannot_certify(dtype):
    """Tree.marginals runs sum-product in scaled probability space (2-5x faster than the two-part log-space
    recursion, which it replaced for every example) and leaves to the exact recursion the examples whose factors
    fall below sqrt(tiny): here batches that mix both, with -inf patterns and padding."""
    gen = torch.Generator().manual_seed(11)
    eps = torch.finfo(dtype).eps
    seen = set()
    for _ in range(60):
        n, c, b = int(torch.randint(1, 12, (1,), generator=gen)), int(torch.randint(1, 6, (1,), generator=gen)), 6
        tree = bp.Tree(_random_tree(n, gen))
        node = torch.randn(b, n, c, generator=gen, dtype=dtype) * 3
        edge = torch.randn(b, max(n - 1, 0), c, c, generator=gen, dtype=dtype) * 3
        if c > 1:
            node[torch.rand(node.shape, generator=gen) < 0.2] = -INF
            node[..., 0] = 0.0
            edge[torch.rand(edge.shape, generator=gen) < 0.2] = -INF
            edge[..., 0, 0] = 0.0
            if n > 1:                                   # example 1: an edge table with a gap no factor can hold
                edge[1, 0, 0, 1] = -1e3 if dtype == torch.float64 else -60.0
        lengths = torch.randint(1, n + 1, (b,), generator=gen)
        lengths[:2] = n
        pot = bp.PairwisePotentials(node, edge, lengths)
        ok = tree._scaled(pot)[3]
        seen.update(ok.tolist())
        fast, exact = tree.marginals(pot), tree._exact(pot)
        assert torch.allclose(fast.node, exact.node, atol=8 * eps, rtol=0)
        assert torch.allclose(fast.edge, exact.edge, atol=8 * eps, rtol=0)
        assert torch.allclose(fast.log_partition, exact.log_partition, atol=0,
                              rtol=8 * n * eps) or torch.allclose(fast.log_partition, exact.log_partition, atol=8 * eps)
        if n > 1 and c > 1:
            assert not ok[1]                            # the exact recursion's
            assert torch.equal(fast.node[1], exact.node[1]) and torch.equal(fast.edge[1], exact.edge[1])
    assert seen == {True, False}


def test_factors_below_sqrt_tiny_go_to_the_exact_recursion():
    """Gaps of 700 nats in an edge table: exp(-700) is a normal float64 number, but a product of two such factors
    underflows; the scaled recursion does not certify it, and the marginals are the exact ones (brute force)."""
    parents = [-1, 0, 0, 1]
    node = torch.zeros(2, 4, 2, dtype=DT)
    edge = torch.zeros(2, 3, 2, 2, dtype=DT)
    edge[:, :, 0, 1] = -700.0
    edge[1] = 0.5                                  # example 1 is certified
    pot = bp.PairwisePotentials(node, edge)
    ok = bp.Tree(parents)._scaled(pot)[3]
    assert ok.tolist() == [False, True]
    _check(parents, pot, atol=1e-12)


def test_examples_whose_edge_tables_rule_the_fast_pass_out_skip_it(monkeypatch):
    """The fast pass ran on every example and threw away those with an edge gap beyond ~354 nats (wasted work,
    up to a third of the exact recursion's time): now only the others go to it, and none if none is left."""
    parents = [-1, 0, 0, 1]
    gen = torch.Generator().manual_seed(0)
    node = torch.randn(4, 4, 3, generator=gen, dtype=DT)
    edge = torch.randn(4, 3, 3, 3, generator=gen, dtype=DT)
    edge[[0, 2], 1, 0, 1] = -800.0
    tree = bp.Tree(parents)
    passes = []
    original = bp.Tree._scaled

    def recorded(self, pot, *args):
        passes.append(pot.node.shape[0])
        return original(self, pot, *args)

    monkeypatch.setattr(bp.Tree, "_scaled", recorded)
    got, want = tree.marginals(bp.PairwisePotentials(node, edge)), tree._exact(bp.PairwisePotentials(node, edge))
    assert passes == [2]
    assert torch.allclose(got.node, want.node, atol=1e-15, rtol=0)
    assert torch.allclose(got.edge, want.edge, atol=1e-15, rtol=0)
    assert torch.allclose(got.log_partition, want.log_partition, atol=1e-13, rtol=0)
    passes.clear()
    gapped = bp.PairwisePotentials(node[[0, 2]], edge[[0, 2]])
    assert torch.equal(tree.marginals(gapped).edge, tree._exact(gapped).edge) and passes == []
    _check(parents, bp.PairwisePotentials(node, edge), atol=1e-12)


def test_edges_where_the_parents_favourite_label_is_forbidden_by_a_child():
    """The parent's belief without the child peaks at a label the child's table forbids (a row of -inf), and its
    other label trails by 300 nats (a normal factor, exp(-300) > sqrt(tiny)): certified, and the edge marginals
    (the parent's marginal times the child's conditional) are exact, not inf * 0."""
    parents = [-1, 0, 0]
    node = torch.tensor([[[0.0, -300.0], [0.0, -1.0], [0.0, 0.5]]], dtype=DT)
    edge = torch.zeros(1, 2, 2, 2, dtype=DT)
    edge[0, 0, 0, :] = -INF                      # node 1 rules out the root's label 0
    edge[0, 1, 1, 0] = -250.0
    pot = bp.PairwisePotentials(node, edge)
    assert bp.Tree(parents)._scaled(pot)[3].tolist() == [True]
    _check(parents, pot, atol=1e-15)
    assert torch.isfinite(bp.Tree(parents).marginals(pot).edge).all()
