"""Conjugate entropy of dependency trees (what the accelerated solver reads at each of its averages): the Newton
iteration's Hessian for ``NonProjective`` in closed form beside one inference per arc (the base class's, what it
ran before), and a start at ``Marginals.near`` (the solver's latest oracle point) beside the cold start at
``log mu``; in the same run, on averages ``(1 - w) mu_1 + w mu_2`` of two nearby oracle points.  Also the largest
difference between the entropies the variants give.  Then whole accelerated solves (``SecondOrderArcs`` energy)
with both changes beside neither, with their objectives' largest difference and iteration counts.

Run by hand:  python benchmarks/dependency_entropy.py  [--repeats 3] [--threads 2]
"""

from __future__ import annotations

import time

import torch
from _common import best_time, run, timing_args

import betheproj as bp
from betheproj.oracles.dependency import _DependencyOracle


class _PerArc(bp.NonProjective):
    """``NonProjective`` with the base class's Hessian: one inference per supported arc."""

    def _covariance(self, *args):
        return _DependencyOracle._covariance(self, *args)


class _Before(_PerArc):
    """Per-arc Hessian and the cold start: the conjugate entropy as it was."""

    def entropy(self, marginals):
        return super().entropy(bp.Marginals(marginals.node, None, None, marginals.lengths))


class _ColdProjective(bp.Projective):
    def entropy(self, marginals):
        return super().entropy(bp.Marginals(marginals.node, None, None, marginals.lengths))


def main() -> None:
    args = timing_args(__doc__, 3, "best")
    print(f"{'oracle':>14} {'B':>3} {'N':>3}   per-arc cold s  closed cold s  ratio   closed near s  ratio   "
          f"all: ratio   max |diff|")
    for oracle, slow, b, n in [(bp.NonProjective(), _PerArc(), 8, 8), (bp.NonProjective(), _PerArc(), 4, 16),
                               (bp.NonProjective(), _PerArc(), 2, 24), (bp.Projective(), None, 8, 8),
                               (bp.Projective(), None, 4, 16)]:
        gen = torch.Generator().manual_seed(0)
        lengths = torch.full((b,), n)
        scores = torch.randn(b, n + 1, n + 1, generator=gen, dtype=torch.float64) * 2
        near = bp.arc_potentials(scores + 0.3 * torch.randn(b, n + 1, n + 1, generator=gen, dtype=torch.float64),
                                 lengths)
        other = bp.arc_potentials(scores + 0.3 * torch.randn(b, n + 1, n + 1, generator=gen, dtype=torch.float64),
                                  lengths)
        mix = 0.7 * oracle.marginals(near).node + 0.3 * oracle.marginals(other).node
        cold, warm = bp.Marginals(mix, None, None, lengths), bp.Marginals(mix, None, None, lengths, near=near)
        t_cold = best_time(lambda: oracle.entropy(cold), args.repeats)           # noqa: B023
        t_near = best_time(lambda: oracle.entropy(warm), args.repeats)           # noqa: B023
        values = [oracle.entropy(cold), oracle.entropy(warm)]
        if slow is not None:
            t_slow = best_time(lambda: slow.entropy(cold), args.repeats)         # noqa: B023
            values.append(slow.entropy(cold))
            head = f"{t_slow:14.3f}  {t_cold:13.3f}  {t_slow / t_cold:4.1f}x"
        else:
            t_slow = t_cold
            head = f"{'(per arc)':>14}  {t_cold:13.3f}  {'':>5}"
        diff = max((v - values[0]).abs().max().item() for v in values)
        print(f"{type(oracle).__name__:>14} {b:>3} {n:>3}   {head}   {t_near:13.3f}  {t_cold / t_near:4.1f}x   "
              f"{t_slow / t_near:8.1f}x   {diff:9.1e}")
    from betheproj.energies.second_order import SecondOrderArcs

    print(f"\naccelerated solves  {'oracle':>14} {'B':>3} {'N':>3}   before s   now s  ratio   max |objective diff|  "
          f"same iterations")
    for oracle, before, b, n in [(bp.NonProjective(), _Before(), 8, 12), (bp.NonProjective(), _Before(), 4, 20),
                                 (bp.Projective(), _ColdProjective(), 4, 12)]:
        gen = torch.Generator().manual_seed(0)
        pot = bp.arc_potentials(torch.randn(b, n + 1, n + 1, generator=gen, dtype=torch.float64),
                                torch.full((b,), n))
        energy = SecondOrderArcs(*(0.3 * torch.randn(b, n + 1, n + 1, n + 1, generator=gen, dtype=torch.float64)
                                   for _ in range(2)))
        times, sols = [], []
        for o in (before, oracle):
            start = time.perf_counter()
            sols.append(bp.solve(o, pot, energy, method="accelerated", max_iter=200))
            times.append(time.perf_counter() - start)
        diff = (sols[0].objective - sols[1].objective).abs().max().item()
        same = bool(torch.equal(sols[0].iterations, sols[1].iterations))
        print(f"{'':>19} {type(oracle).__name__:>14} {b:>3} {n:>3}   {times[0]:8.1f}  {times[1]:6.1f}  "
              f"{times[0] / times[1]:4.1f}x   {diff:20.1e}  {same}")


if __name__ == "__main__":
    run(main)
