"""A small-problem path for (23): Bethe mirror descent (Algorithm 4) for one chain with the Poisson energy, in
NumPy, with the generic solver's step-size control and stopping rule.

On a few dozen cells an iteration of :func:`betheproj.solve` costs milliseconds of PyTorch dispatch on
tiny tensors; the same arithmetic in NumPy costs a tenth of that.  The transition factors ``exp(edge)`` are
formed once.  It returns ``None`` (the caller then uses the generic solver) where the scaled recursion
cannot be trusted: non-finite potentials, or a forward or backward sum that underflows.
"""

from __future__ import annotations

import math

import numpy as np

from ..inference.state import _MAX_STEP, _MIN_STEP

__all__ = ["mirror_descent"]

_EPS = np.finfo(np.float64).eps
_TINY = np.finfo(np.float64).tiny


class _Chain:
    """Forward-backward for one chain with fixed edge factors and shifted node scores.

    Every forward and backward vector is rescaled to sum 1, as the generic chain oracle does.  Rescaling only
    where needed would halve the NumPy calls (about 25% off a solve at 25 cells), but it rounds differently, and on
    rounding-limited instances the iterates then part from the generic solver's (883 iterations against its 839
    in ``test_mirror_descent_never_ends_above_its_start``)."""

    def __init__(self, node: np.ndarray, edge: np.ndarray):
        self.node = node                                               # [T, L]
        self.edge_max = edge.max(axis=(1, 2))                          # [T-1]
        self.factors = np.exp(edge - self.edge_max[:, None, None])     # [T-1, L, L]
        self.const = float(self.edge_max.sum())
        # work buffers and their rows, made once: a call spends most of its time in NumPy's per-call overhead
        self._p, self._alpha, self._beta = (np.empty_like(node) for _ in range(3))
        self._sums, self._v = np.empty(node.shape[0]), np.empty(node.shape[1])
        self._rows = [list(x) for x in (self._p, self._alpha, self._beta, self.factors)]

    def marginals(self, delta: np.ndarray) -> tuple[np.ndarray, float] | None:
        scores = self.node + delta
        top = scores.max(axis=1)
        np.exp(np.subtract(scores, top[:, None], out=self._p), out=self._p)
        p, alpha, beta, factors = self._rows
        sums, v = self._sums, self._v
        reduce, dot, multiply = np.add.reduce, np.dot, np.multiply
        a = alpha[0]
        a[...] = p[0]
        sums[0] = s = reduce(a)
        a /= s
        for t in range(1, len(p)):
            dot(a, factors[t - 1], out=alpha[t])
            a = alpha[t]
            a *= p[t]
            sums[t] = s = reduce(a)
            a /= s
        b = beta[-1]
        b.fill(1.0)
        for t in range(len(p) - 2, -1, -1):
            multiply(p[t + 1], b, out=v)
            b = beta[t]
            dot(factors[t], v, out=b)
            b /= reduce(b)
        # underflow or overflow (every entry is >= 0 or NaN, and NaN fails both tests): not trusted
        if not (np.minimum.reduce(sums) > 0 and np.maximum.reduce(sums) < np.inf
                and np.maximum.reduce(self._beta, axis=None) < np.inf):
            return None
        mu = self._alpha * self._beta
        mu /= mu.sum(axis=1, keepdims=True)
        return mu, float(top.sum()) + self.const + float(np.log(sums).sum())


def _residual(delta: np.ndarray, grad: np.ndarray, mu: np.ndarray, log_mu: np.ndarray, kl: bool = False) -> float:
    """The generic solver's stationarity residual (total-variation change of a node marginal; ``kl``: its
    KL divergence, the tie-break where the total variation saturates at 2)."""
    logits = log_mu - (delta + grad)
    logits -= logits.max(axis=1, keepdims=True)
    q = np.exp(logits)
    total = q.sum(axis=1, keepdims=True)
    q /= total
    if kl:
        terms = np.where(q > 0, q * (logits - np.log(total) - log_mu), 0.0)
        return float(terms.sum(axis=1).max())
    q -= mu
    return float(np.abs(q).sum(axis=1).max())


