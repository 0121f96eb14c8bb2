"""Pairwise MRFs built from accelerator tensors agree with the same MRFs built from CPU tensors.

The MRF module computes in NumPy on the host: device tensors (potentials, features, weights, labellings, the
paper's inputs) are accepted wherever CPU tensors are and give the same NumPy results; the oracle potentials of
:meth:`PairwiseMRF.to_pairwise_potentials`, moved to the device, decode there.  Skipped without CUDA;
``BETHEPROJ_TEST_DEVICE=cpu`` runs them on the CPU (see ``tests/conftest.py``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import betheproj as bp
from betheproj.mrf import (
    TRIANGLE_INPUTS,
    LinearPairwiseMRF,
    LocalPolytope,
    PairwiseMRF,
    exact_map,
    figure2_mrf,
    lbp_map,
    lp_map,
    lp_margin_bounds,
    lp_radius_bounds,
    random_grid_dataset,
    triangle_correct,
    triangle_model,
)
from betheproj.oracles.base import PairwisePotentials

DTYPES = [torch.float64, torch.float32]
EDGES = [(0, 1), (1, 2), (2, 3), (3, 4), (4, 0), (1, 3)]            # loopy
SOLVERS = {"exact": exact_map, "lp": lp_map, "lbp": lambda m: lbp_map(m, max_iter=100),
           "lbp_factor_graphs": lambda m: lbp_map(m, max_iter=100, backend="factor_graphs")}


def _same(a, b):
    """NumPy arrays (or lists of them) from the same float64 inputs: equal up to rounding."""
    if isinstance(b, list):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _same(x, y)
        return
    assert isinstance(a, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


def _randn(gen, dtype, to):
    return lambda *shape: to(torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype))


def _mrf(to, dtype, shared):
    rnd = _randn(torch.Generator().manual_seed(3), dtype, to)
    cards = (3,) * 5 if shared else (2, 3, 2, 3, 2)
    node = [rnd(c) for c in cards]
    if shared:
        return PairwiseMRF(list(cards), EDGES, node, rnd(3, 3))
    edge = [rnd(cards[i], cards[j]) for i, j in EDGES]
    edge[0][1, 0] = -torch.inf
    return PairwiseMRF(list(cards), EDGES, node, edge)


def _check_result(res, ref):
    assert np.array_equal(res.labels, ref.labels) and res.integral == ref.integral
    assert res.objective == pytest.approx(ref.objective, rel=1e-12, abs=1e-12)
    _same(res.marginals.node, ref.marginals.node)
    _same(res.marginals.edge, ref.marginals.edge)
    assert (res.converged, res.iterations) == (ref.converged, ref.iterations)


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_pairwise_mrf_map(accelerator, dtype, shared):
    ref, mrf = _mrf(lambda t: t, dtype, shared), _mrf(lambda t: t.to(accelerator), dtype, shared)
    _same(mrf.node_potentials, ref.node_potentials)
    _same(mrf.edge_potentials, ref.edge_potentials)
    for solve in SOLVERS.values():
        _check_result(solve(mrf), solve(ref))
    y = torch.from_numpy(exact_map(ref).labels)
    assert mrf.score(y.to(accelerator)) == ref.score(y.numpy())
    assert mrf.label_names(y.to(accelerator)) == ref.label_names(y.numpy())
    _same(mrf.one_hot(y.to(accelerator)).stack(), ref.one_hot(y.numpy()).stack())


def _linear(to, dtype, binary=False):
    rnd = _randn(torch.Generator().manual_seed(4), dtype, to)
    cards, edges, d = ((2, 2, 2), [(0, 1), (1, 2), (2, 0)], 3) if binary else ((2, 3, 2, 3, 2), EDGES, 4)
    nf = [rnd(c, d) for c in cards]
    ef = [rnd(cards[i], cards[j], d) if e % 2 else None for e, (i, j) in enumerate(edges)]
    if binary:                                       # Theorem 1's bounds: no offsets
        return LinearPairwiseMRF(list(cards), edges, nf, ef)
    return LinearPairwiseMRF(list(cards), edges, nf, ef, [rnd(c) for c in cards],
                             [rnd(cards[i], cards[j]) for i, j in edges])


@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_mrf_features_and_bounds(accelerator, dtype):
    to = lambda t: t.to(accelerator)                 # noqa: E731
    ref, model = _linear(lambda t: t, dtype), _linear(to, dtype)
    _same(model.feature_matrix(), ref.feature_matrix())
    w = torch.randn(model.num_features, dtype=torch.float64).to(dtype)
    pot, pot_ref = model.potentials(to(w)), ref.potentials(w)
    _same(pot.node_potentials, pot_ref.node_potentials)
    _same(pot.edge_potentials, pot_ref.edge_potentials)
    res = lp_map(pot_ref)
    y = torch.from_numpy(res.labels)
    _same(model.features(to(y)), ref.features(y.numpy()))
    _same(model.features(res), ref.features(res))
    assert model.offset(to(y)) == ref.offset(y.numpy())
    poly = LocalPolytope.of(ref)
    c = torch.randn(poly.num_columns, dtype=torch.float64)
    value, z = poly.maximize(to(c))
    value_ref, z_ref = poly.maximize(c.numpy())
    assert value == pytest.approx(value_ref, rel=1e-12, abs=1e-12)
    _same(z, z_ref)

    ref, model = _linear(lambda t: t, dtype, binary=True), _linear(to, dtype, binary=True)
    w = torch.randn(model.num_features, dtype=torch.float64).to(dtype)
    gold = torch.from_numpy(exact_map(ref.potentials(w)).labels)
    assert lp_margin_bounds(model, to(gold), to(w)) == pytest.approx(lp_margin_bounds(ref, gold.numpy(), w),
                                                                     rel=1e-12, abs=1e-12)
    assert lp_radius_bounds(model, to(gold)) == pytest.approx(lp_radius_bounds(ref, gold.numpy()), rel=1e-12,
                                                              abs=1e-12)


def test_paper_constructions(accelerator):
    to = lambda t: t.to(accelerator)                 # noqa: E731
    for x in TRIANGLE_INPUTS:                        # section 3: the triangle, its LP solution, the zero-loss rule
        xt = torch.tensor(x, dtype=torch.float64)
        model = triangle_model(to(xt))
        _same(model.feature_matrix(), triangle_model(x).feature_matrix())
        res, ref = lp_map(model.potentials(to(torch.ones(3)))), lp_map(triangle_model(x).potentials(np.ones(3)))
        _check_result(res, ref)
        assert triangle_correct(to(xt), res) == triangle_correct(x, ref)
        for y in ([0, 1, 0], [1, 1, 0]):
            assert triangle_correct(to(xt), to(torch.tensor(y))) == triangle_correct(x, y)
    for alpha, beta in ((1.0, -0.95), (0.5, -1.0)):  # section 4: Figure 2, scalars given as 0-dim device tensors
        args = [to(torch.tensor(v, dtype=torch.float64)) for v in (alpha, beta, 30.0)]
        mrf, ref = figure2_mrf(*args), figure2_mrf(alpha, beta, 30.0)
        for solve in SOLVERS.values():
            _check_result(solve(mrf), solve(ref))
    w = torch.randn(5, dtype=torch.float64)          # section 5.1: a grid data set under a device w_true
    data, w_true = random_grid_dataset(2, 2, 2, w_true=to(w), min_margin=0.0)
    data_ref, w_ref = random_grid_dataset(2, 2, 2, w_true=w, min_margin=0.0)
    _same(w_true, w_ref)
    for (m, gold), (m_ref, gold_ref) in zip(data, data_ref, strict=True):
        assert np.array_equal(gold, gold_ref)
        _same(m.feature_matrix(), m_ref.feature_matrix())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", ["chain", "tree"])
def test_oracle_potentials_on_device(accelerator, shape, dtype):
    """``to_pairwise_potentials`` (label sets padded with -inf) moved to the device: the chain and tree oracles
    decode the MRF's exact MAP there and their marginals agree with the CPU."""
    rng = np.random.default_rng(5)
    cards = (2, 3, 1, 3, 2, 3)
    if shape == "chain":
        parents, oracle = None, bp.LinearChain()
        edges = [(0, 1), (2, 1), (2, 3), (3, 4), (4, 5)]
    else:
        parents, oracle = [-1, 0, 0, 1, 1, 2], bp.Tree([-1, 0, 0, 1, 1, 2])
        edges = [(1, 3), (0, 1), (0, 2), (4, 1), (2, 5)]
    mrf = PairwiseMRF(list(cards), edges, [rng.normal(size=c) for c in cards],
                      [rng.normal(size=(cards[i], cards[j])) for i, j in edges])
    pot = mrf.to_pairwise_potentials(parents, dtype=dtype)
    moved = PairwisePotentials(pot.node.to(accelerator), pot.edge.to(accelerator), pot.lengths.to(accelerator))
    labels = oracle.map(moved)
    assert labels.device.type == accelerator.type
    assert np.array_equal(labels[0].cpu().numpy(), exact_map(mrf).labels)
    assert torch.equal(labels.cpu(), oracle.map(pot))
    marg, ref = oracle.marginals(moved), oracle.marginals(pot)
    assert marg.node.device.type == accelerator.type and marg.node.dtype == dtype
    tol = 1e-10 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(marg.node.cpu(), ref.node, atol=tol, rtol=tol)
