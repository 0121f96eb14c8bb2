"""Projective dependency trees: Eisner's algorithm (inside in log space, marginals by autograd, MAP with
backpointers).

Eisner (1996)'s first-order chart over positions ``0..n`` with complete (``C``) and incomplete (``I``) spans,
``->`` headed at the left end and ``<-`` at the right end:

    I->[s, t] = I<-[s, t] - theta(t -> s) + theta(s -> t) = (+)_{s <= r < t} C->[s, r] (x) C<-[r+1, t] (x) theta(s -> t)
    C->[s, t] = (+)_{s < r <= t} I->[s, r] (x) C->[r, t],    C<-[s, t] = (+)_{s <= r < t} C<-[s, r] (x) I<-[r, t]

in the semiring (logsumexp, +) for ``log Z`` or (max, +) for MAP.  ``log Z = C->[0, n]`` (the root may have
several children); with a single root child ``log Z = (+)_r theta(0 -> r) (x) C<-[1, r] (x) C->[r, n]``.
Spans of one width are computed at once (tensor ops over the diagonal), so a sentence costs ``O(n)`` steps of
``O(n^2)`` work.  Marginals are ``d log Z / d theta`` (autograd through the chart; the outside pass).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .base import _split_sum
from .dependency import (
    _DependencyOracle,
    _differentiable,
    _lse,
    _prepare,
    _raise_no_tree,
    _raise_overflow,
    _shifted_columns,
)

__all__ = ["eisner", "eisner_map", "Projective"]


def _chart(s: Tensor, lengths: Tensor, single_root: bool, maximize: bool
           ) -> tuple[Tensor, tuple[Tensor, Tensor, Tensor] | None, Tensor | None]:
    """Inside pass: the root value [B] and, for ``maximize``, the backpointers ([B, C, C] each, indexed by the span's
    ends) and the root child [B].

    Each chart is kept twice, by the span's left end (``lo[:, s, w]``: the span ``(s, s + w)``) and by its right
    end with the width reversed (``hi[:, t, C-1-w]``: the span ``(t - w, t)``), so that the split points of all
    spans of one width are contiguous slices of both (as torch-struct lays its charts out): no gathers, and views
    instead of copies in the backward pass."""
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
    if maximize:
        bp_i, bp_cr, bp_cl = (torch.zeros(b, c, c, dtype=torch.long, device=device) for _ in range(3))

    def reduce(x: Tensor) -> tuple[Tensor, Tensor | None]:
        if maximize:
            return x.max(-1)
        return _lse(x, -1), None

    def put(lo: Tensor, hi: Tensor, w: int, val: Tensor) -> None:
        lo[:, : c - w, w] = val
        hi[:, w:, c - 1 - w] = val

    for w in range(1, c):
        k = c - w                                                     # spans of width w: starts 0..k-1
        inner, arg = reduce(lo_cr[:, :k, :w] + hi_cl[:, w:, k:])        # r = s .. t-1
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
    if maximize:
        return top, (bp_i, bp_cr, bp_cl), root_child
    return top, None, None


def eisner(scores: Tensor, lengths: Tensor, single_root: bool = False) -> tuple[Tensor, Tensor]:
    """Log-partition [B] and arc marginals [B, N+1, N+1] (head-major) over projective trees, by Eisner's inside
    algorithm in the (logsumexp, +) semiring and autograd for the outside pass.  Same conventions as
    :func:`~betheproj.oracles.nonprojective.matrix_tree`; ``ValueError`` if an example has no projective tree."""
    if not isinstance(single_root, bool):
        raise TypeError(f"single_root must be a bool, got {type(single_root).__name__}")
    masked, lengths = _prepare(scores, lengths)
    log_z, marg = _eisner(masked.detach(), lengths, single_root)
    return _differentiable(scores, log_z, marg), marg


def _column_shifted(s: Tensor, single_root: bool) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """Scores shifted by :func:`~betheproj.oracles.dependency._shifted_columns`, and the total shift [B] in two
    parts (:func:`~betheproj.oracles.base._split_sum`): every tree has one arc into each word (and with one root
    child one root arc), so this only rescales Z, and a huge constant cannot absorb O(1) scores."""
    shifted, top = _shifted_columns(s, single_root)
    return shifted, _split_sum(top)


def _eisner(s: Tensor, lengths: Tensor, single_root: bool, strict: bool = True) -> tuple[Tensor, Tensor]:
    """``strict``: raise for an example with no tree (else its ``log Z`` is ``-inf``)."""
    shifted, shift = _column_shifted(s.detach(), single_root)
    with torch.enable_grad():
        x = shifted.requires_grad_(True)
        log_z, _, _ = _chart(x, lengths, single_root, maximize=False)
        if strict:
            _raise_no_tree(log_z, True, single_root)
        (marg,) = torch.autograd.grad(log_z.sum(), x)
    log_z = shift[0] + (shift[1] + log_z.detach())
    _raise_overflow(log_z)
    return log_z, marg


def eisner_map(scores: Tensor, lengths: Tensor, single_root: bool = False) -> tuple[Tensor, Tensor]:
    """Best projective tree: its score [B] and heads [B, N] (long, 0 = root, ``-1`` past each length), by the
    (max, +) inside pass and backpointers."""
    if not isinstance(single_root, bool):
        raise TypeError(f"single_root must be a bool, got {type(single_root).__name__}")
    masked, lengths = _prepare(scores, lengths)
    with torch.no_grad():
        return _eisner_map(masked, lengths, single_root)


def _eisner_map(s: Tensor, lengths: Tensor, single_root: bool) -> tuple[Tensor, Tensor]:
    shifted, shift = _column_shifted(s, single_root)
    best, pointers, root_child = _chart(shifted, lengths, single_root, maximize=True)
    assert pointers is not None                              # kept when maximising
    _raise_no_tree(best, True, single_root)
    best = shift[0] + (shift[1] + best)
    _raise_overflow(best)
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
