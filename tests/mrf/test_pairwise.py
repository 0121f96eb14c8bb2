"""The pairwise MRF layer: validation, exact/LP/LBP MAP against enumeration and the factor-graph machinery, the
feature map (linear in w and in mu), the chain/tree-oracle conversion and the Theorem-1 certificates."""

import itertools

import numpy as np
import pytest
import torch

import betheproj as bp
from betheproj.factor_graphs import belief_propagation
from betheproj.mrf import (
    LinearPairwiseMRF,
    LocalMarginals,
    LocalPolytope,
    PairwiseMRF,
    exact_map,
    grid_edges,
    lbp_map,
    lp_map,
    lp_margin_bounds,
    lp_radius_bounds,
)


def _random_mrf(rng, cards, edges, scale=1.0):
    node = [rng.normal(size=c) * scale for c in cards]
    edge = [rng.normal(size=(cards[i], cards[j])) * scale for i, j in edges]
    return PairwiseMRF(list(cards), edges, node, edge)


def _brute_force(mrf):
    best, arg = -np.inf, None
    for y in itertools.product(*[range(c) for c in mrf.cardinalities]):
        s = mrf.score(np.array(y))
        if s > best:
            best, arg = s, np.array(y)
    return best, arg


# --- validation --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("labels, edges, err, match", [
    ([2, 0], [], ValueError, r"labels\[1\] must be at least 1"),
    ([2, ["a", "a"]], [], ValueError, r"labels\[1\] repeats"),
    ([2, []], [], ValueError, r"labels\[1\] is empty"),
    ([2, 2.5], [], TypeError, r"labels\[1\] must be an int"),
    ([], [], ValueError, "labels is empty"),
    ("ab", [], TypeError, "labels must be a sequence"),
    ([2, 2], [(0, 0)], ValueError, "self-loop"),
    ([2, 2], [(0, 1), (1, 0)], ValueError, "repeats an edge"),
    ([2, 2], [(0, 2)], ValueError, r"edges\[0\]\[1\] = 2 is not a node"),
    ([2, 2], [(0,)], ValueError, r"edges\[0\] must be a pair"),
    ([2, 2], [(0, 1.0)], TypeError, r"edges\[0\]\[1\] must be an int"),
])
def test_structure_errors(labels, edges, err, match):
    with pytest.raises(err, match=match):
        PairwiseMRF(labels, edges)


def test_potential_errors():
    with pytest.raises(ValueError, match=r"node_potentials\[1\] must have shape \(3,\)"):
        PairwiseMRF([2, 3], [(0, 1)], [np.zeros(2), np.zeros(2)])
    with pytest.raises(ValueError, match=r"node_potentials\[0\] contains NaN"):
        PairwiseMRF([2, 3], [(0, 1)], [np.array([np.nan, 0.0]), np.zeros(3)])
    with pytest.raises(ValueError, match=r"edge_potentials\[0\] must have shape \(2, 3\)"):
        PairwiseMRF([2, 3], [(0, 1)], None, [np.zeros((3, 2))])
    with pytest.raises(ValueError, match="one table per edge"):
        PairwiseMRF([2, 3], [(0, 1)], None, [])
    with pytest.raises(ValueError, match=r"must be finite or -inf"):
        PairwiseMRF([2, 2], [(0, 1)], None, np.full((2, 2), np.inf))
    mrf = PairwiseMRF([2, 3], [(0, 1)])
    with pytest.raises(ValueError, match="labelling has label indices outside"):
        mrf.score([0, 3])
    with pytest.raises(ValueError, match="labelling must hold 2 integer"):
        mrf.score([0.0, 1.0])
    with pytest.raises(TypeError, match="mrf must be a PairwiseMRF"):
        exact_map("not an mrf")
    with pytest.raises(ValueError, match="more than max_configurations=4"):
        exact_map(mrf, max_configurations=4)
    with pytest.raises(ValueError, match="backend must be"):
        lbp_map(mrf, backend="torch")
    with pytest.raises(ValueError, match="damping must lie in"):
        lbp_map(mrf, damping=1.0)
    with pytest.raises(ValueError, match="max_iter must be a positive int"):
        lbp_map(mrf, max_iter=0)
    forbidden = PairwiseMRF([2, 2], [(0, 1)], None, np.full((2, 2), -np.inf))
    with pytest.raises(ValueError, match="score -inf"):
        exact_map(forbidden)
    with pytest.raises(ValueError, match="zero for every label"):
        lbp_map(forbidden)


