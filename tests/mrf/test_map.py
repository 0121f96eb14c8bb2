"""Exact, LP-relaxed and loopy-BP MAP against enumeration and the factor-graph machinery."""

import itertools

import numpy as np
import pytest

from betheproj.factor_graphs import belief_propagation
from betheproj.mrf import (
    LocalPolytope,
    PairwiseMRF,
    exact_map,
    grid_edges,
    lbp_map,
    lp_map,
)
from tests.mrf.models import brute_force, ising_mrf, random_mrf


def test_exact_map_and_factor_graph_scores_matchbrute_force():
    rng = np.random.default_rng(0)
    for cards, edges in [((2, 3, 2, 4), [(0, 1), (1, 2), (2, 3), (3, 0), (0, 2)]), ((3,), []),
                         ((2, 2, 2), [(2, 0), (1, 2)])]:
        mrf = random_mrf(rng, cards, edges)
        best, arg = brute_force(mrf)
        res = exact_map(mrf)
        assert res.objective == pytest.approx(best) and np.array_equal(res.labels, arg) and res.integral
        g = mrf.to_factor_graph()
        for y in itertools.product(*[range(c) for c in cards]):
            assert g.score(list(y)) == pytest.approx(mrf.score(np.array(y)))
        assert mrf.expected_score(res.marginals) == pytest.approx(best)


def test_lp_map_is_exact_on_trees_and_an_upper_bound_on_loops():
    rng = np.random.default_rng(1)
    for _ in range(4):
        tree = random_mrf(rng, (2, 3, 2, 3, 2), [(0, 1), (1, 2), (1, 3), (3, 4)])
        lp, ex = lp_map(tree), exact_map(tree)
        assert lp.integral and np.array_equal(lp.labels, ex.labels)
        assert lp.objective == pytest.approx(ex.objective, abs=1e-7)
    fractional = 0
    for k in range(8):
        loopy = random_mrf(rng, (2,) * 6, grid_edges(2, 3), scale=2.0) if k % 2 else ising_mrf(rng, 6, grid_edges(2, 3))
        lp, ex = lp_map(loopy), exact_map(loopy)
        assert lp.objective >= ex.objective - 1e-7
        assert loopy.expected_score(lp.marginals) == pytest.approx(lp.objective, abs=1e-7)
        for e, (i, j) in enumerate(loopy.edges):          # a point of the local polytope
            assert np.allclose(lp.edge_marginals[e].sum(1), lp.node_marginals[i], atol=1e-8)
            assert np.allclose(lp.edge_marginals[e].sum(0), lp.node_marginals[j], atol=1e-8)
        if lp.integral:
            assert lp.objective == pytest.approx(ex.objective, abs=1e-7)
        else:                                              # a fractional vertex: strictly above every labelling
            assert lp.objective > ex.objective + 1e-6
        fractional += not lp.integral
    assert fractional > 0                                  # the frustrated instances give some (measured: 2 of 8)
    # factor_graphs.lp_map agrees with our own local polytope
    poly = LocalPolytope.of(loopy)
    c = np.concatenate([t.reshape(-1) for t in loopy.node_potentials + loopy.edge_potentials])
    val, _ = poly.maximize(c)
    assert val == pytest.approx(lp_map(loopy).objective, abs=1e-7)


@pytest.mark.parametrize("scale", [1e-12, 1e-8, 1e-6, 1e6])
def test_lp_map_does_not_depend_on_the_scale_of_the_potentials(scale):
    """HiGHS's tolerances are absolute: scores of 1e-7 were once declared optimal at a wrong vertex (32 of 60
    random trees at 1e-7 labelled wrongly, with integral=True and an "upper bound" below the MAP score)."""
    rng = np.random.default_rng(7)
    edges = [(0, 1), (1, 2), (1, 3), (3, 4), (4, 5)]
    for _ in range(10):
        tree = random_mrf(rng, (2, 3, 2, 2, 3, 2), edges)
        small = PairwiseMRF(tree.cardinalities, tree.edges, [t * scale for t in tree.node_potentials],
                            [t * scale for t in tree.edge_potentials])
        lp, ex = lp_map(small), exact_map(small)
        assert np.array_equal(ex.labels, exact_map(tree).labels)
        assert lp.integral and np.array_equal(lp.labels, ex.labels)
        assert lp.objective == pytest.approx(ex.objective, rel=1e-7)
        c = np.concatenate([t.reshape(-1) for t in small.node_potentials + small.edge_potentials])
        assert LocalPolytope.of(small).maximize(c)[0] == pytest.approx(ex.objective, rel=1e-7)


