"""The constructions of Kulesza & Pereira (NIPS 2007): the triangle MRF of Figure 1 (section 3), the 4-node MRF
of Figure 2 with loopy BP's ``gamma`` and the training set of Figure 3 (section 4), and random loopy grids labelled
by LP-relaxed MAP, an algorithmically separable data set (section 5.1)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from .._checks import check_count, check_nonnegative, check_positive, check_real, check_seed
from .bounds import _unit_vector, lp_margin_bounds
from .linear import LinearPairwiseMRF
from .map import lbp_map, lp_map
from .pairwise import (
    LocalMarginals,
    MAPResult,
    PairwiseMRF,
    _as_float_array,
    agreement_table,
    grid_edges,
)

__all__ = ["TRIANGLE_INPUTS", "triangle_model", "triangle_correct", "figure2_mrf", "figure3_dataset",
           "lbp_exponents", "lbp_gamma", "lbp_decision_boundary", "random_grid_dataset"]

TRIANGLE_LABELS: tuple[tuple[str, str], ...] = (("A", "B"), ("B", "C"), ("C", "A"))
TRIANGLE_EDGES: tuple[tuple[int, int], ...] = ((0, 1), (1, 2), (2, 0))
TRIANGLE_INPUTS: tuple[tuple[float, float, float], ...] = ((4.0, 3.0, 3.0), (3.0, 4.0, 3.0), (3.0, 3.0, 4.0))
"""The three equiprobable inputs ``x = (x12, x23, x31)`` of section 3.2."""


def triangle_model(x: Sequence[float]) -> LinearPairwiseMRF:
    """The triangle MRF of Figure 1 (section 3.1) for input ``x = (x12, x23, x31)``: node 1 has labels {A, B},
    node 2 {B, C}, node 3 {C, A} (nodes numbered 0, 1, 2 here); unit node potentials; edge ``ij`` has potential
    ``exp(lambda_ij)`` when ``y_i = y_j`` with ``lambda_ij = w_ij x_ij`` (section 3.2), i.e. feature
    ``G_ij[y_i, y_j] = x_ij I(y_i = y_j) e_ij`` in ``R^3``."""
    xs = _as_float_array("x", x, ndim=1, allow_neg_inf=False)
    if xs.shape != (3,):
        raise ValueError(f"x must hold 3 edge features (x12, x23, x31), got shape {xs.shape}")
    ef = []
    for e, (i, j) in enumerate(TRIANGLE_EDGES):
        g = np.zeros((2, 2, 3))
        g[:, :, e] = xs[e] * agreement_table(TRIANGLE_LABELS[i], TRIANGLE_LABELS[j])
        ef.append(g)
    return LinearPairwiseMRF(TRIANGLE_LABELS, TRIANGLE_EDGES, edge_features=ef)


def triangle_correct(x: Sequence[float], prediction: MAPResult | LocalMarginals | Sequence[int],
                     tol: float = 1e-6) -> bool:
    """Section 3.2's zero-loss rule: with ``i*j* = argmax_ij x_ij``, a labelling has loss 0 iff nodes ``i*`` and
    ``j*`` take the same label.  A fractional prediction (``mu`` not integral) always has positive loss.  A
    prediction that is not a labelling or point of the triangle's local polytope is a ``ValueError``."""
    model = triangle_model(x)
    if isinstance(prediction, (MAPResult, LocalMarginals)):
        mu = model.structure.check_marginals(prediction, "prediction")
        if not mu.is_integral(tol):
            return False
        y = mu.argmax()
    else:
        y = model.structure.check_labelling(prediction, "prediction")
    e = int(np.argmax(_as_float_array("x", x, ndim=1, allow_neg_inf=False)))   # checked by triangle_model
    i, j = TRIANGLE_EDGES[e]
    return TRIANGLE_LABELS[i][y[i]] == TRIANGLE_LABELS[j][y[j]]


FIGURE2_LABELS = (-1, 1)
FIGURE2_TYPES = ("A", "B", "B", "A")
FIGURE2_EDGES: tuple[tuple[int, int], ...] = ((0, 1), (0, 2), (1, 2), (1, 3), (2, 3))
"""Figure 2 (after Wainwright et al. 2005): A-type nodes 0 and 3 are adjacent to both B-type nodes 1 and 2, which
share an edge.  This is the structure implied by the message updates of section 4.1 (``m_BB = e^beta m_AB^2``: a
B node has two A neighbours and one B neighbour; ``m_AB = e^alpha m_BA``: an A node has two B neighbours)."""