def test_feature_model_errors():
    with pytest.raises(ValueError, match=r"node_features\[1\] must have shape \(3, d\)"):
        LinearPairwiseMRF([2, 3], [(0, 1)], [np.zeros((2, 4)), np.zeros((2, 4))])
    with pytest.raises(ValueError, match=r"edge_features\[0\] has 5 features, the others 4"):
        LinearPairwiseMRF([2, 3], [(0, 1)], [np.zeros((2, 4)), None], [np.zeros((2, 3, 5))])
    with pytest.raises(ValueError, match="no features given"):
        LinearPairwiseMRF([2, 3], [(0, 1)])
    with pytest.raises(ValueError, match=r"node_features\[0\] must be finite"):
        LinearPairwiseMRF([2], [], [np.array([[np.inf], [0.0]])])
    m = LinearPairwiseMRF([2, 3], [(0, 1)], [np.zeros((2, 4)), None])
    with pytest.raises(ValueError, match=r"w must have shape \(4,\)"):
        m.potentials(np.zeros(3))
    with pytest.raises(ValueError, match="z must hold 2 integer"):
        m.features([0])
    with pytest.raises(ValueError, match="one label per node"):
        m.structure.label_index(["x"])


# --- MAP routines ------------------------------------------------------------------------------------------------
def test_per_node_label_sets_and_names():
    mrf = PairwiseMRF([("A", "B"), ("B", "C"), 3], [(0, 1), (1, 2)])
    assert mrf.cardinalities == (2, 2, 3)
    assert mrf.label_names([1, 0, 2]) == ["B", "B", 2]
    assert mrf.label_index(["B", "C", 0]).tolist() == [1, 1, 0]
    assert mrf.neighbors(1) == [0, 2]
    with pytest.raises(ValueError, match=r"names\[0\] = 'C' is not in node 0's label set"):
        mrf.label_index(["C", "C", 0])


def test_exact_map_and_factor_graph_scores_match_brute_force():
    rng = np.random.default_rng(0)
    for cards, edges in [((2, 3, 2, 4), [(0, 1), (1, 2), (2, 3), (3, 0), (0, 2)]), ((3,), []),
                         ((2, 2, 2), [(2, 0), (1, 2)])]:
        mrf = _random_mrf(rng, cards, edges)
        best, arg = _brute_force(mrf)
        res = exact_map(mrf)
        assert res.objective == pytest.approx(best) and np.array_equal(res.labels, arg) and res.integral
        g = mrf.to_factor_graph()
        for y in itertools.product(*[range(c) for c in cards]):
            assert g.score(list(y)) == pytest.approx(mrf.score(np.array(y)))
        assert mrf.expected_score(res.marginals) == pytest.approx(best)


def test_lp_map_is_exact_on_trees_and_an_upper_bound_on_loops():
    rng = np.random.default_rng(1)
    for _ in range(4):
        tree = _random_mrf(rng, (2, 3, 2, 3, 2), [(0, 1), (1, 2), (1, 3), (3, 4)])
        lp, ex = lp_map(tree), exact_map(tree)
        assert lp.integral and np.array_equal(lp.labels, ex.labels)
        assert lp.objective == pytest.approx(ex.objective, abs=1e-7)
    fractional = 0
    for _ in range(8):
        loopy = _random_mrf(rng, (2,) * 6, grid_edges(2, 3), scale=2.0)
        lp, ex = lp_map(loopy), exact_map(loopy)
        assert lp.objective >= ex.objective - 1e-7
        assert loopy.expected_score(lp.marginals) == pytest.approx(lp.objective, abs=1e-7)
        for e, (i, j) in enumerate(loopy.edges):          # a point of the local polytope
            assert np.allclose(lp.edge_marginals[e].sum(1), lp.node_marginals[i], atol=1e-8)
            assert np.allclose(lp.edge_marginals[e].sum(0), lp.node_marginals[j], atol=1e-8)
        if lp.integral:
            assert lp.objective == pytest.approx(ex.objective, abs=1e-7)
        fractional += not lp.integral
    # factor_graphs.lp_map agrees with our own local polytope
    poly = LocalPolytope.of(loopy)
    c = np.concatenate([t.reshape(-1) for t in loopy.node_potentials + loopy.edge_potentials])
    val, _ = poly.maximize(c)
    assert val == pytest.approx(lp_map(loopy).objective, abs=1e-7)