def test_exact_map_counts_ties_at_any_scale():
    for scale in (1e-12, 1.0, 1e8):
        distinct = PairwiseMRF([2, 2], [(0, 1)], [np.zeros(2), np.zeros(2)], [np.array([[0, 1], [2, 3]]) * scale])
        tied = PairwiseMRF([2, 2], [(0, 1)], [np.zeros(2), np.zeros(2)], [np.array([[3, 1], [2, 3]]) * scale])
        assert exact_map(distinct).num_ties == 0 and exact_map(tied).num_ties == 1
    # a large finite penalty for disagreeing (a stand-in for -inf) made the tolerance 1e-9 * 1e12 = 1000: the
    # labelling scoring 0 counted as a tie of the best, scoring 10
    penalty = PairwiseMRF([2, 2], [(0, 1)], [np.array([0.0, 5.0])] * 2, [np.array([[0.0, -1e12], [-1e12, 0.0]])])
    res = exact_map(penalty)
    assert res.labels.tolist() == [1, 1] and res.objective == 10.0 and res.num_ties == 0
    assert exact_map(penalty.with_potentials([np.array([0.0, 5.0])] * 2, [np.array([[10.0, -1e12], [-1e12, 0.0]])])
                     ).num_ties == 1
    # a tie is judged at the scale of the tied labellings' own terms: 1e12 - (1e12 - 0.3) is 0.3 to 1.2e-4 only
    big = PairwiseMRF([2, 2], [(0, 1)], [np.array([0.3, 1e12]), np.array([0.0, 0.3 - 1e12])],
                      [np.array([[0.0, -np.inf], [-np.inf, 0.0]])])
    assert big.score([1, 1]) != big.score([0, 0]) and exact_map(big).num_ties == 1


@pytest.mark.parametrize("backend", ["numpy", "factor_graphs"])
def test_lbp_ties_at_any_scale(backend):
    # ties were two best beliefs within an absolute 1e-9: at scale 1e-12 every node of the distinct model was a
    # tie, and a rounding-level tie at scale 1e12 (beliefs 1 and 0.99995) was none
    for scale in (1e-12, 1.0, 1e12):
        distinct = PairwiseMRF([2, 2], [(0, 1)], [np.zeros(2), np.zeros(2)], [np.array([[0, 1], [2, 3]]) * scale])
        tied = PairwiseMRF([2, 2], [(0, 1)], [np.zeros(2), np.zeros(2)], [np.array([[3, 1], [2, 3]]) * scale])
        assert lbp_map(distinct, backend=backend).ties == [] and lbp_map(tied, backend=backend).ties == [0, 1]
    big = PairwiseMRF([2, 2], [(0, 1)], [np.array([0.3, 1e12]), np.array([0.0, 0.3 - 1e12])],
                      [np.array([[0.0, -np.inf], [-np.inf, 0.0]])])
    res = lbp_map(big, backend=backend)
    assert 0 < 1.0 - res.beliefs[0].min() < 1e-3 and res.ties == [0, 1]


def test_lbp_is_exact_on_trees_and_matches_the_factor_graph_backend():
    rng = np.random.default_rng(2)
    for _ in range(3):
        tree = random_mrf(rng, (2, 3, 2, 4, 2), [(0, 1), (1, 2), (3, 1), (3, 4)])
        res = lbp_map(tree)
        assert res.converged and res.iterations < 20
        assert np.array_equal(res.labels, exact_map(tree).labels)
    for damping, space in ((0.0, "probability"), (0.3, "probability"), (0.3, "log")):
        loopy = random_mrf(rng, (2, 3, 2, 3), [(0, 1), (1, 2), (2, 3), (3, 0), (1, 3)])
        for iters in (1, 2, 7):
            mine = lbp_map(loopy, max_iter=iters, tol=0.0, damping=damping, damping_space=space)
            ref = belief_propagation(loopy.to_factor_graph(), "max", schedule="parallel", normalize="max",
                                     damping=damping, tol=0.0, max_iter=iters, damping_space=space)
            for b, r in zip(mine.beliefs, ref.variable_beliefs, strict=True):
                assert np.allclose(b, r, atol=1e-12)
            k = min(len(mine.history), len(ref.history))     # tol=0 stops at an exact fixed point, which
            assert np.allclose(mine.history[:k], ref.history[:k], atol=1e-12)   # rounding may reach in one only
            assert max(mine.history[k:] + ref.history[k:], default=0.0) <= 1e-12
        fg = lbp_map(loopy, backend="factor_graphs", damping=damping, damping_space=space)
        npy = lbp_map(loopy, damping=damping, damping_space=space)
        assert np.array_equal(fg.labels, npy.labels) and fg.converged == npy.converged


