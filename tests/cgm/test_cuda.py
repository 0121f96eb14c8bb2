"""The collective graphical models on an accelerator agree with the CPU: the transition model, the simulator, MAP
counts (the CPU's NumPy fast path against the accelerator's general solver), the interior-point baseline and hard
EM (the ``accelerator`` fixture: CUDA, else skip)."""

import copy

import pytest
import torch

from betheproj.cgm import TransitionModel, default_model, fit_hard_em, interior_point, map_counts, simulate
from betheproj.oracles import ChainPotentials
from tests.devices import agree

F64, F32 = torch.float64, torch.float32
TOL = {F64: dict(rtol=1e-8, atol=1e-10), F32: dict(rtol=1e-4, atol=1e-5)}
POPULATION, RATE = 400, 0.5


def _agree(ref, out, device: torch.device, dtype: torch.dtype = F64, **tol) -> None:
    """``out`` (the accelerator's) agrees with the CPU's ``ref``: to ``tol``, by default the dtype's."""
    agree(ref, out, device, **(tol or TOL[dtype]))


def _instance(grid=3, steps=4, seasons=2, noise=0.2, dtype=F64):
    """A simulated instance from a default model, on the CPU."""
    return simulate(default_model(grid, steps, seed=1, dtype=dtype), POPULATION, RATE, seasons, noise, seed=3)


@pytest.mark.parametrize("dtype", [F64, F32])
def test_transition_model(accelerator, dtype):
    model = default_model(3, 4, seed=2, dtype=dtype)
    runs = []
    for device in (torch.device("cpu"), accelerator):
        m = copy.deepcopy(model).to(device)
        pot = m.potentials(2)
        (pot.edge.exp() * m.log_transitions()).sum().backward()
        runs.append([m.log_initial(), m.log_transitions(), pot.node, pot.edge, pot.lengths, m.centred(),
                     {k: p.grad for k, p in m.named_parameters()}])
    _agree(*runs, accelerator, dtype)


def test_transition_model_lives_where_its_tensors_do(accelerator):
    gen = torch.Generator().manual_seed(1)
    attraction, initial = torch.randn(9, generator=gen, dtype=F64), torch.randn(9, generator=gen, dtype=F64)
    cpu = TransitionModel(3, 4, attraction=attraction, initial=initial)
    dev = TransitionModel(3, 4, attraction=attraction.to(accelerator), initial=initial.to(accelerator))
    assert all(t.device.type == accelerator.type for t in [*dev.parameters(), *dev.buffers()])
    _agree([cpu.log_transitions(), cpu.potentials(2).node], [dev.log_transitions(), dev.potentials(2).node],
           accelerator, F64)
    if accelerator.type != "cpu":
        with pytest.raises(ValueError, match="attraction and initial must be on one device"):
            TransitionModel(3, 4, attraction=attraction.to(accelerator), initial=initial)


@pytest.mark.parametrize("dtype", [F64, F32])
@pytest.mark.parametrize("noise", [0.0, 0.3])
def test_simulate(accelerator, noise, dtype):
    """The same draw (NumPy's generator) from a model on the accelerator; the noise is drawn on the CPU."""
    model = default_model(3, 4, seed=1, dtype=dtype)
    runs = []
    for device in (torch.device("cpu"), accelerator):
        inst = simulate(copy.deepcopy(model).to(device), POPULATION, RATE, seasons=2, noise=noise, seed=5)
        runs.append([inst.potentials.node, inst.potentials.edge, inst.counts, inst.flows, inst.observed])
    assert runs[0][4].sum() > 0
    _agree(*runs, accelerator, dtype)


