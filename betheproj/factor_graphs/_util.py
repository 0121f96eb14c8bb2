"""Input validation and log-space helpers shared by the factor-graph modules (numpy, float64)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from .._checks import check_int

LOG2 = float(np.log(2.0))


def as_numpy(x: object) -> object:
    """A torch tensor (on any device) as a NumPy array, anything else as it is: what ``np.asarray`` can read
    (it reads CPU tensors only)."""
    if type(x).__module__.startswith("torch"):
        return x.detach().cpu().numpy()  # type: ignore[attr-defined]
    return x


def as_log_array(name: str, x: object, ndim: int | None = None) -> np.ndarray:
    """``x`` (array-like or torch tensor) as a float64 array of log-potentials: finite or ``-inf``."""
    x = as_numpy(x)
    if isinstance(x, (str, bytes)) or x is None:
        raise TypeError(f"{name} must be an array of floats, got {type(x).__name__}")
    try:
        arr = np.asarray(x)
    except ValueError as err:                   # ragged nesting: "inhomogeneous shape ..."
        raise ValueError(f"{name} must be a rectangular array ({err})") from None
    if arr.dtype == object or not (np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)):
        raise TypeError(f"{name} must be an array of real numbers, got dtype {arr.dtype}")
    arr = np.array(arr, dtype=np.float64)  # a copy: later edits of the caller's array do not leak in
    if ndim is not None and arr.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {arr.shape}")
    if np.isnan(arr).any():
        raise ValueError(f"{name} contains NaN")
    if np.isposinf(arr).any():
        raise ValueError(f"{name} contains +inf (log-potentials must be finite or -inf)")
    return arr


def as_index(name: str, x: object) -> int:
    """``x`` as a non-negative Python int (bools refused)."""
    return check_int(name, x, 0)


def as_variables(name: str, variables: object, min_arity: int = 1, max_arity: int | None = None) -> tuple[int, ...]:
    """A tuple of distinct non-negative variable ids."""
    if isinstance(variables, (int, np.integer)) or not isinstance(variables, (Sequence, np.ndarray)):
        raise TypeError(f"{name} must be a sequence of variable ids, got {type(variables).__name__}")
    out = tuple(as_index(f"{name}[{k}]", v) for k, v in enumerate(variables))
    if len(out) < min_arity or (max_arity is not None and len(out) > max_arity):
        want = f"exactly {min_arity}" if min_arity == max_arity else f"at least {min_arity}"
        raise ValueError(f"{name} must hold {want} variable{'' if want.endswith(' 1') else 's'}, got {len(out)}")
    if len(set(out)) != len(out):
        raise ValueError(f"{name} must not repeat a variable, got {out}")
    return out


def as_config(name: str, config: object, cardinalities: tuple[int, ...]) -> np.ndarray:
    """``config`` as int64 states [len(cardinalities)], each an integer in ``0..cardinality-1`` (floats such as
    1.7 are refused, not truncated)."""
    y = np.asarray(as_numpy(config))
    if y.shape != (len(cardinalities),) or not (np.issubdtype(y.dtype, np.integer) or y.dtype == np.bool_) \
            or ((y < 0) | (y >= np.asarray(cardinalities, dtype=np.int64))).any():
        raise ValueError(f"{name} must be {len(cardinalities)} integer states in the ranges {tuple(cardinalities)}, "
                         f"got {config!r}")
    return y.astype(np.int64)


def as_flags(name: str, flags: object, n: int) -> tuple[bool, ...]:
    """``None`` (all False) or a length-``n`` sequence of booleans."""
    if flags is None:
        return (False,) * n
    if not isinstance(flags, (Sequence, np.ndarray)) or isinstance(flags, str):
        raise TypeError(f"{name} must be a sequence of bools, got {type(flags).__name__}")
    if len(flags) != n:
        raise ValueError(f"{name} must have one flag per variable ({n}), got {len(flags)}")
    out = []
    for k, f in enumerate(flags):
        if not isinstance(f, (bool, np.bool_, int, np.integer)) or int(f) not in (0, 1):
            raise TypeError(f"{name}[{k}] must be a bool, got {f!r}")
        out.append(bool(f))
    return tuple(out)


def exclusive(x: np.ndarray, op: np.ufunc, identity: float) -> np.ndarray:
    """``out[i] = op(x[j] for j != i)`` in O(n) by prefix and suffix scans (robust to infinities)."""
    n = len(x)
    pre = np.full(n + 1, identity)
    suf = np.full(n + 1, identity)
    if n:
        pre[1:] = op.accumulate(x)
        suf[:n] = op.accumulate(x[::-1])[::-1]
    return op(pre[:n], suf[1:])


def cavity_sums(base: float, t: np.ndarray) -> np.ndarray:
    """``base + sum_{j != i} t_j`` for every ``i`` in O(n), to a rounding or two of the result where it is finite: the
    whole sum is carried as ``hi + lo`` (``math.fsum``) and ``t_i`` comes off ``hi`` before ``lo`` is added, so terms
    far apart that cancel (``base = -1e30`` against a ``t_j = 1e30``) keep the O(1) rest a running sum rounds away.
    Infinite results (NaN for ``inf - inf``) as :func:`exclusive` gives them."""
    t = np.asarray(t, dtype=np.float64)
    out = base + exclusive(t, np.add, 0.0)
    fin = np.isfinite(out)
    if fin.any():                                   # base finite, and t_i the only infinite term if any is
        terms = [float(base), *t[np.isfinite(t)].tolist()]
        try:
            hi = math.fsum(terms)
            lo = math.fsum([*terms, -hi])
        except OverflowError:                       # the exact sum leaves float64: keep the running sums
            return out
        out[fin] = (hi - np.where(np.isfinite(t), t, 0.0)[fin]) + lo
    return out


def log1mexp(s: np.ndarray | float) -> np.ndarray:
    """``log(1 - exp(-s))`` for ``s >= 0`` (``-inf`` at 0, ``0`` at ``+inf``), stable on both ends."""
    s = np.asarray(s, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(s < LOG2, np.log(-np.expm1(-s)), np.log1p(-np.exp(-s)))


def softplus(x: np.ndarray) -> np.ndarray:
    """``log(1 + exp(x))``."""
    return np.logaddexp(0.0, x)


# Below exp(-30) the first-order expansions used here are exact to rounding: log(1 + t) = t (1 - t/2 + ...),
# 1 - exp(-s) = s (1 - s/2 + ...), exp(t) - 1 = t (1 + t/2 + ...), with t, s < 1e-13.
_TINY_LOG = -30.0


def log_softplus(x: np.ndarray) -> np.ndarray:
    """``log(log(1 + exp(x)))``, also where ``softplus(x)`` underflows (``x`` below about -745)."""
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(divide="ignore"):
        return np.where(x < _TINY_LOG, x, np.log(softplus(np.maximum(x, _TINY_LOG))))


def log1mexp_of_log(log_s: np.ndarray | float) -> np.ndarray:
    """``log(1 - exp(-s))`` given ``log s``, also where ``s`` itself underflows."""
    log_s = np.asarray(log_s, dtype=np.float64)
    with np.errstate(over="ignore"):
        s = np.exp(np.maximum(log_s, _TINY_LOG))
    return np.where(log_s < _TINY_LOG, log_s, log1mexp(s))


def log_expm1_of_log(log_t: np.ndarray | float) -> np.ndarray:
    """``log(exp(t) - 1)`` given ``log t``, also where ``t`` itself underflows."""
    log_t = np.asarray(log_t, dtype=np.float64)
    with np.errstate(over="ignore"):
        t = np.exp(np.maximum(log_t, _TINY_LOG))
    return np.where(log_t < _TINY_LOG, log_t, t + log1mexp(t))


def log_sigmoid(x: np.ndarray) -> np.ndarray:
    """``log(1 / (1 + exp(-x)))``: ``-inf`` at ``-inf`` and ``0`` at ``+inf``."""
    return -np.logaddexp(0.0, -np.asarray(x, dtype=np.float64))


def log_ratio(name: str, msg: np.ndarray) -> float:
    """``log M(1) - log M(0)`` of a binary log-message (``+-inf`` allowed; all ``-inf`` refused)."""
    a0, a1 = float(msg[0]), float(msg[1])
    if a0 == -np.inf and a1 == -np.inf:
        raise ValueError(f"{name} is -inf for both states (a contradictory message)")
    if a0 == -np.inf:
        return np.inf
    if a1 == -np.inf:
        return -np.inf
    return a1 - a0


def ratio_to_log_message(l: np.ndarray) -> list[np.ndarray]:
    """Binary log-messages ``[log M(0), log M(1)]`` from log-ratios, normalised to max 0 (NaN stays NaN)."""
    out = []
    for v in np.asarray(l, dtype=np.float64):
        if np.isnan(v):
            out.append(np.array([np.nan, np.nan]))
        else:
            out.append(np.array([min(-v, 0.0), min(v, 0.0)]))
    return out


def xlogy(p: np.ndarray | float, logq: np.ndarray) -> np.ndarray:
    """``p * logq`` with ``0 * (-inf) = 0``."""
    p = np.asarray(p, dtype=np.float64)
    logq = np.asarray(logq, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        return np.where(p > 0, p * logq, 0.0)


def normalise_log(v: np.ndarray, how: str) -> tuple[np.ndarray, float]:
    """Shift a log-vector so that ``logsumexp = 0`` (``"sum"``) or ``max = 0`` (``"max"``); ``"none"`` keeps it.

    Returns the shifted vector and the shift (``-inf`` when every entry is ``-inf``)."""
    if how == "none":
        return v, 0.0
    top = float(v.max())
    if top == -np.inf:
        return v, -np.inf
    if how == "max":
        return v - top, top
    w = v - top
    c = float(np.log(np.exp(w).sum()))
    return w - c, top + c


def damp_log_message(new: np.ndarray, old: np.ndarray, damping: float, space: str) -> np.ndarray:
    """The damped log-messages (not normalised) from normalised log-messages ``new`` and ``old`` (one message
    along the last axis): in probability space ``log((1 - d) e^new + d e^old)``, in log space
    ``(1 - d) new + d old``.  Exact zeros (``-inf``) of ``new`` are kept in both (mixed in probability space, a
    zero would only shrink by ``d`` per iteration and never converge); in log space a message with an entry that
    is ``-inf`` in ``old`` alone is taken undamped (mixed, that entry would stay ``-inf``)."""
    if space == "log":
        revived = (np.isneginf(old) & ~np.isneginf(new)).any(-1, keepdims=True)
        return np.where(revived, new, (1.0 - damping) * new + damping * old)
    with np.errstate(divide="ignore"):
        damped = np.logaddexp(np.log1p(-damping) + new, np.log(damping) + old)
    return np.where(np.isneginf(new), -np.inf, damped)
