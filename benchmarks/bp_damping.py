"""Iterations of damped loopy BP to convergence as the scores grow: damping in probability space against log space.

Run by hand:  python benchmarks/bp_damping.py  [--graphs 5] [--damping 0.5] [--max-iter 2000]

Random loopy factor graphs (five ternary variables on a cycle with a chord, unary and pairwise log-potentials
drawn from N(0, 1) times the scale), sum-product, parallel schedule, ``tol`` 1e-8
(:func:`betheproj.factor_graphs.belief_propagation`).  Mixed in probability space, a message entry that must fall
by ``D`` nats moves by about ``log(1/damping)`` a step, so the iterations grow with the scores; mixed in log space
(``damping_space="log"``) every gap shrinks by the factor ``damping`` a step.  Both have plain BP's fixed points:
the script reports the largest belief difference from undamped BP where both converged.
"""

from __future__ import annotations

import argparse

import numpy as np
from _common import fraction, positive_int, run

from betheproj.factor_graphs import FactorGraph, belief_propagation

SCALES = (1.0, 10.0, 100.0, 1e3, 1e6)


def loop_graph(scale: float, seed: int) -> FactorGraph:
    rng = np.random.default_rng(seed)
    g = FactorGraph()
    vs = [g.add_variable(3, rng.normal(size=3) * scale) for _ in range(5)]
    for i in range(5):
        g.add_dense([vs[i], vs[(i + 1) % 5]], rng.normal(size=(3, 3)) * scale)
    g.add_dense([vs[0], vs[2]], rng.normal(size=(3, 3)) * scale)
    return g


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graphs", type=positive_int, default=5, help="random graphs per scale (default 5)")
    parser.add_argument("--damping", type=fraction, default=0.5, help="damping in [0, 1) (default 0.5)")
    parser.add_argument("--max-iter", type=positive_int, default=2000, help="iteration limit (default 2000)")
    args = parser.parse_args()
    if args.damping == 0.0:
        parser.error("--damping: must be > 0 to compare where it mixes the messages")
    print(f"{args.graphs} graphs a scale, sum-product, damping {args.damping}, tol 1e-8, at most {args.max_iter} "
          "iterations (mean iterations; converged runs / graphs)")
    print(f"{'scale':>8} {'undamped':>12} {'probability':>14} {'log':>12} {'max |b - b_undamped|':>22}")
    for scale in SCALES:
        rows = {"undamped": [], "probability": [], "log": []}
        gap = 0.0
        for seed in range(args.graphs):
            g = loop_graph(scale, seed)
            plain = belief_propagation(g, max_iter=args.max_iter, tol=1e-8)
            rows["undamped"].append(plain)
            for space in ("probability", "log"):
                res = belief_propagation(g, damping=args.damping, damping_space=space, max_iter=args.max_iter,
                                         tol=1e-8)
                rows[space].append(res)
                if res.converged and plain.converged:
                    gap = max(gap, max(float(np.abs(a - b).max())
                                       for a, b in zip(res.variable_beliefs, plain.variable_beliefs, strict=True)))

        def cell(results: list) -> str:
            done = sum(r.converged for r in results)
            return f"{np.mean([r.iterations for r in results]):.0f} ({done}/{len(results)})"

        print(f"{scale:>8g} {cell(rows['undamped']):>12} {cell(rows['probability']):>14} {cell(rows['log']):>12} "
              f"{gap:>22.1e}")


if __name__ == "__main__":
    run(main)