def figure2_mrf(alpha: float, beta: float, coupling: float = 1e6) -> PairwiseMRF:
    """The MRF of Figure 2: binary nodes with labels (-1, 1); ``psi_A(1) = e^alpha``, ``psi_B(1) = e^beta``,
    ``psi(-1) = 1``; every edge has ``psi_ij(y_i, y_j) = lambda`` if ``y_i = y_j`` else 1, with
    ``log lambda = coupling`` (large, so that the MAP is all -1 or all 1: ``y_MAP = sign(alpha + beta)``)."""
    a, b, lam = check_real("alpha", alpha), check_real("beta", beta), check_positive("coupling", coupling)
    node = [np.array([0.0, a if t == "A" else b]) for t in FIGURE2_TYPES]
    return PairwiseMRF([FIGURE2_LABELS] * 4, FIGURE2_EDGES, node, lam * np.eye(2))


def figure3_dataset(coupling: float = 1e6) -> list[tuple[LinearPairwiseMRF, np.ndarray]]:
    """The two-instance training set of Figure 3 (section 4.2) as ``(model, gold label indices)`` pairs.

    Unshaded (A) nodes carry ``x_alpha``, shaded (B) nodes ``x_beta``; ``alpha = w . x_alpha``,
    ``beta = w . x_beta``.  (a): ``x_alpha = (1, 0)``, ``x_beta = (0, 0.95)``, label -1; (b): ``x_alpha = (0, 1)``,
    ``x_beta = (0.95, 0)``, label 1, so that ``w* = (1, -1)`` gives ``alpha = 1, beta = -0.95`` on (a) and the
    mirror image on (b), and the perceptron updates are ``-(1, 0.95)`` and ``+(0.95, 1)`` (up to the step size:
    with 2 nodes of each type ``Phi(x, 1) - Phi(x, -1) = 2 (x_alpha + x_beta)``).  Edge potentials are fixed
    offsets ``coupling * I(y_i = y_j)``."""
    lam = check_nonnegative("coupling", coupling)
    out = []
    for xa, xb, label in (((1.0, 0.0), (0.0, 0.95), -1), ((0.0, 1.0), (0.95, 0.0), 1)):
        nf = []
        for t in FIGURE2_TYPES:
            f = np.zeros((2, 2))
            f[1] = xa if t == "A" else xb
            nf.append(f)
        model = LinearPairwiseMRF([FIGURE2_LABELS] * 4, FIGURE2_EDGES, nf,
                                  edge_offsets=lam * np.eye(2))
        out.append((model, np.full(4, FIGURE2_LABELS.index(label), dtype=np.int64)))
    return out


def lbp_exponents(iterations: int) -> list[tuple[tuple[int, int], tuple[int, int], tuple[int, int]]]:
    """Iterate section 4.1's parallel updates of the label-1 messages, ``m = exp(p alpha + q beta)``:
    ``m_AB <- e^alpha m_BA``, ``m_BA <- e^beta m_AB m_BB``, ``m_BB <- e^beta m_AB^2``, from ``p = q = 0``.
    Returns ``[(p, q) of m_AB, m_BA, m_BB]`` after each iteration (exact integers)."""
    iterations = check_count("iterations", iterations)
    ab, ba, bb = (0, 0), (0, 0), (0, 0)
    out = []
    for _ in range(iterations):
        ab, ba, bb = ((ba[0] + 1, ba[1]), (ab[0] + bb[0], ab[1] + bb[1] + 1), (2 * ab[0], 2 * ab[1] + 1))
        out.append((ab, ba, bb))
    return out


def lbp_gamma() -> float:
    """``gamma = lim q/p`` of :func:`lbp_exponents` in closed form: with ``rho`` the real root of
    ``rho^3 = rho + 2`` (the spectral radius of the update), the left Perron vector ``(rho^2, rho, 1)`` weighs the
    ``alpha`` input (entering ``m_AB``) by ``rho^2`` and the ``beta`` inputs (``m_BA``, ``m_BB``) by ``rho + 1``,
    so ``gamma = (rho + 1) / rho^2 ≈ 1.0893389`` (the paper's 1.089339)."""
    roots = np.roots([1.0, 0.0, -1.0, -2.0])
    rho = float(roots[np.argmin(np.abs(roots.imag))].real)
    for _ in range(3):                                   # polish by Newton's method
        rho -= (rho ** 3 - rho - 2.0) / (3 * rho ** 2 - 1.0)
    return (rho + 1.0) / rho ** 2


