"""CGM MAP (eq. 23) on the CPU and on a CUDA device, measured in the same run.

For each grid G (L = G^2 cells, s = L^2): one synthetic instance, solved by ``map_counts`` (Bethe mirror
descent) on the CPU (the NumPy fast path up to 400 cells, the batched PyTorch solver beyond) and on the GPU
(the batched solver), best of --repeats after a warm-up run.  Prints seconds, the CPU / GPU ratio and the
relative objective difference (ratio: CPU seconds / device seconds).

Run:  python benchmarks/cgm_device.py [--grids 10 20 32] [--steps 10] [--repeats 3] [--device cuda]
"""

from __future__ import annotations

import argparse
import time

import torch
from _common import positive_int

from betheproj.cgm import default_model, map_counts, simulate


def _best(device: torch.device, problem: tuple, population: int, repeats: int):
    """The result of ``map_counts`` on ``problem`` and its best time over ``repeats`` runs after a warm-up."""
    res = map_counts(*problem, 0.5, population)
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        res = map_counts(*problem, 0.5, population)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return res, min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grids", type=positive_int, nargs="*", default=[10, 20, 32])
    parser.add_argument("--steps", type=positive_int, default=10)
    parser.add_argument("--population", type=positive_int, default=100_000)
    parser.add_argument("--repeats", type=positive_int, default=3)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("no CUDA device here")
    cpu = torch.device("cpu")
    print(f"CPU: {torch.get_num_threads()} threads; {device}: "
          f"{torch.cuda.get_device_name(device) if device.type == 'cuda' else device}")
    other = device.type.upper() + " s"
    print(f"{'G':>4} {'L':>6} {'s':>10} {'CPU s':>9} {other:>9} {'ratio':>8} {'iters':>6} {'rel. obj. diff':>15}")
    for grid in args.grids:
        model = default_model(grid, args.steps, 0)
        inst = simulate(model, args.population, 0.5, 1, 0.0, 0)
        pot = inst.potentials
        problems = {cpu: (pot, inst.observed), device: (pot.to(device), inst.observed.to(device))}
        (ours, t_cpu), (theirs, t_dev) = (_best(d, problems[d], args.population, args.repeats) for d in (cpu, device))
        gap = float(((theirs.objective.cpu() - ours.objective).abs() / ours.objective.abs()).max())
        cells = grid * grid
        print(f"{grid:>4} {cells:>6} {cells * cells:>10,} {t_cpu:>9.3f} {t_dev:>9.3f} {t_cpu / t_dev:>8.2f} "
              f"{int(theirs.iterations.max()):>6} {gap:>15.2e}", flush=True)


if __name__ == "__main__":
    main()
