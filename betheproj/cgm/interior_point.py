"""The interior-point baseline: problem (23) as a CVXPY exponential-cone program solved by Clarabel.

On a chain, ``-H_B(mu) = -H(mu_1) + sum_t sum_ij rel_entr(mu_t(i,j), mu_t(i))`` (minus the conditional entropies),
which is jointly convex, so the whole of (2) with the Poisson energy is a disciplined convex program over
the edge marginals with the local-polytope constraints (exact on a chain).  Needs the ``cgm`` extra
(``pip install "betheproj[cgm]"``: cvxpy and clarabel).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from .._checks import check_positive
from ..oracles import ChainPotentials
from .inference import check_observations

__all__ = ["IPResult", "check_installed", "interior_point"]


@dataclass
class IPResult:
    """Objective of (2) [B] and node marginals [B, T, L]; ``seconds`` all told (building, compiling and
    solving, per batch), ``solve_seconds`` inside Clarabel alone.  ``status`` is CVXPY's per example; where the
    solve failed (``"solver_error: ..."``, or no value) the objective is NaN and the marginals zero."""

    objective: Tensor
    node: Tensor
    seconds: float
    solve_seconds: float
    status: list[str]


def _one(node: np.ndarray, edge: np.ndarray, y: np.ndarray, rate: float, population: float, tol: float,
         scale: float) -> tuple[float | None, np.ndarray | None, float, str]:
    import cvxpy as cp

    steps, cells = node.shape
    mu = cp.Variable((steps, cells), nonneg=True)
    pairs = [cp.Variable((cells, cells), nonneg=True) for _ in range(steps - 1)]
    cons = [cp.sum(mu, axis=1) == 1]
    fin = np.isfinite(node)
    if not fin.all():
        cons.append(mu[~fin] == 0)
    linear = cp.sum(cp.multiply(np.where(fin, node, 0.0), mu))
    neg_entropy = -cp.sum(cp.entr(mu[0]))
    ones = np.ones((1, cells))
    for t, p in enumerate(pairs):
        cons += [cp.sum(p, axis=1) == mu[t], cp.sum(p, axis=0) == mu[t + 1]]
        fin = np.isfinite(edge[t])
        if not fin.all():
            cons.append(p[~fin] == 0)
        linear += cp.sum(cp.multiply(np.where(fin, edge[t], 0.0), p))
        neg_entropy += cp.sum(cp.rel_entr(p, cp.reshape(mu[t], (cells, 1), order="C") @ ones))
    # Poisson: (1/M) sum [alpha M mu - y log(alpha M mu)]
    seen = y > 0
    poisson = rate * cp.sum(mu) - float((y[seen] * math.log(rate * population)).sum()) / population
    if seen.any():
        poisson = poisson - cp.sum(cp.multiply(y[seen] / population, cp.log(mu[seen])))
    problem = cp.Problem(cp.Minimize(scale * (neg_entropy - linear + poisson)), cons)
    try:
        problem.solve(solver=cp.CLARABEL, tol_gap_abs=tol, tol_gap_rel=tol, tol_feas=tol, max_iter=500)
    except cp.error.SolverError as err:          # reported like any other failed solve: status, NaN objective
        return None, None, 0.0, f"solver_error: {' '.join(str(err).split())}"
    solve_time = problem.solver_stats.solve_time or 0.0
    # no marginals (e.g. "unbounded", whose value is -inf, on this bounded problem): no value either
    value = None if problem.value is None or mu.value is None else problem.value / scale
    return value, mu.value, solve_time, problem.status


def check_installed() -> None:
    """``ImportError`` unless cvxpy and clarabel (the ``cgm`` extra) can be imported: without clarabel, CVXPY
    only fails inside each solve, which would come back as a "solver_error" status and a NaN objective."""
    try:
        import clarabel  # noqa: F401
        import cvxpy  # noqa: F401
    except ImportError:
        raise ImportError('the interior-point baseline needs cvxpy and clarabel: pip install "betheproj[cgm]"'
                          ) from None


def interior_point(potentials: ChainPotentials, observed: Tensor, rate: float, population: float,
                   tol: float = 1e-9, scale: float = 0.01) -> IPResult:
    """Solve (23) for each example of the batch with CVXPY + Clarabel (gap and feasibility tolerances ``tol``).

    Clarabel minimises ``scale`` times the objective: unscaled (``scale=1``) it declared optimality 1e-6
    (relative) above the optimum at s = 10,000, at a feasible point, and tightening its tolerances to 1e-12
    only made it report "optimal_inaccurate"; scaled by 0.01 it agreed with the Bethe solvers to 5e-9."""
    tol, scale = check_positive("tol", tol), check_positive("scale", scale)
    check_installed()
    observed = check_observations(observed, rate, population, potentials)
    node = potentials.node.detach().cpu().double().numpy()
    edge = potentials.full_edge().detach().cpu().double().numpy()
    y = observed.detach().cpu().double().numpy()
    values, nodes, status = [], [], []
    solve_seconds = 0.0
    start = time.perf_counter()
    for b in range(node.shape[0]):
        n = int(potentials.lengths[b])
        value, mu, secs, stat = _one(node[b, :n], edge[b, :n - 1], y[b, :n], float(rate), float(population),
                                     tol, scale)
        full = np.zeros(node.shape[1:])
        if mu is not None:
            full[:n] = mu
        values.append(np.nan if value is None else value)
        nodes.append(full)
        status.append(stat)
        solve_seconds += secs
    seconds = time.perf_counter() - start
    dtype, device = potentials.node.dtype, potentials.node.device
    node_out = np.stack(nodes) if nodes else np.zeros(node.shape)
    return IPResult(torch.tensor(values, dtype=dtype, device=device),
                    torch.tensor(node_out, dtype=dtype, device=device), seconds, solve_seconds, status)
