"""Generalised mean field, eq. (9): cliques missing from the base structure, scored on products of node
marginals."""

from __future__ import annotations

import torch
from torch import Tensor

from ..oracles.base import Marginals, check_marginals
from .base import Energy, Gradient

__all__ = ["MeanField"]


class MeanField(Energy):
    """``L(mu) = -sum_k <theta_k, mu_{a_k} (x) mu_{b_k}>`` for pairs ``(a_k, b_k)`` (eq. 9); non-convex.

    Args:
        pairs: [K, 2] node indices of the missing pairwise cliques.
        weights: their log-potentials ``theta_k``, [K, C, C] or per example [B, K, C, C]
            (rows index the label of ``a_k``).  Pairs that reach past an example's length are ignored.
    """

    edge_totals = True          # node marginals only

    def __init__(self, pairs: Tensor, weights: Tensor):
        try:
            pairs = torch.as_tensor(pairs)
        except (RuntimeError, TypeError, ValueError):
            raise TypeError(f"pairs must be an integer tensor [K, 2], got {type(pairs).__name__}") from None
        if pairs.is_floating_point() or pairs.is_complex() or pairs.dtype == torch.bool:
            raise TypeError(f"pairs must be an integer tensor [K, 2], got {pairs.dtype}")
        if pairs.dim() != 2 or pairs.shape[1] != 2:
            raise ValueError(f"pairs must be an integer tensor [K, 2], got shape {tuple(pairs.shape)}")
        if pairs.shape[0] == 0:
            raise ValueError("pairs must hold at least one pair (K >= 1), got shape (0, 2)")
        if (pairs < 0).any():
            raise ValueError("pairs must hold non-negative node indices")
        if not isinstance(weights, Tensor) or not weights.is_floating_point():
            raise TypeError("weights must be a floating-point tensor [K, C, C] or [B, K, C, C]")
        if weights.dim() not in (3, 4) or weights.shape[-3] != pairs.shape[0] or weights.shape[-1] != weights.shape[-2]:
            raise ValueError(f"weights must be [K, C, C] or [B, K, C, C] with K={pairs.shape[0]}, "
                             f"got shape {tuple(weights.shape)}")
        if not torch.isfinite(weights).all():
            raise ValueError("weights must be finite")
        self.pairs = pairs.long()
        self.weights = weights

    def _parts(self, marginals: Marginals) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, str]:
        """Node indices ``a``, ``b`` [K]; ``keep`` [B, K, 1], 1 for the pairs inside each example's length, else 0;
        the pairs' marginals ``keep * mu_a`` and ``mu_b`` [B, K, C]; the weights as given ([K, C, C] is never
        copied per example) and their einsum letters."""
        mu = marginals.node
        a, b = self.pairs[:, 0].to(mu.device), self.pairs[:, 1].to(mu.device)
        keep = ((a[None] < marginals.lengths[:, None]) & (b[None] < marginals.lengths[:, None]))[..., None].to(mu.dtype)
        w = self.weights.to(mu)
        return a, b, keep, mu[:, a] * keep, mu[:, b], w, "kij" if w.dim() == 3 else "bkij"

    def value(self, marginals: Marginals) -> Tensor:
        _, _, _, mu_a, mu_b, w, sub = self._parts(marginals)
        return -torch.einsum(f"bki,{sub},bkj->b", mu_a, w, mu_b)

    def grad(self, marginals: Marginals) -> Gradient:
        a, b, keep, mu_a, mu_b, w, sub = self._parts(marginals)
        g = torch.zeros_like(marginals.node)
        g.index_add_(1, a, -torch.einsum(f"{sub},bkj->bki", w, mu_b) * keep)
        g.index_add_(1, b, -torch.einsum(f"{sub},bki->bkj", w, mu_a))
        return Gradient(g, None)

    def validate(self, marginals: Marginals) -> None:
        check_marginals(marginals)
        bsz, n, c = marginals.node.shape
        if int(self.pairs.max()) >= n:
            raise ValueError(f"pairs reference node {int(self.pairs.max())} but marginals have N={n}")
        if self.weights.shape[-1] != c:
            raise ValueError(f"weights have {self.weights.shape[-1]} labels, marginals have C={c}")
        if self.weights.dim() == 4 and self.weights.shape[0] != bsz:
            raise ValueError(f"weights have B={self.weights.shape[0]}, marginals have B={bsz}")

    def __repr__(self) -> str:
        return f"MeanField(K={self.pairs.shape[0]})"
