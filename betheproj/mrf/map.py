"""MAP in a :class:`~betheproj.mrf.PairwiseMRF`: exact, LP-relaxed and max-product loopy BP (Kulesza & Pereira,
NIPS 2007, eqs. 1, 5 and 6); each returns a :class:`~betheproj.mrf.MAPResult`.

* :func:`exact_map`: enumeration of all labellings (small models), eq. (1);
* :func:`lp_map`: LP-relaxed MAP over the local polytope (section 3.1 and eq. 6), solved by
  :func:`betheproj.factor_graphs.lp_map`; returns the (possibly fractional) vertex ``mu``;
* :func:`lbp_map`: max-product loopy BP (eq. 5) with the parallel schedule and messages normalised to sum 1
  (section 4.1), with a convergence report.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from .._checks import check_count, check_damping_space, check_nonnegative, check_real
from ..factor_graphs import belief_propagation
from ..factor_graphs import lp_map as _fg_lp_map
from ..factor_graphs._util import damp_log_message
from .pairwise import MAX_CONFIGURATIONS, LocalMarginals, MAPResult, PairwiseMRF, _overflow

__all__ = ["exact_map", "lp_map", "lbp_map"]


def _check_mrf(mrf: object) -> PairwiseMRF:
    if not isinstance(mrf, PairwiseMRF):
        raise TypeError(f"mrf must be a PairwiseMRF, got {type(mrf).__name__}")
    return mrf


def exact_map(mrf: PairwiseMRF, *, max_configurations: int = MAX_CONFIGURATIONS) -> MAPResult:
    """Exact MAP, eq. (1) ``argmax_y score(y)``, by enumerating all ``prod_i c_i`` labellings.

    Ties are broken towards the lexicographically smallest labelling (``num_ties`` counts the other labellings
    ``y`` whose score is within ``1e-9 * max(|y*|, |y|)`` of the best, ``|y|`` the sum of the absolute values of
    ``y``'s finite terms: a rounding-level tie, at any scale of the potentials and whatever other labellings score).
    Raises ``ValueError`` above ``max_configurations`` labellings or when every labelling is forbidden (score
    ``-inf``)."""
    mrf = _check_mrf(mrf)
    scores = mrf.all_scores(max_configurations)
    flat = scores.reshape(-1)
    k = int(np.argmax(flat))
    best = float(flat[k])
    if best == -np.inf:
        raise ValueError("every labelling of the MRF has score -inf (contradictory potentials)")
    y = np.array(np.unravel_index(k, mrf.cardinalities), dtype=np.int64).reshape(-1)
    parts = mrf.num_nodes + mrf.num_edges
    top = max(float(np.max(np.abs(t[np.isfinite(t)]), initial=0.0)) for t in (*mrf._node, *mrf._edge))
    near = flat >= best - 1e-9 * parts * top                  # |y| <= parts * top: every possible tie
    ties = 0
    if np.count_nonzero(near) > 1:                            # |y| / parts for every labelling (never overflows)
        size = _mean_magnitudes(mrf).all_scores(max_configurations).reshape(-1)
        ties = int(np.sum(flat[near] >= best - (1e-9 * parts) * np.maximum(size[near], size[k]))) - 1
    return MAPResult("exact", y, mrf.one_hot(y), best, True, num_ties=ties)


def _mean_magnitudes(mrf: PairwiseMRF) -> PairwiseMRF:
    """The MRF whose score of ``y`` is ``|y| / (N + E)``, ``|y|`` the sum of the absolute values of ``y``'s finite
    terms (the scale of its score's rounding); a mean, so that it never overflows."""
    parts = mrf.num_nodes + mrf.num_edges
    mean = [np.where(np.isfinite(t), np.abs(t) / parts, 0.0) for t in (*mrf._node, *mrf._edge)]
    return PairwiseMRF._trusted(mrf, mean[: mrf.num_nodes], mean[mrf.num_nodes:])


def lp_map(mrf: PairwiseMRF, *, tol: float = 1e-6) -> MAPResult:
    """LP-relaxed MAP over the local polytope (section 3.1; eq. 6 ``argmax_{z in Z'(x)} w . Phi(x, z)``).

    Solved by :func:`betheproj.factor_graphs.lp_map` (HiGHS, a vertex of the polytope).  ``marginals`` holds the
    possibly fractional ``mu_i`` and ``mu_e``; entries within ``tol`` of 0 or 1 count as integral.  ``ValueError``
    where the objective overflows float64 (finite potentials summing past ``1.8e308``), as in :func:`exact_map`."""
    mrf = _check_mrf(mrf)
    with np.errstate(over="ignore"):                     # the objective's rescaling overflows: named below
        res = _fg_lp_map(mrf.to_factor_graph(), tol=tol)
    if not np.isfinite(res.objective):
        raise _overflow()
    mu = LocalMarginals([m.copy() for m in res.variable_marginals], [m.copy() for m in res.factor_marginals])
    integral = mu.is_integral(tol)
    labels = mu.argmax()
    return MAPResult("lp", labels, mu, float(res.objective), integral, ties=mu.fractional_nodes(tol))


def lbp_map(mrf: PairwiseMRF, *, damping: float = 0.0, tol: float = 1e-9, max_iter: int = 1000,
            backend: str = "numpy", damping_space: str = "probability") -> MAPResult:
    """Max-product loopy BP (Kulesza & Pereira 2007, eq. 5) with the parallel schedule, decoded by
    ``argmax_y b_i(y)`` with ``b_i ∝ psi_i prod_{j in N(i)} m_ji`` (section 4.1).

    Every message is normalised, to max 1 (section 4.1 normalises to sum 1, ``m_ij(-1) + m_ij(1) = 1``: the two
    differ by a positive factor per message, which changes neither the beliefs' argmax nor whether the messages
    converge), optionally damped in probability space, ``m <- (1 - damping) m_new + damping m_old``, or with
    ``damping_space="log"`` in log space, ``log m <- (1 - damping) log m_new + damping log m_old`` (a gap of any
    size shrinks by the factor ``damping`` per iteration: see :mod:`betheproj.factor_graphs.bp`), and the run
    stops when the largest change of a normalised log-message entry drops below ``tol`` (or after ``max_iter``
    iterations; ``converged`` says which).  Messages start uniform.  With finite potentials the messages of
    section 4.1 converge: ``log m_ij(1) - log m_ij(-1)`` is clipped to ``[-log lambda, log lambda]``.
    ``backend="numpy"``: a vectorised implementation over directed edges; ``backend="factor_graphs"``:
    :func:`betheproj.factor_graphs.belief_propagation` with ``mode="max"``, ``schedule="parallel"``,
    ``normalize="max"`` (the same iterates, slower on small graphs).

    ``marginals`` is the one-hot point of the decoded labelling (LBP proposes that labelling); ``beliefs`` holds the
    max-marginal beliefs scaled to max 1; ``ties`` lists nodes whose two best log-beliefs are within
    ``1e-9 * |y|``, ``|y|`` the sum of the absolute values of the decoded labelling's finite terms (as in
    :func:`exact_map`: a rounding-level tie at any scale of the potentials);
    ``objective`` is that labelling's score (``ValueError`` where it overflows float64, as in :func:`exact_map`)."""
    mrf = _check_mrf(mrf)
    damping = check_real("damping", damping, 0.0, 1.0, high_open=True)
    damping_space = check_damping_space(damping_space)
    tol, max_iter = check_nonnegative("tol", tol), check_count("max_iter", max_iter)
    if backend == "numpy":
        beliefs, converged, iterations, history = _lbp_numpy(mrf, damping, float(tol), max_iter, damping_space)
    elif backend == "factor_graphs":
        res = belief_propagation(mrf.to_factor_graph(), "max", schedule="parallel", damping=damping,
                                 normalize="max", tol=float(tol), max_iter=max_iter, damping_space=damping_space)
        beliefs, converged, iterations, history = res.variable_beliefs, res.converged, res.iterations, res.history
    else:
        raise ValueError(f"backend must be 'numpy' or 'factor_graphs', got {backend!r}")
    labels = np.array([int(np.argmax(b)) for b in beliefs], dtype=np.int64)
    tol = (1e-9 * (mrf.num_nodes + mrf.num_edges)) * _mean_magnitudes(mrf).score(labels)   # 1e-9 |y|
    with np.errstate(divide="ignore"):
        ties = [i for i, b in enumerate(beliefs) if b.size > 1 and -np.log(np.sort(b)[-2]) <= tol]
    return MAPResult("lbp", labels, mrf.one_hot(labels), mrf.score(labels), True, converged=converged,
                     iterations=iterations, max_change=history[-1] if history else 0.0, history=history,
                     ties=ties, beliefs=beliefs)


def _lbp_numpy(mrf: PairwiseMRF, damping: float, tol: float, max_iter: int, damping_space: str = "probability"
               ) -> tuple[list[np.ndarray], bool, int, list[float]]:
    """Parallel max-product over directed edges ``d = 2e`` (``i -> j``) and ``2e + 1`` (``j -> i``) of edge
    ``e = (i, j)``, in log space, label sets padded with ``-inf``.  Cavities ``theta_i + sum_{k != j} m_ki`` are
    node totals minus the reverse message, with ``-inf`` entries counted apart so that the subtraction is exact."""
    cards = np.array(mrf.cardinalities)
    n, m, c = mrf.num_nodes, mrf.num_edges, int(cards.max())
    theta = np.full((n, c), -np.inf)
    for i, u in enumerate(mrf._node):
        theta[i, : u.size] = u
    if m == 0:
        dead = [i for i, t in enumerate(theta) if np.isneginf(t[: cards[i]]).all()]
        if dead:
            raise ValueError(f"node {dead[0]} has every label forbidden (-inf): there is no labelling")
        return [np.exp(t[: cards[i]] - t[: cards[i]].max()) for i, t in enumerate(theta)], True, 0, []
    table = np.full((2 * m, c, c), -np.inf)
    src = np.empty(2 * m, dtype=np.int64)
    dst = np.empty(2 * m, dtype=np.int64)
    for e, ((i, j), t) in enumerate(zip(mrf._edges, mrf._edge, strict=True)):
        table[2 * e, : t.shape[0], : t.shape[1]] = t
        table[2 * e + 1, : t.shape[1], : t.shape[0]] = t.T
        src[2 * e], dst[2 * e], src[2 * e + 1], dst[2 * e + 1] = i, j, j, i
    rev = np.arange(2 * m) ^ 1
    if n * 2 * m <= 1 << 16:
        incidence = np.zeros((n, 2 * m))
        incidence[dst, np.arange(2 * m)] = 1.0
    else:
        incidence = sp.csr_matrix((np.ones(2 * m), (dst, np.arange(2 * m))), shape=(n, 2 * m))
    valid = np.arange(c)[None, :] < cards[dst][:, None]
    msg = np.where(valid, 0.0, -np.inf)
    th_fin = np.where(np.isfinite(theta), theta, 0.0)
    th_inf = np.isneginf(theta).astype(np.float64)
    exact_inf = not (np.isfinite(theta).all() and np.isfinite(table).all())   # else every message stays finite

    def totals(mg: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        if not exact_inf:
            return theta + incidence @ mg, th_inf, mg, mg
        fin = np.where(np.isfinite(mg), mg, 0.0)
        ninf = np.isneginf(mg).astype(np.float64)
        return th_fin + incidence @ fin, th_inf + incidence @ ninf, fin, ninf

    history: list[float] = []
    converged = False
    it = 0
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        while it < max_iter:
            it += 1
            b_fin, b_inf, fin, ninf = totals(msg)
            if exact_inf:
                cav = np.where(b_inf[src] - ninf[rev] > 0.5, -np.inf, b_fin[src] - fin[rev])
                new = np.max(cav[:, :, None] + table, axis=1)
            else:                                          # finite messages: the lean path
                new = ((b_fin[src] - msg[rev])[:, :, None] + table).max(axis=1)
            if np.isposinf(new).any():                     # inf - inf below: NaN beliefs read as "converged"
                raise ValueError("node plus edge scores overflow float64 in a message: rescale the potentials")
            new = _normalise_rows(new) if exact_inf else new - new.max(axis=1, keepdims=True)
            if not exact_inf and not np.isfinite(new).all():  # finite potentials: a -inf or NaN is an overflow below
                raise ValueError("node plus edge scores overflow float64 in a message: rescale the potentials")
            if damping > 0.0:                              # exact zeros are kept (see factor_graphs.bp)
                new = _normalise_rows(damp_log_message(new, msg, damping, damping_space))
            d = np.abs(new - msg)
            change = float(np.nanmax(d)) if exact_inf else float(d.max())
            if np.isnan(change):
                change = 0.0
            history.append(change)
            msg = new
            if change <= tol:
                converged = True
                break
        b_fin, b_inf, _, _ = totals(msg)
    beliefs = []
    for i in range(n):
        b = np.where(b_inf[i] > 0.5, -np.inf, b_fin[i])[: cards[i]]
        top = b.max()
        if top == -np.inf:
            raise ValueError(f"every label of node {i} has zero belief (contradictory potentials)")
        beliefs.append(np.exp(b - top))
    return beliefs, converged, it, history


def _normalise_rows(v: np.ndarray) -> np.ndarray:
    """Log-messages shifted to max 0 (raises when one is ``-inf`` for every label)."""
    top = v.max(axis=1, keepdims=True)
    if top.min() == -np.inf:
        d = int(np.nonzero(np.isneginf(top[:, 0]))[0][0])
        raise ValueError(f"message {d} (edge {d // 2}) is zero for every label (contradictory potentials)")
    return v - top
