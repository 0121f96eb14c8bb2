"""Prediction from a solution of (2): Proposition 1."""

from __future__ import annotations

import torch
from torch import Tensor

from ..oracles.base import Oracle
from .solve import Solution, check_oracle

__all__ = ["decode"]


def decode(oracle: Oracle, solution: Solution, method: str = "map") -> Tensor:
    """Labels [B, N] (``-1`` past each length).

    ``method="map"`` (default) is Proposition 1: MAP in the MRF with ``theta~ = theta - grad L(mu*)``, the
    solver's dual iterate, so the output is a feasible joint labelling.  ``method="marginal"`` takes each
    position's most probable label, for comparison; it may violate hard constraints of the base model.
    """
    check_oracle(oracle, ("map",))
    if not isinstance(solution, Solution):
        raise TypeError(f"solution must be a Solution from betheproj.solve, got {type(solution).__name__}")
    if solution.oracle is not None and solution.oracle is not oracle \
            and _structure(solution.oracle) != _structure(oracle):
        raise ValueError(f"solution was solved with {_structure(solution.oracle)} but oracle is {_structure(oracle)}: "
                         "decode with the oracle that solved it")
    if method == "map":
        return oracle.map(solution.potentials)
    if method == "marginal":
        mu = solution.marginals
        labels = mu.node.argmax(-1)
        return torch.where(mu.node_mask(), labels, torch.full_like(labels, -1))
    raise ValueError(f"method must be 'map' or 'marginal', got {method!r}")


def _structure(oracle: object) -> str:
    """What identifies an oracle's structure: its ``repr`` (``Tree(parents=[...])``) where its class defines one,
    else that of the oracle it wraps (``.oracle``, as :class:`~betheproj.parsing.GreedyFirst`'s), else its class
    name (two instances of a class without a ``repr`` are taken for the same structure)."""
    kind = type(oracle)
    if kind.__repr__ is not object.__repr__:
        return repr(oracle)
    inner = vars(oracle).get("oracle") if hasattr(oracle, "__dict__") else None
    return _structure(inner) if inner is not None and inner is not oracle else kind.__qualname__
