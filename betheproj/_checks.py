"""Scalar argument checks shared by the whole package (in the spirit of scikit-learn's ``check_scalar``).

A number may be a Python, NumPy or zero-dimensional torch scalar; a bool is never a number.  A wrong type is a
``TypeError``, a value out of range a ``ValueError``, and both name the argument, so ``max_iter=np.int64(50)`` is
accepted everywhere and ``max_iter=2.5`` or ``tol=float("nan")`` is refused everywhere in the same words."""

from __future__ import annotations

import math
from numbers import Integral, Real

import numpy as np
import torch

__all__ = ["check_bool", "check_count", "check_damping_space", "check_device", "check_float_dtype", "check_int",
           "check_log", "check_nonnegative", "check_positive", "check_real", "check_seed", "is_bio_label"]

SEED_MAX = 2 ** 63 - 1          # the seeds of the command line; torch wraps larger ones, NumPy counts in int64


def _scalar(value: object) -> object:
    """A zero-dimensional tensor as its Python value (bool tensors stay bools, so they are refused)."""
    if isinstance(value, torch.Tensor) and value.dim() == 0 and not value.is_complex():
        return value.item()
    return value


def check_int(name: str, value: object, minimum: int | None = None, maximum: int | None = None) -> int:
    """``value`` as a Python int in ``[minimum, maximum]`` (either bound may be ``None``)."""
    v = _scalar(value)
    if isinstance(v, bool | np.bool_) or not isinstance(v, Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    v = int(v)
    if (minimum is not None and v < minimum) or (maximum is not None and v > maximum):
        top = "2**63 - 1" if maximum == SEED_MAX else maximum        # int64's largest, as --seed's errors name it
        if maximum is None:
            wanted = f">= {minimum}"
        elif minimum is None:
            wanted = f"<= {top}"
        else:
            wanted = f"in [{minimum}, {top}]"
        raise ValueError(f"{name} must be an int {wanted}, got {v}")
    return v


def check_seed(name: str, value: object) -> int:
    """A random seed: an int in ``[0, 2**63 - 1]``, the range every seed of the package and its command line takes
    (torch would wrap a negative seed around silently, NumPy refuse it in its own words)."""
    return check_int(name, value, 0, SEED_MAX)


def check_count(name: str, value: object, minimum: int = 1) -> int:
    """``value`` as an int ``>= minimum`` (an iteration count, a batch size, ...)."""
    return check_int(name, value, minimum)


def check_real(name: str, value: object, low: float | None = None, high: float | None = None, *,
               low_open: bool = False, high_open: bool = False, finite: bool = True) -> float:
    """``value`` as a float in the interval from ``low`` to ``high`` (open at an end where ``*_open``; a bound may be
    ``None``), finite unless ``finite=False`` (NaN is always refused)."""
    v = _scalar(value)
    if isinstance(v, bool | np.bool_) or not isinstance(v, Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r}")
    v = float(v)
    below = low is not None and (v <= low if low_open else v < low)
    above = high is not None and (v >= high if high_open else v > high)
    if math.isnan(v) or (finite and math.isinf(v)) or below or above:
        if high is None and low is not None:
            wanted = f"> {low:g}" if low_open else f">= {low:g}"
        elif low is None and high is not None:
            wanted = f"< {high:g}" if high_open else f"<= {high:g}"
        elif low is not None and high is not None:
            wanted = f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
        else:
            wanted = ""
        kind = "a finite number" if finite else "a number"
        raise ValueError(f"{name} must be {kind}{' ' + wanted if wanted else ''}, got {value!r}")
    return v


def check_positive(name: str, value: object) -> float:
    """``value`` as a finite float ``> 0`` (a learning rate, a width)."""
    return check_real(name, value, 0.0, low_open=True)


def check_nonnegative(name: str, value: object) -> float:
    """``value`` as a finite float ``>= 0`` (a tolerance, an L2 weight)."""
    return check_real(name, value, 0.0)


def check_type(name: str, value: object, kind: type | tuple[type, ...], what: str | None = None) -> None:
    """A ``TypeError`` naming ``name`` unless ``value`` is a ``kind`` (``what`` says what that is, default "a"
    and its name)."""
    if not isinstance(value, kind):
        if what is None:
            what = " or ".join(f"a {k.__name__}" for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise TypeError(f"{name} must be {what}, got {type(value).__name__}")


def check_integer_vector(name: str, value: object, what: str = "[B]") -> torch.Tensor:
    """``value``, which must be a one-dimensional integer tensor (``what`` names its shape in the error)."""
    if not isinstance(value, torch.Tensor) or value.dim() != 1 or value.is_floating_point() or value.is_complex() \
            or value.dtype == torch.bool:
        got = f"a {value.dtype} tensor of shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else \
            type(value).__name__
        raise TypeError(f"{name} must be an integer tensor {what}, got {got}")
    return value


def check_bool(name: str, value: object) -> bool:
    """``value``, which must be a bool (a NumPy bool is accepted)."""
    if not isinstance(value, bool | np.bool_):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")
    return bool(value)


def check_log(log: object) -> None:
    """A ``TypeError`` unless ``log`` is ``None`` or a callable (the experiments' progress lines go to it)."""
    if log is not None and not callable(log):
        raise TypeError(f"log must be None or a callable taking one str (e.g. print), got {type(log).__name__} {log!r}")


def check_increasing_counts(name: str, values: object) -> tuple[int, ...]:
    """``values``, a non-empty tuple or list of strictly increasing ints ``>= 1`` (an axis of iteration counts;
    NumPy and 0-d tensor ints too), as a tuple of Python ints."""
    counts = [_scalar(t) for t in values] if isinstance(values, tuple | list) else []
    ints = [int(t) for t in counts if isinstance(t, Integral) and not isinstance(t, bool | np.bool_)]
    if (not ints or len(ints) < len(counts) or min(ints) < 1
            or any(b <= a for a, b in zip(ints, ints[1:], strict=False))):
        raise ValueError(f"{name} must be strictly increasing positive iteration counts, got {values!r}")
    return tuple(ints)


def check_device(name: str, value: object) -> torch.device:
    """``value`` (a ``torch.device`` or a string such as ``"cpu"``, ``"cuda"``, ``"cuda:1"``) as a device that
    exists on this machine: a CUDA device where CUDA is not available is refused here, not at the first tensor."""
    if not isinstance(value, str | torch.device):
        raise TypeError(f"{name} must be a torch.device or a string such as 'cpu' or 'cuda', got "
                        f"{type(value).__name__}")
    try:
        device = torch.device(value)
    except RuntimeError:
        raise ValueError(f"{name} must name a device such as 'cpu' or 'cuda', got {value!r}") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"{name} is {str(value)!r} but no CUDA device is available here")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(f"{name} is {str(value)!r} but this machine has {torch.cuda.device_count()} CUDA "
                             f"device(s)")
    elif device.type != "cpu":
        raise ValueError(f"{name} must be 'cpu' or a CUDA device, got {str(value)!r}")
    return device


def check_float_dtype(name: str, value: object) -> torch.dtype:
    """``value`` as ``torch.float32`` or ``torch.float64``, the two precisions the package computes in."""
    if value not in (torch.float32, torch.float64):
        raise TypeError(f"{name} must be torch.float32 or torch.float64, got {value!r}")
    return value


def is_bio_label(label: object) -> bool:
    """Whether ``label`` is a BIO label: ``"O"``, or ``"B-<type>"`` / ``"I-<type>"`` with a non-empty type (the
    reader, the feature index and the segment decoder all check labels this way)."""
    if not isinstance(label, str):
        return False
    tag, _, name = label.partition("-")
    return label == "O" or (tag in ("B", "I") and bool(name))


DAMPING_SPACES = ("probability", "log")


def check_damping_space(damping_space: object) -> str:
    """``damping_space`` of a loopy BP, which must be ``"probability"`` or ``"log"`` (where damping mixes the
    messages)."""
    if damping_space not in DAMPING_SPACES:
        raise ValueError(f"damping_space must be one of {DAMPING_SPACES}, got {damping_space!r}")
    return damping_space
