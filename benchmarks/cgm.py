"""CGM MAP (eq. 23, Table 4): Bethe mirror descent against CVXPY + Clarabel, measured in the same run.

For each grid G (s = G^4, the cardinality of the edge potentials): one synthetic instance (betheproj.cgm,
T steps, population M, detection rate alpha), solved by ours (best of --repeats after a warm-up run) and
by the interior-point solver (CVXPY building and compiling + Clarabel; once).  Prints seconds, the ratio and
the relative objective difference; then ours alone at the --ours-only sizes and for several T; writes a
log-log PNG of runtime against s.

Run:  python benchmarks/cgm.py [--grids 5 10 15] [--ours-only 32] [--steps 10] [--png FILE] [--json FILE]
      [--pytorch-path]
(the PNG goes to benchmarks/cgm.png beside this script unless --png names another file; --png "" writes none)
Needs the cgm extra (cvxpy, clarabel) and matplotlib.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from _common import positive_float, positive_int, require, run

from betheproj import LinearChain, solve
from betheproj.cgm import default_model, interior_point, map_counts, simulate
from betheproj.energies import Poisson


def _best(run, repeats: int):
    """The last result of ``run()`` and its best time over ``repeats`` runs after a warm-up run."""
    res = run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        res = run()
        times.append(time.perf_counter() - start)
    return res, min(times)


def _ours(inst, repeats: int):
    return _best(lambda: map_counts(inst.potentials, inst.observed, inst.rate, inst.population), repeats)


def _pytorch_path(inst, repeats: int):
    """The batched PyTorch solver on the instance (what map_counts runs beyond 400 cells), at any size."""
    energy = Poisson(inst.observed, rate=inst.rate, scale=float(inst.population))
    return _best(lambda: solve(LinearChain(), inst.potentials, energy, method="md", tol=1e-6, max_iter=300), repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grids", type=positive_int, nargs="*", default=[5, 10, 15], help="sizes with both solvers")
    parser.add_argument("--ours-only", type=positive_int, nargs="*", default=[32], help="sizes with ours alone")
    parser.add_argument("--steps", type=positive_int, default=10)
    parser.add_argument("--step-sweep", type=positive_int, nargs="*", default=[5, 10, 20, 40],
                        help="T values timed for ours at the grid --sweep-grid")
    parser.add_argument("--sweep-grid", type=positive_int, default=10)
    parser.add_argument("--population", type=positive_int, default=100_000)
    parser.add_argument("--rate", type=positive_float, default=0.5)
    parser.add_argument("--repeats", type=positive_int, default=3)
    parser.add_argument("--png", default=str(Path(__file__).with_name("cgm.png")),
                        help="the runtime plot (default: cgm.png beside this script; '' for none)")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--pytorch-path", action="store_true",
                        help="also time the batched PyTorch solver at the --grids and --ours-only sizes (map_counts "
                             "uses NumPy up to 400 cells)")
    args = parser.parse_args()
    if args.steps < 2 or any(t < 2 for t in args.step_sweep):
        parser.error("--steps and --step-sweep need T >= 2 (a chain of at least two steps)")
    for flag, path in (("--png", args.png), ("--json", args.json)):
        if path and not Path(path).resolve().parent.is_dir():      # found before the work, not after it
            parser.error(f"{flag}: the folder of {path} does not exist")
    if args.grids:                                                  # the peer, and the plot, before the work
        require("cvxpy", "cvxpy", "cgm")
        require("clarabel", "clarabel", "cgm")
    if args.png:
        require("matplotlib", "matplotlib", "plot")

    rows = []
    print(f"T = {args.steps}, population {args.population:,}, rate {args.rate}, {torch.get_num_threads()} threads")
    print(f"{'G':>3} {'s':>10} {'ours s':>9} {'iters':>6} {'IP s':>9} {'Clarabel s':>11} {'IP/ours':>9} "
          f"{'Clar/ours':>10} {'rel diff':>9}", flush=True)
    for g in list(args.grids) + list(args.ours_only):
        inst = simulate(default_model(g, args.steps), args.population, args.rate, seed=0)
        res, ours = _ours(inst, args.repeats)
        row = {"grid": g, "s": g ** 4, "ours_seconds": ours, "iterations": int(res.iterations.max()),
               "converged": bool(res.converged.all()), "objective": float(res.objective.sum())}
        if g in args.grids:
            ip = interior_point(inst.potentials, inst.observed, inst.rate, inst.population)
            failed = sorted({s for s in ip.status if s not in ("optimal", "optimal_inaccurate")})
            if failed:
                raise ValueError(f"CVXPY + Clarabel did not solve G = {g}: {'; '.join(failed)}")
            row.update(ip_seconds=ip.seconds, clarabel_seconds=ip.solve_seconds, ip_status=ip.status,
                       ip_objective=float(ip.objective.sum()),
                       relative_difference=abs(float(ip.objective.sum()) - row["objective"]) / abs(row["objective"]))
            print(f"{g:>3} {g ** 4:>10,} {ours:>9.4f} {row['iterations']:>6} {ip.seconds:>9.2f} "
                  f"{ip.solve_seconds:>11.2f} {ip.seconds / ours:>8.0f}x {ip.solve_seconds / ours:>9.0f}x "
                  f"{row['relative_difference']:>9.1e}", flush=True)
        else:
            print(f"{g:>3} {g ** 4:>10,} {ours:>9.4f} {row['iterations']:>6} {'-':>9} {'-':>11}", flush=True)
        if args.pytorch_path:
            sol, seconds = _pytorch_path(inst, args.repeats)
            row.update(pytorch_seconds=seconds, pytorch_iterations=int(sol.iterations.max()))
            print(f"    PyTorch path: {seconds:.4f} s, {row['pytorch_iterations']} iterations", flush=True)
        rows.append(row)

    sweep = []
    print(f"\nours against T at G = {args.sweep_grid} (s = {args.sweep_grid ** 4:,})")
    print(f"{'T':>4} {'ours s':>9} {'iters':>6} {'s per step':>11}")
    for t in args.step_sweep:
        inst = simulate(default_model(args.sweep_grid, t), args.population, args.rate, seed=0)
        res, ours = _ours(inst, args.repeats)
        sweep.append({"steps": t, "ours_seconds": ours, "iterations": int(res.iterations.max())})
        print(f"{t:>4} {ours:>9.4f} {sweep[-1]['iterations']:>6} {ours / t:>11.5f}", flush=True)

    if args.json:                        # before the plot, so a failed plot loses nothing
        Path(args.json).write_text(json.dumps({"sizes": rows, "steps": sweep, "threads": torch.get_num_threads()},
                                              indent=2) + "\n")
        print(f"\nwrote {args.json}")
    if args.png:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(5.5, 4))
        ax.loglog([r["s"] for r in rows], [r["ours_seconds"] for r in rows], "o-", label="Bethe mirror descent (ours)")
        both = [r for r in rows if "ip_seconds" in r]
        ax.loglog([r["s"] for r in both], [r["ip_seconds"] for r in both], "s-", label="CVXPY + Clarabel (all told)")
        ax.loglog([r["s"] for r in both], [r["clarabel_seconds"] for r in both], "s--", label="Clarabel solve alone")
        paper = {625: (0.19, 2.8), 10_000: (2.7, 93), 50_625: (14, 690)}
        ax.loglog(list(paper), [v[0] for v in paper.values()], "x:", color="gray", label="paper: Algorithm 1")
        ax.loglog(list(paper), [v[1] for v in paper.values()], "+:", color="black", label="paper: interior point")
        ax.set_xlabel("s = L^2 (cardinality of the edge potentials)")
        ax.set_ylabel(f"seconds (T = {args.steps})")
        ax.set_title("CGM MAP: runtime against problem size")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(args.png, dpi=120)
        print(f"wrote {args.png}")


if __name__ == "__main__":
    run(main)