@pytest.mark.parametrize("backend", ["numpy", "factor_graphs"])
def test_log_space_damping_converges_at_large_scores(backend):
    """Scores of 1e3: damped in probability space LBP had not converged after 400 iterations (a message entry that
    must fall by D nats moves by log(damping) a step); damped in log space it converges, to undamped LBP's labels
    and beliefs."""
    mrf = random_mrf(np.random.default_rng(4), (3, 3, 3, 3), [(0, 1), (1, 2), (2, 3), (3, 0), (0, 2)], scale=1e3)
    plain = lbp_map(mrf, max_iter=400, backend=backend)
    log = lbp_map(mrf, damping=0.5, damping_space="log", max_iter=400, backend=backend)
    prob = lbp_map(mrf, damping=0.5, max_iter=400, backend=backend)
    assert plain.converged and log.converged and log.iterations < 100 and not prob.converged
    assert np.array_equal(log.labels, plain.labels)
    for a, b in zip(log.beliefs, plain.beliefs, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-8)


@pytest.mark.parametrize("space", ["probability", "log"])
@pytest.mark.parametrize("backend", ["numpy", "factor_graphs"])
def test_damped_lbp_keeps_hard_zeros_and_converges(backend, space):
    """A forbidden label pair on a triangle: the exact zeros it sends used to be mixed with the old messages,
    shrinking by the damping factor per iteration, so a tight tolerance was never met."""
    mrf = PairwiseMRF([2, 2, 2], [(0, 1), (1, 2), (2, 0)], [[-np.inf, 1.0], [0.5, 0.0], [0.0, 0.2]],
                      [np.array([[0.0, 0.3], [0.0, -np.inf]]), np.zeros((2, 2)), np.array([[0.4, 0.0], [0.0, 0.1]])])
    res = lbp_map(mrf, damping=0.5, tol=1e-12, max_iter=500, backend=backend,   # node 0 = 1 forbids node 1 = 1
                  damping_space=space)
    assert res.converged and res.iterations < 200
    assert res.beliefs[1][1] == 0.0
    assert np.array_equal(res.labels, exact_map(mrf).labels)


def test_lbp_handles_forbidden_labels_and_unequal_label_sets():
    rng = np.random.default_rng(3)
    mrf = random_mrf(rng, (2, 3, 4), [(0, 1), (1, 2), (2, 0)])
    node = mrf.node_potentials
    node[2][[0, 3]] = -np.inf
    edge = mrf.edge_potentials
    edge[0][1, :] = -np.inf
    mrf = mrf.with_potentials(node, edge)
    res = lbp_map(mrf, max_iter=5, tol=0.0)
    ref = belief_propagation(mrf.to_factor_graph(), "max", schedule="parallel", normalize="max", tol=0.0, max_iter=5)
    for b, r in zip(res.beliefs, ref.variable_beliefs, strict=True):
        assert np.allclose(b, r, atol=1e-12)
    assert res.labels[0] == 0 and res.labels[2] in (1, 2)


def test_lbp_on_an_edgeless_mrf_with_a_node_all_forbidden_raises():
    mrf = PairwiseMRF([2], [], [np.array([-np.inf, -np.inf])], [])
    with pytest.raises(ValueError, match="every label forbidden"):
        lbp_map(mrf)


def test_lbp_names_message_scores_beyond_float64():
    """A node score plus an edge score above float64's range made inf - inf = NaN messages; a NaN change counted
    as 0, so the run "converged" after one iteration with NaN beliefs and labels [0, 0] (the MAP is [1, 1])."""
    big = 1e308
    mrf = PairwiseMRF([2, 2], [(0, 1)], [np.array([0.0, big]), np.zeros(2)], [np.array([[0.0, 0.0], [0.0, big]])])
    with pytest.raises(ValueError, match="overflow float64 in a message"):
        lbp_map(mrf)
    mrf = PairwiseMRF([2, 2], [(0, 1)], [np.array([-np.inf, big]), np.zeros(2)], [np.array([[0.0, 0.0], [0.0, big]])])
    with pytest.raises(ValueError, match="overflow float64 in a message"):
        lbp_map(mrf)                                                # the path that tracks -inf exactly