@pytest.mark.parametrize("method, warm", [("md", False), ("md", True), ("rda", False), ("accelerated", False)])
def test_map_counts(accelerator, method, warm):
    """On the CPU mirror descent takes the NumPy small-problem path; on an accelerator it must take the general
    solver (same algorithm and stopping rule), and agree."""
    inst = _instance()
    pot, observed = inst.potentials, inst.observed
    start = None
    if warm:            # the offset of a solution for other observations
        other = map_counts(pot, observed.flip(-1), RATE, POPULATION)
        start = ChainPotentials(other.potentials.node, pot.edge)
    runs, results = [], []
    for device in (torch.device("cpu"), accelerator):
        moved = ChainPotentials(pot.node.to(device), pot.edge.to(device))
        warm_start = None if start is None else ChainPotentials(start.node.to(device), start.edge.to(device))
        result = map_counts(moved, observed.to(device), RATE, POPULATION, method=method, max_iter=60,
                            warm_start=warm_start)
        results.append(result)
        runs.append([result.counts, result.objective, result.converged, result.potentials.node, result.flows()])
    if method == "md":
        assert results[0].solution.oracle_calls == 0                     # the NumPy path
        if accelerator.type != "cpu":
            assert results[1].solution.oracle_calls > 0                  # the general solver
        assert abs(results[0].iterations - results[1].iterations.cpu()).max() <= 1
        assert bool(results[0].converged.all())
    else:
        _agree(results[0].iterations, results[1].iterations, accelerator)
    _agree(*runs, accelerator, rtol=1e-8, atol=1e-9 * POPULATION)


def test_interior_point(accelerator):
    pytest.importorskip("cvxpy")
    inst = _instance(grid=2, steps=3, seasons=1)
    pot = inst.potentials
    runs = []
    for device in (torch.device("cpu"), accelerator):
        moved = ChainPotentials(pot.node.to(device), pot.edge.to(device))
        result = interior_point(moved, inst.observed.to(device), RATE, POPULATION)
        assert result.status == ["optimal"]
        runs.append([result.objective, result.node])
    _agree(*runs, accelerator)
    bethe = map_counts(pot, inst.observed, RATE, POPULATION, tol=1e-9, max_iter=500)
    torch.testing.assert_close(runs[1][0].cpu(), bethe.objective, rtol=1e-6, atol=0)


@pytest.mark.parametrize("schedule", ["alternate", "quasi_newton"])
def test_fit_hard_em(accelerator, schedule):
    """Learning from CPU observations with a model on the accelerator (the observations follow the model)."""
    inst = _instance(grid=2, steps=3)
    runs = []
    for device in (torch.device("cpu"), accelerator):
        model = default_model(2, 3, seed=4).to(device)
        history = fit_hard_em(model, inst.observed, RATE, POPULATION, rounds=3, m_iter=20, schedule=schedule)
        assert history.rounds >= 2
        runs.append([history.objective, history.parameters, history.rounds, history.converged,
                     dict(model.named_parameters())])
    # E-steps by different paths (NumPy on the CPU), M-steps by L-BFGS: agreement to the E-step's tolerance
    _agree(*runs, accelerator, rtol=1e-6, atol=1e-7)


def test_plot_flows(accelerator, tmp_path):
    pytest.importorskip("matplotlib")
    from betheproj.cgm.plot import plot_flows

    inst = _instance(grid=2, steps=3, seasons=1)
    model = copy.deepcopy(inst.model).to(accelerator)
    result = map_counts(ChainPotentials(inst.potentials.node.to(accelerator), inst.potentials.edge.to(accelerator)),
                        inst.observed.to(accelerator), RATE, POPULATION)
    path = tmp_path / "flows.png"
    plot_flows(model, result.counts[0], result.flows()[0], str(path),
               truth=(inst.counts[0].to(accelerator), inst.flows[0].to(accelerator)), panels=3)
    assert path.stat().st_size > 0



def test_warm_start_on_another_device_is_refused(accelerator):
    if accelerator.type == "cpu":
        pytest.skip("needs a device other than the CPU")
    inst = simulate(default_model(3, 4, 0), 2000, 0.5, 1, 0.0, 0)
    with pytest.raises(ValueError, match="warm_start is on cuda.* but potentials are on cpu"):    # before NumPy's path
        map_counts(inst.potentials, inst.observed, 0.5, 2000, warm_start=inst.potentials.to(accelerator))