def lbp_decision_boundary(beta: float = -1.0, lo: float = 0.5, hi: float = 2.0, *, tol: float = 1e-9,
                          coupling: float = 1e6, max_iter: int = 2000) -> float:
    """Measure ``gamma`` from max-product LBP itself: for fixed ``beta < 0``, bisect on ``alpha`` for the point where
    the LBP labelling of :func:`figure2_mrf` flips from -1 to 1; LBP predicts ``sign(alpha + gamma beta)``, so the
    flip is at ``alpha = gamma |beta|``.  Returns ``alpha / |beta|``."""
    b = check_real("beta", beta, high=0.0, high_open=True)
    lo, hi, tol = check_positive("lo", lo), check_positive("hi", hi), check_positive("tol", tol)
    if lo >= hi:
        raise ValueError(f"lo must be below hi, got lo={lo} and hi={hi}")

    def predicts_one(alpha: float) -> bool:
        res = lbp_map(figure2_mrf(alpha, b, coupling), max_iter=max_iter, tol=1e-12)
        if not res.converged:
            raise RuntimeError(f"LBP did not converge at alpha={alpha}, beta={b}")
        lab = {FIGURE2_LABELS[k] for k in res.labels}
        if len(lab) != 1:
            raise RuntimeError(f"LBP returned a mixed labelling at alpha={alpha}, beta={b}")
        return lab == {1}

    lo_a, hi_a = lo * abs(b), hi * abs(b)
    if predicts_one(lo_a) or not predicts_one(hi_a):
        raise ValueError(f"the LBP decision does not flip between alpha = {lo_a} and {hi_a}")
    while hi_a - lo_a > tol * abs(b):
        mid = 0.5 * (lo_a + hi_a)
        if mid in (lo_a, hi_a):                          # adjacent floats: no finer bracket exists
            break
        if predicts_one(mid):
            hi_a = mid
        else:
            lo_a = mid
    return 0.5 * (lo_a + hi_a) / abs(b)


def random_grid_dataset(num_instances: int, rows: int = 3, cols: int = 3, *, node_dim: int = 3, edge_dim: int = 2,
                        min_margin: float = 0.05, seed: int = 0, max_tries: int = 10000,
                        w_true: np.ndarray | None = None,
                        labeller: Callable[[PairwiseMRF], MAPResult] | None = None,
                        ) -> tuple[list[tuple[LinearPairwiseMRF, np.ndarray]], np.ndarray]:
    """A synthetic algorithmically separable data set for section 5.1: binary MRFs on a ``rows x cols`` grid (loopy)
    labelled by LP-relaxed MAP under a hidden unit weight vector ``w_true``.

    Node ``i`` has features ``F_i[1] = x_i`` (``x_i ~ N(0, I_node_dim)``), ``F_i[0] = 0``; edge ``e`` has
    ``G_e[y, y'] = I(y != y') s_e`` (``s_e ~ N(0, I_edge_dim)``), so ``w`` mixes attractive and repulsive couplings
    (frustrated cycles, where the LP may be fractional).  An instance is kept when the LP solution under
    ``w_true`` is integral and its certified margin (:func:`lp_margin_bounds`, lower bound) is at least
    ``min_margin``.  Returns ``([(model, gold)], w_true)``."""
    num_instances = check_count("num_instances", num_instances)
    node_dim, edge_dim = check_count("node_dim", node_dim), check_count("edge_dim", edge_dim)
    max_tries = check_count("max_tries", max_tries)
    min_margin = check_real("min_margin", min_margin)
    rng = np.random.default_rng(check_seed("seed", seed))
    d = node_dim + edge_dim
    if w_true is None:
        w_true = rng.normal(size=d)
    w_true = _as_float_array("w_true", w_true, ndim=1, allow_neg_inf=False)
    if w_true.shape != (d,):
        raise ValueError(f"w_true must have shape ({d},), got {w_true.shape}")
    w_true = _unit_vector(w_true, "w_true")
    if labeller is not None and not callable(labeller):
        raise TypeError(f"labeller must be a MAP routine PairwiseMRF -> MAPResult (e.g. lp_map), got "
                        f"{type(labeller).__name__}")
    labeller = labeller or lp_map
    edges = grid_edges(rows, cols)
    n = rows * cols
    out: list[tuple[LinearPairwiseMRF, np.ndarray]] = []
    for _ in range(max_tries):
        nf = []
        for _i in range(n):
            f = np.zeros((2, d))
            f[1, :node_dim] = rng.normal(size=node_dim)
            nf.append(f)
        ef = []
        for _e in edges:
            g = np.zeros((2, 2, d))
            s = rng.normal(size=edge_dim)
            g[0, 1, node_dim:] = s
            g[1, 0, node_dim:] = s
            ef.append(g)
        model = LinearPairwiseMRF([2] * n, edges, nf, ef)
        res = labeller(model.potentials(w_true))
        if not isinstance(res, MAPResult):
            raise TypeError(f"labeller must return a MAPResult (as lp_map does), got {type(res).__name__}")
        if not res.integral:
            continue
        lower, _ = lp_margin_bounds(model, res.labels, w_true)
        if lower < min_margin:
            continue
        out.append((model, res.labels))
        if len(out) == num_instances:
            return out, w_true
    raise RuntimeError(f"found only {len(out)} of {num_instances} instances with margin >= {min_margin} in "
                       f"{max_tries} tries")
