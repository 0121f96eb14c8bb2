"""Approximate MAP of the counts in a collective graphical model, problem (23), with the Bethe solvers."""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from .._checks import check_count, check_nonnegative, check_positive
from ..energies import Poisson
from ..inference import Solution, solve
from ..inference.state import _warm_offsets
from ..oracles import ChainPotentials, LinearChain, PairwisePotentials
from .fast import mirror_descent

__all__ = ["CGMResult", "check_observations", "map_counts"]

_FAST_CELLS = 400     # the NumPy path up to this many cells; beyond, the batched PyTorch solver is faster


def _as_observations(observed: object) -> Tensor:
    """``observed`` as a real tensor ([T, L] promoted to [1, T, L]); shapes and values are checked later."""
    if not isinstance(observed, Tensor):
        try:
            observed = torch.as_tensor(observed)
        except (TypeError, ValueError, RuntimeError):
            raise TypeError("observed must be a tensor or array of counts [B, T, L]") from None
    if observed.dtype == torch.bool or observed.is_complex():
        raise TypeError(f"observed must hold real counts, got dtype {observed.dtype}")
    return observed[None] if observed.dim() == 2 else observed


def check_observations(observed: Tensor, rate: float, population: float, potentials: ChainPotentials) -> Tensor:
    """Validate the inputs of (23) and return ``observed`` as a [B, T, L] tensor of the potentials' dtype."""
    if not isinstance(potentials, ChainPotentials):
        raise TypeError(f"potentials must be ChainPotentials, got {type(potentials).__name__}")
    observed = _as_observations(observed)
    shape = tuple(potentials.node.shape)
    if tuple(observed.shape) != shape:
        raise ValueError(f"observed must have the potentials' shape [B, T, L]={shape} (T steps, L = grid^2 cells), "
                         f"got {tuple(observed.shape)}")
    given = observed
    observed = observed.to(dtype=potentials.node.dtype, device=potentials.node.device)
    if not bool(torch.isfinite(observed).all()):
        raise ValueError("observed counts must be finite")
    if bool((observed < 0).any()):
        raise ValueError("observed counts must be non-negative")
    if not bool((observed == observed.round()).all()):
        raise ValueError("observed counts must be whole numbers")
    # the potentials' dtype may have rounded them: 2**24 + 1 is 2**24 in float32, 2**25 + 0.5 a whole 2**25
    changed = observed.to(given.dtype) != given.to(observed.device)
    if bool(changed.any()):
        dtype = potentials.node.dtype
        bits = round(-math.log2(torch.finfo(dtype).eps)) + 1     # every integer up to 2**bits is exact in dtype
        first = changed.nonzero()[0].tolist()
        raise ValueError(f"observed counts must be held exactly by the potentials' {dtype} (every whole number up "
                         f"to 2**{bits} = {2 ** bits} is), got {given[tuple(first)].item()!r}, which it rounds to "
                         f"{observed[tuple(first)].item()!r}")
    rate, population = check_positive("rate", rate), check_positive("population", population)
    expected = rate * population
    if not math.isfinite(expected) or expected < sys.float_info.min:
        raise ValueError(f"rate * population must be a normal float64 number (the scale of the expected counts), "
                         f"got {rate!r} * {population!r} = {expected!r}")
    return observed


@dataclass
class CGMResult:
    """The MAP counts ``population * mu*`` ([B, T, L]) with the solver's report; ``potentials`` is the dual
    iterate ``theta~`` whose marginals are ``mu*`` (Proposition 1)."""

    counts: Tensor
    objective: Tensor
    iterations: Tensor
    converged: Tensor
    seconds: float
    potentials: ChainPotentials
    population: float
    _solution: Solution | None = None
    _residual: Tensor | None = None       # the NumPy path's stationarity residuals
    _safeguarded: Tensor | None = None    # and which of its examples had a step rejected

    @property
    def solution(self) -> Solution:
        """The full :class:`~betheproj.inference.Solution` (marginals with edges on demand).  From the NumPy
        small-problem path it holds the final objective alone as ``objectives`` and no oracle-call count."""
        if self._solution is None:
            assert self._safeguarded is not None and self._residual is not None   # the NumPy path sets both
            chain = LinearChain()
            self._solution = Solution(chain.marginals(self.potentials), self.potentials, self.iterations,
                                      self.converged, self.objective, self.objective[:, None], self._safeguarded,
                                      self._residual, 0, "md", chain)
        return self._solution

    def flows(self) -> Tensor:
        """Expected flows ``population * mu*_t(i, j)`` [B, T-1, L, L] (the edge marginals, computed on demand)."""
        return self.population * self.solution.marginals.edge


