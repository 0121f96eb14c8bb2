"""The collective-graphical-model observation energy, eq. (23)."""

from __future__ import annotations

from numbers import Real

import numpy as np
import torch
from torch import Tensor

from .._checks import check_positive
from ..oracles.base import Marginals, check_marginals
from .base import Energy, Gradient, weight_per_example

__all__ = ["Poisson"]


def _positive(name: str, x: float | Tensor) -> float | Tensor:
    if isinstance(x, Tensor):
        if not x.is_floating_point():
            raise TypeError(f"{name} must be a float or a floating-point tensor, got {x.dtype}")
        if not (torch.isfinite(x).all() and (x > 0).all()):
            raise ValueError(f"{name} must be finite and > 0")
        return x
    if isinstance(x, bool | np.bool_) or not isinstance(x, Real):
        raise TypeError(f"{name} must be a float or a tensor, got {type(x).__name__}")
    return check_positive(name, x)


class Poisson(Energy):
    """Negative Poisson log-likelihood of observed counts of a population spread by the node marginals.

    ``L(mu) = (1/scale) * sum_{n,c} [rate*scale*mu_n(c) - counts_{n,c} * log(rate*scale*mu_n(c))]``: a
    population of ``scale`` individuals has expected counts ``scale * mu_n(c)``, observed with detection
    ``rate``: ``counts ~ Poisson(rate * scale * mu)``.  Convex; its gradient ``rate - counts/(scale*mu)``
    is unbounded at the boundary, which the solvers' step-size control handles.

    Args:
        counts: observed counts [B, N, C], non-negative and finite (padding entries ignored).
        rate: detection rate ``alpha > 0`` (a float or [B]).
        scale: population size ``M > 0`` (a float or [B]).
    """

    edge_totals = True          # node marginals only

    def __init__(self, counts: Tensor, rate: float | Tensor = 1.0, scale: float | Tensor = 1.0):
        if not isinstance(counts, Tensor) or not counts.is_floating_point():
            raise TypeError("counts must be a floating-point tensor [B, N, C]")
        if counts.dim() != 3:
            raise ValueError(f"counts must be [B, N, C], got shape {tuple(counts.shape)}")
        if not torch.isfinite(counts).all():
            raise ValueError("counts must be finite")
        if (counts < 0).any():
            raise ValueError("counts must be non-negative")
        self.counts = counts
        self.rate = _positive("rate", rate)
        self.scale = _positive("scale", scale)

    def _params(self, marginals: Marginals) -> tuple[Tensor, Tensor, Tensor]:
        node = marginals.node
        b = node.shape[0]
        rate = weight_per_example(self.rate, b, node, "rate")[:, None, None]
        scale = weight_per_example(self.scale, b, node, "scale")[:, None, None]
        counts = self.counts.to(node) * marginals.node_mask()[..., None]
        return rate, scale, counts

    def value(self, marginals: Marginals) -> Tensor:
        rate, scale, y = self._params(marginals)
        mu = marginals.node
        mean = rate * scale * mu * marginals.node_mask()[..., None]
        # log of 1 where y = 0 keeps autograd free of 0 * inf
        log_term = y * torch.log(torch.where(y > 0, mean, torch.ones((), dtype=mu.dtype)))
        return (mean - log_term).sum((-1, -2)) / scale[:, 0, 0]

    def grad(self, marginals: Marginals) -> Gradient:
        rate, scale, y = self._params(marginals)
        mu = marginals.node
        # where y = 0 the unselected branch divides by 1, not by mu (0 at padding and forbidden labels): its 0/0
        # would turn the derivative in scale (eq. 15) into NaN through torch.where's backward
        g = rate - torch.where(y > 0, y / (scale * torch.where(y > 0, mu, torch.ones((), dtype=mu.dtype))),
                               torch.zeros((), dtype=mu.dtype))
        return Gradient(g * marginals.node_mask()[..., None], None)

    def validate(self, marginals: Marginals) -> None:
        check_marginals(marginals)
        if self.counts.shape != marginals.node.shape:
            raise ValueError(f"counts have shape {tuple(self.counts.shape)} but the node marginals have "
                             f"{tuple(marginals.node.shape)}")
        b = marginals.node.shape[0]
        weight_per_example(self.rate, b, marginals.node, "rate")
        weight_per_example(self.scale, b, marginals.node, "scale")

    def __repr__(self) -> str:
        return f"Poisson(counts={tuple(self.counts.shape)}, rate={self.rate}, scale={self.scale})"
