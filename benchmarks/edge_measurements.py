"""Edge measurements on a chain: the solver's per-example edge state against its per-position state (same run).

Run by hand:  python benchmarks/edge_measurements.py  [--repeats 3] [--threads 2]

``LinearMeasurements(edge=[J, C, C])`` reads edge marginals only through each example's sum over positions
(``Energy.edge_totals``), so with shared transitions the solver keeps [B, C, C] edge offsets and the chain
takes one transition table per example.  The same energy wrapped so that it does not declare this runs the
per-position path ([B, N-1, C, C] state), the only way before.  Both solve the same problems to the same
tolerance; the script prints time per solve and per oracle call, the ratio, and the largest difference of
the two solutions' objectives.
"""

from __future__ import annotations

import argparse
import time

import torch
from _common import positive_int, run

import betheproj as bp
from betheproj.energies import Energy, LinearMeasurements


class PerPosition(Energy):
    """The wrapped energy, without ``edge_totals``."""

    def __init__(self, energy: Energy):
        self.energy = energy

    def value(self, marginals):
        return self.energy.value(marginals)

    def grad(self, marginals):
        return self.energy.grad(marginals)


def best(theta: bp.ChainPotentials, energy: Energy, repeats: int) -> tuple[float, bp.Solution]:
    """Fastest of ``repeats`` mirror-descent solves after an untimed one (first-call costs), and the solution."""
    out, times = bp.solve(bp.LinearChain(), theta, energy, method="md", max_iter=200), []
    for _ in range(repeats):
        start = time.perf_counter()
        out = bp.solve(bp.LinearChain(), theta, energy, method="md", max_iter=200)
        times.append(time.perf_counter() - start)
    return min(times), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=positive_int, default=3)
    parser.add_argument("--batch", type=positive_int, default=16)
    parser.add_argument("--length", type=positive_int, default=35)
    parser.add_argument("--threads", type=positive_int, default=2, help="torch threads (default 2)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"B={args.batch}, N={args.length}, 20 edge measurements, mirror descent, float64, tol 1e-6, "
          f"{torch.get_num_threads()} threads")
    print(f"{'C':>4} {'per-example (ms)':>17} {'per-position (ms)':>18} {'pos/ex':>6} {'ms/call':>15} {'|dobj|':>8}")
    for c in (10, 26, 50, 97):
        gen = torch.Generator().manual_seed(c)
        shortest = max(1, args.length // 2)
        theta = bp.ChainPotentials(torch.randn(args.batch, args.length, c, generator=gen, dtype=torch.float64) * 2,
                                   torch.randn(c, c, generator=gen, dtype=torch.float64),
                                   torch.randint(shortest, args.length + 1, (args.batch,), generator=gen))
        energy = LinearMeasurements(edge=torch.randn(20, c, c, generator=gen, dtype=torch.float64) * 4 / c,
                                    offset=0.5, loss="smoothed_hinge", psi=2.0)
        t_fast, fast = best(theta, energy, args.repeats)
        t_slow, slow = best(theta, PerPosition(energy), args.repeats)
        per_call = f"{1e3 * t_fast / fast.oracle_calls:.2f} / {1e3 * t_slow / slow.oracle_calls:.2f}"
        diff = (fast.objective - slow.objective).abs().max().item()
        print(f"{c:>4} {1e3 * t_fast:>17.1f} {1e3 * t_slow:>18.1f} {t_slow / t_fast:>6.1f} {per_call:>15} {diff:>8.1e}")


if __name__ == "__main__":
    run(main)
