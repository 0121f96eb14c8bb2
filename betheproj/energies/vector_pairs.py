"""Pairs of label vectors measured through their distinct vectors (shared by the bilinear energies).

:class:`~betheproj.energies.Precedence` and :class:`~betheproj.energies.BigramExclusion` measure pairs
``(a_k, b_k)`` of label vectors with bilinear sums over positions, ``sum_{i, i'} w(i, i') <mu_i, a_k> <mu_i', b_k>``.
Pairs share their vectors (a field group is first in many order templates, a name label starts many bigrams), so
the ``G`` distinct vectors are scored once, every ``G x G`` pair is measured by one batched product, and pair
``k`` reads its cell of that table: ``O(N G^2)`` per example instead of ``O(N K C)``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..oracles.base import Marginals

__all__ = ["VectorPairs"]


class VectorPairs:
    """``K`` pairs ``(first[k], then[k])`` of label vectors ([K, C] each), stored as their distinct vectors."""

    def __init__(self, first: Tensor, then: Tensor):
        for name, v in (("first", first), ("then", then)):
            if not isinstance(v, Tensor) or not v.is_floating_point() or v.dim() != 2:
                raise TypeError(f"{name} must be a floating-point tensor [K, C], got {type(v).__name__}"
                                f"{f' {v.dtype} {tuple(v.shape)}' if isinstance(v, Tensor) else ''}")
        if first.shape != then.shape:
            raise ValueError(f"first and then must have the same shape [K, C], got {tuple(first.shape)} and "
                             f"{tuple(then.shape)}")
        k = first.shape[0]
        self.vectors, inverse = torch.unique(torch.cat([first, then]), dim=0, return_inverse=True)   # [G, C]
        self.cells = inverse[:k] * self.vectors.shape[0] + inverse[k:]          # pair k's cell of the [G, G] table

    def masses(self, marginals: Marginals) -> Tensor:
        """Per-position masses ``<mu_i, g>`` of the distinct vectors [B, N, G], zero at padding."""
        mu = marginals.node * marginals.node_mask()[..., None]
        return mu @ self.vectors.to(mu).t()

    def gather(self, table: Tensor) -> Tensor:
        """The pairs' entries [B, K] of a table [B, G, G] over (first vector, then vector)."""
        return table.flatten(1)[:, self.cells.to(table.device)]

    def scatter(self, weights: Tensor) -> Tensor:
        """The transpose of :meth:`gather`: weights [B, K] summed into their cells of a [B, G, G] table."""
        b, g = weights.shape[0], self.vectors.shape[0]
        return weights.new_zeros(b, g * g).index_add(1, self.cells.to(weights.device), weights).view(b, g, g)

    def node_gradient(self, coef: Tensor, marginals: Marginals) -> Tensor:
        """Gradients [B, N, C] from coefficients on the distinct vectors [B, N, G], zero at padding."""
        return (coef @ self.vectors.to(coef)) * marginals.node_mask()[..., None]
