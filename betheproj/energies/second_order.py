"""Second-order (sibling and grandparent) dependency scores as a non-local energy on arc marginals.

Eq. (9)'s generalised mean field applied to the cliques the arc-factored tree distribution lacks: a pair of arcs
sharing a head (siblings ``h -> m``, ``h -> s``) and a chain of two arcs (grandparent ``g -> h -> m``), each
scored on the product of its arcs' marginals (Vilnis et al. 2015, section 4; the parts of Turbo Parser #1,
Martins et al. 2010, section 4).  With head-major marginals ``A[b, h, m] = mu(h -> m)``::

    L(mu) = - sum_{h,m,s} S[b, h, m, s] A[b, h, m] A[b, h, s] - sum_{g,h,m} G[b, g, h, m] A[b, g, h] A[b, h, m]

so problem (2), ``min_mu -H(mu) - <theta, mu> + L(mu)`` over the arborescence polytope, is the mean-field
approximation of the second-order model ``p(y) ∝ exp(theta . y + sum S y_hm y_hs + sum G y_gh y_hm)``.  The
gradient is in closed form (einsum); it is a torch expression in ``S`` and ``G``, so the surrogate likelihood
(eqs. 12-15) differentiates it in the second-order scores.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .._checks import check_int, check_integer_vector
from ..oracles.base import Marginals, check_marginals
from .base import Energy, Gradient

__all__ = ["SecondOrderArcs", "second_order_masks"]


def second_order_masks(lengths: Tensor, c: int) -> tuple[Tensor, Tensor]:
    """Where sibling and grandparent parts exist, [B, C, C, C] each (``C = N + 1`` positions, 0 the root).

    Sibling ``[b, h, m, s]``: ``h <= n``, ``1 <= m, s <= n``, ``m != s`` and both differ from ``h``.
    Grandparent ``[b, g, h, m]``: ``g <= n``, ``1 <= h, m <= n``, all three distinct (``g = m`` would be a
    two-cycle, which no tree holds).
    """
    check_integer_vector("lengths", lengths)
    c = check_int("c", c, 1)                           # the positions, the root included
    pos = torch.arange(c, device=lengths.device)
    inside = pos[None, :] <= lengths[:, None]                                # [B, C]
    word = inside & (pos[None, :] >= 1)
    ne = pos[:, None] != pos[None, :]                                        # [C, C]
    distinct = ne[:, :, None] & ne[:, None, :] & ne[None, :, :]              # all three positions differ
    sib = inside[:, :, None, None] & word[:, None, :, None] & word[:, None, None, :] & distinct
    grand = inside[:, :, None, None] & word[:, None, :, None] & word[:, None, None, :] & distinct
    return sib, grand


def _head_major(node: Tensor) -> Tensor:
    """``A[b, h, m] = node[b, m-1, h]`` with a zero column ``m = 0``, [B, C, C]."""
    b, n, c = node.shape
    return torch.cat([node.new_zeros(b, c, 1), node.transpose(1, 2)], 2)


def _version(t: Tensor | None) -> int | object | None:
    """``t``'s in-place version counter; inference tensors have none, so they get a fresh object that matches
    nothing (never reused from the cache)."""
    if t is None:
        return None
    return object() if t.is_inference() else t._version


def _check_parts(name: str, idx: object, shape: torch.Size) -> None:
    """``idx`` lists distinct entries of a [B, C, C, C] score tensor as an integer tensor [4, P]."""
    if not isinstance(idx, Tensor) or idx.dtype == torch.bool or idx.is_floating_point() or idx.is_complex():
        raise TypeError(f"parts: {name} indices must be an integer tensor [4, P], got "
                        f"{idx.dtype if isinstance(idx, Tensor) else type(idx).__name__}")
    if idx.dim() != 2 or idx.shape[0] != 4:
        raise ValueError(f"parts: {name} indices must be [4, P], got shape {tuple(idx.shape)}")
    if idx.shape[1] == 0:
        return
    bound = torch.tensor(tuple(shape), device=idx.device)[:, None]
    if bool((idx < 0).any()) or bool((idx >= bound).any()):
        raise ValueError(f"parts: {name} indices must lie in [0, {tuple(shape)}) row by row (b, and three "
                         f"positions < C), got one out of range")
    flat = ((idx[0] * shape[1] + idx[1]) * shape[2] + idx[2]) * shape[3] + idx[3]
    if torch.unique(flat).numel() != flat.numel():
        raise ValueError(f"parts: {name} indices list a part more than once (it would be counted twice)")


_Sources = tuple[tuple[Tensor | None, object], ...]
"""Tensors, each with its in-place version counter (:func:`_version`)."""
_Term = Tensor | tuple[tuple[Tensor, Tensor, Tensor], tuple[Tensor, Tensor, Tensor], Tensor] | None
"""One kind of part's prepared scores: a masked dense tensor, or the indices ``(b, head, modifier)`` of its two
arcs and the part scores; ``None`` for a kind not given."""
_Cache = tuple[Tensor, tuple[bool, torch.dtype, torch.device], list[_Term], _Sources, _Sources]
"""What :meth:`SecondOrderArcs._terms` keeps between calls."""


class SecondOrderArcs(Energy):
    """``L(mu) = -sum S[h,m,s] mu(h->m) mu(h->s) - sum G[g,h,m] mu(g->h) mu(h->m)`` (eq. 9 on second-order parts).

    Args:
        sibling: ``S`` [B, C, C, C] (``[b, h, m, s]``, ``C = N + 1``) or ``None``.  Summed over ordered pairs, so
            only ``S[h, m, s] + S[h, s, m]`` matters; entries that are not sibling parts (see
            :func:`second_order_masks`, e.g. past a sentence's length) are ignored.
        grandparent: ``G`` [B, C, C, C] (``[b, g, h, m]``) or ``None``; invalid entries ignored likewise.
        parts: optional ``(sibling_idx, grandparent_idx)``, integer tensors [4, P] listing the entries
            ``(b, h, m, s)`` / ``(b, g, h, m)`` that may be non-zero (the others are taken as 0).  The value and
            gradient are then sums over the listed parts, ``O(P)`` instead of ``O(B C^3)``: the fast path for
            pruned parsers.  List a part whatever its current score (a score that is 0 now still needs its
            gradient when learning).  Each part at most once, every index inside the score tensors.

    Both must be finite floating-point tensors; they may require grad (learning through
    :func:`betheproj.learning.model.surrogate_nll`).  The energy is non-convex in general (eq. 9).

    The masked (or gathered) scores are prepared once and reused while the score tensors, their in-place
    version counters and the lengths stay the same, so in-place edits (``S.add_(...)``, ``S[...] = v``) are
    seen; a write through ``S.data`` bypasses the counter and is not: make a new energy after one.
    """

    edge_totals = True          # node marginals only

    def __init__(self, sibling: Tensor | None, grandparent: Tensor | None,
                 parts: tuple[Tensor | None, Tensor | None] | None = None):
        if sibling is None and grandparent is None:
            raise ValueError("give at least one of sibling and grandparent scores")
        shape = None
        for name, t in (("sibling", sibling), ("grandparent", grandparent)):
            if t is None:
                continue
            if not isinstance(t, Tensor) or not t.is_floating_point():
                raise TypeError(f"{name} must be a floating-point tensor [B, C, C, C], got {type(t).__name__}")
            if t.dim() != 4 or not t.shape[1] == t.shape[2] == t.shape[3] or t.shape[1] < 2:
                raise ValueError(f"{name} must be [B, C, C, C] with C = N + 1 >= 2, got {tuple(t.shape)}")
            if not torch.isfinite(t.detach()).all():
                raise ValueError(f"{name} scores must be finite")
            if shape is not None and t.shape != shape:
                raise ValueError(f"sibling {tuple(shape)} and grandparent {tuple(t.shape)} shapes differ")
            shape = t.shape
        assert shape is not None                  # one of them is given (checked above)
        if parts is not None:
            if not isinstance(parts, tuple) or len(parts) != 2:
                raise TypeError("parts must be a pair (sibling indices [4, P] or None, grandparent indices [4, Q] "
                                "or None)")
            for name, idx, t in (("sibling", parts[0], sibling), ("grandparent", parts[1], grandparent)):
                if (idx is None) != (t is None):
                    raise ValueError(f"parts: give {name} indices exactly when {name} scores are given")
                if idx is not None:
                    _check_parts(name, idx, shape)
        self.sibling = sibling
        self.grandparent = grandparent
        self.parts = parts
        self.shape = shape
        self._cache: _Cache | None = None      # (lengths, key, prepared terms, sources, lengths source)

    def _sources(self) -> _Sources:
        """The tensors the prepared terms are built from, each with its in-place version counter."""
        return tuple((t, _version(t)) for t in (self.sibling, self.grandparent, *(self.parts or ())))

    @staticmethod
    def _same_sources(a: _Sources, b: _Sources) -> bool:
        return len(a) == len(b) and all(ta is tb and va == vb for (ta, va), (tb, vb) in zip(a, b, strict=True))

    def _terms(self, marginals: Marginals) -> tuple[Tensor, list[_Term]]:
        """Head-major marginals and, per kind of part, its prepared scores: a masked dense tensor, or (with
        ``parts``) the index pairs of its two arcs and the part scores."""
        mu = marginals.node
        a = _head_major(mu)
        lengths = marginals.lengths.to(mu.device)
        # the solvers call the energy many times (without autograd) with the same lengths: prepare the scores once.
        # The key holds the score tensors themselves and their version counters, so in-place edits are seen.  While
        # autograd records through scores that require grad, the terms are rebuilt at every call: cached terms
        # would share one graph between backward passes.
        recording = torch.is_grad_enabled() and any(
            t is not None and t.requires_grad for t in (self.sibling, self.grandparent))
        key = (torch.is_grad_enabled(), mu.dtype, mu.device)
        sources = self._sources()
        cached = None if recording else self._cache
        if cached is None or cached[1] != key or not self._same_sources(cached[3], sources) or not (
                self._same_sources(cached[4], ((lengths, _version(lengths)),)) or torch.equal(cached[0], lengths)):
            valid, _ = second_order_masks(lengths, a.shape[1])
            zero = torch.zeros((), dtype=mu.dtype, device=mu.device)
            terms: list[_Term] = []
            # with parts, each kind of scores given has its indices (checked in __init__)
            indices = self.parts or (None, None)
            for k, (t, idx) in enumerate(zip((self.sibling, self.grandparent), indices, strict=True)):
                if t is None:
                    terms.append(None)
                elif idx is None:
                    terms.append(torch.where(valid, t.to(mu), zero))
                else:
                    b, i, j, l = idx.to(mu.device)
                    keep = valid[b, i, j, l]
                    b, i, j, l = b[keep], i[keep], j[keep], l[keep]
                    vals = t.to(mu)[b, i, j, l]
                    # sibling (h, m, s): arcs (h, m) and (h, s); grandparent (g, h, m): arcs (g, h) and (h, m)
                    first, second = ((b, i, j), (b, i, l)) if k == 0 else ((b, i, j), (b, j, l))
                    terms.append((first, second, vals))
            cached = (lengths.clone(), key, terms, sources, ((lengths, _version(lengths)),))
            self._cache = None if recording else cached
        return a, cached[2]

    def value(self, marginals: Marginals) -> Tensor:
        """``L(mu)`` [B] (quadratic forms as batched matrix-vector products, or sums over the listed parts)."""
        a, terms = self._terms(marginals)
        out = a.new_zeros(a.shape[0])
        for k, t in enumerate(terms):
            if t is None:
                continue
            if isinstance(t, Tensor):
                sub = "bhms,bhs->bhm" if k == 0 else "bghm,bhm->bgh"
                out = out - (a * torch.einsum(sub, t, a)).sum((1, 2))
            else:
                first, second, vals = t
                out = out.index_add(0, first[0], -vals * a[first] * a[second])
        return out

    def grad(self, marginals: Marginals) -> Gradient:
        """Closed form: ``dL/dmu(h->m) = -sum_s (S[h,m,s] + S[h,s,m]) mu(h->s) - sum_g G[g,h,m] mu(g->h)
        - sum_c G[h,m,c] mu(m->c)`` (node layout [B, N, N+1])."""
        a, terms = self._terms(marginals)
        ga = torch.zeros_like(a)
        for k, t in enumerate(terms):
            if t is None:
                continue
            if isinstance(t, Tensor):
                if k == 0:
                    ga = ga - torch.einsum("bhms,bhs->bhm", t, a) - torch.einsum("bhsm,bhs->bhm", t, a)
                else:
                    ga = ga - torch.einsum("bxym,bym->bxy", t, a) - torch.einsum("bgxy,bgx->bxy", t, a)
            else:
                first, second, vals = t
                ga = ga.index_put(first, -vals * a[second], accumulate=True)
                ga = ga.index_put(second, -vals * a[first], accumulate=True)
        return Gradient(ga[:, :, 1:].transpose(1, 2), None)

    def validate(self, marginals: Marginals) -> None:
        check_marginals(marginals)
        b, n, c = marginals.node.shape
        if c != n + 1:
            raise ValueError(f"SecondOrderArcs needs arc marginals [B, N, N+1], got {tuple(marginals.node.shape)}")
        if tuple(self.shape) != (b, c, c, c):
            raise ValueError(f"second-order scores have shape {tuple(self.shape)}, marginals need "
                             f"[B, C, C, C]=({b}, {c}, {c}, {c})")

    def __repr__(self) -> str:
        parts = [p for p, t in (("sibling", self.sibling), ("grandparent", self.grandparent)) if t is not None]
        return f"SecondOrderArcs({'+'.join(parts)}, shape={tuple(self.shape)})"
