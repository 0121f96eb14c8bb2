"""Brute-force references for the factor-graph tests (enumeration of every configuration)."""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np
from scipy.special import logsumexp

from tests.trees import reaches_root

# the constraints, written independently of the package (v: a 0/1 tuple in the factor's variable order)
PREDICATES = {
    "XOR": lambda v: sum(v) == 1,
    "OR": lambda v: sum(v) >= 1,
    "OROut": lambda v: v[-1] == max(v[:-1]),
    "NAND": lambda v: not all(v),
    "IMPLY": lambda v: (not v[0]) or bool(v[1]),
    "XOROut": lambda v: v[-1] == sum(v[:-1]),
}


def negate(pred, negated):
    return lambda v: pred(tuple(1 - x if n else x for x, n in zip(v, negated, strict=True)))


def allowed_set(pred, n):
    return [v for v in itertools.product((0, 1), repeat=n) if pred(v)]


def factor_reference(configs, incoming, log_potential=None):
    """Exact sum/max messages, marginals z_i = b(v_i = 1), entropy and log Z of the factor belief
    ``b(v) ∝ psi(v) prod_i p_i(v_i)`` over the allowed ``configs`` (``log_potential``: extra log-psi per config).

    ``incoming`` are log-messages; each is normalised to sum 1 first (as in Table 1's entropy)."""
    n = len(incoming)
    logp = [m - logsumexp(m) for m in incoming]
    pot = np.zeros(len(configs)) if log_potential is None else np.asarray(log_potential, dtype=float)
    w = np.array([pot[c] + sum(logp[i][v[i]] for i in range(n)) for c, v in enumerate(configs)])
    out = {}
    for mode, op in (("sum", np.logaddexp), ("max", np.maximum)):
        msgs = []
        for i in range(n):
            m = np.full(len(incoming[i]), -np.inf)
            for c, v in enumerate(configs):
                cavity = pot[c] + sum(logp[j][v[j]] for j in range(n) if j != i)
                m[v[i]] = op(m[v[i]], cavity)
            msgs.append(m)
        out[mode] = msgs
    log_z = logsumexp(w) if len(w) and np.isfinite(w).any() else -np.inf
    b = np.exp(w - log_z) if np.isfinite(log_z) else np.zeros(len(w))
    out["log_z"] = log_z
    out["entropy"] = -float(np.sum(b[b > 0] * (w[b > 0] - log_z)))
    out["z"] = np.array([sum(b[c] for c, v in enumerate(configs) if v[i] == 1) for i in range(n)])
    out["belief"] = b
    return out


def log_ratio(m):
    m = np.asarray(m, dtype=float)
    if m[0] == -np.inf and m[1] == -np.inf:
        return np.nan
    if m[0] == -np.inf:
        return np.inf
    if m[1] == -np.inf:
        return -np.inf
    return m[1] - m[0]


def exact_ratio_messages(configs, l, mode):
    """Outgoing log-ratios of the hard factor allowing ``configs`` (0/1 tuples) for incoming log-ratios ``l``
    (``+-inf``: clamped), from the configurations' scores ``sum_{j != i} l_j v_j`` summed exactly (fractions) and
    differenced before anything is rounded: the O(1) digits of a result among scores 1e30 apart survive, where a float
    enumeration rounds them away.  NaN where the clamps leave neither state of ``v_i``."""
    n = len(l)
    out = []
    for i in range(n):
        scores = {0: [], 1: []}
        for v in configs:
            if any(np.isinf(l[j]) and v[j] != (l[j] > 0) for j in range(n) if j != i):
                continue
            scores[v[i]].append(sum((Fraction(float(l[j])) for j in range(n) if j != i and v[j] and np.isfinite(l[j])),
                                    Fraction(0)))
        if not scores[0] or not scores[1]:
            out.append(np.nan if not scores[0] and not scores[1] else (np.inf if scores[1] else -np.inf))
            continue
        top = [max(scores[0]), max(scores[1])]
        diff = float(top[1] - top[0])
        if mode == "sum":
            rest = [np.log(np.sum(np.exp([float(x - top[s]) for x in scores[s]]))) for s in (0, 1)]
            diff += rest[1] - rest[0]
        out.append(diff)
    return np.array(out)


def assert_log_close(a, b, atol=1e-8, rtol=1e-8):
    """Equal log-values (matching infinities)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    assert a.shape == b.shape, (a.shape, b.shape)
    inf = ~np.isfinite(a) | ~np.isfinite(b)
    assert np.array_equal(a[inf], b[inf]), (a, b)
    np.testing.assert_allclose(a[~inf], b[~inf], atol=atol, rtol=rtol)


def graph_reference(graph):
    """Exact log Z, variable marginals, factor marginals (Dense: tables; others: z), MAP and its score, from the
    joint log-potential tensor over all configurations (``joint``, one axis per variable)."""
    cards = graph.cardinalities
    n = len(cards)
    joint = np.zeros(cards)
    for i in range(n):
        shape = [1] * n
        shape[i] = cards[i]
        joint = joint + graph.unary(i).reshape(shape)
    for f in graph.factors:
        sub = [cards[v] for v in f.variables]
        table = np.array([f.log_potential(c) for c in itertools.product(*[range(c) for c in sub])]).reshape(sub)
        order = np.argsort(f.variables)
        table = table.transpose(order)          # axes in increasing variable order, as in the joint
        shape = [1] * n
        for v in f.variables:
            shape[v] = cards[v]
        joint = joint + table.reshape(shape)
    log_z = logsumexp(joint)
    p = np.exp(joint - log_z)
    marg = [p.sum(axis=tuple(j for j in range(n) if j != i)) for i in range(n)]
    fac = []
    for f in graph.factors:
        rest = tuple(j for j in range(n) if j not in f.variables)
        table = p.sum(axis=rest)                 # axes in increasing variable order
        table = table.transpose(np.argsort(np.argsort(f.variables)))
        if getattr(f, "table", None) is not None:
            fac.append(table)
        else:
            fac.append(np.array([marg[v][1] for v in f.variables]))
    best = np.unravel_index(int(np.argmax(joint)), joint.shape)
    return {"log_z": log_z, "marginals": marg, "factors": fac, "map": np.array(best), "joint": joint,
            "map_score": float(joint[best])}


def all_trees(n, single_root=False):
    """Every head vector (heads[m-1] = head of word m) of a dependency tree over words 1..n."""
    out = []
    for heads in itertools.product(range(n + 1), repeat=n):
        if any(h == m + 1 for m, h in enumerate(heads)):
            continue
        if single_root and sum(h == 0 for h in heads) != 1:
            continue
        if reaches_root(heads):
            out.append(heads)
    return out
