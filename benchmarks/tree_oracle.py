"""Tree-marginal speed: ``Tree.marginals`` (the scaled probability-space recursion, certified per example) beside
the exact two-part log-space recursion it falls back to (``Tree._exact``, what every example ran before), and
``LinearChain`` on a chain-shaped tree, in the same run; also the largest difference between the two recursions.

Run by hand:  python benchmarks/tree_oracle.py  [--repeats 15] [--threads 2]
"""

from __future__ import annotations

import torch
from _common import call_times, run, timing_args

import betheproj as bp


def median_ms(fn, repeats: int) -> float:
    times = sorted(call_times(fn, repeats))
    return times[len(times) // 2] * 1e3


def main() -> None:
    args = timing_args(__doc__, 15, "median")
    print(f"{'B':>4} {'N':>4} {'C':>3} {'tree':>7} {'dtype':>8}   exact ms   fast ms  ratio   +edges: exact    fast  "
          f"ratio   max |diff|  certified")
    for b, n, c, shape in [(32, 50, 20, "random"), (32, 50, 20, "chain"), (64, 20, 10, "random"),
                           (8, 200, 40, "random"), (256, 12, 5, "random")]:
        for dtype in (torch.float64, torch.float32):
            gen = torch.Generator().manual_seed(0)
            parents = (list(range(-1, n - 1)) if shape == "chain" else
                       [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, n)])
            pot = bp.PairwisePotentials(torch.randn(b, n, c, generator=gen, dtype=dtype),
                                        torch.randn(b, n - 1, c, c, generator=gen, dtype=dtype),
                                        torch.full((b,), n))
            tree = bp.Tree(parents)
            exact_n = median_ms(lambda: tree._exact(pot), args.repeats)         # noqa: B023
            fast_n = median_ms(lambda: tree.marginals(pot), args.repeats)       # noqa: B023
            exact_e = median_ms(lambda: tree._exact(pot).edge, args.repeats)    # noqa: B023
            fast_e = median_ms(lambda: tree.marginals(pot).edge, args.repeats)  # noqa: B023
            a, e = tree.marginals(pot), tree._exact(pot)
            diff = max((a.node - e.node).abs().max().item(), (a.edge - e.edge).abs().max().item())
            ok = int(tree._scaled(pot)[3].sum())
            print(f"{b:>4} {n:>4} {c:>3} {shape:>7} {str(dtype)[6:]:>8}   {exact_n:8.1f}  {fast_n:8.1f}  "
                  f"{exact_n / fast_n:4.1f}x         {exact_e:6.1f}  {fast_e:6.1f}  {exact_e / fast_e:4.1f}x   "
                  f"{diff:9.1e}  {ok}/{b}")
            if shape == "chain":
                chain = bp.LinearChain()
                ms = median_ms(lambda: chain.marginals(pot).edge, args.repeats)   # noqa: B023
                print(f"{'':>28}LinearChain on the same chain, with edges: {ms:.1f} ms (the tree's fast path takes "
                      f"{fast_e / ms:.1f}x as long)")


if __name__ == "__main__":
    run(main)
