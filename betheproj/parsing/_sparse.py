"""Sparse gradients for hashed weight vectors: a gather whose gradient lists only the entries it read, and the
AdaGrad step over those entries.

A training step of the second-order parser reads about a million of the 2^22 + 2^24 hashed weights.  A dense
gradient and a dense AdaGrad step cost several passes over all of them (allocating and zeroing the gradient, the
square root of every accumulator): most of the step's time at these sizes.  AdaGrad moves an entry with a zero
gradient by exactly 0, so updating only the entries read is the same step.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

__all__ = ["take", "AdaGrad"]


class _Take(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, w: Tensor, idx: Tensor) -> Tensor:
        ctx.save_for_backward(idx)
        ctx.size = w.shape[0]
        return w[idx]

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        (idx,) = ctx.saved_tensors
        # uncoalesced: repeated indices stay listed, and AdaGrad.step sums them
        return torch.sparse_coo_tensor(idx.reshape(1, -1), grad.reshape(-1), (ctx.size,), is_coalesced=False,
                                       check_invariants=False), None


def take(w: Tensor, idx: Tensor) -> Tensor:
    """``w[idx]`` for a 1-D ``w``; where ``w`` requires grad, its gradient is a sparse COO vector over ``idx``."""
    if w.requires_grad and torch.is_grad_enabled():
        return _Take.apply(w, idx)
    return w[idx]


class AdaGrad:
    """``torch.optim.Adagrad``'s step (no decay, ``eps`` 1e-10, accumulators from 0) on 1-D weights, over the
    entries of a sparse gradient (:func:`take`) only; a dense gradient (an L2 term's) updates every entry.

    ``w -= lr g / (sqrt(G) + eps)`` with ``G`` the running sum of ``g^2``, entry by entry."""

    eps = 1e-10

    def __init__(self, groups: list[tuple[Tensor, float]]):
        self.groups = [(w, lr, torch.zeros_like(w)) for w, lr in groups]

    @torch.no_grad()
    def step(self) -> None:
        for w, lr, total in self.groups:
            g = w.grad
            if g is None:
                continue
            if g.is_sparse:
                rows, inverse = torch.unique(g._indices()[0], return_inverse=True)
                g = g._values().new_zeros(len(rows)).index_add_(0, inverse, g._values())
                acc = total[rows].addcmul_(g, g)
                total[rows] = acc
                w[rows] = w[rows].addcdiv_(g, acc.sqrt().add_(self.eps), value=-lr)
            else:
                total.addcmul_(g, g)
                w.addcdiv_(g, total.sqrt().add_(self.eps), value=-lr)
            w.grad = None

    def zero_grad(self) -> None:
        for w, _, _ in self.groups:
            w.grad = None
