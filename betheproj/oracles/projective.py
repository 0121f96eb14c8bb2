"""Projective dependency trees: Eisner's algorithm (inside in log space, marginals by the outside pass, MAP with
backpointers).

Eisner (1996)'s first-order chart over positions ``0..n`` with complete (``C``) and incomplete (``I``) spans,
``->`` headed at the left end and ``<-`` at the right end:

    I->[s, t] = I<-[s, t] - theta(t -> s) + theta(s -> t) = (+)_{s <= r < t} C->[s, r] (x) C<-[r+1, t] (x) theta(s -> t)
    C->[s, t] = (+)_{s < r <= t} I->[s, r] (x) C->[r, t],    C<-[s, t] = (+)_{s <= r < t} C<-[s, r] (x) I<-[r, t]

in the semiring (logsumexp, +) for ``log Z`` or (max, +) for MAP.  ``log Z = C->[0, n]`` (the root may have
several children); with a single root child ``log Z = (+)_r theta(0 -> r) (x) C<-[1, r] (x) C->[r, n]``.
Spans of one width are computed at once (tensor ops over the diagonal), so a sentence costs ``O(n)`` steps of
``O(n^2)`` work.  Marginals are ``d log Z / d theta``, by an explicit outside pass over the same charts.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .dependency import (
    _added_back,
    _DependencyOracle,
    _differentiable,
    _prepare,
    _raise_no_tree,
    _shifted_columns,
)

__all__ = ["eisner", "eisner_map", "Projective"]


@dataclass
class _Charts:
    """The inside pass's charts (see :func:`_chart`), for the outside pass."""

    lo_cr: Tensor
    lo_cl: Tensor
    lo_ir: Tensor
    lo_il: Tensor
    hi_cr: Tensor
    hi_cl: Tensor
    hi_ir: Tensor
    hi_il: Tensor
    inner: Tensor               # by left end: the sum over split points that both incomplete spans share


def _chart(s: Tensor, lengths: Tensor, single_root: bool, maximize: bool
           ) -> tuple[Tensor, tuple[Tensor, Tensor, Tensor] | None, Tensor | None, _Charts]:
    """Inside pass: the root value [B], for ``maximize`` the backpointers ([B, C, C] each, indexed by the span's
    ends) and the root child [B], and the charts.

    Each chart is kept twice, by the span's left end (``lo[:, s, w]``: the span ``(s, s + w)``) and by its right
    end with the width reversed (``hi[:, t, C-1-w]``: the span ``(t - w, t)``), so that the split points of all
    spans of one width are contiguous slices of both (as torch-struct lays its charts out): no gathers, here or in
    the outside pass (:func:`_outside`), which reads the same slices."""
    b, c, _ = s.shape
    device = s.device
    ninf = torch.full((), -torch.inf, dtype=s.dtype, device=device)
    # complete (c) and incomplete (i) spans headed at their left end (r, ->) or right end (l, <-)
    lo_cr, lo_cl, lo_ir, lo_il = (s.new_full((b, c, c), -torch.inf) for _ in range(4))
    hi_cr, hi_cl, hi_ir, hi_il = (s.new_full((b, c, c), -torch.inf) for _ in range(4))
    for x in (lo_cr, lo_cl):
        x[:, :, 0] = 0.0
    for x in (hi_cr, hi_cl):
        x[:, :, c - 1] = 0.0
    inner_chart = s.new_full((b, c, c), -torch.inf)
    if maximize:
        bp_i, bp_cr, bp_cl = (torch.zeros(b, c, c, dtype=torch.long, device=device) for _ in range(3))

    def reduce(x: Tensor) -> tuple[Tensor, Tensor | None]:
        if maximize:
            return x.max(-1)
        return torch.logsumexp(x, -1), None          # -inf where every term is (no autograd: see _outside)

    def put(lo: Tensor, hi: Tensor, w: int, val: Tensor) -> None:
        lo[:, : c - w, w] = val
        hi[:, w:, c - 1 - w] = val

    for w in range(1, c):
        k = c - w                                                     # spans of width w: starts 0..k-1
        inner, arg = reduce(lo_cr[:, :k, :w] + hi_cl[:, w:, k:])        # r = s .. t-1
        inner_chart[:, :k, w] = inner
        put(lo_ir, hi_ir, w, inner + torch.diagonal(s, w, 1, 2))
        put(lo_il, hi_il, w, inner + torch.diagonal(s, -w, 1, 2))
        cr, arg_r = reduce(lo_ir[:, :k, 1 : w + 1] + hi_cr[:, w:, k:])   # r = s+1 .. t
        put(lo_cr, hi_cr, w, cr)
        cl, arg_l = reduce(lo_cl[:, :k, :w] + hi_il[:, w:, k - 1 : c - 1])   # r = s .. t-1
        put(lo_cl, hi_cl, w, cl)
        if maximize:                      # reduce's argmaxes (None only where it sums)
            assert arg is not None and arg_r is not None and arg_l is not None
            st = torch.arange(k, device=device)
            torch.diagonal(bp_i, w, 1, 2).copy_(arg + st)
            torch.diagonal(bp_cr, w, 1, 2).copy_(arg_r + st + 1)
            torch.diagonal(bp_cl, w, 1, 2).copy_(arg_l + st)
    batch = torch.arange(b, device=device)
    if not single_root:
        top = lo_cr[batch, 0, lengths]
        root_child = None
    else:
        kids = torch.arange(1, c, device=device)
        # C<-[1, r] (width r-1) and C->[r, n] (width n-r, at end n)
        right = hi_cr[batch[:, None], lengths[:, None], (c - 1 - (lengths[:, None] - kids[None, :])).clamp(0, c - 1)]
        cand = s[:, 0, 1:] + lo_cl[:, 1, : c - 1] + right
        cand = torch.where(kids[None, :] <= lengths[:, None], cand, ninf)
        top, root_child = reduce(cand)
        if root_child is not None:
            root_child = root_child + 1
    charts = _Charts(lo_cr, lo_cl, lo_ir, lo_il, hi_cr, hi_cl, hi_ir, hi_il, inner_chart)
    if maximize:
        return top, (bp_i, bp_cr, bp_cl), root_child, charts
    return top, None, None, charts