def test_lbp_is_exact_on_trees_and_matches_the_factor_graph_backend():
    rng = np.random.default_rng(2)
    for _ in range(3):
        tree = _random_mrf(rng, (2, 3, 2, 4, 2), [(0, 1), (1, 2), (3, 1), (3, 4)])
        res = lbp_map(tree)
        assert res.converged and res.iterations < 20
        assert np.array_equal(res.labels, exact_map(tree).labels)
    for damping in (0.0, 0.3):
        loopy = _random_mrf(rng, (2, 3, 2, 3), [(0, 1), (1, 2), (2, 3), (3, 0), (1, 3)])
        for iters in (1, 2, 7):
            mine = lbp_map(loopy, max_iter=iters, tol=0.0, damping=damping)
            ref = belief_propagation(loopy.to_factor_graph(), "max", schedule="parallel", normalize="max",
                                     damping=damping, tol=0.0, max_iter=iters)
            for b, r in zip(mine.beliefs, ref.variable_beliefs, strict=True):
                assert np.allclose(b, r, atol=1e-12)
            k = min(len(mine.history), len(ref.history))     # tol=0 stops at an exact fixed point, which
            assert np.allclose(mine.history[:k], ref.history[:k], atol=1e-12)   # rounding may reach in one only
            assert max(mine.history[k:] + ref.history[k:], default=0.0) <= 1e-12
        fg = lbp_map(loopy, backend="factor_graphs", damping=damping)
        npy = lbp_map(loopy, damping=damping)
        assert np.array_equal(fg.labels, npy.labels) and fg.converged == npy.converged


@pytest.mark.parametrize("backend", ["numpy", "factor_graphs"])
def test_damped_lbp_keeps_hard_zeros_and_converges(backend):
    """A forbidden label pair on a triangle: the exact zeros it sends used to be mixed with the old messages,
    shrinking by the damping factor per iteration, so a tight tolerance was never met."""
    mrf = PairwiseMRF([2, 2, 2], [(0, 1), (1, 2), (2, 0)], [[-np.inf, 1.0], [0.5, 0.0], [0.0, 0.2]],
                      [np.array([[0.0, 0.3], [0.0, -np.inf]]), np.zeros((2, 2)), np.array([[0.4, 0.0], [0.0, 0.1]])])
    res = lbp_map(mrf, damping=0.5, tol=1e-12, max_iter=500, backend=backend)   # node 0 = 1 forbids node 1 = 1
    assert res.converged and res.iterations < 200
    assert res.beliefs[1][1] == 0.0
    assert np.array_equal(res.labels, exact_map(mrf).labels)


def test_lbp_handles_forbidden_labels_and_unequal_label_sets():
    rng = np.random.default_rng(3)
    mrf = _random_mrf(rng, (2, 3, 4), [(0, 1), (1, 2), (2, 0)])
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


# --- the feature map ---------------------------------------------------------------------------------------------
def _random_model(rng, cards, edges, d=3, offsets=False):
    nf = [rng.normal(size=(c, d)) for c in cards]
    ef = [rng.normal(size=(cards[i], cards[j], d)) if k % 2 == 0 else None for k, (i, j) in enumerate(edges)]
    no = [rng.normal(size=c) for c in cards] if offsets else None
    return LinearPairwiseMRF(list(cards), edges, nf, ef, node_offsets=no)


