"""Approximate MAP of the counts in a collective graphical model, problem (23), with the Bethe solvers."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
from torch import Tensor

from ..energies import Poisson
from ..inference import Solution, solve
from ..oracles import ChainPotentials, LinearChain

__all__ = ["CGMResult", "check_observations", "map_counts"]


def check_observations(observed: Tensor, rate: float, population: float, potentials: ChainPotentials) -> Tensor:
    """Validate the inputs of (23) and return ``observed`` as a [B, T, L] tensor of the potentials' dtype."""
    if not isinstance(potentials, ChainPotentials):
        raise TypeError(f"potentials must be ChainPotentials, got {type(potentials).__name__}")
    if not isinstance(observed, Tensor):
        try:
            observed = torch.as_tensor(observed)
        except (TypeError, ValueError, RuntimeError):
            raise TypeError("observed must be a tensor or array of counts [B, T, L]") from None
    if observed.dtype == torch.bool or observed.is_complex():
        raise TypeError(f"observed must hold real counts, got dtype {observed.dtype}")
    if observed.dim() == 2:
        observed = observed[None]
    shape = tuple(potentials.node.shape)
    if tuple(observed.shape) != shape:
        raise ValueError(f"observed must have the potentials' shape [B, T, L]={shape} (T steps, L = grid^2 cells), "
                         f"got {tuple(observed.shape)}")
    observed = observed.to(dtype=potentials.node.dtype, device=potentials.node.device)
    if not bool(torch.isfinite(observed).all()):
        raise ValueError("observed counts must be finite")
    if bool((observed < 0).any()):
        raise ValueError("observed counts must be non-negative")
    if not bool((observed == observed.round()).all()):
        raise ValueError("observed counts must be whole numbers")
    for name, value in (("rate", rate), ("population", population)):
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
            raise ValueError(f"{name} must be a positive number, got {value!r}")
    return observed


@dataclass
class CGMResult:
    """The MAP counts ``population * mu*`` ([B, T, L]) with the solver's report."""

    counts: Tensor
    objective: Tensor
    iterations: Tensor
    converged: Tensor
    seconds: float
    solution: Solution
    population: float

    def flows(self) -> Tensor:
        """Expected flows ``population * mu*_t(i, j)`` [B, T-1, L, L] (the edge marginals, computed on demand)."""
        return self.population * self.solution.marginals.edge


def map_counts(potentials: ChainPotentials, observed: Tensor, rate: float, population: float, method: str = "md",
               tol: float | None = 1e-6, max_iter: int = 300, warm_start: ChainPotentials | None = None
               ) -> CGMResult:
    """Solve (23): ``max <theta, mu> + H_B(mu) - L(mu)`` over the chain's marginal polytope, with ``L`` the
    negative Poisson log-likelihood of ``observed ~ Poisson(rate * population * mu)`` scaled by
    ``1/population`` (the :class:`~betheproj.energies.Poisson` energy), i.e. minimise (2).  The objective
    reported is (2)'s, ``-H_B - <theta, mu> + L``.  Mirror descent (the default) meets tight tolerances fastest;
    ``tol`` bounds the stationarity residual (see :func:`betheproj.solve`); at 1e-6 the objective agrees with
    the interior-point solver's to about 1e-10 relative.  Some instances creep just above 1e-6 when the
    objective's rounding hides further progress: ``max_iter`` bounds them and ``converged`` says which.
    ``warm_start``: potentials whose marginals are a good guess (e.g. these potentials plus the node offset of
    a previous solution, ``solution.potentials.node - potentials.node``)."""
    observed = check_observations(observed, rate, population, potentials)
    energy = Poisson(observed, rate=float(rate), scale=float(population))
    start = time.perf_counter()
    sol = solve(LinearChain(), potentials, energy, method=method, max_iter=max_iter, tol=tol,
                warm_start=warm_start)
    seconds = time.perf_counter() - start
    return CGMResult(population * sol.marginals.node, sol.objective, sol.iterations, sol.converged, seconds, sol,
                     float(population))
