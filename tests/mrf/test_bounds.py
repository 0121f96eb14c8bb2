"""The Theorem-1 certificates: brackets on the LP margin and radius."""


import numpy as np
import pytest

from betheproj.mrf import (
    LinearPairwiseMRF,
    grid_edges,
    lp_map,
    lp_margin_bounds,
    lp_radius_bounds,
)


def test_margin_and_radius_brackets():
    rng = np.random.default_rng(6)
    d = 3
    edges = grid_edges(2, 3)
    nf = [np.vstack([np.zeros(d), rng.normal(size=d)]) for _ in range(6)]
    ef = [np.stack([np.stack([np.zeros(d), s]), np.stack([s, np.zeros(d)])]) for s in 3 * rng.normal(size=(7, d))]
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
    # vertices found under other weights, fractional ones included (strong couplings make them common here),
    # respect both brackets
    fractional = 0
    for _ in range(20):
        z = lp_map(model.potentials(rng.normal(size=d)))
        if not np.array_equal(z.labels, gold.labels) or not z.integral:
            diff = model.features(gold.labels) - model.features(z)
            assert u @ diff >= g_lo - 1e-9 and np.linalg.norm(diff) <= r_hi + 1e-9
        fractional += not z.integral
    assert fractional > 0                                   # measured: 5 of 20
    with pytest.raises(ValueError, match="binary label sets"):
        lp_margin_bounds(LinearPairwiseMRF([3], [], [np.ones((3, 1))]), [0], np.ones(1))
    with pytest.raises(ValueError, match="offsets"):
        lp_margin_bounds(LinearPairwiseMRF([2], [], [np.ones((2, 1))], node_offsets=[np.zeros(2)]), [0], np.ones(1))


def test_margin_bounds_depend_on_the_direction_of_w_only():
    """||w|| was formed from squares: w = (1e160, 1e160) gave the bounds (0, 0), (1e-300, 1e-300) "w must be
    non-zero", and (1e-160, 1e-160) bounds 5.6e-6 off (subnormal squares)."""
    features = [np.array([[0.0, 0.0], [1.0, 0.0]]), np.array([[0.0, 0.0], [0.0, 1.0]])]
    model = LinearPairwiseMRF([2, 2], [(0, 1)], features)
    expected = lp_margin_bounds(model, [1, 1], [1.0, 1.0])
    assert expected == pytest.approx((2 ** -1.5, 2 ** -0.5), rel=1e-12)
    for scale in (1e160, 1e-160, 1e-300, 1e300):
        assert lp_margin_bounds(model, [1, 1], [scale, scale]) == pytest.approx(expected, rel=1e-12)
    with pytest.raises(ValueError, match="w must be a non-zero vector"):
        lp_margin_bounds(model, [1, 1], [0.0, 0.0])


def test_radius_bounds_scale_with_the_features():
    """||Phi(z_i) - Phi(z)|| was formed from squares: features of 1e160 raised a bare OverflowError ('Numerical result
    out of range'), and features of 1e-170 gave the radius bounds (0, 0)."""
    def model(scale):
        features = [np.array([[0.0, 0.0], [1.0, 0.0]]) * scale, np.array([[0.0, 0.0], [0.0, 1.0]]) * scale]
        return LinearPairwiseMRF([2, 2], [(0, 1)], features)

    expected = lp_radius_bounds(model(1.0), [1, 1])
    assert expected == pytest.approx((2 ** 0.5, 2 ** 0.5), rel=1e-12)
    for scale in (1e160, 1e-170, 1e-300, 1e300):
        lower, upper = lp_radius_bounds(model(scale), [1, 1])
        assert (lower / scale, upper / scale) == pytest.approx(expected, rel=1e-12)