def test_exact_map_names_scores_beyond_float64(recwarn):
    """Finite potentials summing past float64's range: +inf sums left no finite score (NumPy's 'zero-size array to
    reduction operation' from the tie count), -inf sums were 'contradictory potentials', with overflow warnings."""
    big = 1e308
    above = PairwiseMRF([2, 2], [(0, 1)], [np.array([big, big]), np.array([big, 0.0])], [np.full((2, 2), big)])
    below = PairwiseMRF([2, 2], [(0, 1)], [np.array([-big, -big]), np.array([0.0, 1.0])], [np.full((2, 2), -big)])
    for mrf in (above, below):
        with pytest.raises(ValueError, match="the potentials' sums overflow float64 for some labellings"):
            exact_map(mrf)
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]
    # -inf potentials are forbidden parts, not an overflow; a sum that is finite next to them is kept
    mixed = PairwiseMRF([2, 2], [(0, 1)], [np.array([-np.inf, big]), np.array([0.0, 1.0])],
                        [np.array([[0.0, -np.inf], [-np.inf, 0.0]])])
    res = exact_map(mixed)
    assert res.labels.tolist() == [1, 1] and res.objective == big + 1.0
    contradictory = PairwiseMRF([2, 2], [(0, 1)], [np.array([-np.inf, 0.0]), np.array([0.0, -np.inf])],
                                [np.array([[0.0, 0.0], [-np.inf, -np.inf]])])
    with pytest.raises(ValueError, match="contradictory potentials"):
        exact_map(contradictory)


def test_lbp_names_message_scores_below_float64():
    """Finite scores whose sums fell below -float64's range became -inf on the path that assumes finite messages:
    a message row all -inf (-inf - -inf = NaN after normalising) or one -inf entry (NaN cavities next iteration);
    the NaN change counted as 0 and the run "converged" with NaN beliefs and labels [0, 0]."""
    big = 1e308
    row = PairwiseMRF([2, 2], [(0, 1)], [np.array([-big, -big]), np.array([0.0, 1.0])], [np.full((2, 2), -big)])
    entry = PairwiseMRF([2, 2], [(0, 1)], [np.array([0.0, -big]), np.zeros(2)],
                        [np.array([[big, -big], [-big, -big]])])
    for mrf in (row, entry):
        with pytest.raises(ValueError, match="overflow float64 in a message"):
            lbp_map(mrf)


def test_lp_lbp_and_scores_name_sums_beyond_float64_as_exact_map_does(recwarn):
    """Two nodes of score 1e308: exact_map named the overflow, while lbp_map and lp_map returned objective inf,
    score([1, 1]) and expected_score of its one-hot point inf, and score([0, 0]) of two -1e308 nodes -inf (read as
    forbidden), all with overflow warnings."""
    big = 1e308
    above = PairwiseMRF([2, 2], [(0, 1)], [np.array([0.0, big])] * 2)
    below = PairwiseMRF([2, 2], [(0, 1)], [np.array([-big, 0.0])] * 2)
    calls = (lambda: lbp_map(above), lambda: lbp_map(above, backend="factor_graphs"), lambda: lp_map(above),
             lambda: above.score([1, 1]), lambda: above.expected_score(above.one_hot([1, 1])),
             lambda: below.score([0, 0]), lambda: below.expected_score(below.one_hot([0, 0])))
    for call in calls:
        with pytest.raises(ValueError, match="the potentials' sums overflow float64"):
            call()
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning) and "mrf" in w.filename]
    # a forbidden part stays -inf whatever the other terms sum to; sums in range are unchanged
    forbid = above.with_potentials(above.node_potentials, [np.array([[0.0, 0.0], [0.0, -np.inf]])])
    assert forbid.score([1, 1]) == -np.inf and forbid.expected_score(forbid.one_hot([1, 1])) == -np.inf
    assert above.score([0, 1]) == big and lp_map(above.with_potentials([np.array([0.0, big]), np.zeros(2)])
                                                 ).objective == big
