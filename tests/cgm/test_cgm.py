"""Collective graphical models: the simulator, MAP counts against the interior-point solver, bad input."""

import sys

import pytest
import torch

from betheproj.cgm import TransitionModel, default_model, interior_point, map_counts, simulate
from betheproj.oracles import LinearChain


def test_transition_model_is_a_normalised_markov_chain():
    model = default_model(3, 4, seed=1)
    log_p = model.log_transitions()
    assert log_p.shape == (3, 9, 9)
    assert torch.allclose(log_p.exp().sum(-1), torch.ones(3, 9, dtype=torch.float64), atol=1e-12)
    mu = LinearChain().marginals(model.potentials(2))
    assert torch.allclose(mu.log_partition, torch.zeros(2, dtype=torch.float64), atol=1e-12)
    prob = model.log_initial().exp()                                   # forward propagation of the chain
    for t in range(4):
        assert torch.allclose(mu.node[0, t], prob, atol=1e-12)
        if t < 3:
            prob = prob @ log_p[t].exp()


def test_drift_turns_from_north_to_south():
    model = TransitionModel(5, 5, distance=1.0, drift=3.0)
    centre = 12                                                        # cell (2, 2)
    moves = (model.log_transitions()[:, centre].exp()[..., None] * model.displacement[centre]).sum(1)
    assert moves[0, 0] > 0.5 and moves[-1, 0] < -0.5                  # rows: north first, south at the end
    assert moves[len(moves) // 2, 1] > 0.5                             # east in mid-season


def test_simulated_counts_are_consistent():
    inst = simulate(default_model(4, 5), population=700, rate=0.3, seasons=2, noise=0.3, seed=2)
    assert inst.counts.shape == (2, 5, 16) and inst.flows.shape == (2, 4, 16, 16)
    assert (inst.counts.sum(-1) == 700).all()
    assert torch.equal(inst.flows.sum(-1), inst.counts[:, :-1]) and torch.equal(inst.flows.sum(-2), inst.counts[:, 1:])
    assert (inst.observed >= 0).all() and torch.equal(inst.observed, inst.observed.round())
    assert inst.observed.sum() < inst.counts.sum()                    # detection rate 0.3


def test_same_objective_as_the_interior_point_solver():
    """s = 625 (a 5 x 5 grid), T = 10: the objective of (23) to 1e-6 relative, and the same counts."""
    pytest.importorskip("cvxpy")
    inst = simulate(default_model(5, 10, seed=3), population=20_000, rate=0.5, seasons=2, noise=0.3, seed=3)
    ours = map_counts(inst.potentials, inst.observed, 0.5, 20_000)
    ip = interior_point(inst.potentials, inst.observed, 0.5, 20_000)
    assert ip.status == ["optimal", "optimal"] and bool(ours.converged.all())
    assert torch.allclose(ours.objective, ip.objective, rtol=1e-6, atol=0)
    assert (ours.counts - 20_000 * ip.node).abs().max() < 1.0          # of 20,000 individuals


def test_map_counts_beat_the_prior_and_respect_the_population():
    """Data from perturbed transitions (noise 0.5), MAP with the unperturbed model: the observations correct
    the model.  Measured: count error 0.082 against 0.121 for the model's marginals alone."""
    model = default_model(5, 8, seed=4)
    inst = simulate(model, population=50_000, rate=0.5, noise=0.5, seed=4)
    with torch.no_grad():
        potentials = model.potentials()
    res = map_counts(potentials, inst.observed, 0.5, 50_000)
    prior = 50_000 * LinearChain().marginals(potentials).node
    error = (res.counts - inst.counts).abs().sum() / inst.counts.sum()
    assert error < 0.8 * (prior - inst.counts).abs().sum() / inst.counts.sum()
    assert torch.allclose(res.counts.sum(-1), torch.full((1, 8), 50_000.0, dtype=torch.float64))
    flows = res.flows()
    assert torch.allclose(flows.sum(-1), res.counts[:, :-1], atol=1e-6)


@pytest.mark.parametrize("change, message", [
    (lambda y: -y, "non-negative"),
    (lambda y: y + 0.5, "whole numbers"),
    (lambda y: y[..., :-1], "shape"),
    (lambda y: y * float("nan"), "finite"),
])
def test_bad_observations(change, message):
    inst = simulate(default_model(3, 4), population=100, rate=1.0, seed=0)
    observed = inst.observed.clone()
    observed[0, 0, 0] = 3.0
    with pytest.raises(ValueError, match=message):
        map_counts(inst.potentials, change(observed), 1.0, 100)


@pytest.mark.parametrize("rate, population, message", [(0.0, 100, "rate"), (-1.0, 100, "rate"),
                                                       (float("inf"), 100, "rate"), (1.0, 0, "population")])
def test_bad_rate_and_population(rate, population, message):
    inst = simulate(default_model(3, 4), population=100, rate=1.0, seed=0)
    with pytest.raises(ValueError, match=message):
        map_counts(inst.potentials, inst.observed, rate, population)


def test_bad_model_and_simulation_arguments():
    with pytest.raises(ValueError, match="grid"):
        TransitionModel(0, 5)
    with pytest.raises(ValueError, match="steps"):
        TransitionModel(3, 1)
    with pytest.raises(ValueError, match="attraction"):
        TransitionModel(3, 4, attraction=torch.zeros(8))
    with pytest.raises(ValueError, match="rate"):
        simulate(default_model(3, 4), rate=0.0)
    with pytest.raises(TypeError, match="population must be an int"):
        simulate(default_model(3, 4), population=2.5)
    with pytest.raises(TypeError, match="observed"):
        map_counts(default_model(3, 4).potentials(), "counts", 1.0, 10)


def test_float32_models_refuse_counts_they_cannot_hold_exactly():
    small = simulate(default_model(2, 3, dtype=torch.float32), population=2 ** 24, rate=0.5, seed=0)
    assert small.counts.sum(-1).eq(2 ** 24).all()
    with pytest.raises(ValueError, match=r"holds counts exactly only up to 2\*\*24 = 16777216.*population 16777217"):
        simulate(default_model(2, 3, dtype=torch.float32), population=2 ** 24 + 1, rate=0.5, seed=0)
    with pytest.raises(ValueError, match="has a count of"):            # a Poisson observation above 2**24
        simulate(default_model(2, 3, dtype=torch.float32), population=2 ** 23, rate=4.0, seed=0)
    big = simulate(default_model(2, 3), population=2 ** 24 + 1, rate=0.5, seed=0)
    assert big.counts.sum(-1).eq(2 ** 24 + 1).all()


def test_float64_models_refusing_huge_counts_say_what_to_do():
    """A float64 model already: the remedy is a smaller population (or rate), not "use a float64 model"."""
    with pytest.raises(ValueError, match=r"up to 2\*\*53 .*population 9007199254740993\); use a smaller population$"):
        simulate(default_model(2, 2), population=2 ** 53 + 1, rate=0.5, seed=0)
    with pytest.raises(ValueError, match=r"has a count of .*; use a smaller population or rate$"):
        simulate(default_model(2, 2), population=2 ** 53, rate=2.0, seed=0)
    with pytest.raises(ValueError, match=r"use a float64 model \(exact up to 2\*\*53\) or a smaller population$"):
        simulate(default_model(2, 3, dtype=torch.float32), population=2 ** 24 + 1, rate=0.5, seed=0)


def _learning_instance():
    model = default_model(3, 5, seed=5)
    return model, simulate(model, population=200_000, rate=0.5, seasons=3, seed=5)


def test_hard_em_alternating_decreases_the_objective():
    from betheproj.cgm import fit_hard_em
    from betheproj.experiments.cgm import _initial_model

    _, inst = _learning_instance()
    learner = _initial_model(3, 5)
    history = fit_hard_em(learner, inst.observed, 0.5, 200_000, rounds=4, m_iter=30)
    values = history.objective
    assert len(values) == 4 and len(history.parameters) == 4
    assert all(b <= a + 1e-9 * abs(a) for a, b in zip(values, values[1:], strict=False))
    assert values[-1] < values[0] - 1e-3


def test_hard_em_recovers_the_transition_parameters():
    """Known parameters generate three seasons of 200,000 individuals on a 3 x 3 grid; learning from the
    observed counts alone, starting far away (distance 0.5, no drift, no attraction, uniform start).  Measured:
    errors 0.003 (distance), 0.002 (drift), 0.006 RMS (attraction; the true values have RMS 0.6); count error
    0.57 with the initial parameters, 0.003 with the learned ones."""
    from betheproj.cgm import fit_hard_em
    from betheproj.experiments.cgm import _initial_model, count_error

    model, inst = _learning_instance()
    learner = _initial_model(3, 5)
    before = map_counts(learner.potentials(3), inst.observed, 0.5, 200_000).counts
    fit_hard_em(learner, inst.observed, 0.5, 200_000, rounds=80, schedule="quasi_newton")
    after = map_counts(learner.potentials(3), inst.observed, 0.5, 200_000).counts
    true, got = model.centred(), learner.centred()
    assert abs(float(got["distance"] - true["distance"])) < 0.05                # measured 0.003
    assert abs(float(got["drift"] - true["drift"])) < 0.05                      # measured 0.002
    assert float((got["attraction"] - true["attraction"]).pow(2).mean().sqrt()) < 0.03   # measured 0.006
    assert count_error(after, inst.counts) < 0.5 * count_error(before, inst.counts)


def test_hard_em_bad_arguments():
    from betheproj.cgm import fit_hard_em

    model, inst = _learning_instance()
    with pytest.raises(ValueError, match="schedule"):
        fit_hard_em(model, inst.observed, 0.5, 200_000, schedule="newton")
    with pytest.raises(ValueError, match="rounds"):
        fit_hard_em(model, inst.observed, 0.5, 200_000, rounds=0)
    with pytest.raises(ValueError, match="rate"):
        fit_hard_em(model, inst.observed, -0.5, 200_000)
    for options, error, message in [({"m_iter": 0}, ValueError, "m_iter must be an int >= 1"),
                                    ({"m_iter": 2.5}, TypeError, "m_iter must be an int"),
                                    ({"m_iter": None}, TypeError, "m_iter must be an int"),
                                    ({"tol": -1.0}, ValueError, "tol must be a finite number >= 0"),
                                    ({"tol": float("nan")}, ValueError, "tol must be"),
                                    ({"progress": "yes"}, TypeError, "progress must be a bool")]:
        with pytest.raises(error, match=message):
            fit_hard_em(model, inst.observed, 0.5, 200_000, **options)


def test_hard_em_learns_only_the_parameters_left_trainable():
    from betheproj.cgm import fit_hard_em

    model, inst = _learning_instance()
    named = dict(model.named_parameters())
    for p in named.values():
        p.requires_grad_(False)
    for schedule in ("alternate", "quasi_newton"):
        with pytest.raises(ValueError, match="model has nothing to learn: every parameter has requires_grad=False"):
            fit_hard_em(model, inst.observed, 0.5, 200_000, rounds=2, schedule=schedule)
    name = next(iter(named))
    named[name].requires_grad_(True)
    before = {k: v.detach().clone() for k, v in named.items()}
    fit_hard_em(model, inst.observed, 0.5, 200_000, rounds=3)
    assert not torch.equal(named[name], before[name])
    assert all(torch.equal(named[k], before[k]) for k in named if k != name)


def _small_instance():
    return simulate(default_model(2, 3), population=100, rate=0.5, seed=0)


@pytest.mark.parametrize("method", ["md", "rda"])
@pytest.mark.parametrize("kwargs, error, message", [
    ({"tol": float("nan")}, ValueError, "tol"),
    ({"tol": -1.0}, ValueError, "tol"),
    ({"tol": "small"}, TypeError, "tol"),
    ({"max_iter": -1}, ValueError, "max_iter"),
    ({"max_iter": True}, TypeError, "max_iter"),
    ({"warm_start": torch.zeros(1)}, TypeError, "warm_start"),
])
def test_bad_solver_arguments_on_the_fast_path_too(method, kwargs, error, message):
    """The NumPy fast path (CPU, <= 400 cells, md) runs before solve(): map_counts checks them itself."""
    inst = _small_instance()
    with pytest.raises(error, match=message):
        map_counts(inst.potentials, inst.observed, 0.5, 100, method=method, **kwargs)


def test_rate_and_population_of_numpy_and_tensor_types():
    import numpy as np

    inst = _small_instance()
    expected = map_counts(inst.potentials, inst.observed, 0.5, 100).counts
    got = map_counts(inst.potentials, inst.observed, np.float32(0.5), torch.tensor(100)).counts
    assert torch.equal(got, expected)
    for rate in (np.bool_(True), torch.tensor([0.5]), "0.5"):
        with pytest.raises(TypeError, match="rate must be a real number"):
            map_counts(inst.potentials, inst.observed, rate, 100)


@pytest.mark.parametrize("kwargs, name", [
    ({"distance": float("nan")}, "distance"),
    ({"drift": float("inf")}, "drift"),
    ({"attraction": torch.tensor([float("nan"), 0.0, 0.0, 0.0])}, "attraction"),
    ({"initial": torch.tensor([float("inf"), 0.0, 0.0, 0.0])}, "initial"),
    ({"initial": torch.tensor([float("-inf"), 0.0, 0.0, 0.0])}, "initial"),
])
def test_non_finite_model_parameters(kwargs, name):
    with pytest.raises(ValueError, match=name):
        TransitionModel(2, 3, **kwargs)


@pytest.mark.parametrize("kwargs, error, message", [
    ({"rate": True}, TypeError, "rate"),
    ({"noise": True}, TypeError, "noise"),
    ({"noise": float("inf")}, ValueError, "noise"),
    ({"noise": float("nan")}, ValueError, "noise"),
    ({"noise": 1.7e308}, ValueError, r"^noise 1.7e\+308 times the N\(0, 1\) draws overflows"),   # numpy's "pvals"
    ({"rate": 1e300}, ValueError, "rate \\* population"),
    ({"model": None}, TypeError, "model"),
    ({"population": 10 ** 19, "rate": 1e-5}, ValueError, "population must be an int in"),
    ({"seed": -1}, ValueError, "seed must be an int in"),
    ({"seed": 1.5}, TypeError, "seed must be an int"),
])
def test_bad_simulation_arguments(kwargs, error, message):
    kwargs = {"model": default_model(2, 3), "population": 10, **kwargs}
    with pytest.raises(error, match=message):
        simulate(**kwargs)


def test_the_largest_seed_simulates_with_noise():
    inst = simulate(default_model(2, 3, seed=2 ** 63 - 1), population=10, noise=0.1, seed=2 ** 63 - 1)
    assert inst.counts.sum(-1).eq(10).all()


@pytest.mark.parametrize("dtype", [torch.int64, torch.float16, "float64"])
def test_models_are_float32_or_float64(dtype):
    for make in (lambda: TransitionModel(2, 3, dtype=dtype), lambda: default_model(2, 3, dtype=dtype)):
        with pytest.raises(TypeError, match="dtype must be torch.float32 or torch.float64"):
            make()


@pytest.mark.parametrize("rate, population", [(1e-170, 1e-170), (1e200, 1e200)])
def test_expected_counts_beyond_float64_are_refused(rate, population):
    inst = _small_instance()
    with pytest.raises(ValueError, match=r"rate \* population must be a normal float64 number"):
        map_counts(inst.potentials, inst.observed, rate, population)


def test_interior_point_reports_a_failed_solve_and_takes_an_empty_batch():
    pytest.importorskip("cvxpy")
    inst = _small_instance()
    node = inst.potentials.node.clone()
    node[0, 0, 0] = -float("inf")                           # a cell theta forbids ...
    observed = inst.observed.clone()
    observed[0, 0, 0] = 5.0                                 # ... where birds were seen: no feasible optimum
    res = interior_point(type(inst.potentials)(node, inst.potentials.edge), observed, 0.5, 100)
    assert res.status[0] != "optimal" and torch.isnan(res.objective[0])
    empty = interior_point(type(inst.potentials)(node[:0], inst.potentials.edge[:0]), observed[:0], 0.5, 100)
    assert empty.objective.shape == (0,) and empty.node.shape == (0, *node.shape[1:]) and empty.status == []


def test_interior_point_reports_no_value_as_nan_not_as_an_infinite_objective():
    """Clarabel's "unbounded" on a bounded problem (1e15 counts of 10 birds) came back as an objective of -inf
    with zero marginals, as if it were the optimum; a solve without marginals is NaN, as documented."""
    pytest.importorskip("cvxpy")
    res = interior_point(default_model(2, 2).potentials(1), torch.full((1, 2, 4), 1e15), 0.5, 10)
    assert res.status[0] != "optimal" and torch.isnan(res.objective[0]) and (res.node == 0).all()


def test_hard_em_takes_observations_as_arrays_and_lists():
    from betheproj.cgm import fit_hard_em
    from betheproj.experiments.cgm import _initial_model

    inst = _small_instance()
    reference = _initial_model(2, 3)
    expected = fit_hard_em(reference, inst.observed, 0.5, 100, rounds=2, m_iter=5).objective
    for observed in (inst.observed.numpy(), inst.observed.tolist()):
        learner = _initial_model(2, 3)
        assert fit_hard_em(learner, observed, 0.5, 100, rounds=2, m_iter=5).objective == expected
    with pytest.raises(TypeError, match="observed"):
        fit_hard_em(_initial_model(2, 3), "counts", 0.5, 100)
    with pytest.raises(ValueError, match="observed must have"):
        fit_hard_em(_initial_model(2, 3), inst.observed[0, 0], 0.5, 100)


def test_hard_em_quasi_newton_runs_at_most_one_e_step_past_rounds():
    from betheproj.cgm import fit_hard_em
    from betheproj.experiments.cgm import _initial_model

    observed = simulate(default_model(2, 3, seed=2), population=500, rate=0.5, seed=2).observed
    for rounds in (1, 3):
        history = fit_hard_em(_initial_model(2, 3), observed, 0.5, 500, rounds=rounds, schedule="quasi_newton")
        assert 1 <= history.rounds <= rounds + 1 and len(history.objective) == history.rounds


@pytest.mark.parametrize("kwargs, name", [
    ({"scale": 0.0}, "scale"), ({"scale": -1.0}, "scale"), ({"scale": float("inf")}, "scale"),
    ({"tol": -1.0}, "tol"), ({"tol": float("nan")}, "tol"),
])
def test_interior_point_bad_scale_and_tol(kwargs, name):
    inst = _small_instance()    # checked before cvxpy is imported: no need to skip without it
    with pytest.raises(ValueError, match=name):
        interior_point(inst.potentials, inst.observed, 0.5, 100, **kwargs)


def test_the_fast_path_reports_its_residual_like_solve():
    """The NumPy path's Solution carries its stationarity residuals (it reported 0 for unconverged examples)."""
    from betheproj.energies import Poisson
    from betheproj.inference import solve
    from betheproj.oracles import LinearChain

    inst = simulate(default_model(3, 4), population=200, rate=0.5, seasons=2)
    fast = map_counts(inst.potentials, inst.observed, 0.5, 200, max_iter=2)
    generic = solve(LinearChain(), inst.potentials, Poisson(inst.observed, rate=0.5, scale=200.0), method="md",
                    max_iter=2)
    assert not fast.converged.any()
    assert fast.solution.residual.dtype == inst.potentials.node.dtype
    assert torch.allclose(fast.solution.residual, generic.residual, rtol=1e-9)


def test_interior_point_keeps_the_dtype():
    pytest.importorskip("cvxpy")
    inst = simulate(default_model(2, 3), population=100, rate=0.5, seed=0)
    pot = inst.potentials
    pot32 = type(pot)(pot.node.float(), pot.edge.float(), pot.lengths)
    ip = interior_point(pot32, inst.observed, 0.5, 100)
    assert ip.node.dtype == torch.float32 and ip.objective.dtype == torch.float32


@pytest.mark.parametrize("kwargs, message", [
    ({"distance": 1e39, "dtype": torch.float32}, "distance must be finite in torch.float32"),
    ({"drift": -1e39, "dtype": torch.float32}, "drift must be finite in torch.float32"),
    ({"drift": 1e308}, "overflow the transition scores"),            # a score of +inf: NaN transitions
    ({"distance": -1e308}, "overflow the transition scores"),
])
def test_model_parameters_that_overflow_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TransitionModel(3, 3, **kwargs)


@pytest.mark.parametrize("value", ["abcd", torch.tensor([True, False, True, False]), torch.ones(4, dtype=torch.cfloat)])
def test_cell_parameters_must_be_real_arrays(value):
    for name in ("attraction", "initial"):
        with pytest.raises(TypeError, match=name):
            TransitionModel(2, 3, **{name: value})


def test_a_warm_start_of_another_dtype_is_refused_on_the_fast_path_too():
    """solve() refuses it (the generic path, e.g. on CUDA); the NumPy path used to take it."""
    from betheproj.oracles import ChainPotentials

    inst = _small_instance()
    warm = map_counts(inst.potentials, inst.observed, 0.5, 100).potentials
    warm32 = ChainPotentials(warm.node.float(), warm.edge.float())
    with pytest.raises(TypeError, match="warm_start must have the potentials' dtype torch.float64"):
        map_counts(inst.potentials, inst.observed, 0.5, 100, warm_start=warm32)


def test_a_warm_start_of_other_lengths_is_refused_on_the_fast_path_too():
    """solve() refuses it; the NumPy path took it."""
    from betheproj.oracles import ChainPotentials

    inst = simulate(default_model(3, 5, seed=4), population=5000, rate=0.3, seasons=3, seed=4)
    short = ChainPotentials(inst.potentials.node, inst.potentials.edge, torch.tensor([5, 3, 2]))
    with pytest.raises(ValueError, match="warm_start has other lengths than the potentials"):
        map_counts(short, inst.observed, 0.3, 5000, warm_start=inst.potentials)


def test_an_objective_beyond_float32_is_left_to_the_generic_solver():
    """The NumPy path (float64 inside) returned an objective of inf marked converged where float32 cannot hold
    its 1.4e39; the generic solver names the problem.  And what the fast path returns requires no grad."""
    from betheproj.oracles import ChainPotentials

    pot = ChainPotentials(torch.zeros(1, 2, 2), torch.zeros(1, 1, 2, 2))
    with pytest.raises(ValueError, match="the objective is not finite at the base marginals"):
        map_counts(pot, torch.tensor([[[1e7, 0.0], [1e7, 0.0]]]), 1.0, 1e-30)
    inst = _small_instance()
    node = inst.potentials.node.clone().requires_grad_(True)
    result = map_counts(ChainPotentials(node, inst.potentials.edge), inst.observed, 0.5, 100)
    assert not result.potentials.node.requires_grad


def test_observed_counts_the_potentials_cannot_hold_exactly_are_refused():
    """Checked as given: float32 potentials used to round 2**24 + 1 to 2**24 and 2**25 + 0.5 to a whole 2**25."""
    from betheproj.cgm import check_observations

    small = default_model(1, 2, dtype=torch.float32).potentials()
    with pytest.raises(ValueError, match=r"float32 \(every whole number up to 2\*\*24 = 16777216 is\), got "
                                         r"33554432.5, which it rounds to 33554432.0"):
        check_observations(torch.tensor([[[2.0], [2.0 ** 25 + 0.5]]], dtype=torch.float64), 1.0, 2 ** 24, small)
    with pytest.raises(ValueError, match=r"up to 2\*\*24 = 16777216 is\), got 16777217, which it rounds to 16777216"):
        check_observations(torch.tensor([[[2 ** 24 + 1], [2]]]), 1.0, 2 ** 24, small)
    with pytest.raises(ValueError, match=r"up to 2\*\*53 = 9007199254740992 is\), got 9007199254740993"):
        map_counts(default_model(1, 2).potentials(), torch.tensor([[[2 ** 53 + 1], [2]]]), 1.0, 2 ** 53)
    for dtype in (torch.int32, torch.uint32, torch.uint64, torch.float16):        # exact: taken as they are
        exact = check_observations(torch.tensor([[[2 ** 11], [2]]], dtype=dtype), 1.0, 2 ** 24, small)
        assert exact.dtype == torch.float32 and exact.flatten().tolist() == [2 ** 11, 2]


@pytest.mark.parametrize("panels, error", [(0, ValueError), (-1, ValueError), ("5", TypeError), (2.5, TypeError)])
def test_plot_flows_checks_panels(panels, error, tmp_path):
    from betheproj.cgm.plot import plot_flows

    inst = _small_instance()
    with pytest.raises(error, match="panels must be an int"):
        plot_flows(inst.model, inst.counts[0], inst.flows[0], str(tmp_path / "flows.png"), panels=panels)


def test_plot_flows_checks_the_shapes_of_counts_and_flows(tmp_path):
    """A season's batch [B, T, L] (result.counts rather than result.counts[0]) or counts of another grid were a
    bare RuntimeError from reshape."""
    from betheproj.cgm.plot import plot_flows

    inst = _small_instance()
    t, cells = inst.model.steps, inst.model.cells
    path = str(tmp_path / "flows.png")
    batched = rf"counts must have shape \[T, L\] \(one season, L = {cells} cells.*got \(1, {t}, {cells}\)"
    with pytest.raises(ValueError, match=batched):
        plot_flows(inst.model, inst.counts, inst.flows[0], path)
    with pytest.raises(ValueError, match=r"flows must have shape \[T-1, L, L\]"):
        plot_flows(inst.model, inst.counts[0], inst.flows, path)
    with pytest.raises(ValueError, match=r"truth\[0\] must have shape \[T, L\]"):
        plot_flows(inst.model, inst.counts[0], inst.flows[0], path, truth=(inst.counts[0][:, :-1], inst.flows[0]))
    # a truth of fewer steps was an IndexError ("index 1 is out of bounds for dimension 0 with size 1"); one of
    # more steps was drawn at the counts' panels, cut short
    for steps in (2, t + 1):
        counts = torch.zeros(steps, cells, dtype=inst.counts.dtype)
        flows = torch.zeros(steps - 1, cells, cells, dtype=inst.flows.dtype)
        with pytest.raises(ValueError, match=rf"truth must cover the counts' {t} steps, got {steps}"):
            plot_flows(inst.model, inst.counts[0], inst.flows[0], path, truth=(counts, flows))
    with pytest.raises(TypeError, match="counts must be a tensor"):
        plot_flows(inst.model, inst.counts[0].tolist(), inst.flows[0], path)
    with pytest.raises(TypeError, match="model must be a TransitionModel"):
        plot_flows(None, inst.counts[0], inst.flows[0], path)
    plot_flows(inst.model, inst.counts[0], inst.flows[0], path)


def test_plot_flows_closes_its_figure_when_the_file_cannot_be_written(tmp_path):
    """A path in a missing folder raised the OSError but left the figure open (one more each call; matplotlib warns
    past 20 and keeps their memory)."""
    import matplotlib.pyplot as plt

    from betheproj.cgm.plot import plot_flows

    inst = _small_instance()
    before = plt.get_fignums()
    with pytest.raises(OSError):
        plot_flows(inst.model, inst.counts[0], inst.flows[0], str(tmp_path / "missing" / "flows.png"))
    assert plt.get_fignums() == before


@pytest.mark.parametrize("missing", ["clarabel", "cvxpy"])
def test_interior_point_without_its_solver_is_an_import_error(monkeypatch, missing):
    """Without clarabel (cvxpy installed) each solve came back as status "solver_error: The solver CLARABEL is not
    installed." with a NaN objective, and `betheproj cgm --compare` exited 0 with a relative difference of nan."""
    pytest.importorskip("cvxpy")
    monkeypatch.setitem(sys.modules, missing, None)          # as if not installed
    inst = _small_instance()
    with pytest.raises(ImportError, match=r'needs cvxpy and clarabel: pip install "betheproj\[cgm\]"'):
        interior_point(inst.potentials, inst.observed, 0.5, 100)
