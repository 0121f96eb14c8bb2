"""All three solvers reach the optimum of (2) computed by CVXPY + Clarabel, for every convex energy."""

import cvxpy as cp
import numpy as np
import pytest
import torch

import betheproj as bp
from betheproj.energies import FunctionEnergy, LinearMeasurements, Poisson
from tests.cvx_reference import chain_problem

DT = torch.float64
METHODS = ["rda", "md", "accelerated"]


def _random_chain(b=3, n=4, c=3, lengths=(4, 2, 1), scale=1.0, forbid=True):
    node = torch.randn(b, n, c, dtype=DT) * scale
    edge = torch.randn(b, n - 1, c, c, dtype=DT) * scale
    if forbid:
        edge[0, 0, 0, 1] = -float("inf")          # a forbidden transition
    return bp.ChainPotentials(node, edge, torch.tensor(lengths[:b]))


def _np(x):
    return x.detach().numpy()


# each case: (energy, cvxpy builder for one example given (b, mu, pairs, length))
def _label_count_case(loss, cvx_loss, b):
    a = torch.randn(5, 3, dtype=DT)
    off = torch.randn(5, dtype=DT)
    psi = torch.rand(1, 5, dtype=DT) + 0.5
    energy = LinearMeasurements(node=a, offset=off, loss=loss, psi=psi)

    def build(i, mu, pairs, length):
        z = cp.sum(mu, axis=0) @ _np(a).T - _np(off)
        return cp.sum(cp.multiply(_np(psi)[0], cvx_loss(z)))
    return energy, build


CVX_LOSSES = {
    "smoothed_hinge": lambda z: cp.huber(cp.pos(z), 1.0) / 2,
    "squared_hinge": lambda z: cp.square(cp.pos(z)) / 2,
    "squared": lambda z: cp.square(z) / 2,
    "smoothed_abs": lambda z: cp.huber(z, 1.0) / 2,
}


def _edge_case(b):
    a = torch.randn(4, 3, 3, dtype=DT)
    off = torch.rand(4, dtype=DT)
    energy = LinearMeasurements(edge=a, offset=off, loss="squared_hinge", psi=1.5)

    def build(i, mu, pairs, length):
        if not pairs:
            z = -_np(off) + np.zeros(4)
            return float(1.5 * (np.maximum(z, 0) ** 2 / 2).sum())
        total = sum(pairs)
        z = cp.hstack([cp.sum(cp.multiply(_np(a[j]), total)) for j in range(4)]) - _np(off)
        return 1.5 * cp.sum(cp.square(cp.pos(z))) / 2
    return energy, build


def _position_case(b, n=4):
    a = torch.randn(3, n, 3, dtype=DT)
    energy = LinearMeasurements(node=a, offset=0.2, loss="squared", psi=torch.tensor([1.0, 2.0, 0.5], dtype=DT))

    def build(i, mu, pairs, length):
        psi = [1.0, 2.0, 0.5][i]
        z = cp.hstack([cp.sum(cp.multiply(_np(a[j, :length]), mu)) for j in range(3)]) - 0.2
        return psi * cp.sum(cp.square(z)) / 2
    return energy, build


def _poisson_case(b, n=4, c=3, rate=0.7, scale=5.0):
    counts = torch.randint(0, 4, (b, n, c)).to(DT)
    energy = Poisson(counts, rate=rate, scale=scale)

    def build(i, mu, pairs, length):
        y = _np(counts[i, :length])
        const = (y / scale * np.log(rate * scale)).sum()
        return rate * cp.sum(mu) - cp.sum(cp.multiply(y / scale, cp.log(mu))) - const
    return energy, build


def _user_case(b):
    a = torch.randn(2, 3, dtype=DT)

    def fn(mu):
        counts = mu.node.sum(1)                                  # [B, C]
        hinge = 0.5 * torch.relu(counts @ a.t() - 0.3).pow(2).sum(-1)
        log_barrier = torch.where(mu.node_mask()[..., None], torch.log(mu.node), torch.zeros((), dtype=DT))
        return hinge - 0.05 * log_barrier.sum((1, 2))

    def build(i, mu, pairs, length):
        z = cp.sum(mu, axis=0) @ _np(a).T - 0.3
        return cp.sum(cp.square(cp.pos(z))) / 2 - 0.05 * cp.sum(cp.log(mu))
    return FunctionEnergy(fn, "hinge_plus_log_barrier"), build


def _sum_case(b):
    e1, b1 = _label_count_case("smoothed_hinge", CVX_LOSSES["smoothed_hinge"], b)
    e2, b2 = _poisson_case(b)
    e3, b3 = _edge_case(b)
    return e1 + e2 + e3, lambda *args: b1(*args) + b2(*args) + b3(*args)


def _reference(theta, build):
    values = []
    for i in range(theta.node.shape[0]):
        length = int(theta.lengths[i])
        node = _np(theta.node[i, :length])
        edge = _np(theta.full_edge()[i, : length - 1])
        value, _ = chain_problem(node, edge, lambda mu, pairs, i=i, length=length: build(i, mu, pairs, length))
        values.append(value)
    return torch.tensor(values, dtype=DT)


CASES = {
    **{f"labelcount-{name}": (lambda name=name: _label_count_case(name, CVX_LOSSES[name], 3)) for name in CVX_LOSSES},
    "edge-measurements": lambda: _edge_case(3),
    "per-position": lambda: _position_case(3),
    "poisson": lambda: _poisson_case(3),
    "user-written": lambda: _user_case(3),
    "sum": lambda: _sum_case(3),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("method", METHODS)
def test_reaches_cvxpy_optimum(case, method):
    theta = _random_chain()
    energy, build = CASES[case]()
    ref = _reference(theta, build)
    sol = bp.solve(bp.LinearChain(), theta, energy, method=method, max_iter=1500, tol=1e-8)
    rel = ((sol.objective - ref).abs() / ref.abs().clamp_min(1.0))
    assert torch.isfinite(sol.objective).all()
    assert rel.max() < 1e-6, (sol.objective, ref, sol.iterations)
    # anytime: the reported objective is the objective of the returned marginals
    direct = bp.objective(bp.LinearChain(), theta, energy, sol.marginals)
    assert torch.allclose(direct, sol.objective, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("method", METHODS)
def test_poisson_cgm_like_chain(method):
    """A CGM-like instance: C = 16 cells, one long chain, Poisson counts of a population."""
    c, n = 16, 6
    theta = bp.ChainPotentials(torch.randn(1, n, c, dtype=DT) * 0.5, torch.randn(c, c, dtype=DT) * 2)
    energy, build = _poisson_case(1, n=n, c=c, rate=0.5, scale=20.0)
    ref = _reference(theta, build)
    sol = bp.solve(bp.LinearChain(), theta, energy, method=method, max_iter=1500, tol=1e-8)
    assert ((sol.objective - ref).abs() / ref.abs().clamp_min(1.0)).max() < 1e-6
