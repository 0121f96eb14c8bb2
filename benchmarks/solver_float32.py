"""How often each solver meets its tolerance in float32 and in float64 on small random problems (run by hand).

Problems shaped like the README's example: B = 8 chains of N = 12 positions (lengths 6-12), C = 5 labels, random
potentials, and one of three energies in turn: a smoothed hinge on a label count (psi 8) plus a log barrier on the
first position's marginals, a squared loss on three random linear measurements (psi 2), Poisson counts.  Default
tolerances (1e-4 in float32, 1e-6 in float64), ``max_iter`` 200.  An example that is neither converged nor at
``max_iter`` stopped early: mirror descent's step reached its floor, where rounding hides progress (its step test,
L(mu') - L(mu) + <delta', mu' - mu> <= 0 and its trapezoid estimate, is decided below the objective's rounding;
decided on the objective, float32 stopped early on 98 of the 480 chains).

    python benchmarks/solver_float32.py [--problems 60]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from _common import positive_int, run

import betheproj as bp
from betheproj.energies import FunctionEnergy, LinearMeasurements, Poisson


def problem(seed: int, dtype: torch.dtype) -> tuple[bp.PairwisePotentials, bp.energies.Energy]:
    torch.manual_seed(seed)
    b, n, c = 8, 12, 5
    theta = bp.ChainPotentials(torch.randn(b, n, c, dtype=dtype), torch.randn(c, c, dtype=dtype),
                               lengths=torch.randint(6, n + 1, (b,)))
    kind = seed % 3
    if kind == 0:
        a = torch.zeros(1, c, dtype=dtype)
        a[0, seed % c] = -1.0
        energy = LinearMeasurements(node=a, offset=-2.0, loss="smoothed_hinge", psi=8.0) + FunctionEnergy(
            lambda m: -0.1 * torch.log(m.node[:, 0]).sum(-1))
    elif kind == 1:
        energy = LinearMeasurements(node=torch.randn(3, c, dtype=dtype), offset=torch.randn(3, dtype=dtype),
                                    loss="squared", psi=2.0)
    else:
        energy = Poisson(torch.poisson(torch.rand(b, n, c, dtype=dtype) * 2), rate=1.0, scale=1.0)
    return theta, energy


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problems", type=positive_int, default=60)
    ap.add_argument("--max-iter", type=positive_int, default=200)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    print(f"{args.problems} problems x 8 chains, max_iter {args.max_iter}, default tolerances")
    print(f"{'dtype':<9}{'method':<13}{'converged':>10}{'stopped early':>15}{'at max_iter':>13}"
          f"{'median residual left':>22}{'oracle calls':>14}{'seconds':>9}")
    for dtype in (torch.float32, torch.float64):
        for method in ("md", "accelerated", "rda"):
            conv = early = maxed = calls = 0
            left: list[float] = []
            start = time.perf_counter()
            for seed in range(args.problems):
                theta, energy = problem(seed, dtype)
                sol = bp.solve(bp.LinearChain(), theta, energy, method=method, max_iter=args.max_iter)
                stopped = ~sol.converged & (sol.iterations < args.max_iter)
                conv += int(sol.converged.sum())
                early += int(stopped.sum())
                maxed += int((~sol.converged & ~stopped).sum())
                left += sol.residual[~sol.converged].tolist()
                calls += sol.oracle_calls
            med = f"{statistics.median(left):.1e}" if left else "-"
            print(f"{str(dtype)[6:]:<9}{method:<13}{conv:>10}{early:>15}{maxed:>13}{med:>22}{calls:>14,}"
                  f"{time.perf_counter() - start:>9.1f}")


if __name__ == "__main__":
    run(main)
