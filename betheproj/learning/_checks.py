"""Batch checks shared by the learners (scalar checks: :mod:`betheproj._checks`)."""

from __future__ import annotations

from torch import Tensor

from ..oracles.base import _check_lengths

__all__ = ["check_lengths_like", "check_sequences"]


def _shape(x: object) -> object:
    return tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__


def check_sequences(features: object, labels: object, lengths: object, *, features_dim: int | None = 3,
                    training: bool = False) -> None:
    """A batch of sequences: ``features`` [B, N, ...] (exactly ``features_dim``-D unless it is ``None``; then at
    least 2-D), ``labels`` [B, N] and ``lengths`` [B] (integers in [1, N]) to match; with ``training``, at least
    one sequence."""
    if not isinstance(features, Tensor) or features.dim() < 2 or features_dim not in (None, features.dim()):
        raise ValueError(f"features must be a {'[B, N, F]' if features_dim == 3 else '[B, N, ...]'} tensor, "
                         f"got {_shape(features)}")
    if not isinstance(labels, Tensor) or labels.shape != features.shape[:2]:
        raise ValueError(f"labels must be a [B, N]={tuple(features.shape[:2])} tensor like features, got "
                         f"{_shape(labels)}")
    check_lengths_like(features, lengths)
    if training and features.shape[0] == 0:
        raise ValueError("no training examples: features, labels and lengths hold B = 0 sequences")


def check_lengths_like(features: Tensor, lengths: object) -> None:
    """``lengths``: a [B] tensor of integers in [1, N] for ``features`` [B, N, ...]."""
    if not isinstance(features, Tensor) or features.dim() < 2:
        raise ValueError(f"features must be a [B, N, ...] tensor, got {_shape(features)}")
    if not isinstance(lengths, Tensor) or lengths.shape != features.shape[:1]:
        raise ValueError(f"lengths must be a [B]=({features.shape[0]},) tensor like features, got {_shape(lengths)}")
    _check_lengths(lengths, features.shape[0], features.shape[1], lengths.device)