def mirror_descent(node: np.ndarray, edge: np.ndarray, observed: np.ndarray, rate: float, population: float,
                   tol: float, max_iter: int, delta: np.ndarray | None = None, step: float = 1.0,
                   trust_region: float = 10.0, max_backtracks: int = 40
                   ) -> tuple[np.ndarray, np.ndarray, float, int, bool, float, bool] | None:
    """Minimise ``-H_B(mu) - <theta, mu> + L(mu)`` (the Poisson ``L``) for one chain: ``node`` [T, L], ``edge``
    [T-1, L, L], ``observed`` [T, L].  Returns ``(mu, delta, objective, iterations, converged, residual,
    safeguarded)`` with the dual iterate ``theta + delta`` (``safeguarded``: some step was rejected, as
    ``Solution.safeguarded``), or ``None`` where the generic solver must take over."""
    if not (np.isfinite(node).all() and np.isfinite(edge).all()):
        return None
    chain = _Chain(node, edge)
    weight = observed / population                                  # zero where nothing was seen
    offset = float((observed * np.log(rate * population)).sum()) / population

    def oracle(d: np.ndarray) -> tuple[np.ndarray, np.ndarray, float, float, bool, float] | None:
        """Marginals, their logs and the objective at the dual offset ``d``; ``None`` if not trusted."""
        out = chain.marginals(d)
        if out is None:
            return None
        m, lz = out
        log_m = np.log(np.maximum(m, _TINY))
        inner = float(np.vdot(d, m))
        val = rate * float(m.sum()) - offset - float(np.vdot(weight, log_m))
        floor = 64 * _EPS * (abs(lz) + abs(inner) + abs(val))
        return m, log_m, -lz + inner + val, floor, bool((m == 0).any()), val

    delta = np.zeros_like(node) if delta is None else delta.copy()
    out = oracle(delta)
    if out is None or out[4] or not np.isfinite(out[2]):      # an overflowing objective: the generic solver says why
        return None
    mu, log_mu, f, _, _, val = out                 # mu > 0 everywhere, here and at every accepted step
    half = 0.5 * trust_region
    eta, residual, iterations, converged, safeguarded = step, np.inf, 0, False, False
    for _ in range(max_iter):
        g = rate - weight / np.maximum(mu, _TINY)
        residual = _residual(delta, g, mu, log_mu)
        if residual <= tol:
            converged = True
            break
        clean = True
        min_step = _MIN_STEP / max(1.0, float(np.abs(g + delta).max()))   # relative floor, as in solve()
        for attempt in range(max_backtracks + 1):
            w = eta / (1.0 + eta)
            move = w * (-g - delta)     # clipped, as solve() does where mu > 0 (_clip_move): here mu > 0 everywhere
            cand = delta + np.minimum(np.maximum(move, -half), half)
            out = oracle(cand)
            if out is None:
                return None
            m, log_m, fc, floor, collapsed, val_c = out
            floor += 64 * _EPS * abs(f)
            ok = math.isfinite(fc) and fc <= f + floor
            # sufficient decrease, as in solve(): L(m) - L(mu) + <cand, m - mu> <= 0, less its rounding error
            dmu, both = m - mu, m + mu                      # the change, and the scale of its rounding
            d = val_c - val + float(np.vdot(cand, dmu))
            err = 64 * _EPS * (float(np.vdot(np.abs(cand), both)) + abs(val) + abs(val_c))
            band = ok and abs(d) <= err
            ok = ok and d <= err
            if band:                                        # rounding hides D: the trapezoid rule, as solve() does
                g_cand = rate - weight / np.maximum(m, _TINY)
                slope = 0.5 * (g + g_cand) + cand
                trap = float(np.vdot(slope, dmu))
                if math.isfinite(trap) and abs(trap) > 2 * _EPS * float(np.vdot(np.abs(slope), both)):
                    ok = trap <= 0
                else:                                       # rounding hides that too: the residual must fall
                    r_cand = _residual(cand, g_cand, m, log_m)
                    ok = r_cand < residual
                    if r_cand == residual:                  # saturated: compare KL divergences, as solve() does
                        ok = _residual(cand, g_cand, m, log_m, kl=True) < _residual(delta, g, mu, log_mu, kl=True)
            change = float(np.abs(log_m - log_mu).max())
            ok = ok and change <= trust_region and not collapsed
            if attempt == max_backtracks and not ok:       # any finite step that does not raise the objective
                ok = math.isfinite(fc) and math.isfinite(change) and not collapsed and fc <= f + floor
                safeguarded = safeguarded or ok
            if ok:
                delta, mu, log_mu, f, val = cand, m, log_m, fc, val_c
                iterations += 1
                break
            clean, safeguarded = False, True
            eta = max(eta / 2, min_step)
        if clean:
            eta = min(eta * 2, _MAX_STEP)
        if eta <= 1e4 * min_step:    # steps shrunk to nothing (a failed iteration goes on from the halved step)
            break
    if not converged:                # the residual of the point returned, not of the one before the last step
        residual = _residual(delta, rate - weight / np.maximum(mu, _TINY), mu, log_mu)
        converged = residual <= tol
    return mu, delta, f, iterations, converged, residual, safeguarded