def _fast(potentials: ChainPotentials, observed: Tensor, rate: float, population: float, tol: float, max_iter: int,
          warm_start: ChainPotentials | None) -> CGMResult | None:
    """Every example through the NumPy small-problem path; ``None`` if any needs the generic solver.  A warm start
    is checked as :func:`~betheproj.solve` checks it."""
    warm, _ = _warm_offsets(warm_start, potentials, False, "md")
    node = potentials.node.detach().double().numpy()
    edge = potentials.full_edge().detach().double().numpy()
    y = observed.detach().double().numpy()
    delta = None if warm is None else warm.detach().double().numpy()
    rows = []
    for b in range(node.shape[0]):
        n = int(potentials.lengths[b])
        with np.errstate(all="ignore"):         # overflow or 0/0 makes it hand over (None), not warn the user
            out = mirror_descent(node[b, :n], edge[b, :n - 1], y[b, :n], rate, population, tol, max_iter,
                                 None if delta is None else delta[b, :n])
        if out is None:
            return None
        rows.append(out)
    dtype = potentials.node.dtype
    mu = torch.zeros(potentials.node.shape, dtype=dtype)
    offset = torch.zeros(potentials.node.shape, dtype=dtype)
    for b, row in enumerate(rows):
        n = row[0].shape[0]
        mu[b, :n], offset[b, :n] = torch.from_numpy(row[0]).to(dtype), torch.from_numpy(row[1]).to(dtype)
    as_tensor = lambda i, kind: torch.tensor([r[i] for r in rows], dtype=kind)  # noqa: E731
    objective = as_tensor(2, dtype)
    if not (bool(torch.isfinite(objective).all()) and bool(torch.isfinite(offset).all())):
        return None                      # beyond the dtype's range (float32): the generic solver says why
    tilde = potentials.detach().shifted(offset, None)          # nothing returned requires grad, as solve()'s
    return CGMResult(population * mu, objective, as_tensor(3, torch.long), as_tensor(4, torch.bool), 0.0,
                     tilde, float(population), _residual=as_tensor(5, dtype), _safeguarded=as_tensor(6, torch.bool))


def map_counts(potentials: ChainPotentials, observed: Tensor, rate: float, population: float, method: str = "md",
               tol: float | None = 1e-6, max_iter: int = 300, warm_start: ChainPotentials | None = None
               ) -> CGMResult:
    """Solve (23): ``max <theta, mu> + H_B(mu) - L(mu)`` over the chain's marginal polytope, with ``L`` the
    negative Poisson log-likelihood of ``observed ~ Poisson(rate * population * mu)`` scaled by
    ``1/population`` (the :class:`~betheproj.energies.Poisson` energy), i.e. minimise (2).  The objective
    reported is (2)'s, ``-H_B - <theta, mu> + L``.  Mirror descent (the default) meets tight tolerances fastest;
    on the CPU and up to 400 cells it runs in the NumPy small-problem path (:mod:`betheproj.cgm.fast`, the same
    algorithm and stopping rule) unless the scaled recursion cannot be trusted there; otherwise
    :func:`betheproj.solve`.  ``tol`` bounds the stationarity residual (see :func:`betheproj.solve`); at 1e-6
    the objective agrees with the interior-point solver's to about 1e-8 relative or better.  Some instances
    creep just above the tolerance when the objective's rounding hides further progress: ``max_iter`` bounds
    them and ``converged`` says which.  ``warm_start``: potentials whose marginals are a good guess (e.g. these
    potentials plus the node offset of a previous solution, ``result.potentials.node - potentials.node``)."""
    observed = check_observations(observed, rate, population, potentials)
    # checked here as well as in solve(): the NumPy fast path below runs first
    tol = 1e-6 if tol is None else check_nonnegative("tol", tol)
    max_iter = check_count("max_iter", max_iter, 0)
    if warm_start is not None and not isinstance(warm_start, PairwisePotentials):
        raise TypeError(f"warm_start must be ChainPotentials/PairwisePotentials or None, "
                        f"got {type(warm_start).__name__}")
    if warm_start is not None and warm_start.node.device != potentials.node.device:
        raise ValueError(f"warm_start is on {warm_start.node.device} but potentials are on {potentials.node.device}")
    start = time.perf_counter()
    if method == "md" and potentials.node.device.type == "cpu" and potentials.node.shape[2] <= _FAST_CELLS:
        result = _fast(potentials, observed, float(rate), float(population), tol, max_iter, warm_start)
        if result is not None:
            result.seconds = time.perf_counter() - start
            return result
    energy = Poisson(observed, rate=float(rate), scale=float(population))
    sol = solve(LinearChain(), potentials, energy, method=method, max_iter=max_iter, tol=tol,
                warm_start=warm_start)
    seconds = time.perf_counter() - start
    return CGMResult(population * sol.marginals.node, sol.objective, sol.iterations, sol.converged, seconds,
                     sol.potentials, float(population), sol)
