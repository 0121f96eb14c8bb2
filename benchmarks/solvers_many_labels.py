"""The three solvers on chains with many labels (run by hand): time, iterations and peak memory, with ratios against
mirror descent measured in the same run.

Problems shaped like the citation experiment's non-local row: B chains of N = 35 positions (lengths 10-35), C = 95
labels, random potentials with one shared transition table, and J = 40 smoothed-hinge label-count measurements
(``LinearMeasurements``, node marginals only), solved in float64 to the default tolerance with at most
``--max-iter`` iterations.  Mirror descent and Bethe-RDA keep one [C, C] edge offset per example for such an energy;
the accelerated method's objective at its averages reads their Bethe entropy, so it keeps the averages' edge
marginals, [B, N-1, C, C] (and no other edge state: its dual offsets stay 0 on the edges for an energy of node
marginals).  Each method runs in its own process, so that its peak resident memory is its own.  With
``--device cuda`` the same problems (drawn on the CPU, then moved) are solved on the GPU after a two-iteration
warm-up, and the memory columns are the device's peak allocation during the solve.

    python benchmarks/solvers_many_labels.py [--batch 64] [--max-iter 60] [--device cuda]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

import torch
from _common import positive_int, run

import betheproj as bp
from betheproj.energies import LinearMeasurements

METHODS = ("md", "rda", "accelerated")


def problem(batch: int, device: str = "cpu") -> tuple[bp.PairwisePotentials, LinearMeasurements]:
    """Drawn on the CPU (the same problems on every device), then put on ``device``."""
    g = torch.Generator().manual_seed(0)
    n, c, j = 35, 95, 40
    theta = bp.ChainPotentials(torch.randn(batch, n, c, generator=g, dtype=torch.float64) * 2,
                               torch.randn(c, c, generator=g, dtype=torch.float64),
                               torch.randint(10, n + 1, (batch,), generator=g))
    a = ((torch.rand(j, c, generator=g) < 0.1).double() - (torch.rand(j, c, generator=g) < 0.1).double())
    offset = torch.rand(j, generator=g, dtype=torch.float64) * 3
    psi = torch.rand(1, j, generator=g, dtype=torch.float64) * 3
    energy = LinearMeasurements(node=a.to(device), offset=offset.to(device), loss="smoothed_hinge", psi=psi.to(device))
    return theta.to(device), energy


def measure(method: str, batch: int, max_iter: int, device: str) -> dict:
    """Runs in a subprocess: one solve, as JSON."""
    torch.set_num_threads(2)
    theta, energy = problem(batch, device)
    if device == "cpu":
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    else:
        bp.solve(bp.LinearChain(), theta, energy, method=method, max_iter=2)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    start = time.perf_counter()
    sol = bp.solve(bp.LinearChain(), theta, energy, method=method, max_iter=max_iter)
    if device != "cpu":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    if device == "cpu":
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    else:
        peak = torch.cuda.max_memory_allocated() / 1024
        before /= 1024
    return {"seconds": seconds, "iterations": sol.iterations.double().mean().item(),
            "converged": sol.converged.double().mean().item(), "calls": sol.oracle_calls,
            "objective": sol.objective.sum().item(), "peak_mb": peak / 1024, "rise_mb": (peak - before) / 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=positive_int, default=64, help="chains in the batch (default 64)")
    parser.add_argument("--max-iter", type=positive_int, default=60, help="iterations at most (default 60)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where to solve (default cpu)")
    parser.add_argument("--measure", choices=METHODS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is available")
    if args.measure:
        print(json.dumps(measure(args.measure, args.batch, args.max_iter, args.device)))
        return
    where = "2 threads" if args.device == "cpu" else f"on {torch.cuda.get_device_name()}"
    print(f"{args.batch} chains, N = 35, C = 95, J = 40 measurements, float64, max_iter {args.max_iter}, {where}")
    rows = {}
    for method in METHODS:
        cmd = [sys.executable, __file__, "--measure", method, "--batch", str(args.batch),
               "--max-iter", str(args.max_iter), "--device", args.device]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(f"{method} failed: {out.stderr.strip().splitlines()[-1]}")
        rows[method] = json.loads(out.stdout)
    md = rows["md"]
    print(f"{'method':<12} {'seconds':>8} {'x md':>6} {'iters':>6} {'converged':>9} {'calls':>6} "
          f"{'objective':>16} {'peak MB':>8} {'solve MB':>8}")
    for method, r in rows.items():
        print(f"{method:<12} {r['seconds']:8.2f} {r['seconds'] / md['seconds']:6.1f} {r['iterations']:6.1f} "
              f"{r['converged']:9.1%} {r['calls']:6d} {r['objective']:16.6f} {r['peak_mb']:8.0f} {r['rise_mb']:8.0f}")
    memory = ("the rise of the process's peak resident memory during the solve" if args.device == "cpu" else
              "the device's peak allocation during the solve less what it held before (peak MB: that peak)")
    print(f"iters: mean over the chains, the accelerated method's mirror-descent rescue included; solve MB: {memory}")


if __name__ == "__main__":
    run(main)
