"""The feature map Phi(x, z): validation, linear in w and in mu, overflowing potentials."""

import itertools

import numpy as np
import pytest
import torch

from betheproj.mrf import (
    LinearPairwiseMRF,
    LocalMarginals,
)


def _random_model(rng, cards, edges, d=3, offsets=False):
    nf = [rng.normal(size=(c, d)) for c in cards]
    ef = [rng.normal(size=(cards[i], cards[j], d)) if k % 2 == 0 else None for k, (i, j) in enumerate(edges)]
    no = [rng.normal(size=c) for c in cards] if offsets else None
    return LinearPairwiseMRF(list(cards), edges, nf, ef, node_offsets=no)


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


def test_feature_lists_may_be_stacked_arrays_and_other_types_are_named():
    # a stacked (n, c, d) array was a ValueError 'must be a list with one (c_i, d) array per node (2)' although
    # it held 2; PairwiseMRF takes stacked node potentials
    nf, ef = np.arange(12.0).reshape(2, 2, 3), np.ones((1, 2, 2, 3))
    ref = LinearPairwiseMRF([2, 2], [(0, 1)], list(nf), list(ef))
    for node, edge in ((nf, ef), (torch.tensor(nf), torch.tensor(ef))):
        model = LinearPairwiseMRF([2, 2], [(0, 1)], node, edge)
        assert np.array_equal(model.feature_matrix(), ref.feature_matrix())
    with pytest.raises(ValueError, match=r"node_features must hold one \(c_i, d\) array \(or None\) per node \(2\), "
                                         "got 3"):
        LinearPairwiseMRF([2, 2], [(0, 1)], np.ones((3, 2, 3)))
    for bad in (5, "ab", np.float64(1.0), {0: np.ones((2, 3))}):
        with pytest.raises(TypeError, match="node_features must be a list with one"):
            LinearPairwiseMRF([2, 2], [(0, 1)], bad)
    with pytest.raises(TypeError, match="edge_features must be a list with one"):
        LinearPairwiseMRF([2, 2], [(0, 1)], None, {0: ef[0]})


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


def test_potentials_that_overflow_are_an_error_naming_w():
    model = LinearPairwiseMRF([2], [], [np.array([[1.0], [2.0]])])
    for w in ([1e308], [-1e308]):
        with pytest.raises(ValueError, match="w is too large"):
            model.potentials(np.array(w))
    # F w finite, F w + offsets +inf: accepted, and exact_map's objective was inf
    model = LinearPairwiseMRF([2], [], [np.array([[1.0], [0.0]])], node_offsets=[np.array([1e308, 0.0])])
    with pytest.raises(ValueError, match=r"F w \+ offsets overflow float64"):
        model.potentials(np.array([1e308]))
    assert model.potentials(np.array([-1e308])).node_potentials[0].tolist() == [0.0, 0.0]