def _outside(s: Tensor, lengths: Tensor, single_root: bool, log_z: Tensor, ch: _Charts) -> Tensor:
    """``d log Z / d s`` [B, C, C] (the arc marginals) by the outside pass over the sum charts of :func:`_chart`:
    each span's adjoint, widest spans first, split among the terms of its log-sum-exp in proportion to their
    share ``exp(term - value)`` (0 where the value is ``-inf``: no tree passes there).  The same arithmetic as
    autograd through a log-sum-exp, at half its cost."""
    b, c, _ = s.shape
    device = s.device
    zero = torch.zeros((), dtype=s.dtype, device=device)
    g_lo = {k: torch.zeros_like(s) for k in ("cr", "cl", "ir", "il")}
    g_hi = {k: torch.zeros_like(s) for k in ("cr", "cl", "ir", "il")}
    grad = torch.zeros_like(s)
    batch = torch.arange(b, device=device)

    def share(x: Tensor, value: Tensor, g: Tensor) -> Tensor:
        # renormalised: the rounding of the log-sum-exp ``value`` (1e-13 at |value| ~ 1e3) would otherwise scale
        # every share, and the marginals of a word would sum to 1 + 2e-14
        e = torch.exp(x - torch.where(torch.isfinite(value), value, zero)[..., None])
        total = e.sum(-1, keepdim=True)
        return e * (g[..., None] / torch.where(total > 0, total, 1.0))

    if not single_root:
        g_lo["cr"][batch, 0, lengths] = 1.0
    else:
        kids = torch.arange(1, c, device=device)
        col = (c - 1 - (lengths[:, None] - kids[None, :])).clamp(0, c - 1)
        cand = s[:, 0, 1:] + ch.lo_cl[:, 1, : c - 1] + ch.hi_cr[batch[:, None], lengths[:, None], col]
        cand = torch.where(kids[None, :] <= lengths[:, None], cand, -torch.inf)
        p = share(cand, log_z, torch.ones_like(log_z))
        grad[:, 0, 1:] += p
        g_lo["cl"][:, 1, : c - 1] += p
        g_hi["cr"][batch[:, None], lengths[:, None], col] += p

    def total(kind: str, w: int) -> Tensor:
        """The adjoint of the spans of width ``w`` [B, C-w]: what was read through either layout."""
        return g_lo[kind][:, : c - w, w] + g_hi[kind][:, w:, c - 1 - w]

    for w in range(c - 1, 0, -1):
        k = c - w
        gcr, gcl = total("cr", w), total("cl", w)
        x = share(ch.lo_ir[:, :k, 1 : w + 1] + ch.hi_cr[:, w:, k:], ch.lo_cr[:, :k, w], gcr)
        g_lo["ir"][:, :k, 1 : w + 1] += x
        g_hi["cr"][:, w:, k:] += x
        x = share(ch.lo_cl[:, :k, :w] + ch.hi_il[:, w:, k - 1 : c - 1], ch.lo_cl[:, :k, w], gcl)
        g_lo["cl"][:, :k, :w] += x
        g_hi["il"][:, w:, k - 1 : c - 1] += x
        gir, gil = total("ir", w), total("il", w)          # complete now: read by complete spans of width >= w
        torch.diagonal(grad, w, 1, 2).add_(gir)
        torch.diagonal(grad, -w, 1, 2).add_(gil)
        x = share(ch.lo_cr[:, :k, :w] + ch.hi_cl[:, w:, k:], ch.inner[:, :k, w], gir + gil)
        g_lo["cr"][:, :k, :w] += x
        g_hi["cl"][:, w:, k:] += x
    return torch.where(torch.isfinite(s), grad, zero)


