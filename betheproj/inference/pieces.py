"""Global minimum of (2) for an energy that is a minimum of convex pieces, ``L(mu) = min_k L_k(mu)``.

``min_mu F(mu) + min_k L_k(mu) = min_k min_mu F(mu) + L_k(mu)``: each inner problem is convex (``F = -H_B -
<theta, .>`` is convex on a tree-structured polytope), so solving every piece and keeping the best objective
finds the global minimum of the non-convex problem, where the local solvers find a stationary point near
their starting marginals.  The nearest-prototype energies (21)-(22) are of this form; for ``L^w`` each piece
is linear on the polytope (the L1 distance to a vertex), and Bethe-RDA solves a linear piece in one step.

An energy opts in by implementing ``pieces(lengths) -> (rows, energy)``: one row per (example, candidate
piece) pair, ``rows`` [R] (long) naming the example, and one energy over the R rows, convex in each.  An
energy that splits only some examples (a nearest-prototype energy with ``psi < 0`` is a maximum of concave
pieces) also implements ``remainder(lengths) -> (rows, energy)``: one row per example it leaves out with a
non-zero energy, solved by :func:`solve` from the base marginals (a stationary point, not the global minimum).
"""

from __future__ import annotations

from typing import Any

import torch

from ..energies.base import Energy
from ..oracles.base import Marginals, Oracle, PairwisePotentials, _log_partition_of
from .solve import Solution, check_options, check_oracle, solve

__all__ = ["solve_global"]


@torch.no_grad()
def solve_global(oracle: Oracle, potentials: PairwisePotentials, energy: Energy, method: str = "md",
                 **options: Any) -> Solution:
    """Solve (2) for ``energy = min_k L_k``: all (example, piece) rows in one batched :func:`solve` (with
    ``method`` and ``options``), then per example the row with the lowest objective.  Examples with no
    candidate piece have zero energy: their solution is the oracle's marginals; those of the energy's
    ``remainder`` (if any) are solved by :func:`solve` with it from the base marginals.  ``iterations`` is the most any
    of an example's rows took (the rows run side by side); ``objectives`` has a single column (the rows'
    histories are not comparable).  Like :func:`solve`, it runs without autograd: nothing returned requires grad."""
    check_oracle(oracle, ("marginals", "map", "entropy"))
    pieces = getattr(energy, "pieces", None)
    if not callable(pieces):
        raise TypeError(f"solve_global needs an energy with pieces(lengths), got {type(energy).__name__}")
    if not isinstance(potentials, PairwisePotentials):
        raise TypeError("potentials must be PairwisePotentials")
    check_options(oracle, potentials, energy, method, options)    # whether or not some example has a piece
    potentials = potentials.detach()
    b = potentials.node.shape[0]
    device = potentials.node.device
    base = oracle.marginals(potentials)
    energy.validate(base)                                # named as solve names it, not by a piece's internals
    parts = [pieces(potentials.lengths)]
    remainder = getattr(energy, "remainder", None)
    if callable(remainder):
        parts.append(remainder(potentials.lengths))
    best = -_log_partition_of(base).clone()                 # zero energy: f = -H_B - <theta, mu> = -log Z
    node, edge = potentials.node.clone(), potentials.edge
    iterations = torch.zeros(b, dtype=torch.long, device=device)
    converged = torch.ones(b, dtype=torch.bool, device=device)
    safeguarded = torch.zeros(b, dtype=torch.bool, device=device)
    residual = torch.zeros(b, dtype=node.dtype, device=device)
    calls = b
    mu_node, log_z = base.node.clone(), _log_partition_of(base).clone()
    edge_from: list[tuple[torch.Tensor, Marginals, torch.Tensor]] = []   # (examples, their rows' marginals, winners)
    for rows, piece in parts:                            # the parts' examples are disjoint
        if not rows.numel():
            continue
        sol = solve(oracle, potentials.index(rows), piece, method=method, **options)
        calls += sol.oracle_calls
        has = torch.zeros(b, dtype=torch.bool, device=device).index_fill_(0, rows, True)
        best = torch.where(has, torch.full_like(best, float("inf")), best)
        best = best.scatter_reduce(0, rows, sol.objective, reduce="amin")
        won = torch.nonzero(sol.objective == best[rows]).flatten()
        examples, first = torch.unique(rows[won], return_inverse=True)
        pick = torch.full((len(examples),), len(won), device=device).scatter_reduce(
            0, first, torch.arange(len(won), device=device), reduce="amin")
        won = won[pick]                                  # one winning row per example (the first on a tie)
        node[examples] = sol.potentials.node[won]
        if sol.potentials.edge.dim() == 4:
            if edge is potentials.edge:                  # a copy, never the caller's tensor (or a view of one table)
                edge = potentials.full_edge().clone()
            edge[examples] = sol.potentials.edge[won]
        # the winners' own marginals: the point each objective was measured at (the accelerated method's is
        # not oracle(potentials) unless it converged)
        mu_node[examples], log_z[examples] = sol.marginals.node[won], _log_partition_of(sol.marginals)[won]
        edge_from.append((examples, sol.marginals, won))
        iterations.scatter_reduce_(0, rows, sol.iterations, reduce="amax")
        converged &= iterations.new_zeros(b).index_add_(0, rows, (~sol.converged).long()) == 0
        safeguarded |= iterations.new_zeros(b).index_add_(0, rows, sol.safeguarded.long()) > 0
        residual[examples] = sol.residual[won]
    tilde = PairwisePotentials(node, edge, potentials.lengths)

    def edges() -> torch.Tensor:
        out = base.edge.clone()
        for examples, marg, won in edge_from:
            out[examples] = marg.edge[won]
        return out

    marginals = Marginals(mu_node, edges, log_z, potentials.lengths)
    return Solution(marginals=marginals, potentials=tilde, iterations=iterations, converged=converged,
                    objective=best, objectives=best[:, None], safeguarded=safeguarded, residual=residual,
                    oracle_calls=calls, method=f"global-{method}", oracle=oracle)
