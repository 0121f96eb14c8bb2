"""LP-relaxed MAP over the local polytope: tight on tree-shaped graphs and for every hard factor and TREE factor,
fractional (mu = 1/2) on the frustrated triangle of Kulesza & Pereira (2007)."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from betheproj.factor_graphs import IMPLY, NAND, OR, XOR, FactorGraph, OROut, Tree, XOROut, lp_map

from ._brute import all_trees, graph_reference
from ._graphs import mixed_graph, tree_factor_graph


@pytest.mark.parametrize("build", [mixed_graph, tree_factor_graph, lambda: tree_factor_graph(1, single_root=True)],
                         ids=["mixed", "tree_factor", "tree_factor_single_root"])
def test_lp_tight_on_tree_shaped_graphs(build):
    g = build()
    ref = graph_reference(g)
    res = lp_map(g)
    assert res.integral and res.fractional_variables == [] and res.fractional_factors == []
    np.testing.assert_allclose(res.objective, ref["map_score"], atol=1e-7)
    np.testing.assert_array_equal(res.assignment, ref["map"])
    for v, mu in enumerate(res.variable_marginals):
        np.testing.assert_allclose(mu, np.eye(g.cardinalities[v])[ref["map"][v]], atol=1e-6)
    for f, factor in enumerate(g.factors):
        sub = tuple(int(ref["map"][v]) for v in factor.variables)
        if getattr(factor, "table", None) is not None:
            want = np.zeros(factor.table.shape)
            want[sub] = 1.0
        else:
            want = np.array(sub, dtype=float)
        np.testing.assert_allclose(res.factor_marginals[f], want, atol=1e-6)


HARD = [XOR([0, 1, 2, 3]), XOR([0, 1, 2], negated=[True, False, True]), OR([0, 1, 2, 3, 4]),
        OR([0, 1, 2], negated=[False, True, True]), OROut([0, 1, 2, 3]), OROut([0, 1, 2], negated=[True, False, True]),
        NAND([0, 1, 2]), IMPLY([0, 1]), XOROut([0, 1, 2, 3]), XOR([0])]


@pytest.mark.parametrize("factor", HARD, ids=repr)
def test_hard_factor_constraints_are_the_convex_hull(factor):
    """Table 1's local-agreement constraints describe conv S_C: the LP over one hard factor is integral and
    optimal for any objective (several random ones)."""
    rng = np.random.default_rng(zlib.crc32(repr(factor).encode()))
    for _ in range(6):
        g = FactorGraph([2] * factor.arity)
        for v in range(factor.arity):
            g.set_unary(v, [0.0, rng.normal()])
        g.add_factor(factor)
        ref = graph_reference(g)
        res = lp_map(g)
        assert res.integral
        np.testing.assert_allclose(res.objective, ref["map_score"], atol=1e-8)


@pytest.mark.parametrize("n,single_root", [(3, False), (3, True), (4, False), (4, True)])
def test_tree_factor_flow_lp_is_exact(n, single_root):
    """The multi-commodity flow constraints give the arborescence polytope: LP = best tree, integral."""
    rng = np.random.default_rng(n + 10 * single_root)
    arcs = Tree.all_arcs(n)
    trees = all_trees(n, single_root)
    for _ in range(3):
        w = rng.normal(size=len(arcs))
        g = FactorGraph([2] * len(arcs))
        for k in range(len(arcs)):
            g.set_unary(k, [0.0, w[k]])
        g.add_factor(Tree(range(len(arcs)), arcs, single_root=single_root))
        best = max(sum(w[arcs.index((h, m + 1))] for m, h in enumerate(heads)) for heads in trees)
        res = lp_map(g)
        assert res.integral
        np.testing.assert_allclose(res.objective, best, atol=1e-7)
        assert g.score(res.assignment) == pytest.approx(best)


def frustrated_triangle(lam=(1.0, 1.0, 1.0)):
    """Kulesza & Pereira (2007), Figure 1: node i has two of the labels {A, B, C} -- (A, B), (B, C), (C, A) --
    and edge ij rewards agreement with lambda_ij (node 1 = B and node 2 = B, 2 = C and 3 = C, 3 = A and 1 = A)."""
    labels = [("A", "B"), ("B", "C"), ("C", "A")]
    edges = [(0, 1), (1, 2), (2, 0)]
    tables = []
    for (i, j), weight in zip(edges, lam, strict=True):
        tables.append(np.array([[weight if a == b else 0.0 for b in labels[j]] for a in labels[i]]))
    return FactorGraph.pairwise([np.zeros(2)] * 3, edges, tables)


def test_frustrated_triangle_is_fractional():
    g = frustrated_triangle()
    res = lp_map(g)
    assert not res.integral
    assert res.fractional_variables == [0, 1, 2] and res.fractional_factors == [0, 1, 2]
    for mu in res.variable_marginals:
        np.testing.assert_allclose(mu, [0.5, 0.5], atol=1e-7)
    np.testing.assert_allclose(res.objective, 1.5, atol=1e-7)     # (l12 + l23 + l31) / 2 > max l_ij = 1
    assert graph_reference(g)["map_score"] == pytest.approx(1.0)
    for f in range(3):
        assert res.factor_marginals[f].sum() == pytest.approx(1.0)
    # when one edge dominates, (l12 + l23 + l31) / 2 < max l_ij and the relaxation is tight
    tight = lp_map(frustrated_triangle((3.0, 1.0, 1.0)))
    assert tight.integral and tight.objective == pytest.approx(3.0)


def test_lp_handles_forbidden_states_and_reports_infeasibility():
    g = FactorGraph([3, 2])
    g.set_unary(0, [5.0, 0.0, -np.inf])
    g.add_dense((0, 1), [[-np.inf, 0.0], [1.0, 0.0], [9.0, 9.0]])
    res = lp_map(g)
    assert res.integral and res.objective == pytest.approx(5.0)
    np.testing.assert_array_equal(res.assignment, [0, 1])
    bad = FactorGraph([2, 2])
    bad.add_factor(XOR([0, 1]))
    bad.set_unary(0, [0.0, -np.inf])
    bad.set_unary(1, [0.0, -np.inf])
    with pytest.raises(ValueError, match="local polytope is empty"):
        lp_map(bad)
    with pytest.raises(TypeError, match="graph"):
        lp_map(None)
    with pytest.raises(ValueError, match="tol"):
        lp_map(g, tol=0.7)


def test_a_graph_without_variables_is_a_clear_error():
    with pytest.raises(ValueError, match="no variables"):
        lp_map(FactorGraph([]))


@pytest.mark.parametrize("penalty", [1e6, 1e7])
def test_a_large_soft_penalty_does_not_hide_the_other_scores(penalty):
    """A state penalised by a large finite score (a "soft -inf") beside O(1) scores on a chain: the LP is tight, so
    lp_map must return the MAP.  With HiGHS's default tolerances (1e-7 on the objective scaled to max 1) it
    stopped at a wrong vertex and called it integral (at 1e7: 10 of 20 chains, up to 2.1 below the MAP score).
    Differences below about 1e-9 of the penalty stay beyond HiGHS (its smallest tolerance is 1e-10)."""
    wrong = []
    for seed in range(20):
        rng = np.random.default_rng(seed)
        unary = [rng.normal(size=2) for _ in range(6)]
        unary[0] = np.array([-penalty, 0.0])
        g = FactorGraph.pairwise(unary, [(i, i + 1) for i in range(5)], [rng.normal(size=(2, 2)) for _ in range(5)])
        ref = graph_reference(g)
        res = lp_map(g)
        assert res.integral
        if not np.array_equal(res.assignment, ref["map"]) or abs(res.objective - ref["map_score"]) > 1e-6:
            wrong.append((seed, ref["map_score"] - g.score(res.assignment)))
    assert wrong == []


def test_scores_near_the_float64_limit_are_solved():
    """The objective was scaled by 2**e with e = 1024 for max |score| >= 2**1023: 2**1024 is inf, the scaled
    scores all 0 and the objective 0 * inf = NaN."""
    for top in (9e307, 3.0, 1e-300):
        g = FactorGraph([2, 3])
        g.set_unary(0, [0.0, top])
        g.set_unary(1, [0.0, -top, 0.5 * top])
        result = lp_map(g)
        assert result.objective == pytest.approx(1.5 * top, rel=1e-12)


def test_lp_builder_needs_a_factor_graph():
    from betheproj.factor_graphs import LPBuilder

    with pytest.raises(TypeError, match="^graph must be a FactorGraph, got NoneType"):
        LPBuilder(None)
