"""Loopy belief propagation on a :class:`FactorGraph`, sum-product and max-product, in log space.

Messages follow Martins et al. (2010), eqs. (4)-(7):

* variable to factor, eq. (4): ``M_{i->C}(y_i) ∝ exp(unary_i(y_i)) prod_{D != C} M_{D->i}(y_i)``;
* factor to variable, eq. (5): ``M_{C->i}(y_i) ∝ sum_{y_C ~ y_i} psi_C(y_C) prod_{j != i} M_{j->C}(y_j)`` (max
  instead of sum for max-product), in closed form for the hard factors (Table 1);
* beliefs, eqs. (6)-(7): ``b_i ∝ exp(unary_i) prod_C M_{C->i}`` and ``b_C ∝ psi_C prod_i M_{i->C}``.

Schedules.  ``"parallel"`` (flooding): every iteration recomputes all variable-to-factor messages from the
previous iteration's factor-to-variable messages, then all factor-to-variable messages from those; for a
pairwise MRF this is the synchronous node-to-node update ``m_ij <- max_{y_i} psi_i psi_ij prod_{k != j} m_ki``
(Kulesza & Pereira 2007, eq. 5).  ``"sequential"``: factors are visited one at a time (in id order on odd
iterations, reverse order on even ones), each using the latest messages; a forward and a backward sweep make
BP exact on a chain whose factors were added along it.

Normalisation (``normalize``): ``"sum"`` rescales every message to sum 1 (Kulesza & Pereira's
``m(-1) + m(1) = 1``), ``"max"`` to max 1, ``"none"`` keeps raw products (only with Dense factors; the message
values may then grow without bound, e.g. in Kulesza & Pereira's loopy example, so the change never drops
below ``tol``).  Defaults: ``"sum"`` for sum-product and ``"max"`` for max-product.  Normalisation does not
change the beliefs.

Damping ``d`` mixes each new factor-to-variable message with the previous one in probability space,
``M <- (1 - d) M_new + d M_old`` (both normalised first; computed stably in log space).  An entry that falls
by ``D`` nats from one iteration to the next (large scores) shrinks only by the factor ``d`` per iteration, so
its log-message settles after about ``D / log(1/d)`` iterations (1,000 nats at ``d = 0.5``: ~1,450); until
then the beliefs can be far from the fixed point, and the result says ``converged=False``.  Exact zeros (a
hard constraint's verdict, ``-inf``) are not mixed.  ``damping_space="log"`` mixes the log-messages instead,
``log M <- (1 - d) log M_new + d log M_old`` (geometric mixing, then normalised; the same fixed points): a gap of
any size then shrinks by the factor ``d`` per iteration, so large scores converge in as many iterations as small
ones; exact zeros of the new message are kept, and a message with an entry that is ``-inf`` in the old message
alone is taken undamped (mixed, an old zero would hold that entry at zero for ever).  Convergence: the
largest absolute change of a factor-to-variable log-message entry within one iteration (entries that are
``-inf`` in both count 0, in one only count ``inf``) drops below ``tol``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from .._checks import check_count, check_damping_space, check_nonnegative, check_real
from ._util import as_numpy, damp_log_message, normalise_log, xlogy
from .factors import Dense, Factor
from .graph import FactorGraph

__all__ = ["BPResult", "belief_propagation", "decode_map"]

SCHEDULES = ("parallel", "sequential")
NORMALIZATIONS = ("sum", "max", "none")


@dataclass
class BPResult:
    """The outcome of :func:`belief_propagation`.

    ``variable_beliefs[i]``: sum-product marginals ``b_i`` (eq. 6, summing to 1) or max-product max-marginals
    scaled to max 1.  ``factor_beliefs[C]``: for a Dense factor its table ``b_C`` (eq. 7; max-scaled for
    max-product); for a binary hard factor or a TREE factor under sum-product the vector ``z_i = b_C(v_i = 1)``;
    ``None`` for hard factors under max-product.  ``converged``/``iterations``/``max_change``: the convergence
    report (``history`` holds every iteration's max change).  ``log_partition``: the Bethe estimate of
    ``log Z`` (sum-product only; exact on tree-shaped graphs at convergence) and ``bethe_free_energy`` its
    negative, ``F_Bethe = -E_b[score] - H_Bethe(b)`` with ``H_Bethe = sum_C H(b_C) + sum_i (1 - d_i) H(b_i)``.
    ``messages[C][k]``: the final factor-to-variable log-messages (for warm starts).
    """

    mode: str
    variable_beliefs: list[np.ndarray]
    factor_beliefs: list[np.ndarray | None]
    converged: bool
    iterations: int
    max_change: float
    history: list[float] = field(default_factory=list)
    log_partition: float | None = None
    bethe_entropy: float | None = None
    messages: list[list[np.ndarray]] = field(default_factory=list)

    @property
    def bethe_free_energy(self) -> float | None:
        return None if self.log_partition is None else -self.log_partition

    def decode(self) -> np.ndarray:
        """Per-variable argmax of the beliefs (see :func:`decode_map`)."""
        return decode_map(self)

    def ties(self, tol: float = 1e-9) -> list[int]:
        """Variables whose two largest beliefs are within ``tol`` (relative): their decoding is ambiguous."""
        tol = check_nonnegative("tol", tol)
        out = []
        for i, b in enumerate(self.variable_beliefs):
            if b.size > 1:
                top2 = np.sort(b)[-2:]
                if top2[1] - top2[0] <= tol * max(top2[1], 1e-300):
                    out.append(i)
        return out


def decode_map(result: BPResult) -> np.ndarray:
    """MAP assignment from max-product beliefs: ``y_i = argmax b_i`` (eq. 6), the exact MAP on a tree-shaped
    graph when it is unique.  On loopy graphs, or with ties, the result may violate hard constraints; check it
    with :meth:`FactorGraph.score`."""
    if not isinstance(result, BPResult):
        raise TypeError(f"result must be a BPResult, got {type(result).__name__}")
    return np.array([int(np.argmax(b)) for b in result.variable_beliefs], dtype=np.int64)


class _Contradiction(ValueError):
    pass


def belief_propagation(graph: FactorGraph, mode: str = "sum", *, schedule: str = "parallel", damping: float = 0.0,
                       normalize: str | None = None, tol: float = 1e-8, max_iter: int = 200,
                       init_messages: Sequence[Sequence[np.ndarray]] | None = None,
                       damping_space: str = "probability") -> BPResult:
    """Run loopy BP (``mode`` ``"sum"`` or ``"max"``) on ``graph``; see the module docstring for the options
    (``damping_space``: ``"probability"`` or ``"log"``, where ``damping`` mixes the messages).

    Raises ``ValueError`` if the messages become contradictory (every state of some variable or factor
    gets zero belief: infeasible hard constraints, or a contradiction reached by loopy BP).
    """
    if not isinstance(graph, FactorGraph):
        raise TypeError(f"graph must be a FactorGraph, got {type(graph).__name__}")
    if mode not in ("sum", "max"):
        raise ValueError(f"mode must be 'sum' or 'max', got {mode!r}")
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    if normalize is None:
        normalize = mode
    if normalize not in NORMALIZATIONS:
        raise ValueError(f"normalize must be one of {NORMALIZATIONS} (or None), got {normalize!r}")
    damping = check_real("damping", damping, 0.0, 1.0, high_open=True)
    damping_space = check_damping_space(damping_space)
    tol, max_iter = check_nonnegative("tol", tol), check_count("max_iter", max_iter)
    factors = graph.factors
    if normalize == "none" and any(not isinstance(f, Dense) for f in factors):
        raise ValueError("normalize='none' supports Dense factors only (hard factors send message ratios)")

    cards = graph.cardinalities
    unary = [graph._unary[i] for i in range(graph.num_variables)]
    adj = graph._adj
    mu = _init_messages(factors, cards, init_messages, normalize)

    def cavity(v: int, f: int) -> np.ndarray:
        t = unary[v]
        for g, k in adj[v]:
            if g != f:
                t = t + mu[g][k]
        t, c = normalise_log(t, normalize)
        if c == -np.inf:
            raise _Contradiction(f"every state of variable {v} has zero message product (contradictory hard "
                                 "constraints or a contradiction reached by loopy BP)")
        return t

    def compute(f: int) -> list[np.ndarray]:
        factor = factors[f]
        incoming = [cavity(v, f) for v in factor.variables]
        out = factor._messages(incoming, mode)
        new = []
        for k, m in enumerate(out):
            if np.isnan(m).any():
                raise _Contradiction(f"factor {f} ({factor!r}) received contradictory messages")
            m, c = normalise_log(np.asarray(m, dtype=np.float64), normalize)
            if c == -np.inf:
                raise _Contradiction(f"factor {f} ({factor!r}) sends an all-zero message to variable "
                                     f"{factor.variables[k]} (contradictory constraints)")
            if damping > 0.0:
                m, _ = normalise_log(damp_log_message(m, mu[f][k], damping, damping_space), normalize)
            new.append(m)
        return new

    history: list[float] = []
    converged = not factors
    iterations = 0
    try:
        while not converged and iterations < max_iter:
            iterations += 1
            change = 0.0
            if schedule == "parallel":
                fresh = [compute(f) for f in range(len(factors))]
                for f in range(len(factors)):
                    change = max(change, _change(fresh[f], mu[f]))
                mu = fresh
            else:
                order = range(len(factors)) if iterations % 2 else range(len(factors) - 1, -1, -1)
                for f in order:
                    new = compute(f)
                    change = max(change, _change(new, mu[f]))
                    mu[f] = new
            history.append(change)
            converged = change <= tol
        return _finish(graph, mode, mu, converged, iterations, history, cavity)
    except _Contradiction as err:
        raise ValueError(str(err)) from None


def _init_messages(factors: Sequence[Factor], cards: Sequence[int], init: object, normalize: str
                   ) -> list[list[np.ndarray]]:
    if init is None:
        return [[normalise_log(np.zeros(cards[v]), normalize)[0] for v in f.variables] for f in factors]
    if isinstance(init, BPResult):
        init = init.messages
    if not isinstance(init, (Sequence, np.ndarray)) or len(init) != len(factors):
        raise ValueError(f"init_messages must hold one list of messages per factor ({len(factors)})")
    out = []
    for f, (factor, msgs) in enumerate(zip(factors, init, strict=True)):
        if not isinstance(msgs, (Sequence, np.ndarray)):
            raise TypeError(f"init_messages[{f}] must be a list of {factor.arity} log-messages, got "
                            f"{type(msgs).__name__}")
        if len(msgs) != factor.arity:
            raise ValueError(f"init_messages[{f}] must hold {factor.arity} messages, got {len(msgs)}")
        row = []
        for k, (v, m) in enumerate(zip(factor.variables, msgs, strict=True)):
            kind = type(m).__name__
            try:
                raw = np.asarray(as_numpy(m))
                kind = f"{kind} of {raw.dtype}"
                if raw.dtype == np.bool_:       # a mask is not a log-message: True would read as log-potential 1
                    raise TypeError(kind)
                arr = raw.astype(np.float64)
            except (TypeError, ValueError) as err:
                raise TypeError(f"init_messages[{f}][{k}] must be a real log-message, got {kind}") from err
            if (arr.shape != (cards[v],) or np.isnan(arr).any() or np.isposinf(arr).any()
                    or np.isneginf(arr).all()):
                raise ValueError(f"init_messages[{f}][{k}] must be a log-message of shape ({cards[v]},) without "
                                 "NaN or +inf and with a finite entry")
            row.append(normalise_log(arr, normalize)[0])
        out.append(row)
    return out


def _change(new: list[np.ndarray], old: list[np.ndarray]) -> float:
    with np.errstate(invalid="ignore"):
        d = np.concatenate(new) - np.concatenate(old)    # NaN only where both are -inf (no change)
    d = np.abs(d[~np.isnan(d)])
    return float(d.max()) if d.size else 0.0


def _finish(graph: FactorGraph, mode: str, mu: list[list[np.ndarray]], converged: bool, iterations: int,
            history: list[float], cavity: Callable[[int, int], np.ndarray]) -> BPResult:
    beliefs = []
    log_beliefs = []
    for v in range(graph.num_variables):
        t = graph._unary[v]
        for g, k in graph._adj[v]:
            t = t + mu[g][k]
        t, c = normalise_log(t, "sum" if mode == "sum" else "max")
        if c == -np.inf:
            raise _Contradiction(f"every state of variable {v} has zero belief (contradictory constraints)")
        log_beliefs.append(t)
        beliefs.append(np.exp(t))
    factor_beliefs: list[np.ndarray | None] = []
    log_z = entropy_total = None
    if mode == "sum":
        energy = 0.0
        entropy = 0.0
        for v in range(graph.num_variables):
            p, logp = beliefs[v], log_beliefs[v]
            energy += float(np.sum(xlogy(p, graph._unary[v])))
            entropy += (1 - graph.degree(v)) * -float(np.sum(xlogy(p, logp)))
        for f, factor in enumerate(graph.factors):
            fb = factor._belief([cavity(v, f) for v in factor.variables])
            factor_beliefs.append(fb.marginals)
            energy += fb.energy
            entropy += fb.entropy
        log_z, entropy_total = energy + entropy, entropy
    else:
        for f, factor in enumerate(graph.factors):
            if isinstance(factor, Dense):
                incoming = [cavity(v, f) for v in factor.variables]
                factor_beliefs.append(factor.max_belief(incoming))
            else:
                factor_beliefs.append(None)
    return BPResult(mode=mode, variable_beliefs=beliefs, factor_beliefs=factor_beliefs, converged=converged,
                    iterations=iterations, max_change=history[-1] if history else 0.0, history=history,
                    log_partition=log_z, bethe_entropy=entropy_total, messages=mu)