def eisner(scores: Tensor, lengths: Tensor, single_root: bool = False) -> tuple[Tensor, Tensor]:
    """Log-partition [B] and arc marginals [B, N+1, N+1] (head-major) over projective trees, by Eisner's inside
    algorithm in the (logsumexp, +) semiring and the outside pass.  Same conventions as
    :func:`~betheproj.oracles.nonprojective.matrix_tree`; ``ValueError`` if an example has no projective tree."""
    if not isinstance(single_root, bool):
        raise TypeError(f"single_root must be a bool, got {type(single_root).__name__}")
    masked, lengths = _prepare(scores, lengths)
    log_z, marg = _eisner(masked.detach(), lengths, single_root)
    return _differentiable(scores, log_z, marg), marg


def _eisner(s: Tensor, lengths: Tensor, single_root: bool, strict: bool = True) -> tuple[Tensor, Tensor]:
    """``strict``: raise for an example with no tree (else its ``log Z`` is ``-inf``)."""
    shifted, shift = _shifted_columns(s.detach(), single_root)
    log_z, _, _, charts = _chart(shifted, lengths, single_root, maximize=False)
    if strict:
        _raise_no_tree(log_z, True, single_root)
    marg = _outside(shifted, lengths, single_root, log_z, charts)
    return _added_back(shift, log_z), marg


def eisner_map(scores: Tensor, lengths: Tensor, single_root: bool = False) -> tuple[Tensor, Tensor]:
    """Best projective tree: its score [B] and heads [B, N] (long, 0 = root, ``-1`` past each length), by the
    (max, +) inside pass and backpointers."""
    if not isinstance(single_root, bool):
        raise TypeError(f"single_root must be a bool, got {type(single_root).__name__}")
    masked, lengths = _prepare(scores, lengths)
    with torch.no_grad():
        return _eisner_map(masked, lengths, single_root)


def _eisner_map(s: Tensor, lengths: Tensor, single_root: bool) -> tuple[Tensor, Tensor]:
    shifted, shift = _shifted_columns(s, single_root)
    best, pointers, root_child, _ = _chart(shifted, lengths, single_root, maximize=True)
    assert pointers is not None                              # kept when maximising
    _raise_no_tree(best, True, single_root)
    best = _added_back(shift, best)
    b, c, _ = s.shape
    heads = torch.full((b, c - 1), -1, dtype=torch.long)
    bp_i, bp_cr, bp_cl = (p.cpu().tolist() for p in pointers)
    for i, n in enumerate(lengths.tolist()):
        h = heads[i]
        if root_child is None:
            stack = [("C>", 0, n)]
        else:
            r = int(root_child[i])
            h[r - 1] = 0
            stack = [("C<", 1, r), ("C>", r, n)]
        while stack:
            kind, lo, hi = stack.pop()
            if lo == hi:
                continue
            if kind == "C>":
                r = bp_cr[i][lo][hi]
                stack += [("I>", lo, r), ("C>", r, hi)]
            elif kind == "C<":
                r = bp_cl[i][lo][hi]
                stack += [("C<", lo, r), ("I<", r, hi)]
            else:
                if kind == "I>":
                    h[hi - 1] = lo
                else:
                    h[lo - 1] = hi
                r = bp_i[i][lo][hi]
                stack += [("C>", lo, r), ("C<", r + 1, hi)]
    return best, heads.to(s.device)


class Projective(_DependencyOracle):
    """Arc-factored distribution over projective dependency trees (no crossing arcs), rooted at 0.

    Marginals and ``log Z`` by Eisner's inside-outside algorithm (:func:`eisner`), MAP by Eisner's Viterbi pass
    (:func:`eisner_map`); ``single_root=True`` allows exactly one child of the root.
    """

    def _marginals_core(self, scores: Tensor, lengths: Tensor, strict: bool = True) -> tuple[Tensor, Tensor]:
        return _eisner(scores, lengths, self.single_root, strict)

    def _map_core(self, scores: Tensor, lengths: Tensor) -> Tensor:
        return _eisner_map(scores, lengths, self.single_root)[1]
