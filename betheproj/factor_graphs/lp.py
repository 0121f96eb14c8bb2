"""LP-relaxed MAP over the local polytope (Martins et al. 2010, eqs. 10-11 with ``M`` replaced by ``L``).

The LP has one column ``mu_i(y_i) in [0, 1]`` per variable state and one column ``mu_C(y_C)`` per configuration
of every Dense factor, and solves

    max  sum_i <unary_i, mu_i> + sum_C <table_C, mu_C>
    s.t. sum_{y_i} mu_i(y_i) = 1,   sum_{y_C ~ y_i} mu_C(y_C) = mu_i(y_i)             (eq. 11)
         z = (mu_i(1))_{i in C} in conv S_C for every hard factor C                    (Table 1)

States or configurations of log-potential ``-inf`` are fixed to 0.  The TREE factor adds the multi-commodity
flow formulation of the arborescence polytope (Martins, Smith & Xing 2009), which is exact for that factor.
The relaxation is tight on tree-shaped factor graphs; on loopy graphs the optimum may be fractional (e.g.
mu = 1/2 on the frustrated triangle of Kulesza & Pereira 2007, section 3.1).  Solved with
``scipy.optimize.linprog(method="highs")``, which returns a vertex of the polytope.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import OptimizeResult, linprog
from scipy.sparse import coo_matrix

from .._checks import check_real, check_type
from ._util import as_numpy
from .graph import FactorGraph

__all__ = ["LPBuilder", "LPResult", "lp_map", "maximize_linear"]


# HiGHS's smallest accepted primal / dual feasibility tolerances (its defaults are 1e-7)
_HIGHS_OPTIONS = {"primal_feasibility_tolerance": 1e-10, "dual_feasibility_tolerance": 1e-10}


def maximize_linear(score: np.ndarray, **constraints: object) -> OptimizeResult:
    """``max score . x`` by ``linprog(method="highs")`` under ``constraints`` (its keyword arguments), the
    objective scaled to ``max |score|`` in [0.5, 1) for the solve (by a power of two: exact both ways).
    HiGHS's optimality tolerances are absolute, so unscaled scores of about 1e-7 were declared optimal at a
    wrong vertex; after the scaling they are relative to ``max |score|``, and they are set to HiGHS's smallest
    (1e-10, not its default 1e-7): with the default, one large soft penalty (``-1e6`` on a state) hid the O(1)
    scores beside it and a wrong vertex was returned as optimal.  Score differences below about
    ``1e-9 max |score|`` remain beyond the solver.  ``res.fun`` is ``-max``, in the units of ``score``."""
    score = np.asarray(as_numpy(score), dtype=np.float64)
    largest = float(np.max(np.abs(score))) if score.size else 0.0
    exponent = int(np.frexp(largest)[1])                  # ldexp, not a division by 2**e: 2**1024 is inf
    res = linprog(-np.ldexp(score, -exponent), method="highs", options=_HIGHS_OPTIONS, **constraints)
    if res.fun is not None:
        res.fun = float(np.ldexp(float(res.fun), exponent))
    return res


_Rows = tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray], list[float]]
"""Constraint rows of one kind (equalities or upper bounds): per row, the row index, columns and coefficients of
its entries (an array each), and the right-hand sides."""


class LPBuilder:
    """Accumulates the columns (bounds, objective) and sparse constraint rows of the LP relaxation.

    Factors add themselves through :meth:`add_columns`, :meth:`add_eq`, :meth:`add_ub` and :meth:`register`;
    variable state ``(v, s)`` is column :meth:`var_col`."""

    def __init__(self, graph: FactorGraph):
        check_type("graph", graph, FactorGraph)
        self.graph = graph
        self._var_start = np.concatenate([[0], np.cumsum(graph.cardinalities)]).astype(np.int64)
        self._upper: list[np.ndarray] = []
        self._score: list[np.ndarray] = []
        self.num_columns = 0
        self._eq: _Rows = ([], [], [], [])
        self._ub: _Rows = ([], [], [], [])
        self.factor_columns: dict[int, tuple[int | None, tuple[int, ...] | None]] = {}
        self._current: int | None = None
        for v in range(graph.num_variables):
            u = graph._unary[v]
            finite = np.isfinite(u)
            self.add_columns(u.size, upper=np.where(finite, 1.0, 0.0), score=np.where(finite, u, 0.0))
            self.add_eq(self.var_col(v, 0) + np.arange(u.size), np.ones(u.size), 1.0)

    def var_col(self, v: int, s: int) -> int:
        """Column of ``mu_v(s)``."""
        return int(self._var_start[v] + s)

    def add_columns(self, n: int, upper: np.ndarray | float = 1.0, score: np.ndarray | float = 0.0) -> int:
        """Add ``n`` columns in ``[0, upper]`` with objective coefficients ``score`` (maximised); returns the
        first column's index."""
        start = self.num_columns
        self._upper.append(np.broadcast_to(np.asarray(upper, dtype=np.float64), (n,)).copy())
        self._score.append(np.broadcast_to(np.asarray(score, dtype=np.float64), (n,)).copy())
        self.num_columns += n
        return start

    @staticmethod
    def _row(store: _Rows, cols: np.ndarray, coefs: np.ndarray, rhs: float) -> None:
        rows, cs, vals, b = store
        r = len(b)
        cols = np.asarray(cols, dtype=np.int64).reshape(-1)
        rows.append(np.full(cols.size, r, dtype=np.int64))
        cs.append(cols)
        vals.append(np.asarray(coefs, dtype=np.float64).reshape(-1))
        b.append(float(rhs))

    def add_eq(self, cols: np.ndarray, coefs: np.ndarray, rhs: float) -> None:
        """Add the row ``sum_k coefs[k] x[cols[k]] = rhs``."""
        self._row(self._eq, cols, coefs, rhs)

    def add_ub(self, cols: np.ndarray, coefs: np.ndarray, rhs: float) -> None:
        """Add the row ``sum_k coefs[k] x[cols[k]] <= rhs``."""
        self._row(self._ub, cols, coefs, rhs)

    def register(self, factor: object, start: int | None, shape: tuple[int, ...] | None) -> None:
        """Record where the current factor's ``mu_C`` columns live (``None`` for factors without them)."""
        if self._current is not None:
            self.factor_columns[self._current] = (start, shape)

    def _matrix(self, store: _Rows) -> tuple[coo_matrix | None, np.ndarray | None]:
        rows, cols, vals, b = store
        if not b:
            return None, None
        a = coo_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                       shape=(len(b), self.num_columns)).tocsr()
        return a, np.asarray(b)

    def solve(self) -> OptimizeResult:
        score = np.concatenate(self._score)
        upper = np.concatenate(self._upper)
        a_eq, b_eq = self._matrix(self._eq)
        a_ub, b_ub = self._matrix(self._ub)
        bounds = np.stack([np.zeros_like(upper), upper], axis=1)
        return maximize_linear(score, A_ub=a_ub, b_ub=b_ub, A_eq=a_eq, b_eq=b_eq, bounds=bounds)


