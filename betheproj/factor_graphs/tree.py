"""The TREE hard-constraint factor of Martins et al. (2010), Table 1: binary arc variables ``y_a`` (one per
candidate arc ``a = h -> m`` of a sentence with words ``1..n`` and root ``0``) that must form a dependency tree
(a spanning arborescence rooted at 0; optionally with a single root child).

With incoming log-ratios ``l_a = log m_{a->TREE}``, the message-induced distribution is the arc-factored
tree distribution with arc scores ``l_a``.  Sum-product uses the matrix-tree theorem
(:func:`betheproj.oracles.dependency.matrix_tree`): ``m_{TREE->a} = m_{a->TREE}^{-1} MARG_a / (1 - MARG_a)``.
Max-product uses max-marginals from Chu-Liu-Edmonds (:func:`betheproj.oracles.dependency.chu_liu_edmonds`):
``m_{TREE->a} = m_{a->TREE}^{-1} MAX-MARG_{a,1} / MAX-MARG_{a,0}``.  One CLE call finds the best tree, which
gives one of the two max-marginals of every arc; the other side takes one CLE call per arc with the arc forced
in (the column of ``m`` restricted to ``h``) or out, so a max-product update costs ``|A| + 1`` CLE calls,
``O(n^5)`` for a complete arc set (``O(n^6)`` with ``single_root``); fine for small ``n`` only (the paper's
footnote 9 makes the same remark).

Clamped arcs (``l_a = +inf``: forced on; ``-inf``: forced off) are handled exactly: a forced arc ``h -> m``
removes the other arcs into ``m``, and the message to a clamped arc is ``log Z(arc on) - log Z(arc off)`` over
its cavity (the other arcs only), the logit of the arc at score 0.  Every logit comes from
:func:`betheproj.oracles.nonprojective.log_arc_marginals`, to a relative accuracy however close the marginal is
to 0 or 1 (``logit(MARG)`` of the closed-form marginals was accurate only where it stayed away from them).
The LP relaxation uses
the multi-commodity flow formulation of the arborescence polytope (Martins, Smith & Xing 2009), which is
exact: ``z`` lies in ``Z_tree`` (Table 1's local agreement constraint).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

import numpy as np
import torch

from ..oracles.dependency import chu_liu_edmonds, matrix_tree
from ..oracles.nonprojective import _arc_logits, log_arc_marginals
from ._util import as_config, as_index, as_numpy, as_variables, log_ratio, log_sigmoid, ratio_to_log_message, xlogy
from .factors import Factor, FactorBelief, _check_mode

if TYPE_CHECKING:
    from .lp import LPBuilder

__all__ = ["Tree", "TreeFactor"]


class Tree(Factor):
    """Table 1, row TREE: ``psi(y) = 1`` iff ``{a : y_a = 1}`` is a directed spanning tree rooted at 0.

    ``variables[k]`` is the binary variable of arc ``arcs[k] = (h, m)`` (``0 <= h <= n``, ``1 <= m <= n``,
    ``h != m``); arcs not listed are absent (pruned).  ``n`` defaults to the largest position in ``arcs``.
    ``single_root=True`` allows exactly one child of the root.  Sum-product messages via the matrix-tree
    theorem, max-product via max-marginals (``|A| + 1`` Chu-Liu-Edmonds calls), entropy
    ``H_tree = log Z_tree - sum_a MARG_a log m_{a->TREE}`` (Table 1), LP constraints ``z in Z_tree``.
    """

    def __init__(self, variables: Sequence[int], arcs: Sequence[tuple[int, int]], n: int | None = None,
                 single_root: bool = False):
        self.variables = as_variables("variables", variables)
        if not isinstance(arcs, (Sequence, np.ndarray)) or isinstance(arcs, str):
            raise TypeError(f"arcs must be a sequence of (head, modifier) pairs, got {type(arcs).__name__}")
        if len(arcs) != self.arity:
            raise ValueError(f"arcs must hold one (head, modifier) pair per variable ({self.arity}), got {len(arcs)}")
        parsed = []
        for k, arc in enumerate(arcs):
            if not isinstance(arc, (Sequence, np.ndarray)) or len(arc) != 2:
                raise ValueError(f"arcs[{k}] must be a pair (head, modifier), got {arc!r}")
            h, m = as_index(f"arcs[{k}][0]", arc[0]), as_index(f"arcs[{k}][1]", arc[1])
            if m == 0 or h == m:
                raise ValueError(f"arcs[{k}] = ({h}, {m}): the modifier must be a word (>= 1) other than the head")
            parsed.append((h, m))
        if len(set(parsed)) != len(parsed):
            raise ValueError("arcs must not repeat an arc")
        top = max(max(h, m) for h, m in parsed)
        self.n = top if n is None else as_index("n", n)
        if self.n < top or self.n < 1:
            raise ValueError(f"n must be at least {max(top, 1)} (the largest position in arcs), got {self.n}")
        if not isinstance(single_root, bool):
            raise TypeError(f"single_root must be a bool, got {type(single_root).__name__}")
        self.arcs = tuple(parsed)
        self.single_root = single_root
        self._h = np.array([h for h, _ in parsed], dtype=np.int64)
        self._m = np.array([m for _, m in parsed], dtype=np.int64)

    @staticmethod
    def all_arcs(n: int, single_root: bool = False) -> list[tuple[int, int]]:
        """Every candidate arc ``h -> m`` of a sentence of ``n`` words (head-major order)."""
        n = as_index("n", n)
        return [(h, m) for h in range(n + 1) for m in range(1, n + 1) if h != m]

    def check_cardinalities(self, cardinalities: tuple[int, ...]) -> None:
        for v, c in zip(self.variables, cardinalities, strict=True):
            if c != 2:
                raise ValueError(f"variables of a Tree factor must be binary; variable {v} has {c} states")

    # --- trees --------------------------------------------------------------------------------------------
    def allows(self, config: Sequence[int]) -> bool:
        """Whether the arcs switched on in ``config`` form a (single-root, if requested) dependency tree."""
        y = as_config("config", config, (2,) * self.arity)
        heads = np.full(self.n + 1, -1)
        for k in np.nonzero(y)[0]:
            if heads[self._m[k]] != -1:
                return False
            heads[self._m[k]] = self._h[k]
        if (heads[1:] < 0).any():
            return False
        if self.single_root and int(np.sum(heads[1:] == 0)) != 1:
            return False
        for m in range(1, self.n + 1):
            seen, x = 0, m
            while x != 0:
                x = heads[x]
                seen += 1
                if seen > self.n:
                    return False
        return True

    def log_potential(self, config: Sequence[int]) -> float:
        return 0.0 if self.allows(config) else -np.inf

    def _scores(self, l: np.ndarray) -> np.ndarray | None:
        """Head-major arc scores [n+1, n+1] for log-ratios ``l``: ``-inf`` arcs dropped, ``+inf`` arcs forced (score
        0, the other arcs into the same word dropped).  ``None`` if two forced arcs share a modifier."""
        s = np.full((self.n + 1, self.n + 1), -np.inf)
        finite = np.isfinite(l)
        s[self._h[finite], self._m[finite]] = l[finite]
        forced = np.nonzero(l == np.inf)[0]
        if len(set(self._m[forced].tolist())) != forced.size:
            return None
        for k in forced:
            s[:, self._m[k]] = -np.inf
            s[self._h[k], self._m[k]] = 0.0
        return s

    def _matrix_tree(self, s: np.ndarray) -> tuple[float, np.ndarray | None]:
        """``log Z`` and the head-major marginals [n+1, n+1] under scores ``s``; ``-inf`` and ``None`` if no tree
        has a finite score."""
        scores = torch.as_tensor(s[None], dtype=torch.float64)
        lengths = torch.full((1,), self.n, dtype=torch.long)
        try:
            log_z, marg = matrix_tree(scores, lengths, single_root=self.single_root)
        except ValueError:
            return -np.inf, None
        return float(log_z[0]), marg[0].detach().numpy()

    def _best(self, s: np.ndarray) -> tuple[float, np.ndarray | None]:
        """Score and heads [n+1] (``heads[0] = -1``) of the best tree under scores ``s`` (``-inf``, None if none)."""
        try:
            heads = chu_liu_edmonds(torch.as_tensor(s), single_root=self.single_root).numpy()
        except ValueError:
            return -np.inf, None
        total = float(s[heads, np.arange(1, self.n + 1)].sum())
        if not np.isfinite(total):
            return -np.inf, None
        return total, np.concatenate([[-1], heads])

    # --- messages and beliefs ----------------------------------------------------------------------------
    def _in_ratios(self, incoming: list[np.ndarray]) -> np.ndarray:
        return np.array([log_ratio(f"incoming[{k}]", m) for k, m in enumerate(incoming)])

    def ratio_messages(self, in_ratios: Sequence[float] | np.ndarray, mode: str = "sum") -> np.ndarray:
        """Outgoing log-ratios ``log m_{TREE->a}`` from incoming ``log m_{a->TREE}`` (NaN if no tree is possible)."""
        l = np.asarray(as_numpy(in_ratios), dtype=np.float64)
        if l.shape != (self.arity,) or np.isnan(l).any():
            raise ValueError(f"in_ratios must be {self.arity} log-ratios without NaN, got shape {l.shape}")
        return self._ratios(l, _check_mode(mode))

    def _ratios(self, l: np.ndarray, mode: str) -> np.ndarray:
        base = self._scores(l)
        nan = np.full(self.arity, np.nan)
        if base is None:
            return nan
        return self._sum_ratios(l, base) if mode == "sum" else self._max_ratios(l, base)

    def _sum_ratios(self, l: np.ndarray, base: np.ndarray) -> np.ndarray:
        """``logit(MARG_a) - l_a`` from :func:`~betheproj.oracles.nonprojective.log_arc_marginals`, which gives
        every arc's log marginal to a relative accuracy (an arc at ``1e-30`` included, exactly ``-inf`` / ``inf``
        logits for arcs in no / every tree).  A clamped arc's message is the logit of its cavity, its own score
        set to 0 (one more matrix-tree problem per such arc, batched), and so is that of an arc with ``|l_a| >
        1e3``, where ``logit - l_a`` would round away O(1) parts (1e30 + 1.043 - 1e30 is 0)."""
        clamped = np.nonzero(~(np.abs(l) <= 1e3))[0]
        batch = [base]
        for k in clamped:
            lk = l.copy()
            lk[k] = 0.0
            batch.append(cast(np.ndarray, self._scores(lk)))     # never None: base's forced arcs minus one
        scores = torch.as_tensor(np.stack(batch), dtype=torch.float64)
        lengths = torch.full((len(batch),), self.n, dtype=torch.long)
        try:
            log_marg = log_arc_marginals(scores, lengths, self.single_root)[1]
        except ValueError:                       # no tree (then in every problem), or log Z beyond float64
            return np.full(self.arity, np.nan)
        logit = _arc_logits(log_marg).numpy()
        with np.errstate(invalid="ignore"):
            out = logit[0, self._h, self._m] - l
        out[clamped] = logit[1 + np.arange(clamped.size), self._h[clamped], self._m[clamped]]
        return out

    def _max_ratios(self, l: np.ndarray, base: np.ndarray) -> np.ndarray:
        """``MAX-MARG_{a,1} - MAX-MARG_{a,0}`` over the cavity (without ``l_a``), as the sum of the two best trees'
        per-word score differences, not the difference of their totals: scores shared by both trees cancel exactly,
        so an O(1) difference beside a huge score (an arc at 1e30) is kept (1e30 + 0.3 - (1e30 + 0.8) was 0)."""
        best, heads = self._best(base)
        if heads is None:
            return np.full(self.arity, np.nan)
        words = np.arange(1, self.n + 1)
        kept = base[heads[1:], words]                        # the best tree's score per word
        out = np.empty(self.arity)
        for k in range(self.arity):
            h, m = self._h[k], self._m[k]
            lk = l.copy()
            contains = heads[m] == h                        # the best tree is MAX-MARG_{a,1} (else MAX-MARG_{a,0})
            lk[k] = -np.inf if contains else np.inf
            s = self._scores(lk)
            other = self._best(s)[1] if s is not None else None
            if s is None or other is None:
                out[k] = np.inf if contains else -np.inf
                continue
            mine = kept.copy()
            if contains:
                mine[m - 1] = 0.0                           # the cavity leaves out a's own score l_a
            diff = mine - s[other[1:], words]               # best tree minus the other one, word by word
            out[k] = float(diff.sum()) if contains else -float(diff.sum())
        return out

    def _messages(self, incoming: list[np.ndarray], mode: str) -> list[np.ndarray]:
        return ratio_to_log_message(self._ratios(self._in_ratios(incoming), mode))

    def _belief(self, incoming: list[np.ndarray]) -> FactorBelief:
        """``z_a = MARG_a`` by the matrix-tree theorem, and Table 1's entropy ``H_tree = log Z_C - sum_a [z_a log p_a(1)
        + (1 - z_a) log p_a(0)]`` (the incoming messages normalised to ``p_a``), i.e. ``log Z - sum_a z_a l_a``, taken
        word by word: every tree has one arc into each word ``m``, so with its best incoming score ``c_m`` taken off
        the column, ``log Z = log Z' + sum_m c_m`` and ``sum_a z_a l_a = sum_m c_m + sum_a z_a (l_a - c_m)``, and
        ``H_tree = log Z' - sum_a z_a (l_a - c_m)``; likewise ``log Z_C = log Z + sum_a log p_a(0)`` is ``log Z'``
        plus ``log p_a(1)`` for that best arc and ``log p_a(0)`` for the others.  (Differencing ``log Z`` against
        ``sum_a log p_a(0)``, both 1e30 beside an arc at 1e30, gave a single tree an entropy of 2.8.)"""
        l = self._in_ratios(incoming)
        base = self._scores(l)
        if base is not None:
            top = base.max(0)
            base = base - np.where(np.isfinite(top), top, 0.0)
        log_z, marg = (-np.inf, None) if base is None else self._matrix_tree(base)
        if base is None or log_z == -np.inf or marg is None:
            raise ValueError(f"Tree factor on {self.variables}: no dependency tree is compatible with the incoming "
                             "messages (contradictory messages)")
        z = np.where(l == np.inf, 1.0, np.where(l == -np.inf, 0.0, marg[self._h, self._m]))
        lead = np.zeros(self.arity, dtype=bool)              # one arc of best score into each word
        for m in range(1, self.n + 1):
            into = np.nonzero(self._m == m)[0]
            lead[into[np.argmax(l[into])]] = True
        log_zc = log_z + float(np.sum(np.where(lead, log_sigmoid(l), log_sigmoid(-l))))
        entropy = log_z - float(np.sum(xlogy(z, base[self._h, self._m])))
        return FactorBelief(z, max(entropy, 0.0), 0.0, log_zc)

    # --- LP -------------------------------------------------------------------------------------------------
    def lp_constraints(self, lp: LPBuilder) -> None:
        """Multi-commodity flow (Martins, Smith & Xing 2009): ``sum_h z_{h,m} = 1`` for every word ``m``; for
        every commodity ``k = 1..n`` a unit flow ``f^k`` from the root to ``k`` with ``0 <= f^k_a <= z_a``; with
        ``single_root``, ``sum_m z_{0,m} = 1``.  Its projection on ``z`` is the arborescence polytope
        ``Z_tree``.  Adds ``n |A|`` flow columns and ``O(n |A|)`` rows."""
        z = np.array([lp.var_col(v, 1) for v in self.variables], dtype=np.int64)
        n, arity = self.n, self.arity
        for m in range(1, n + 1):
            into = np.nonzero(self._m == m)[0]
            lp.add_eq(z[into], np.ones(into.size), 1.0)
        if self.single_root:
            root = np.nonzero(self._h == 0)[0]
            lp.add_eq(z[root], np.ones(root.size), 1.0)
        for k in range(1, n + 1):
            f = lp.add_columns(arity, upper=1.0, score=0.0) + np.arange(arity)
            for a in range(arity):
                lp.add_ub(np.array([f[a], z[a]]), np.array([1.0, -1.0]), 0.0)
            for j in range(1, n + 1):                        # inflow - outflow = [j == k]
                into = np.nonzero(self._m == j)[0]
                out = np.nonzero(self._h == j)[0]
                lp.add_eq(np.concatenate([f[into], f[out]]),
                          np.concatenate([np.ones(into.size), -np.ones(out.size)]), 1.0 if j == k else 0.0)
        lp.register(self, None, None)

    def __repr__(self) -> str:
        return f"Tree(n={self.n}, arcs={self.arity}, single_root={self.single_root})"


TreeFactor = Tree
"""Alias of :class:`Tree` (the factor, not the tree-shaped MRF oracle :class:`betheproj.oracles.Tree`)."""
