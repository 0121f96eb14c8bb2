"""A small-problem path for (23): Bethe mirror descent (Algorithm 4) for one chain with the Poisson energy, in
NumPy, with the generic solver's step-size control and stopping rule.

On a few dozen cells an iteration of :func:`betheproj.solve` costs milliseconds of PyTorch dispatch on
tiny tensors; the same arithmetic in NumPy costs a tenth of that.  The transition factors ``exp(edge)`` are
formed once.  It returns ``None`` (the caller then uses the generic solver) where the scaled recursion
cannot be trusted: non-finite potentials, or a forward or backward sum that underflows.
"""

from __future__ import annotations

import numpy as np

__all__ = ["mirror_descent"]

_EPS = np.finfo(np.float64).eps
_TINY = np.finfo(np.float64).tiny


class _Chain:
    """Forward-backward for one chain with fixed edge factors and shifted node scores."""

    def __init__(self, node: np.ndarray, edge: np.ndarray):
        self.node = node                                               # [T, L]
        self.edge_max = edge.max(axis=(1, 2))                          # [T-1]
        self.factors = np.exp(edge - self.edge_max[:, None, None])     # [T-1, L, L]
        self.const = float(self.edge_max.sum())

    def marginals(self, delta: np.ndarray) -> tuple[np.ndarray, float] | None:
        scores = self.node + delta
        top = scores.max(axis=1)
        p = np.exp(scores - top[:, None])
        steps = p.shape[0]
        factors = self.factors
        alpha = np.empty_like(p)
        beta = np.empty_like(p)
        sums = np.empty(steps)
        a = p[0]
        for t in range(steps):
            if t:
                a = np.dot(a, factors[t - 1]) * p[t]
            s = np.add.reduce(a)
            sums[t] = s
            a = a * (1.0 / s)
            alpha[t] = a
        b = np.ones(p.shape[1])
        beta[-1] = b
        for t in range(steps - 2, -1, -1):
            b = np.dot(factors[t], p[t + 1] * b)
            b = b * (1.0 / np.add.reduce(b))
            beta[t] = b
        if not (np.isfinite(sums).all() and (sums > 0).all() and np.isfinite(beta).all()):
            return None                                                # underflow or overflow: not trusted
        mu = alpha * beta
        mu /= mu.sum(axis=1, keepdims=True)
        return mu, float(top.sum()) + self.const + float(np.log(sums).sum())


def _residual(delta: np.ndarray, grad: np.ndarray, mu: np.ndarray) -> float:
    """The generic solver's stationarity residual (total-variation change of a node marginal)."""
    logits = np.log(np.maximum(mu, _TINY)) - (delta + grad)
    logits -= logits.max(axis=1, keepdims=True)
    q = np.exp(logits)
    q /= q.sum(axis=1, keepdims=True)
    return float(np.abs(q - mu).sum(axis=1).max())


def mirror_descent(node: np.ndarray, edge: np.ndarray, observed: np.ndarray, rate: float, population: float,
                   tol: float, max_iter: int, delta: np.ndarray | None = None, step: float = 1.0,
                   trust_region: float = 10.0, max_backtracks: int = 40):
    """Minimise ``-H_B(mu) - <theta, mu> + L(mu)`` (the Poisson ``L``) for one chain: ``node`` [T, L], ``edge``
    [T-1, L, L], ``observed`` [T, L].  Returns ``(mu, delta, objective, iterations, converged, residual)``
    with the dual iterate ``theta + delta``, or ``None`` where the generic solver must take over."""
    if not (np.isfinite(node).all() and np.isfinite(edge).all()):
        return None
    chain = _Chain(node, edge)
    seen = observed > 0
    weight = observed / population
    offset = float((observed[seen] * np.log(rate * population)).sum()) / population

    def energy(mu: np.ndarray) -> float:
        return rate * float(mu.sum()) - offset - float((weight[seen] * np.log(mu[seen])).sum())

    def gradient(mu: np.ndarray) -> np.ndarray:
        return rate - weight / np.maximum(mu, _TINY)

    delta = np.zeros_like(node) if delta is None else delta.copy()
    out = chain.marginals(delta)
    if out is None:
        return None
    mu, log_z = out
    if seen.any() and (mu[seen] == 0).any():
        return None
    f = -log_z + float((delta * mu).sum()) + energy(mu)
    eta, residual, iterations, converged = step, np.inf, 0, False
    for _ in range(max_iter):
        g = gradient(mu)
        residual = _residual(delta, g, mu)
        if residual <= tol:
            converged = True
            break
        clean, accepted = True, False
        for attempt in range(max_backtracks + 1):
            w = eta / (1.0 + eta)
            cand = delta + w * (-g - delta)
            out = chain.marginals(cand)
            if out is None:
                return None
            m, lz = out
            inner = float((cand * m).sum())
            val = energy(m) if (m[seen] > 0).all() else np.inf
            fc = -lz + inner + val
            floor = 64 * _EPS * (abs(lz) + abs(inner) + abs(val) + abs(f))
            ok = np.isfinite(fc) and fc <= f + floor
            if ok and abs(fc - f) <= floor:                 # rounding hides the change: the residual must fall
                ok = _residual(cand, gradient(m), m) < residual
            change = np.abs(np.log(np.maximum(m, _TINY)) - np.log(np.maximum(mu, _TINY))).max()
            collapsed = bool((m == 0).any())
            ok = ok and change <= trust_region and not collapsed
            if attempt == max_backtracks:
                ok = bool(np.isfinite(fc)) and np.isfinite(change) and not collapsed
            if ok:
                delta, mu, f, accepted = cand, m, fc, True
                iterations += 1
                break
            clean = False
            eta = max(eta / 2, 1e-20)
        if clean:
            eta = min(eta * 2, 1e6)
        if not accepted or eta <= 1e4 * 1e-20:
            break
    return mu, delta, f, iterations, converged, residual
