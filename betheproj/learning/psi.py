"""Parametrisations of the energy weight ``psi(x)`` (section 7: "each psi_j is a differentiable function of x").

A psi module maps a batch ``(features [B, N, F], lengths [B])`` to the weights the energy takes: ``[B]`` for
one weight per example, ``[B, J]`` for one per measurement.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .._checks import check_count, check_positive, check_seed
from ._checks import check_lengths_like

__all__ = ["ConstantPsi", "RandomFourierFeatures", "MeanMapPsi"]


def _check_batch(features: Tensor, lengths: Tensor) -> None:
    if not isinstance(features, Tensor) or features.dim() != 3:
        raise ValueError(f"features must be a [B, N, F] tensor, got "
                         f"{tuple(features.shape) if isinstance(features, Tensor) else type(features).__name__}")
    check_lengths_like(features, lengths)


def _finite(name: str, value: float | Tensor) -> Tensor:
    """``value`` as a tensor (a float tensor keeps its dtype; numbers take the default dtype), checked finite."""
    if not (isinstance(value, Tensor) and value.is_floating_point()):
        value = torch.as_tensor(value, dtype=torch.get_default_dtype())
    if not bool(torch.isfinite(value).all()):
        raise ValueError(f"{name} must be finite, got {value.tolist()}")
    return value


class ConstantPsi(nn.Module):
    """A learned weight shared by all examples (the paper's "single bias feature"): ``psi`` [J] or scalar."""

    def __init__(self, init: float | Tensor = 1.0):
        super().__init__()
        self.value = nn.Parameter(_finite("init", init).clone())

    def forward(self, features: Tensor, lengths: Tensor) -> Tensor:
        _check_batch(features, lengths)
        return self.value.expand(features.shape[0], *self.value.shape)


class RandomFourierFeatures(nn.Module):
    """``z(x) = sqrt(2/D) cos(W x + b)``, ``W ~ N(0, 1/bandwidth^2)``, ``b ~ U[0, 2 pi)`` (Rahimi & Recht, 2007):
    ``z(x)^T z(x')`` approximates the RBF kernel ``exp(-||x - x'||^2 / (2 bandwidth^2))``. Fixed, not learned."""

    weight: Tensor                                   # buffers: W [F, D] and b [D]
    offset: Tensor

    def __init__(self, in_features: int, num_features: int = 1000, bandwidth: float = 1.0, seed: int = 0):
        super().__init__()
        in_features, num_features = check_count("in_features", in_features), check_count("num_features", num_features)
        bandwidth = check_positive("bandwidth", bandwidth)
        gen = torch.Generator().manual_seed(check_seed("seed", seed))
        self.register_buffer("weight", torch.randn(in_features, num_features, generator=gen) / bandwidth)
        self.register_buffer("offset", torch.rand(num_features, generator=gen) * 2 * math.pi)

    def forward(self, x: Tensor) -> Tensor:
        if not isinstance(x, Tensor) or x.shape[-1:] != self.weight.shape[:1]:
            raise ValueError(f"features must have {self.weight.shape[0]} values in their last dimension, got "
                             f"{tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__}")
        if not x.is_floating_point():                # integer pixels: the weights must stay real
            x = x.to(self.weight.dtype)
        w = self.weight.to(x.dtype)
        return math.sqrt(2.0 / w.shape[1]) * torch.cos(x @ w + self.offset.to(x.dtype))


class MeanMapPsi(nn.Module):
    """``psi(x) = v^T mean_n z(x_n) + c``: linear in the random-Fourier approximation of the RBF kernel mean map
    of a sequence's per-position features (Smola et al., 2007), the paper's "(MM)" models (section 8.2)."""

    def __init__(self, in_features: int, num_features: int = 1000, bandwidth: float = 1.0, init: float = 1.0,
                 outputs: int | None = None, seed: int = 0):
        super().__init__()
        if outputs is not None:
            outputs = check_count("outputs", outputs)
        self.features = RandomFourierFeatures(in_features, num_features, bandwidth, seed)
        self.linear = nn.Linear(num_features, 1 if outputs is None else outputs)
        self.squeeze = outputs is None
        nn.init.zeros_(self.linear.weight)
        bias = _finite("init", init)
        if bias.numel() != 1:
            raise ValueError(f"init must be one number (every example's psi bias), got shape {tuple(bias.shape)}")
        nn.init.constant_(self.linear.bias, float(bias))

    def mean_map(self, features: Tensor, lengths: Tensor) -> Tensor:
        """``mean_n z(x_n)`` over each sequence's valid positions: [B, D]."""
        _check_batch(features, lengths)
        mask = torch.arange(features.shape[1], device=features.device) < lengths[:, None]
        z = self.features(features)
        if features.is_floating_point() and not bool(torch.isfinite(features[mask]).all()):
            raise ValueError("features hold NaN or infinite values at valid positions (padding may hold anything)")
        z = torch.where(mask[..., None], z, torch.zeros((), dtype=z.dtype, device=z.device))   # padding: any value
        return z.sum(1) / lengths.clamp(min=1).to(z.dtype)[:, None]

    def forward(self, features: Tensor, lengths: Tensor) -> Tensor:
        out = self.linear(self.mean_map(features, lengths).to(self.linear.weight.dtype))
        return out.squeeze(-1) if self.squeeze else out
