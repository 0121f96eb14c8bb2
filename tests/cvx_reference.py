"""Problem (2) on one chain example as a CVXPY exponential-cone program (test-only reference).

``-H_B(mu) = -H(mu_1) + sum_t sum_ij rel_entr(mu_t(i,j), mu_t(i))`` on a chain (the conditional-entropy form,
jointly convex), so the whole objective is DCP for the convex energies the tests use.
"""

import warnings

import cvxpy as cp
import numpy as np


def chain_problem(node: np.ndarray, edge: np.ndarray, energy_terms):
    """``node`` [L, C], ``edge`` [L-1, C, C] (``-inf`` allowed); ``energy_terms(mu_node, mu_edges)`` -> expr."""
    length, c = node.shape
    mu = cp.Variable((length, c), nonneg=True)
    pair = [cp.Variable((c, c), nonneg=True) for _ in range(length - 1)]
    cons = [cp.sum(mu, axis=1) == 1]
    neg_entropy = -cp.sum(cp.entr(mu[0]))
    lin = 0
    fin_node = np.isfinite(node)
    cons.append(mu[~fin_node] == 0) if (~fin_node).any() else None
    lin += cp.sum(cp.multiply(np.where(fin_node, node, 0.0), mu))
    for t, p in enumerate(pair):
        cons += [cp.sum(p, axis=1) == mu[t], cp.sum(p, axis=0) == mu[t + 1]]
        fin = np.isfinite(edge[t])
        if (~fin).any():
            cons.append(p[~fin] == 0)
        lin += cp.sum(cp.multiply(np.where(fin, edge[t], 0.0), p))
        parent = cp.reshape(mu[t], (c, 1), order="C") @ np.ones((1, c))
        neg_entropy += cp.sum(cp.rel_entr(p, parent))
    obj = neg_entropy - lin + energy_terms(mu, pair)
    prob = cp.Problem(cp.Minimize(obj), [x for x in cons if x is not None])
    with warnings.catch_warnings():
        # at these tolerances Clarabel sometimes stops "almost solved" (CVXPY's optimal_inaccurate, with a
        # warning); its value still agrees with the solvers' to about 1e-8, far inside the tests' 1e-6
        warnings.filterwarnings("ignore", "Solution may be inaccurate", UserWarning)
        prob.solve(solver=cp.CLARABEL, tol_gap_abs=1e-10, tol_gap_rel=1e-10, tol_feas=1e-10, max_iter=500)
    if prob.status not in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE):
        raise RuntimeError(f"the CVXPY reference did not solve: {prob.status}")
    return prob.value, mu.value
