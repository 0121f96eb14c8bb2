"""Argument checks shared by the learners: clear errors that name the argument, never NaN or a torch error."""

from __future__ import annotations

import math
from numbers import Integral, Real

from torch import Tensor

__all__ = ["check_count", "check_nonnegative", "check_positive", "check_sequences"]


def _real(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    return float(value)


def check_nonnegative(name: str, value: object) -> float:
    """``value`` as a float, which must be finite and ``>= 0`` (e.g. an L2 weight or a tolerance)."""
    x = _real(name, value)
    if not math.isfinite(x) or x < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return x


def check_positive(name: str, value: object) -> float:
    """``value`` as a float, which must be finite and ``> 0`` (e.g. a learning rate)."""
    x = _real(name, value)
    if not math.isfinite(x) or x <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return x


def check_count(name: str, value: object, minimum: int = 1) -> int:
    """``value`` as an int, which must be an integer (not a bool) ``>= minimum``."""
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise TypeError(f"{name} must be an int >= {minimum}, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return int(value)


def _shape(x: object) -> object:
    return tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__


def check_sequences(features: object, labels: object, lengths: object, *, features_dim: int | None = 3,
                    training: bool = False) -> None:
    """A batch of sequences: ``features`` [B, N, ...] (exactly ``features_dim``-D unless it is ``None``; then at
    least 2-D), ``labels`` [B, N] and ``lengths`` [B] to match; with ``training``, at least one sequence."""
    if not isinstance(features, Tensor) or features.dim() < 2 or features_dim not in (None, features.dim()):
        raise ValueError(f"features must be a {'[B, N, F]' if features_dim == 3 else '[B, N, ...]'} tensor, "
                         f"got {_shape(features)}")
    if not isinstance(labels, Tensor) or labels.shape != features.shape[:2]:
        raise ValueError(f"labels must be a [B, N]={tuple(features.shape[:2])} tensor like features, got "
                         f"{_shape(labels)}")
    if not isinstance(lengths, Tensor) or lengths.shape != features.shape[:1]:
        raise ValueError(f"lengths must be a [B]=({features.shape[0]},) tensor like features, got {_shape(lengths)}")
    if training and features.shape[0] == 0:
        raise ValueError("no training examples: features, labels and lengths hold B = 0 sequences")
