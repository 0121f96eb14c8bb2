"""The quantities of Theorem 1 of Kulesza & Pereira (NIPS 2007, section 5): the LP margin ``gamma`` and the radius
``R`` of the feature differences over the local polytope, bracketed by certified lower and upper bounds."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from ..factor_graphs._util import as_numpy
from ..factor_graphs.lp import maximize_linear
from .linear import LinearPairwiseMRF
from .map import _check_mrf
from .pairwise import MAX_CONFIGURATIONS, LocalMarginals, PairwiseMRF

__all__ = ["LocalPolytope", "lp_margin_bounds", "lp_radius_bounds"]

# ------------------------------------------------------------------------------------------------------------------
# the local polytope and the quantities of Theorem 1
# ------------------------------------------------------------------------------------------------------------------
def _unit_vector(w: np.ndarray, name: str) -> np.ndarray:
    """``w / ||w||``, scaled by ``max |w|`` first: the squares of ``||w||`` overflow beyond ~1e154 (the bounds
    of ``w = (1e160, 1e160)`` came out 0) and lose digits as subnormals below ~1e-154."""
    top = float(np.abs(w).max(initial=0.0))
    if top == 0.0:
        raise ValueError(f"{name} must be a non-zero vector")
    v = w / top
    return v / np.linalg.norm(v)


def _norms(x: np.ndarray) -> np.ndarray:
    """``||x||_2`` along the last axis, scaled by ``max |x|`` first, as in :func:`_unit_vector` (the squares of
    feature differences overflow beyond ~1e154 and underflow to 0 below ~1e-154)."""
    top = float(np.abs(x).max(initial=0.0))
    v = x / top if top > 0.0 else x
    return np.sqrt((v ** 2).sum(-1)) * top


@dataclass
class LocalPolytope:
    """``{z >= 0 : sum_y mu_i(y) = 1, sum_{y_j} mu_e(y_i, y_j) = mu_i(y_i), sum_{y_i} mu_e(y_i, y_j) = mu_j(y_j)}``
    in the column order of :meth:`LocalMarginals.stack` (``Z'(x)`` of section 5 is its vertex set)."""

    a_eq: sp.csr_matrix
    b_eq: np.ndarray
    num_columns: int
    node_slices: list[slice]
    edge_slices: list[slice]

    @classmethod
    def of(cls, mrf: PairwiseMRF | LinearPairwiseMRF) -> LocalPolytope:
        s = mrf.structure if isinstance(mrf, LinearPairwiseMRF) else _check_mrf(mrf)
        cards = s.cardinalities
        col = 0
        node_sl, edge_sl = [], []
        for c in cards:
            node_sl.append(slice(col, col + c))
            col += c
        for i, j in s.edges:
            edge_sl.append(slice(col, col + cards[i] * cards[j]))
            col += cards[i] * cards[j]
        rows: list[int] = []
        cols: list[int] = []
        vals: list[float] = []
        b: list[float] = []

        def row(cs: Sequence[int], vs: Sequence[float], rhs: float) -> None:
            r = len(b)
            rows.extend([r] * len(cs))
            cols.extend(cs)
            vals.extend(vs)
            b.append(rhs)

        for i, c in enumerate(cards):
            row(list(range(node_sl[i].start, node_sl[i].stop)), [1.0] * c, 1.0)
        for e, (i, j) in enumerate(s.edges):
            idx = np.arange(edge_sl[e].start, edge_sl[e].stop).reshape(cards[i], cards[j])
            for a in range(cards[i]):
                row(list(idx[a]) + [node_sl[i].start + a], [1.0] * cards[j] + [-1.0], 0.0)
            for bb in range(cards[j]):
                row(list(idx[:, bb]) + [node_sl[j].start + bb], [1.0] * cards[i] + [-1.0], 0.0)
        a = sp.csr_matrix((vals, (rows, cols)), shape=(len(b), col))
        return cls(a, np.asarray(b, dtype=np.float64), col, node_sl, edge_sl)

    def maximize(self, c: np.ndarray, a_ub: np.ndarray | None = None, b_ub: np.ndarray | None = None
                 ) -> tuple[float, np.ndarray]:
        """``max c . z`` over the polytope (with optional extra rows ``a_ub z <= b_ub``): value and maximiser."""
        res = maximize_linear(np.asarray(as_numpy(c), dtype=np.float64), A_ub=a_ub, b_ub=b_ub, A_eq=self.a_eq,
                              b_eq=self.b_eq, bounds=(0.0, 1.0))
        if not res.success:
            raise RuntimeError(f"linprog(method='highs') failed: {res.message}")
        return float(-res.fun), res.x

    def unstack(self, z: np.ndarray, mrf: PairwiseMRF | LinearPairwiseMRF) -> LocalMarginals:
        s = mrf.structure if isinstance(mrf, LinearPairwiseMRF) else mrf
        node = [z[sl].copy() for sl in self.node_slices]
        edge = [z[sl].reshape(s.cardinalities[i], s.cardinalities[j]).copy()
                for sl, (i, j) in zip(self.edge_slices, s.edges, strict=True)]
        return LocalMarginals(node, edge)


def _check_model(model: object, name: str = "model") -> LinearPairwiseMRF:
    if not isinstance(model, LinearPairwiseMRF):
        raise TypeError(f"{name} must be a LinearPairwiseMRF, got {type(model).__name__}")
    return model


def lp_margin_bounds(model: LinearPairwiseMRF, gold: Sequence[int] | np.ndarray, w: object, *,
                     max_configurations: int = MAX_CONFIGURATIONS) -> tuple[float, float]:
    """Lower and upper bounds on the LP margin of Theorem 1 for one instance,
    ``gamma_i = min_{z in Z'(x) \\ {z_i}} u . (Phi(x, z_i) - Phi(x, z))`` with ``u = w / ||w||``.

    * Upper bound: the minimum over the integral labellings ``y != gold`` (they are vertices of the polytope),
      by enumeration.
    * Lower bound: ``min u . (Phi(z_i) - Phi(z))`` over the polytope cut by ``||z - z_i||_1 >= 1 + d_min`` (one
      linear row, ``z_i`` being 0/1; ``d_min`` the smallest node degree).  Valid for binary label sets: the
      vertices of the local polytope of a binary pairwise MRF are half-integral (Padberg 1989), and a vertex
      ``z != z_i`` has integral node marginals equal to ``z_i``'s only if it is ``z_i`` (they then fix the edge
      marginals), so it differs at some node ``j`` by at least 1/2 in both entries (L1 distance >= 1) and, through
      the marginalisation rows, in every edge at ``j`` by at least 1/2 in both row sums (>= 1 per edge).  Every
      other vertex thus lies in the cut polytope.

    Requires a model without offsets (Theorem 1's score is ``w . Phi``) and binary label sets."""
    model = _check_model(model)
    if model.has_offsets:
        raise ValueError("model has fixed offsets; Theorem 1's margin is defined for scores w . Phi only")
    if any(c != 2 for c in model.cardinalities):
        raise ValueError(f"the certified lower bound needs binary label sets, got sizes {model.cardinalities}")
    w = model._check_w(w)
    u = _unit_vector(w, "w")
    y = model.structure.check_labelling(gold, "gold")
    feats = model.all_features(max_configurations) @ u                      # scores of all labellings
    gold_score = float(feats[tuple(y)])
    others = feats.copy()
    others[tuple(y)] = -np.inf
    upper = gold_score - float(others.max())
    poly = LocalPolytope.of(model)
    c = model.feature_matrix().T @ u
    zi = model.structure.one_hot(y).stack()
    degree = np.zeros(model.num_nodes, dtype=np.int64)
    for i, j in model.edges:
        degree[i] += 1
        degree[j] += 1
    delta = 1.0 + float(degree.min())
    # ||z - z_i||_1 = sum_{zi=1} (1 - z) + sum_{zi=0} z >= delta   <=>   sum_{zi=1} z - sum_{zi=0} z <= n1 - delta
    row = np.where(zi > 0.5, 1.0, -1.0)[None, :]
    best, _ = poly.maximize(c, row, np.array([zi.sum() - delta]))
    lower = float(c @ zi) - best
    return lower, upper


def lp_radius_bounds(model: LinearPairwiseMRF, gold: Sequence[int] | np.ndarray, *,
                     max_configurations: int = MAX_CONFIGURATIONS) -> tuple[float, float]:
    """Lower and upper bounds on ``R_i = max_{z in Z'(x)} ||Phi(x, z_i) - Phi(x, z)||`` (Theorem 1) for one instance.

    Lower: the maximum over the integral labellings (enumeration).  Upper: ``sqrt(sum_k r_k^2)`` with
    ``r_k = max_{z in L} |Phi_k(z) - Phi_k(z_i)|`` from two LPs per feature ``k`` (``L`` contains ``Z'(x)``)."""
    model = _check_model(model)
    y = model.structure.check_labelling(gold, "gold")
    feats = model.all_features(max_configurations)
    diff = feats - feats[tuple(y)]
    lower = float(_norms(diff).max())
    poly = LocalPolytope.of(model)
    f = model.feature_matrix()
    zi = model.structure.one_hot(y).stack()
    r = np.zeros(model.num_features)
    for k in range(model.num_features):
        base = float(f[k] @ zi)
        hi, _ = poly.maximize(f[k])
        lo, _ = poly.maximize(-f[k])
        r[k] = max(abs(hi - base), abs(-lo - base))
    return lower, float(_norms(r))