@dataclass
class LPResult:
    """The solution of :func:`lp_map`.

    ``variable_marginals[i]``: ``mu_i`` (possibly fractional).  ``factor_marginals[C]``: for a Dense factor the
    table ``mu_C``; for a hard or TREE factor the vector ``z = (mu_i(1))_{i in C}``.  ``objective``: the LP
    value (an upper bound on the MAP score, equal to it when the solution is integral).  Integrality report:
    ``integral`` is True when every ``mu_i`` and Dense ``mu_C`` entry lies within ``tol`` of 0 or 1;
    ``fractional_variables``/``fractional_factors`` list the others.  ``assignment``: ``argmax mu_i`` per
    variable (the MAP when integral, a rounding otherwise).
    """

    variable_marginals: list[np.ndarray]
    factor_marginals: list[np.ndarray]
    objective: float
    integral: bool
    fractional_variables: list[int]
    fractional_factors: list[int]
    assignment: np.ndarray
    tol: float = 1e-6
    solver_message: str = ""
    columns: int = field(default=0)


def _is_fractional(x: np.ndarray, tol: float) -> bool:
    return bool(np.any(np.minimum(np.abs(x), np.abs(x - 1.0)) > tol))


def lp_map(graph: FactorGraph, *, tol: float = 1e-6) -> LPResult:
    """LP-relaxed MAP over the local polytope of ``graph`` (see the module docstring).

    Raises ``ValueError`` when the local polytope is empty (contradictory hard constraints or ``-inf``
    potentials) and ``RuntimeError`` if HiGHS fails otherwise."""
    if not isinstance(graph, FactorGraph):
        raise TypeError(f"graph must be a FactorGraph, got {type(graph).__name__}")
    tol = check_real("tol", tol, 0.0, 0.5, high_open=True)
    if graph.num_variables == 0:
        raise ValueError("graph has no variables: there is nothing to decode")
    lp = LPBuilder(graph)
    for f, factor in enumerate(graph.factors):
        lp._current = f
        factor.lp_constraints(lp)
    lp._current = None
    res = lp.solve()
    if res.status == 2:
        raise ValueError(f"the local polytope is empty (contradictory hard constraints or -inf potentials): "
                         f"{res.message}")
    if not res.success:
        raise RuntimeError(f"linprog(method='highs') failed: {res.message}")
    x = np.clip(res.x, 0.0, 1.0)
    mus = [x[lp.var_col(v, 0): lp.var_col(v, 0) + c].copy() for v, c in enumerate(graph.cardinalities)]
    factor_mu = []
    frac_f = []
    for f, factor in enumerate(graph.factors):
        start, shape = lp.factor_columns.get(f, (None, None))
        if start is not None and shape is not None:
            m = x[start: start + int(np.prod(shape))].reshape(shape).copy()
        else:
            m = np.array([mus[v][1] for v in factor.variables])
        factor_mu.append(m)
        if _is_fractional(m, tol):
            frac_f.append(f)
    frac_v = [v for v, m in enumerate(mus) if _is_fractional(m, tol)]
    assignment = np.array([int(np.argmax(m)) for m in mus], dtype=np.int64)
    return LPResult(variable_marginals=mus, factor_marginals=factor_mu, objective=float(-res.fun),
                    integral=not frac_v and not frac_f, fractional_variables=frac_v, fractional_factors=frac_f,
                    assignment=assignment, tol=float(tol), solver_message=str(res.message),
                    columns=lp.num_columns)
