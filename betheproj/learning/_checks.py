"""Argument checks shared by the learners: clear errors that name the argument, never NaN or a torch error."""

from __future__ import annotations

import math
from numbers import Integral, Real

__all__ = ["check_count", "check_nonnegative", "check_positive"]


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
