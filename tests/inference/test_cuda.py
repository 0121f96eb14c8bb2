"""The solvers on the accelerator agree with the CPU: the first iterations of every method step for step (objective
histories, dual iterates, step-size control, oracle calls), converged solutions and their decodings, warm starts,
the global search over pieces, ``objective`` and the state's residuals (skipped without CUDA;
``BETHEPROJ_TEST_DEVICE=cpu`` runs them on the CPU)."""

import pytest
import torch

import betheproj as bp
from betheproj.energies import (
    LinearMeasurements,
    MeanField,
    NearestPrototype,
    Poisson,
    SecondOrderArcs,
)
from betheproj.inference import METHODS, decode, objective, solve, solve_global
from betheproj.inference.state import _log_change, _residual, _warm_offsets
from betheproj.oracles import NonProjective, PairwisePotentials, Projective
from tests.devices import agree as _agree
from tests.devices import to_device as _to

DT = torch.float64
INF = float("inf")
# float32 iterates: the accelerated method's averages and its hand-over to mirror descent amplify the devices'
# rounding differences to a few 1e-4 (H100, against the CPU) within three iterations
TOL = {torch.float64: {"atol": 1e-9, "rtol": 1e-10}, torch.float32: {"atol": 2e-3, "rtol": 1e-4}}
PARENTS = [-1, 0, 0, 1, 2, 2]


def _problem(kind, dtype, gen):
    """Potentials (as a dict of CPU tensors), the oracle, and a function building the energy from CPU tensors."""
    def n(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen, dtype=DT) * scale).to(dtype)

    if kind.startswith("chain"):
        b, length, c = 4, 6, 4
        pot = {"node": n(b, length, c, scale=2.0), "lengths": torch.tensor([6, 4, 1, 5])}
        counts = torch.randint(0, 4, (b, length, c), generator=gen).to(dtype)
        if kind == "chain-shared":             # one transition table: the per-example edge-total path
            pot["edge"] = n(c, c)
            data = {"a": n(3, c), "e": n(3, c, c), "y": counts}
        else:                                  # per position, with forbidden transitions
            pot["edge"] = n(b, length - 1, c, c)
            pot["edge"][:, :, 0, 1] = -INF
            data = {"a": n(3, c), "e": n(3, length - 1, c, c), "y": counts}

        def energy(d):
            return (LinearMeasurements(node=d["a"], edge=d["e"], offset=0.5, loss="squared_hinge", psi=2.0)
                    + Poisson(d["y"], rate=0.5, scale=10.0))
        return pot, bp.LinearChain(), energy, data
    if kind == "tree":
        b, c = 3, 3
        pot = {"node": n(b, len(PARENTS), c), "edge": n(b, len(PARENTS) - 1, c, c), "lengths": torch.tensor([6, 3, 5])}
        data = {"a": n(2, c), "w": n(2, c, c, scale=0.5)}

        def energy(d):
            return (LinearMeasurements(node=d["a"], loss="smoothed_abs", psi=1.5)
                    + MeanField(torch.tensor([[1, 2], [3, 5]]), d["w"]))
        return pot, bp.Tree(PARENTS), energy, data
    # dependency trees: arc scores with a second-order mean-field energy
    b, words = 2, 4
    pot = {"node": n(b, words, words + 1), "edge": torch.zeros(words + 1, words + 1, dtype=dtype),
           "lengths": torch.tensor([4, 3])}
    data = {"s": n(b, words + 1, words + 1, words + 1, scale=0.3), "g": n(b, words + 1, words + 1, words + 1,
                                                                           scale=0.3)}
    oracle = NonProjective() if kind == "nonprojective" else Projective(single_root=True)
    return pot, oracle, lambda d: SecondOrderArcs(d["s"], d["g"]), data


def _solution(sol, oracle):
    m = sol.marginals
    out = {"node": m.node, "log_z": m.log_partition, "theta_node": sol.potentials.node,
           "theta_edge": sol.potentials.edge, "iterations": sol.iterations, "converged": sol.converged,
           "objective": sol.objective, "objectives": sol.objectives, "safeguarded": sol.safeguarded,
           "residual": sol.residual, "oracle_calls": sol.oracle_calls, "method": sol.method,
           "map": decode(oracle, sol), "argmax": decode(oracle, sol, method="marginal"), "edge": m.edge}
    return out


def _run(kind, dtype, device, params_on, seed, **options):
    pot, oracle, energy, data = _problem(kind, dtype, torch.Generator().manual_seed(seed))
    pot = _to(pot, device)
    theta = PairwisePotentials(pot["node"], pot["edge"], pot["lengths"])
    e = energy(_to(data, device) if params_on == "accelerator" else data)
    sol = solve(oracle, theta, e, **options)
    out = _solution(sol, oracle)
    out["refit"] = objective(oracle, theta, e, sol.marginals)          # (2) at the returned marginals
    return out


def _on_both(kind, dtype, accelerator, params_on="accelerator", seed=0, **options):
    cpu = _run(kind, dtype, torch.device("cpu"), "cpu", seed, **options)
    dev = _run(kind, dtype, accelerator, params_on, seed, **options)
    return cpu, dev


CASES = [("chain-shared", DT), ("chain-per-position", DT), ("tree", DT), ("nonprojective", DT),
         ("projective", DT), ("chain-shared", torch.float32), ("chain-per-position", torch.float32)]


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("kind,dtype", CASES)
def test_first_iterations_step_for_step(accelerator, kind, dtype, method):
    # tol=0: every example takes every step; the two devices must take the same steps (same accepted candidates,
    # same step-size control, same oracle calls) and reach the same iterates
    cpu, dev = _on_both(kind, dtype, accelerator, method=method, max_iter=4 if dtype == DT else 3, tol=0.0)
    _agree(cpu, dev, accelerator, **TOL[dtype])
    assert (cpu["iterations"] > 0).any()