def test_features_are_linear_in_w_and_in_mu():
    rng = np.random.default_rng(4)
    model = _random_model(rng, (2, 3, 2), [(0, 1), (1, 2), (2, 0)], offsets=True)
    w = rng.normal(size=3)
    mrf = model.potentials(w)
    feats = model.all_features()
    for y in itertools.product(range(2), range(3), range(2)):
        y = np.array(y)
        phi = model.features(y)
        assert np.allclose(phi, feats[tuple(y)])
        assert mrf.score(y) == pytest.approx(w @ phi + model.offset(y))
        assert np.allclose(model.features(mrf.one_hot(y)), phi)
        assert np.allclose(model.feature_matrix() @ mrf.one_hot(y).stack(), phi)
    # expected features of a mixture of two labellings
    a, b = mrf.one_hot([0, 1, 1]), mrf.one_hot([1, 2, 0])
    mix = LocalMarginals([0.3 * p + 0.7 * q for p, q in zip(a.node, b.node, strict=True)],
                         [0.3 * p + 0.7 * q for p, q in zip(a.edge, b.edge, strict=True)])
    assert np.allclose(model.features(mix), 0.3 * model.features([0, 1, 1]) + 0.7 * model.features([1, 2, 0]))
    assert model.features(torch.tensor([1, 2, 0])) == pytest.approx(model.features([1, 2, 0]))


def test_chain_and_tree_oracle_conversion_match_enumeration():
    rng = np.random.default_rng(5)
    chain = _random_mrf(rng, (3, 3, 3, 3, 3), [(0, 1), (2, 1), (2, 3), (3, 4)])
    labels = bp.LinearChain().map(chain.to_pairwise_potentials())[0].numpy()
    assert np.array_equal(labels, exact_map(chain).labels)
    parents = [-1, 0, 0, 1, 1, 2]
    tree = _random_mrf(rng, (2, 3, 3, 2, 3, 1), [(1, 3), (0, 1), (0, 2), (4, 1), (2, 5)])
    labels = bp.Tree(parents).map(tree.to_pairwise_potentials(parents))[0].numpy()
    assert np.array_equal(labels, exact_map(tree).labels)
    with pytest.raises(ValueError, match="no edge between node 2 and its parent 1"):
        tree.to_pairwise_potentials()
    with pytest.raises(ValueError, match="a tree on 3 nodes has 2"):
        PairwiseMRF([2, 2, 2], [(0, 1), (1, 2), (2, 0)]).to_pairwise_potentials()


# --- Theorem-1 certificates --------------------------------------------------------------------------------------
def test_margin_and_radius_brackets():
    rng = np.random.default_rng(6)
    d = 3
    edges = grid_edges(2, 3)
    nf = [np.vstack([np.zeros(d), rng.normal(size=d)]) for _ in range(6)]
    ef = [np.stack([np.stack([np.zeros(d), s]), np.stack([s, np.zeros(d)])]) for s in rng.normal(size=(7, d))]
    model = LinearPairwiseMRF([2] * 6, edges, nf, ef)
    w = rng.normal(size=d)
    gold = lp_map(model.potentials(w))
    assert gold.integral
    g_lo, g_hi = lp_margin_bounds(model, gold.labels, w)
    assert 0 < g_lo <= g_hi
    u = w / np.linalg.norm(w)
    second = np.sort((model.all_features() @ u).reshape(-1))[-2]
    assert g_hi == pytest.approx(model.features(gold.labels) @ u - second)
    r_lo, r_hi = lp_radius_bounds(model, gold.labels)
    assert 0 < r_lo <= r_hi
    # fractional vertices found under other weights respect both brackets
    for _ in range(20):
        z = lp_map(model.potentials(rng.normal(size=d)))
        if not np.array_equal(z.labels, gold.labels) or not z.integral:
            diff = model.features(gold.labels) - model.features(z)
            assert u @ diff >= g_lo - 1e-9 and np.linalg.norm(diff) <= r_hi + 1e-9
    with pytest.raises(ValueError, match="binary label sets"):
        lp_margin_bounds(LinearPairwiseMRF([3], [], [np.ones((3, 1))]), [0], np.ones(1))
    with pytest.raises(ValueError, match="offsets"):
        lp_margin_bounds(LinearPairwiseMRF([2], [], [np.ones((2, 1))], node_offsets=[np.zeros(2)]), [0], np.ones(1))


def test_lbp_on_an_edgeless_mrf_with_a_node_all_forbidden_raises():
    mrf = PairwiseMRF([2], [], [np.array([-np.inf, -np.inf])], [])
    with pytest.raises(ValueError, match="every label forbidden"):
        lbp_map(mrf)


def test_potentials_that_overflow_are_an_error_naming_w():
    model = LinearPairwiseMRF([2], [], [np.array([[1.0], [2.0]])])
    for w in ([1e308], [-1e308]):
        with pytest.raises(ValueError, match="w is too large"):
            model.potentials(np.array(w))
