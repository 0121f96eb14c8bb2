"""The CGM experiment behind ``betheproj cgm``: its results on the CPU and on another device agree."""

import pytest

from betheproj.experiments import cgm


def _quiet(line: str) -> None:
    pass


def test_run_reports_the_device_and_a_small_count_error():
    res = cgm.run(grid=3, steps=4, population=5000, echo=_quiet)
    assert res["device"] == "cpu" and all(res["converged"])
    assert res["count_error"] < res["prior_count_error"]


def test_run_refuses_an_unknown_device():
    with pytest.raises(ValueError, match="device must name a device such as 'cpu' or 'cuda', got 'gpu0'"):
        cgm.run(grid=3, steps=4, echo=_quiet, device="gpu0")
    with pytest.raises(TypeError, match="device must be a torch.device or a string"):
        cgm.run(grid=3, steps=4, echo=_quiet, device=0)


def test_run_on_the_accelerator_matches_the_cpu(accelerator):
    """The CPU takes the NumPy fast path, CUDA the batched solver: the same optimum, the same learned model."""
    kwargs = dict(grid=3, steps=4, population=5000, seasons=2, learn=True, echo=_quiet)
    cpu, dev = cgm.run(**kwargs), cgm.run(**kwargs, device=accelerator)
    assert dev["device"] == str(accelerator)
    assert dev["objective"] == pytest.approx(cpu["objective"], rel=1e-9)
    assert dev["count_error"] == pytest.approx(cpu["count_error"], rel=1e-6)
    for name, value in cpu["learning"]["learned"].items():
        assert dev["learning"]["learned"][name] == pytest.approx(value, rel=1e-4, abs=1e-6)


def test_results_json_is_strict_json_when_the_interior_point_solve_fails(tmp_path, monkeypatch):
    """A failed Clarabel solve has a NaN objective: results.json says null, not the bare NaN JSON does not allow."""
    import json

    import torch

    from betheproj.cgm import IPResult

    def failed(potentials, observed, rate, population):
        b = potentials.node.shape[0]
        return IPResult(torch.full((b,), float("nan"), dtype=torch.float64), torch.zeros_like(potentials.node),
                        0.1, 0.0, ["solver_error: numerical trouble"] * b)

    monkeypatch.setattr(cgm, "interior_point", failed)
    res = cgm.run(grid=3, steps=4, population=5000, compare=True, out=str(tmp_path), echo=_quiet)
    assert res["interior_point"]["relative_gap"] != res["interior_point"]["relative_gap"]      # NaN in memory

    def refuse(name):
        raise AssertionError(f"{name} in results.json")

    saved = json.loads((tmp_path / "results.json").read_text(), parse_constant=refuse)
    assert saved["interior_point"]["relative_gap"] is None and saved["interior_point"]["objective"] == [None]
    assert saved["count_error"] == pytest.approx(res["count_error"])


def test_run_checks_its_switches_and_the_schedule_before_solving(monkeypatch):
    import betheproj.experiments.cgm as module

    def no_solve(*args, **kwargs):
        raise AssertionError("solved before the options were checked")

    monkeypatch.setattr(module, "map_counts", no_solve)
    with pytest.raises(ValueError, match="schedule must be 'alternate' or 'quasi_newton', got 'newton'"):
        cgm.run(grid=3, steps=4, learn=True, schedule="newton", echo=_quiet)
    with pytest.raises(TypeError, match="compare must be a bool"):
        cgm.run(grid=3, steps=4, compare="yes", echo=_quiet)
    with pytest.raises(TypeError, match="learn must be a bool"):
        cgm.run(grid=3, steps=4, learn=1, echo=_quiet)


def test_count_error_refuses_an_all_zero_truth_and_shapes_that_differ():
    """An all-zero truth gave NaN (or inf), and counts of another shape were broadcast against the truth."""
    import torch

    truth = torch.tensor([[1.0, 3.0], [2.0, 2.0]])
    assert cgm.count_error(truth + 1, truth) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="truth must not be all zero"):
        cgm.count_error(torch.zeros(2, 2), torch.zeros(2, 2))
    with pytest.raises(ValueError, match=r"counts must have the truth's shape \(2, 2\), got \(2,\)"):
        cgm.count_error(truth[0], truth)


def test_compare_without_clarabel_is_an_import_error_before_the_work(monkeypatch):
    """run(compare=True) without clarabel returned an interior-point objective of NaN, status "solver_error: The
    solver CLARABEL is not installed.", and a relative gap of NaN."""
    import sys

    from betheproj.experiments import cgm

    monkeypatch.setitem(sys.modules, "clarabel", None)
    monkeypatch.setattr(cgm, "simulate", None)              # the instance is never drawn
    with pytest.raises(ImportError, match="needs cvxpy and clarabel"):
        cgm.run(2, 2, 100, compare=True, echo=lambda line: None)
