"""The bird-migration CGM of section 8.3 on a synthetic instance: MAP counts (eq. 23), optionally against the
interior-point solver and with hard-EM learning of the transitions; behind ``betheproj cgm``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from .._checks import check_bool, check_device, check_type
from .._files import write_json
from ..cgm import TransitionModel, default_model, fit_hard_em, interior_point, map_counts, simulate
from ..cgm.interior_point import check_installed
from ..cgm.learn import check_schedule
from ..cgm.plot import plot_flows
from ..oracles import LinearChain

__all__ = ["count_error", "run"]


def count_error(counts: torch.Tensor, truth: torch.Tensor) -> float:
    """``||counts - truth||_1 / ||truth||_1``."""
    for name, x in (("counts", counts), ("truth", truth)):
        check_type(name, x, torch.Tensor, "a tensor")
    if counts.shape != truth.shape:                  # broadcasting would compare the wrong entries
        raise ValueError(f"counts must have the truth's shape {tuple(truth.shape)}, got {tuple(counts.shape)}")
    if not bool(truth.any()):
        raise ValueError("truth must not be all zero: the error is relative to its total")
    return float((counts - truth).abs().sum() / truth.abs().sum())


def _initial_model(grid: int, steps: int) -> TransitionModel:
    """Where learning starts: some preference for short moves, no drift, no attraction, a uniform start."""
    return TransitionModel(grid, steps, distance=0.5, drift=0.0)


def run(grid: int = 10, steps: int = 10, population: int = 100_000, rate: float = 0.5, seasons: int = 1,
        noise: float = 0.0, seed: int = 0, compare: bool = False, learn: bool = False, out: str | None = None,
        schedule: str = "quasi_newton", progress: bool = False, echo: Callable[[str], None] = print,
        device: str | torch.device = "cpu") -> dict[str, Any]:
    """Simulate an instance, solve (23), report; returns a JSON-ready dict (written to ``out/results.json``).

    ``device``: where the model, the instance and the solver live (e.g. ``"cuda"``).  The instance is drawn on
    the CPU either way (for a seed, the same instance on every device); on the CPU the NumPy fast path solves
    grids of up to 20 x 20, elsewhere the batched solver."""
    device = check_device("device", device)
    compare, learn = check_bool("compare", compare), check_bool("learn", learn)
    if learn:
        check_schedule(schedule)                        # before the solves, not after them
    if compare:
        check_installed()                               # likewise
    model = default_model(grid, steps, seed).to(device)
    inst = simulate(model, population, rate, seasons, noise, seed)
    cells = grid * grid
    echo(f"CGM: {grid}x{grid} grid (L = {cells} cells, s = L^2 = {cells * cells:,}), T = {steps} steps, "
         f"population {population:,}, detection rate {rate}, {seasons} season(s)")
    res = map_counts(inst.potentials, inst.observed, rate, population)
    prior = population * LinearChain().marginals(inst.potentials).node
    results: dict[str, Any] = {"grid": grid, "cells": cells, "s": cells * cells, "steps": steps,
                               "population": population, "device": str(device), "rate": rate, "seasons": seasons,
                               "noise": noise, "seed": seed, "objective": res.objective.tolist(),
                               "iterations": res.iterations.tolist(), "converged": res.converged.tolist(),
                               "seconds": res.seconds, "count_error": count_error(res.counts, inst.counts),
                               "prior_count_error": count_error(prior, inst.counts)}
    echo(f"Bethe mirror descent: objective {res.objective.sum().item():.10f}, iterations "
         f"{int(res.iterations.max())}, {'converged' if bool(res.converged.all()) else 'NOT converged'}, "
         f"{res.seconds:.3f} s")
    echo(f"count error (||counts - true||_1 / ||true||_1): {results['count_error']:.4f}; from the model alone "
         f"(population x prior marginals): {results['prior_count_error']:.4f}")
    if compare:
        ip = interior_point(inst.potentials, inst.observed, rate, population)
        gap = float(((ip.objective - res.objective).abs() / res.objective.abs().clamp_min(1e-300)).max())
        results["interior_point"] = {"objective": ip.objective.tolist(), "seconds": ip.seconds,
                                     "solve_seconds": ip.solve_seconds, "status": ip.status,
                                     "relative_gap": gap, "speedup": ip.seconds / res.seconds}
        echo(f"interior point (CVXPY + Clarabel): objective {ip.objective.sum().item():.10f}, {ip.seconds:.3f} s "
             f"({ip.solve_seconds:.3f} s inside Clarabel), status {', '.join(sorted(set(ip.status)))}")
        echo(f"relative objective difference {gap:.2e}; ours is {ip.seconds / res.seconds:.1f}x faster "
             f"({ip.solve_seconds / res.seconds:.1f}x against Clarabel's solve time alone)")
    if learn:
        learner = _initial_model(grid, steps).to(device)
        start_counts = map_counts(learner.potentials(seasons), inst.observed, rate, population).counts
        history = fit_hard_em(learner, inst.observed, rate, population, rounds=100, schedule=schedule,
                              progress=progress)
        learned = map_counts(learner.potentials(seasons), inst.observed, rate, population).counts
        true, got = model.centred(), learner.centred()
        errors = {"distance": abs(float(got["distance"] - true["distance"])),
                  "drift": abs(float(got["drift"] - true["drift"])),
                  "attraction_rms": float((got["attraction"] - true["attraction"]).pow(2).mean().sqrt()),
                  "attraction_rms_true": float(true["attraction"].pow(2).mean().sqrt())}
        results["learning"] = {"rounds": history.rounds, "converged": history.converged, "seconds": history.seconds,
                               "objective": history.objective, "learned": {k: v.tolist() for k, v in got.items()},
                               "errors": errors,
                               "count_error_initial": count_error(start_counts, inst.counts),
                               "count_error_learned": count_error(learned, inst.counts)}
        echo(f"hard EM ({schedule}): {history.rounds} E-steps, {history.seconds:.1f} s; "
             f"distance {float(got['distance']):.3f} "
             f"(true {float(true['distance']):.3f}), drift {float(got['drift']):.3f} "
             f"(true {float(true['drift']):.3f}), attraction RMS error {errors['attraction_rms']:.3f} "
             f"(RMS of the true {errors['attraction_rms_true']:.3f})")
        echo(f"count error with the initial parameters {results['learning']['count_error_initial']:.4f}, "
             f"with the learned {results['learning']['count_error_learned']:.4f}")
    if out is not None:
        folder = Path(out)
        folder.mkdir(parents=True, exist_ok=True)
        write_json(folder / "results.json", results)
        plot_flows(model, res.counts[0], res.flows()[0], str(folder / "flows.png"),
                   truth=(inst.counts[0], inst.flows[0]))
        echo(f"wrote {folder / 'results.json'}, {folder / 'flows.png'}")
    return results