@pytest.mark.parametrize("method", METHODS)
def test_energy_tensors_left_on_the_cpu(accelerator, method):
    # the energies move their tensors to the marginals' device: a CPU-built energy solves on the accelerator
    cpu, dev = _on_both("chain-per-position", DT, accelerator, params_on="cpu", method=method, max_iter=4, tol=0.0)
    _agree(cpu, dev, accelerator, **TOL[DT])


@pytest.mark.parametrize("kind", ["chain-shared", "tree"])
def test_converged_solutions_and_decodings(accelerator, kind):
    # mirror descent to a tight tolerance (the accelerated method's hand-over to it runs in the tests above)
    cpu, dev = _on_both(kind, DT, accelerator, seed=1, method="md", max_iter=400, tol=1e-8)
    assert cpu["converged"].all() and dev["converged"].all()
    near = {"atol": 1e-7, "rtol": 1e-9}                 # both at the optimum, by possibly different paths
    for key in ("node", "edge", "log_z", "theta_node", "theta_edge", "objective", "refit"):
        if key in cpu:
            _agree(cpu[key], dev[key], accelerator, name=key, **near)
    for key in ("map", "argmax"):
        _agree(cpu[key], dev[key], accelerator, 0, 0, name=key)


def test_warm_start(accelerator):
    def run(device):
        pot, oracle, energy, data = _problem("chain-per-position", DT, torch.Generator().manual_seed(2))
        pot, data = _to(pot, device), _to(data, device)
        theta = PairwisePotentials(pot["node"], pot["edge"], pot["lengths"])
        first = solve(oracle, theta, energy(data), method="md", max_iter=3, tol=0.0)
        d_node, d_edge = _warm_offsets(first.potentials, theta.shifted(None, None), True, "md")
        sol = solve(oracle, theta, energy(data), method="md", max_iter=3, tol=0.0, warm_start=first.potentials)
        return {**_solution(sol, oracle), "d_node": d_node, "d_edge": d_edge}

    _agree(run(torch.device("cpu")), run(accelerator), accelerator, **TOL[DT])


def test_warm_start_on_another_device_is_refused(accelerator):
    if accelerator.type == "cpu":
        pytest.skip("needs a device other than the CPU")
    pot, oracle, energy, data = _problem("chain-per-position", DT, torch.Generator().manual_seed(2))
    theta = PairwisePotentials(pot["node"], pot["edge"], pot["lengths"])
    with pytest.raises(ValueError, match="warm_start is on cuda.* but potentials are on cpu"):
        solve(oracle, theta, energy(data), method="md", max_iter=3, warm_start=theta.to(accelerator))


@pytest.mark.parametrize("method", ["md", "rda"])
@pytest.mark.parametrize("statistic", ["word", "unigram"])
def test_solve_global(accelerator, statistic, method):
    gen = torch.Generator().manual_seed(3)
    b, n, c = 3, 4, 3
    node, edge = torch.randn(b, n, c, generator=gen, dtype=DT), torch.randn(c, c, generator=gen, dtype=DT)
    lengths = torch.tensor([4, 3, 2])
    labels = torch.randint(0, c, (6, n), generator=gen)
    protos = torch.nn.functional.one_hot(labels, c).to(DT)
    proto_lengths = torch.tensor([4, 3, 3, 2, 4, 1])
    if statistic == "unigram":
        protos = (protos * (torch.arange(n) < proto_lengths[:, None])[..., None]).sum(1)
    psi = torch.rand(b, generator=gen, dtype=DT) + 0.5

    def run(device):
        oracle = bp.LinearChain()
        theta = PairwisePotentials(node.to(device), edge.to(device), lengths.to(device))
        energy = NearestPrototype(protos.to(device), psi.to(device), statistic, proto_lengths.to(device))
        sol = solve_global(oracle, theta, energy, method=method, max_iter=6, tol=0.0)
        return _solution(sol, oracle)

    _agree(run(torch.device("cpu")), run(accelerator), accelerator, **TOL[DT])


@pytest.mark.parametrize("dtype", [DT, torch.float32])
def test_residual_and_log_change(accelerator, dtype):
    gen = torch.Generator().manual_seed(4)
    mu = torch.softmax(torch.randn(3, 5, 4, generator=gen, dtype=DT) * 3, -1).to(dtype)
    mu[0, 1] = torch.tensor([1.0, 0.0, 0.0, 0.0])                     # a label without mass
    mu[2, 3:] = 0.0                                                   # padding
    delta, grad = torch.randn(3, 5, 4, generator=gen, dtype=DT).to(dtype), torch.randn(3, 5, 4, generator=gen,
                                                                                     dtype=DT).to(dtype)
    allowed = torch.ones(3, 5, 4, dtype=torch.bool)
    new = torch.softmax(torch.log(mu.double().clamp_min(1e-300)) + 0.1, -1).to(dtype)
    new[1, 2, 0] = 0.0                                                # a marginal that collapses

    def run(mu, delta, grad, allowed, new):
        return {"tv": _residual(delta, grad, mu, 1), "kl": _residual(delta, grad, mu, 1, allowed, kl=True),
                "edge": _residual(delta[:, :4, :, None].expand(3, 4, 4, 4), grad[:, 1:, None, :].expand(3, 4, 4, 4),
                                  mu[:, :4, :, None] * mu[:, 1:, None, :], 2),
                "change": _log_change(mu, new), "ignored": _log_change(mu, new, ignore=mu < 0.1)}

    args = (mu, delta, grad, allowed, new)
    _agree(run(*args), run(*(a.to(accelerator) for a in args)), accelerator, **TOL[dtype])
