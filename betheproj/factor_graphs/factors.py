"""Factors of a :class:`~betheproj.factor_graphs.FactorGraph`: a dense soft factor and the hard-constraint factors
of Martins et al. (Turbo Parsers, EMNLP 2010), Table 1.

Every factor works in log space and implements, for its attached variables ``variables`` (in order):

* ``log_potential(config)``: ``log psi_C(y_C)`` (``-inf`` for a forbidden configuration);
* ``messages(incoming, mode)``: the factor-to-variable messages of eq. (5),
  ``M_{C->i}(y_i) = sum/max_{y_C ~ y_i} psi_C(y_C) prod_{j != i} M_{j->C}(y_j)``, from the variable-to-factor
  log-messages ``incoming`` (``mode`` ``"sum"`` or ``"max"``);
* ``belief(incoming)``: the sum-product factor belief of eq. (7), ``b_C(y_C) ∝ psi_C(y_C) prod_i M_{i->C}(y_i)``,
  summarised by its marginals, entropy ``H(b_C)`` and expected log-potential, which the Bethe free energy needs;
* ``lp_constraints(lp)``: the local-agreement constraints of eq. (11) / Table 1 for the LP relaxation.

The hard factors act on binary variables (state 1 = "on").  Following Table 1 they only need the message
*ratios* ``m_{i->C} = M_{i->C}(1) / M_{i->C}(0)``; here ``l_i = log m_{i->C}`` may be ``+-inf`` (a clamped
variable).  Any input may be negated (Table 1's footnote: "replace the corresponding messages by their
reciprocal, v_i by 1 - v_i"): the factor is applied to ``v'_i = 1 - v_i`` for negated inputs, and both the
incoming and the outgoing ratios of those inputs are inverted.  Incoming messages that contradict the
constraint (e.g. two inputs of an XOR clamped on) may give NaN messages; belief propagation reports them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from scipy.special import expit

from ._util import (
    as_config,
    as_flags,
    as_log_array,
    as_numpy,
    as_variables,
    cavity_sums,
    exclusive,
    log1mexp_of_log,
    log_ratio,
    log_sigmoid,
    log_softplus,
    ratio_to_log_message,
    softplus,
    xlogy,
)

if TYPE_CHECKING:
    from .lp import LPBuilder

__all__ = ["Factor", "FactorBelief", "Dense", "BinaryHardFactor", "XOR", "OR", "OROut", "NAND", "IMPLY", "XOROut",
           "logsumexp_axes"]

MODES = ("sum", "max")


@dataclass
class FactorBelief:
    """Summary of a factor belief ``b_C`` (eq. 7).

    ``marginals``: for a :class:`Dense` factor the full table ``b_C(y_C)``; for a binary hard factor (and the
    TREE factor) the vector ``z_i = b_C(v_i = 1)`` (Table 1's ``MARG_i``), which determines the belief's
    projection on the variables.  ``entropy``: ``H(b_C)`` (Table 1's ``H_C`` for hard factors).
    ``energy``: ``E_{b_C}[log psi_C]`` (0 for hard factors).  ``log_partition``: ``log Z_C`` of the
    message-induced distribution, with every incoming message normalised to sum 1.
    """

    marginals: np.ndarray
    entropy: float
    energy: float
    log_partition: float


def logsumexp_axes(t: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    """``log sum exp`` over ``axes`` (``-inf`` where every term is ``-inf``; ``axes=()`` returns ``t``)."""
    if not isinstance(t, np.ndarray):
        raise TypeError(f"t must be a NumPy array, got {type(t).__name__}")
    if not isinstance(axes, tuple) or not all(isinstance(a, int | np.integer) for a in axes):
        raise TypeError(f"axes must be a tuple of ints, got {axes!r}")
    if not axes:
        return t
    m = t.max(axis=axes, keepdims=True)
    m[~np.isfinite(m)] = 0.0
    s = np.exp(t - m).sum(axis=axes, keepdims=True)
    s[s == 0.0] = np.nan                     # all -inf: log(0) without a warning, fixed below
    out = np.log(s) + m
    out[np.isnan(out)] = -np.inf
    return out.reshape([d for k, d in enumerate(t.shape) if k not in axes])


def _check_mode(mode: object) -> str:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    return mode


class Factor(ABC):
    """A factor attached to the ordered tuple ``variables`` of a factor graph."""

    variables: tuple[int, ...]

    @property
    def arity(self) -> int:
        return len(self.variables)

    @abstractmethod
    def check_cardinalities(self, cardinalities: tuple[int, ...]) -> None:
        """Raise if the factor cannot act on variables with these numbers of states (called by the graph)."""

    @abstractmethod
    def log_potential(self, config: Sequence[int]) -> float:
        """``log psi_C(y_C)`` for one configuration of the factor's variables (in order)."""

    def messages(self, incoming: Sequence[np.ndarray], mode: str = "sum") -> list[np.ndarray]:
        """Factor-to-variable log-messages (eq. 5; max instead of sum when ``mode="max"``), one per variable, each
        defined up to an additive constant (binary hard factors return them with max 0)."""
        return self._messages(self._check_incoming(incoming), _check_mode(mode))

    def belief(self, incoming: Sequence[np.ndarray]) -> FactorBelief:
        """The sum-product factor belief (eq. 7) induced by the variable-to-factor log-messages ``incoming``."""
        return self._belief(self._check_incoming(incoming))

    @abstractmethod
    def _messages(self, incoming: list[np.ndarray], mode: str) -> list[np.ndarray]: ...

    @abstractmethod
    def _belief(self, incoming: list[np.ndarray]) -> FactorBelief: ...

    @abstractmethod
    def lp_constraints(self, lp: LPBuilder) -> None:
        """Add the factor's columns, objective terms and local-agreement constraints to the LP relaxation."""

    def _cardinalities(self) -> tuple[int, ...]:
        return (2,) * self.arity

    def _check_incoming(self, incoming: Sequence[np.ndarray]) -> list[np.ndarray]:
        if not isinstance(incoming, (Sequence, np.ndarray)):
            raise TypeError(f"incoming must be a sequence of log-message arrays, got {type(incoming).__name__}")
        if len(incoming) != self.arity:
            raise ValueError(f"incoming must hold one message per variable ({self.arity}), got {len(incoming)}")
        out = []
        for k, (msg, c) in enumerate(zip(incoming, self._cardinalities(), strict=True)):
            arr = as_log_array(f"incoming[{k}]", msg, ndim=1)
            if arr.shape != (c,):
                raise ValueError(f"incoming[{k}] must have shape ({c},), got {arr.shape}")
            out.append(arr)
        return out


class Dense(Factor):
    """Soft factor ``psi_C(y_C) = exp(table[y_C])`` over any number of discrete variables.

    ``table`` has one axis per variable, in the order of ``variables``, of that variable's cardinality;
    entries may be ``-inf`` (forbidden configurations), so Table 1's top row ("a general binary factor" with
    an arbitrary allowed set ``S_C``) is a Dense factor with a 0/-inf table.  Messages (eq. 5) and beliefs
    (eq. 7) are computed by enumerating the table: ``O(arity * table.size)`` per update.
    """

    def __init__(self, variables: Sequence[int], table: object):
        self.variables = as_variables("variables", variables)
        self.table = as_log_array("table", table)
        if self.table.ndim != self.arity:
            raise ValueError(f"table must have one axis per variable ({self.arity}), got shape {self.table.shape}")
        if 0 in self.table.shape:
            raise ValueError(f"table has an empty axis, got shape {self.table.shape}")

    def check_cardinalities(self, cardinalities: tuple[int, ...]) -> None:
        if self.table.shape != tuple(cardinalities):
            raise ValueError(f"table must have shape {tuple(cardinalities)} (the cardinalities of variables "
                             f"{self.variables}), got {self.table.shape}")

    def _cardinalities(self) -> tuple[int, ...]:
        return self.table.shape

    def log_potential(self, config: Sequence[int]) -> float:
        return float(self.table[tuple(as_config("config", config, self.table.shape))])

    def _broadcast(self, msg: np.ndarray, k: int) -> np.ndarray:
        shape = [1] * self.arity
        shape[k] = -1
        return msg.reshape(shape)

    def _messages(self, incoming: list[np.ndarray], mode: str) -> list[np.ndarray]:
        n = self.arity
        if n == 2:                                   # the pairwise fast path
            t0 = self.table + incoming[0][:, None]
            t1 = self.table + incoming[1][None, :]
            if mode == "sum":
                return [logsumexp_axes(t1, (1,)), logsumexp_axes(t0, (0,))]
            return [t1.max(axis=1), t0.max(axis=0)]
        out = []
        for i in range(n):
            t = self.table
            for j in range(n):
                if j != i:
                    t = t + self._broadcast(incoming[j], j)
            axes = tuple(j for j in range(n) if j != i)
            out.append(logsumexp_axes(t, axes) if mode == "sum" else (np.max(t, axis=axes) if axes else t))
        return out

    def _joint(self, incoming: list[np.ndarray]) -> np.ndarray:
        t = self.table
        for j in range(self.arity):
            t = t + self._broadcast(incoming[j], j)
        return t

    def _belief(self, incoming: list[np.ndarray]) -> FactorBelief:
        t = self._joint(incoming)
        log_z = float(logsumexp_axes(t, tuple(range(self.arity))))
        if log_z == -np.inf:
            raise ValueError(f"Dense factor on {self.variables}: every configuration has zero belief "
                             "(contradictory messages)")
        logp = t - log_z
        p = np.exp(logp)
        entropy = -float(np.sum(xlogy(p, logp)))
        energy = float(np.sum(xlogy(p, self.table)))
        # log Z_C with every incoming message normalised to sum 1 (as documented, and as the hard factors report)
        log_z -= sum(float(logsumexp_axes(m, (0,))) for m in incoming)
        return FactorBelief(p, entropy, energy, log_z)

    def max_belief(self, incoming: Sequence[np.ndarray]) -> np.ndarray:
        """Max-product factor belief (eq. 7 with max-messages), scaled to max 1."""
        t = self._joint(self._check_incoming(incoming))
        top = float(np.max(t))
        if top == -np.inf:
            raise ValueError(f"Dense factor on {self.variables}: every configuration has zero belief")
        return np.exp(t - top)

    def lp_constraints(self, lp: LPBuilder) -> None:
        """Columns ``mu_C(y_C)`` (``0`` where the table is ``-inf``) with objective ``table[y_C]`` and the
        marginalisation constraints ``sum_{y_C ~ y_i} mu_C(y_C) = mu_i(y_i)`` of eq. (11)."""
        flat = self.table.reshape(-1)
        finite = np.isfinite(flat)
        start = lp.add_columns(flat.size, upper=np.where(finite, 1.0, 0.0), score=np.where(finite, flat, 0.0))
        idx = np.arange(flat.size).reshape(self.table.shape)
        for k, v in enumerate(self.variables):
            for s in range(self.table.shape[k]):
                cols = start + np.take(idx, s, axis=k).reshape(-1)
                lp.add_eq(np.append(cols, lp.var_col(v, s)), np.append(np.ones(cols.size), -1.0), 0.0)
        lp.register(self, start, self.table.shape)

    def __repr__(self) -> str:
        return f"Dense(variables={self.variables}, table_shape={self.table.shape})"


class BinaryHardFactor(Factor):
    """A hard-constraint factor ``psi_C(v) = 1 if v in S_C else 0`` on binary variables (Table 1).

    Subclasses give, in *effective* coordinates (negated inputs already flipped), the closed-form message
    ratios of Table 1, the log-partition function of the message-induced distribution and the convex hull
    of ``S_C`` as linear constraints.  ``negated[k]`` makes the factor act on ``1 - v_k`` instead of ``v_k``.
    """

    _min_arity = 1
    _max_arity: int | None = None
    _name = "hard"

    def __init__(self, variables: Sequence[int], negated: Sequence[bool] | None = None):
        self.variables = as_variables("variables", variables, self._min_arity, self._max_arity)
        self.negated = as_flags("negated", negated, self.arity)
        self._neg = np.array(self.negated, dtype=bool)

    def check_cardinalities(self, cardinalities: tuple[int, ...]) -> None:
        for v, c in zip(self.variables, cardinalities, strict=True):
            if c != 2:
                raise ValueError(f"variables of a {type(self).__name__} factor must be binary; variable {v} has "
                                 f"{c} states")

    # --- definitions in effective coordinates -------------------------------------------------------------
    @abstractmethod
    def _allows(self, v: np.ndarray) -> bool: ...

    @abstractmethod
    def _ratios(self, l: np.ndarray, mode: str) -> np.ndarray:
        """Outgoing log-ratios ``log m_{C->i}`` from incoming ``log m_{i->C}`` (Table 1)."""

    @abstractmethod
    def _log_z(self, lp0: np.ndarray, lp1: np.ndarray) -> float:
        """``log sum_{v in S_C} prod_i p_i(v_i)`` for normalised incoming log-probabilities ``lp0, lp1``."""

    @abstractmethod
    def _hull(self) -> list[tuple[np.ndarray, str, float]]:
        """``conv S_C`` as rows ``(coefficients on z, "eq"|"le", rhs)``."""

    # --- the public interface -----------------------------------------------------------------------------
    def allows(self, config: Sequence[int]) -> bool:
        """Whether ``config`` (a 0/1 sequence, in the order of ``variables``) lies in ``S_C``."""
        v = as_config("config", config, (2,) * self.arity)
        return bool(self._allows(np.where(self._neg, 1 - v, v)))

    def log_potential(self, config: Sequence[int]) -> float:
        return 0.0 if self.allows(config) else -np.inf

    def _in_ratios(self, incoming: list[np.ndarray]) -> np.ndarray:
        l = np.array([log_ratio(f"incoming[{k}]", m) for k, m in enumerate(incoming)])
        return np.where(self._neg, -l, l)

    def ratio_messages(self, in_ratios: Sequence[float] | np.ndarray, mode: str = "sum") -> np.ndarray:
        """Table 1's outgoing ratios ``log m_{C->i}`` from the incoming ``log m_{i->C}`` (both in the
        variables' own coordinates, i.e. negations handled here)."""
        l = np.asarray(as_numpy(in_ratios), dtype=np.float64)
        if l.shape != (self.arity,):
            raise ValueError(f"in_ratios must have shape ({self.arity},), got {l.shape}")
        if np.isnan(l).any():
            raise ValueError("in_ratios contains NaN")
        eff = np.where(self._neg, -l, l)
        with np.errstate(invalid="ignore"):
            out = self._ratios(eff, _check_mode(mode))
        return np.where(self._neg, -out, out)

    def _messages(self, incoming: list[np.ndarray], mode: str) -> list[np.ndarray]:
        with np.errstate(invalid="ignore"):
            out = self._ratios(self._in_ratios(incoming), mode)
        return ratio_to_log_message(np.where(self._neg, -out, out))

    def _belief(self, incoming: list[np.ndarray]) -> FactorBelief:
        """``MARG_i = sigma(log m_{i->C} + log m_{C->i})`` (Table 1: ``m_{C->i} = m_{i->C}^{-1} MARG_i/(1-MARG_i)``)
        and ``H_C = log Z_C - sum_i [MARG_i log p_i(1) + (1 - MARG_i) log p_i(0)]`` (Table 1's entropy with the
        incoming messages normalised to ``p_i``, which keeps it finite for clamped inputs)."""
        eff = self._in_ratios(incoming)
        lp1, lp0 = log_sigmoid(eff), log_sigmoid(-eff)
        with np.errstate(invalid="ignore"):
            log_z = float(self._log_z(lp0, lp1))
            z, entropy = self._marginals_entropy(eff, lp0, lp1, log_z) if log_z > -np.inf else (None, 0.0)
        if z is None or np.isnan(z).any():
            raise ValueError(f"{type(self).__name__} factor on {self.variables}: the incoming messages leave no "
                             "allowed configuration (contradictory messages)")
        return FactorBelief(np.where(self._neg, 1.0 - z, z), max(entropy, 0.0), 0.0, log_z)

    def _marginals_entropy(self, eff: np.ndarray, lp0: np.ndarray, lp1: np.ndarray,
                           log_z: float) -> tuple[np.ndarray, float]:
        """``MARG`` and ``H_C`` in the effective coordinates, by Table 1 (above); a factor overrides this with a
        form that keeps its digits where Table 1's adds terms far apart (XOR, OR, OROut do)."""
        z = expit(eff + self._ratios(eff, "sum"))
        return z, log_z - float(np.sum(xlogy(z, lp1) + xlogy(1.0 - z, lp0)))

    def lp_constraints(self, lp: LPBuilder) -> None:
        """Table 1's local agreement constraints ``z ∈ conv S_C`` on ``z_i = mu_i(1)``, with ``z_i -> 1 - z_i`` for
        negated inputs."""
        cols = np.array([lp.var_col(v, 1) for v in self.variables])
        sign = np.where(self._neg, -1.0, 1.0)
        for coef, kind, rhs in self._hull():
            coef = np.asarray(coef, dtype=np.float64)
            # sum_k c_k z'_k with z'_k = z_k or 1 - z_k
            shift = float(np.sum(coef[self._neg]))
            keep = coef != 0
            if kind == "eq":
                lp.add_eq(cols[keep], (coef * sign)[keep], rhs - shift)
            else:
                lp.add_ub(cols[keep], (coef * sign)[keep], rhs - shift)
        lp.register(self, None, None)

    def __repr__(self) -> str:
        neg = f", negated={self.negated}" if any(self.negated) else ""
        return f"{type(self).__name__}(variables={self.variables}{neg})"


class XOR(BinaryHardFactor):
    """Table 1, row XOR ("one-hot"): ``psi(v_1..v_n) = 1`` iff ``sum_i v_i = 1``.

    Sum-product ``m_{XOR->i} = (sum_{j != i} m_{j->XOR})^{-1}``; max-product
    ``m_{XOR->i} = (max_{j != i} m_{j->XOR})^{-1}``; local agreement ``sum_i z_i = 1, z_i in [0, 1]``;
    ``H_XOR = -sum_i (m_i / sum_j m_j) log(m_i / sum_j m_j)``.  With ``negated`` inputs this covers
    :class:`XOROut` (XOR-WITH-OUTPUT) and other mixed-sign one-hot constraints.
    """

    def _allows(self, v: np.ndarray) -> bool:
        return int(v.sum()) == 1

    def _ratios(self, l: np.ndarray, mode: str) -> np.ndarray:
        if mode == "sum":
            return -exclusive(l, np.logaddexp, -np.inf)
        return -exclusive(l, np.maximum, -np.inf)

    def _log_z(self, lp0: np.ndarray, lp1: np.ndarray) -> float:
        # sum_i p_i(1) prod_{j != i} p_j(0)
        return float(np.logaddexp.reduce(lp1 + exclusive(lp0, np.add, 0.0)))

    def _marginals_entropy(self, eff: np.ndarray, lp0: np.ndarray, lp1: np.ndarray,
                           log_z: float) -> tuple[np.ndarray, float]:
        """``MARG = softmax(l)`` (configuration ``i`` has weight ``p_i(1) prod_{j != i} p_j(0)``, proportional to
        ``exp(l_i)``) and ``H_XOR`` its entropy, from differences of the ``l_i``: Table 1's ``sigma(l_i + log
        m_{XOR->i})`` adds two terms 1e30 apart, so three inputs at -1e30 gave 1/2 each (sum 3/2, not the one-hot's
        1) and an entropy of 5e29."""
        on = eff == np.inf
        if on.any():                                    # an input clamped on (two would have left no configuration)
            marg = on.astype(np.float64)
        else:
            w = np.exp(eff - eff.max())
            marg = w / w.sum()
        with np.errstate(divide="ignore"):
            return marg, float(-np.sum(xlogy(marg, np.log(marg))))

    def _hull(self) -> list[tuple[np.ndarray, str, float]]:
        return [(np.ones(self.arity), "eq", 1.0)]


def _or_log_z(lp0: np.ndarray, lp1: np.ndarray) -> float:
    """OR's ``log Z_C = log(1 - prod_i p_i(0))``, with ``-log p_i(0) = softplus(log p_i(1) - log p_i(0))`` carried
    in log space."""
    return float(log1mexp_of_log(np.logaddexp.reduce(log_softplus(lp1 - lp0))))


def _or_belief(lp0: np.ndarray, lp1: np.ndarray, log_z: float) -> tuple[np.ndarray, float]:
    """OR's ``MARG_i = p_i(1) / Z`` with ``Z = sum_j p_j(1) prod_{k<j} p_k(0)`` (the first active input is j), taken
    as ``1 / sum_j exp(log p_j(1) - log p_i(1) + sum_{k<j} log p_k(0))``: the log-probabilities are differenced
    before they are added, so inputs at -1e30 give 1/3 each, not the 1/2 of Table 1's ``sigma(l_i + log
    m_{OR->i})`` (whose two terms are 1e30 apart and round); and ``H_C = -sum_i MARG_i log MARG_i - sum_i (1 -
    MARG_i) log p_i(0) + log Z (1 - sum_i MARG_i)``, the same entropy without the difference of two 1e30 terms."""
    n = len(lp1)
    prefix = np.concatenate([[0.0], np.cumsum(lp0)[:-1]])        # sum_{k<j} log p_k(0)
    with np.errstate(invalid="ignore"):
        d = lp1[None, :] - lp1[:, None] + prefix[None, :]
    d[~np.isfinite(lp1)[:, None] & ~np.isfinite(lp1)[None, :]] = -np.inf   # -inf - -inf: an input clamped off
    d[np.diag_indices(n)] = prefix                               # j = i, exactly
    lse = np.logaddexp.reduce(d, axis=1)                         # -log MARG_i
    marg = np.where(lp1 == -np.inf, 0.0, np.where(lp0 == -np.inf, 1.0, np.exp(-lse)))   # clamped: exactly 0 / 1
    with np.errstate(invalid="ignore"):
        entropy = (float(np.sum(np.where(marg > 0, marg * lse, 0.0)))
                   - float(np.sum(np.where((marg < 1) & (lp0 > -np.inf), (1.0 - marg) * lp0, 0.0)))
                   + log_z * (1.0 - float(marg.sum())))
    return marg, entropy


class OR(BinaryHardFactor):
    """Table 1, row OR: ``psi(v_1..v_n) = 1`` iff ``sum_i v_i >= 1``.

    Sum-product ``m_{OR->i} = (1 - prod_{j != i} (1 + m_{j->OR})^{-1})^{-1}``; max-product
    ``m_{OR->i} = max{1, min_{j != i} m_{j->OR}^{-1}}``; local agreement ``sum_i z_i >= 1, z_i in [0, 1]``.
    With negated inputs: :class:`NAND` (all inputs negated) and :class:`IMPLY` (2 inputs, the first negated).
    """

    def _allows(self, v: np.ndarray) -> bool:
        return int(v.sum()) >= 1

    def _ratios(self, l: np.ndarray, mode: str) -> np.ndarray:
        if mode == "sum":
            # log prod_{j != i} (1 + m_j) = s_i >= 0, message = -log(1 - exp(-s_i)); s_i carried as log s_i,
            # which stays exact where m_j underflows (log-ratios below about -745)
            return -log1mexp_of_log(exclusive(log_softplus(l), np.logaddexp, -np.inf))
        return np.maximum(0.0, -exclusive(l, np.maximum, -np.inf))

    def _log_z(self, lp0: np.ndarray, lp1: np.ndarray) -> float:
        return _or_log_z(lp0, lp1)

    def _marginals_entropy(self, eff: np.ndarray, lp0: np.ndarray, lp1: np.ndarray,
                           log_z: float) -> tuple[np.ndarray, float]:
        return _or_belief(lp0, lp1, log_z)

    def _hull(self) -> list[tuple[np.ndarray, str, float]]:
        return [(-np.ones(self.arity), "le", -1.0)]


class OROut(BinaryHardFactor):
    """Table 1, row OR-WITH-OUTPUT: ``psi(v_1..v_n) = 1`` iff ``v_n = OR(v_1, .., v_{n-1})`` (last = output).

    Sum-product, ``i < n``: ``m_{->i} = (1 - (1 - m_n^{-1}) prod_{j != i,n} (1 + m_j)^{-1})^{-1}``;
    ``i = n``: ``m_{->n} = prod_{j != n} (1 + m_j) - 1``.  Max-product, ``i < n``:
    ``m_{->i} = min{m_n prod_{j != i,n} max{1, m_j}, max{1, min_{j != i,n} m_j^{-1}}}``; ``i = n``:
    ``m_{->n} = prod_{j != n} max{1, m_j} min{1, max_{j != n} m_j}``.  Local agreement (the convex hull of
    ``S_C``): ``z_i <= z_n`` for ``i < n``, ``z_n <= sum_{i < n} z_i``, ``z in [0, 1]^n``.
    """

    _min_arity = 2

    def _allows(self, v: np.ndarray) -> bool:
        return int(v[-1]) == int(v[:-1].max())

    def _ratios(self, l: np.ndarray, mode: str) -> np.ndarray:
        x, ln = l[:-1], l[-1]
        out = np.empty_like(l)
        if mode == "sum":
            # s_i = log prod_{j != i,n} (1 + m_j) = sum_{j != i,n} max(l_j, 0) + sum_{j != i,n} softplus(-|l_j|): the
            # first sum, where the huge terms are, meets l_n exactly before the bounded second is added (s taken back
            # from log s was 1e30 to 17 places in the last digit, and l_n + s the O(1) rest of -1e30 + 1e30 and that)
            log_s = exclusive(log_softplus(x), np.logaddexp, -np.inf)
            small = softplus(-np.abs(x))
            ln_s = cavity_sums(ln, np.maximum(x, 0.0)) + exclusive(small, np.add, 0.0)
            out[:-1] = -np.logaddexp(log1mexp_of_log(log_s), -ln_s)    # log(1 - P + P / m_n), P = exp(-s)
            # log(exp(s) - 1) = s + log(1 - exp(-s)) over every input
            out[-1] = float(np.sum(np.maximum(x, 0.0)) + (np.sum(small)
                                                          + log1mexp_of_log(np.logaddexp.reduce(log_softplus(x)))))
        else:
            first = cavity_sums(ln, np.maximum(0.0, x))              # l_n meets the exact sum
            second = np.maximum(0.0, -exclusive(x, np.maximum, -np.inf))
            out[:-1] = np.minimum(first, second)
            out[-1] = float(np.sum(np.maximum(0.0, x))) + min(0.0, float(np.max(x)))
        return out

    def _log_z(self, lp0: np.ndarray, lp1: np.ndarray) -> float:
        # p_n(0) prod_{i<n} p_i(0) + p_n(1) (1 - prod_{i<n} p_i(0))
        l0 = float(np.sum(lp0[:-1]))
        rest = log1mexp_of_log(np.logaddexp.reduce(log_softplus(lp1[:-1] - lp0[:-1])))   # log(1 - prod p_i(0))
        return float(np.logaddexp(lp0[-1] + l0, lp1[-1] + rest))

    def _marginals_entropy(self, eff: np.ndarray, lp0: np.ndarray, lp1: np.ndarray,
                           log_z: float) -> tuple[np.ndarray, float]:
        """The output is on with probability ``sigma(T)``, ``T = l_n + log(prod_{i<n} (1 + m_i) - 1)``, and then the
        inputs are distributed as under an :class:`OR` factor: ``MARG_i = sigma(T) MARG^OR_i`` and ``H_C = H(sigma(T))
        + sigma(T) H^OR``, with OR's exact belief (Table 1's ``sigma(l_i + log m_{C->i})`` adds terms 1e30 apart:
        inputs (1e30) and output (-1e30) gave MARG = (1/2, 0), against the factor's own out = in)."""
        x = np.sort(eff[:-1])
        m = float(x[-1])
        if m == -np.inf or eff[-1] == -np.inf:                      # no input can be on, or the output is off
            t = -np.inf
        else:
            # log(prod_i (1 + e^{x_i}) - 1) = m + lse_j(x_j - m + sum_{k<j} softplus(x_k)) (j the first input on,
            # in ascending order), so that l_n + m is formed before the O(1) rest is added
            prefix = np.concatenate([[0.0], np.cumsum(softplus(x))[:-1]])
            with np.errstate(invalid="ignore"):
                rest = float(np.logaddexp.reduce(np.where(x == -np.inf, -np.inf, x - m + prefix)))
            t = (float(eff[-1]) + m) + rest if np.isfinite(m) else float(eff[-1]) + m
        on = float(expit(t))
        marg = np.zeros(self.arity)
        marg[-1] = on
        entropy = float(-xlogy(on, log_sigmoid(np.array(t))) - xlogy(1.0 - on, log_sigmoid(np.array(-t))))
        if on > 0:
            inputs, h = _or_belief(lp0[:-1], lp1[:-1], _or_log_z(lp0[:-1], lp1[:-1]))
            marg[:-1] = on * inputs
            entropy += on * max(h, 0.0)
        return marg, entropy

    def _hull(self) -> list[tuple[np.ndarray, str, float]]:
        n = self.arity
        rows = []
        for i in range(n - 1):
            c = np.zeros(n)
            c[i], c[-1] = 1.0, -1.0
            rows.append((c, "le", 0.0))
        c = -np.ones(n)
        c[-1] = 1.0
        rows.append((c, "le", 0.0))
        return rows


class NAND(OR):
    """Table 1's negated-input variant NAND: an :class:`OR` factor with every input negated, i.e.
    ``psi(v) = 1`` iff not all ``v_i`` are on (for two inputs: at most one on).  Local agreement:
    ``sum_i z_i <= n - 1``."""

    def __init__(self, variables: Sequence[int]):
        n = len(variables) if isinstance(variables, (Sequence, np.ndarray)) else 0
        super().__init__(variables, (True,) * n)


class IMPLY(OR):
    """Table 1's negated-input variant IMPLY: a 2-input :class:`OR` with the first input negated, i.e.
    ``psi(v_1, v_2) = 1`` iff ``v_1 => v_2``.  Local agreement: ``z_1 <= z_2`` (eq. 17)."""

    _min_arity = 2
    _max_arity = 2

    def __init__(self, variables: Sequence[int]):
        super().__init__(variables, (True, False) if isinstance(variables, (Sequence, np.ndarray))
                         and len(variables) == 2 else None)


class XOROut(XOR):
    """Table 1's negated-input variant XOR-WITH-OUTPUT: an :class:`XOR` with the last input negated, i.e.
    ``psi(v_1..v_n) = 1`` iff ``v_n = sum_{i < n} v_i`` (at most one input on, and the output says whether
    one is).  Local agreement: ``z_n = sum_{i < n} z_i`` (eq. 18)."""

    _min_arity = 2

    def __init__(self, variables: Sequence[int]):
        n = len(variables) if isinstance(variables, (Sequence, np.ndarray)) else 0
        super().__init__(variables, (False,) * (n - 1) + (True,) if n >= 1 else None)
