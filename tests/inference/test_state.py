"""The solver's state and its pieces: the stationarity residual, the trust-region measure, warm-start offsets,
and one iteration of SolverState (convergence without an oracle call, step-size control on a failed step)."""

import math

import pytest
import torch

import betheproj as bp
from betheproj.energies import FunctionEnergy, LinearMeasurements
from betheproj.inference.state import SolverState, _log_change, _residual, _warm_offsets


def _d(*rows):
    return torch.tensor(rows, dtype=torch.float64)


def test_residual_is_the_total_variation_of_the_reweighted_marginal():
    mu = _d([[0.5, 0.5]])                                  # [B=1, N=1, C=2]
    # delta + grad = (0, log 3): q ∝ mu exp(-r) = (1/2, 1/6) -> (3/4, 1/4), ||q - mu||_1 = 1/2
    r = _d([[0.0, math.log(3.0)]])
    assert _residual(r, torch.zeros_like(r), mu, 1).item() == pytest.approx(0.5, abs=1e-15)
    # a constant per factor drops out; a stationary point (delta = -grad) has residual 0
    assert _residual(r + 7.0, torch.zeros_like(r), mu, 1).item() == pytest.approx(0.5, abs=1e-15)
    g = _d([[0.3, -1.2]])
    assert _residual(-g, g, mu, 1).item() == 0.0


def test_residual_ignores_padding_and_counts_mass_a_label_would_gain():
    # position 1 is padding (no mass): ignored even with a huge offset
    mu = _d([[0.5, 0.5], [0.0, 0.0]])
    r = _d([[0.0, 0.0], [0.0, 100.0]])
    assert _residual(r, torch.zeros_like(r), mu, 1).item() == 0.0
    # a label with tiny mass pulled hard: the residual is the mass it would gain, not its current mass
    mu = _d([[1 - 1e-12, 1e-12]])
    r = _d([[0.0, -40.0]])
    assert _residual(r, torch.zeros_like(r), mu, 1).item() > 0.99


def test_log_change_is_infinite_when_a_marginal_collapses_and_ignores_tiny_entries():
    old, new = _d([[0.5, 0.5]]), _d([[0.25, 0.75]])
    assert _log_change(old, new).item() == pytest.approx(math.log(2.0))
    assert _log_change(_d([[0.5, 0.5]]), _d([[1.0, 0.0]])).item() == math.inf
    # rising from an underflowed 0 is not limited: its log could not be measured
    assert _log_change(_d([[1.0, 0.0]]), _d([[0.5, 0.5]])).item() == pytest.approx(math.log(2.0))
    tiny = torch.finfo(torch.float64).tiny
    assert _log_change(_d([[1.0, tiny / 4]]), _d([[1.0, tiny / 8]])).item() == 0.0


def test_warm_offsets_are_zero_where_theta_is_minus_inf():
    node = _d([[0.0, -math.inf], [1.0, 2.0]])                 # [B=1, N=2, C=2]
    theta = bp.ChainPotentials(node, torch.zeros(2, 2, dtype=torch.float64))
    warm = bp.ChainPotentials(node + 3.0, torch.zeros(2, 2, dtype=torch.float64))
    d_node, d_edge = _warm_offsets(warm, theta, need_edges=False, method="md")
    assert torch.equal(d_node, _d([[3.0, 0.0], [3.0, 3.0]])) and d_edge is None
    with pytest.raises(ValueError, match="method='md' only"):
        _warm_offsets(warm, theta, need_edges=False, method="rda")


def test_a_warm_start_of_other_lengths_is_refused():
    """A warm start of the same shape but other lengths (the potentials of other examples) was taken silently."""
    g = torch.Generator().manual_seed(0)
    theta = bp.ChainPotentials(torch.randn(2, 5, 3, generator=g, dtype=torch.float64),
                               torch.randn(3, 3, generator=g, dtype=torch.float64), torch.tensor([5, 3]))
    energy = LinearMeasurements(node=torch.tensor([[1.0, 0.0, 0.0]], dtype=torch.float64), offset=0.0, loss="squared",
                                psi=4.0)
    sol = bp.solve(bp.LinearChain(), theta, energy, method="md")
    again = bp.solve(bp.LinearChain(), theta, energy, method="md", warm_start=sol.potentials)
    assert again.converged.all() and (again.iterations <= 1).all()
    other = bp.ChainPotentials(theta.node, theta.edge, torch.tensor([2, 5]))
    with pytest.raises(ValueError, match="warm_start has other lengths than the potentials"):
        bp.solve(bp.LinearChain(), other, energy, method="md", warm_start=sol.potentials)


def test_a_warm_start_that_forbids_what_theta_allows_is_named_and_its_padding_is_ignored():
    # -inf in the warm start where theta is finite gave a NaN objective, reported as an energy infinite where
    # theta allows no mass; -inf at padding (which no oracle reads) was rejected the same way
    g = torch.Generator().manual_seed(0)
    theta = bp.ChainPotentials(torch.randn(2, 3, 2, generator=g, dtype=torch.float64),
                               torch.randn(2, 2, 2, 2, generator=g, dtype=torch.float64), torch.tensor([3, 1]))
    energy = LinearMeasurements(node=_d([1.0, -1.0]), edge=torch.ones(1, 2, 2, dtype=torch.float64), loss="squared")
    sol = bp.solve(bp.LinearChain(), theta, energy, tol=1e-10)
    for where in ("node", "edge"):
        node, edge = sol.potentials.node.clone(), sol.potentials.full_edge().clone()
        (node[1, 2, 0] if where == "node" else edge[1, 1, 0, 0]).fill_(-math.inf)              # padding
        warm = bp.solve(bp.LinearChain(), theta, energy, tol=1e-10, warm_start=bp.ChainPotentials(node, edge,
                                                                                                   theta.lengths))
        assert bool(warm.converged.all()) and torch.allclose(warm.objective, sol.objective, atol=1e-12)
        (node[0, 1, 1] if where == "node" else edge[0, 0, 1, 0]).fill_(-math.inf)              # a valid position
        with pytest.raises(ValueError, match=f"warm_start is -inf .*{where}"):
            bp.solve(bp.LinearChain(), theta, energy, warm_start=bp.ChainPotentials(node, edge, theta.lengths))


def _state(energy, method="md", **options):
    g = torch.Generator().manual_seed(0)
    theta = bp.ChainPotentials(torch.randn(3, 4, 3, generator=g, dtype=torch.float64),
                               torch.randn(3, 3, generator=g, dtype=torch.float64))
    settings = dict(tol=1e-9, beta=0.0, step=1.0, lipschitz=1.0, max_backtracks=40, trust_region=10.0,
                    warm_start=None)
    settings.update(options)
    return SolverState(bp.LinearChain(), theta, energy, method, **settings)


def test_an_example_already_stationary_drops_out_without_an_oracle_call():
    # an energy whose gradient is zero everywhere: the base marginals solve (2)
    state = _state(FunctionEnergy(lambda m: 0.0 * m.node.sum((1, 2))))
    calls = state.calls
    assert state.iterate(0) is False
    assert state.converged.all() and state.calls == calls and (state.iterations == 0).all()
    assert state.residual.max().item() < 1e-15          # softmax rounding of log mu


def test_one_iteration_moves_every_example_and_records_the_objective():
    energy = LinearMeasurements(node=torch.ones(1, 3, dtype=torch.float64) * torch.tensor([1.0, 0, 0]),
                                offset=0.0, loss="squared", psi=4.0)
    for method in ("rda", "md", "accelerated"):
        state = _state(energy, method)
        f0 = state.f.clone()
        assert state.iterate(0) is True
        assert (state.iterations == 1).all() and len(state.history) == 2
        assert state.calls >= 2 * 3                       # the base marginals and one candidate per example
        if method == "md":                                # a descent method: no example goes up
            assert (state.f <= f0 + 1e-12).all()


def test_a_rejected_step_shrinks_mirror_descents_step():
    # a steep energy and a huge first step: without a trust region the candidate overshoots, raises the
    # objective and is shrunk
    energy = LinearMeasurements(node=torch.tensor([[1.0, 0.0, 0.0]], dtype=torch.float64), offset=0.0,
                                loss="squared", psi=1e3)
    state = _state(energy, "md", step=1e3, trust_region=None)
    state.iterate(0)
    assert state.safeguarded.all()
    assert (state.param < 1e3).all()


def test_mirror_descent_moves_no_dual_entry_beyond_half_the_trust_region():
    """The same huge step with a trust region of 0.1 nats: every dual entry moves by at most 0.05, so the step
    passes and the step size grows instead of shrinking."""
    energy = LinearMeasurements(node=torch.tensor([[1.0, 0.0, 0.0]], dtype=torch.float64), offset=0.0,
                                loss="squared", psi=1e3)
    state = _state(energy, "md", step=1e3, trust_region=0.1)
    state.iterate(0)
    assert (state.iterations == 1).all() and not state.safeguarded.any()
    assert 0.0 < state.delta_node.abs().max() <= 0.05 and (state.param > 1e3).all()


def test_the_accelerated_method_keeps_no_edge_state_over_dependency_trees():
    """Dependency trees have no pairwise factors, so their edge marginals are the oracle's all-zero placeholders;
    the accelerated method kept [B, N-1, N+1, N+1] copies of them (iterate, last oracle point, dual offsets,
    prox-centre, gradient average, best point), O(B N^3) memory and time for nothing.  Its restarts and its
    mirror-descent rescue run with node state alone."""
    from betheproj.energies.second_order import SecondOrderArcs

    g = torch.Generator().manual_seed(0)
    pot = bp.arc_potentials(torch.randn(3, 6, 6, generator=g, dtype=torch.float64), torch.tensor([5, 4, 3]))
    energy = SecondOrderArcs(torch.randn(3, 6, 6, 6, generator=g, dtype=torch.float64) * 3, None)
    state = SolverState(bp.NonProjective(), pot, energy, "accelerated", tol=1e-6, beta=0.0, step=1.0,
                        lipschitz=1.0, max_backtracks=40, trust_region=10.0, warm_start=None)
    edges = (state.mu_edge, state.nu_edge, state.delta_edge, state.anchor_edge, state.gbar_edge, state.best_edge,
             state.best_de)
    assert not state.need_edges and all(e is None for e in edges)
    for it in range(40):
        if not state.iterate(it):
            break
    assert (state.iterations > 0).all()
    sol = bp.solve(bp.NonProjective(), pot, energy, method="accelerated", max_iter=40)
    assert sol.safeguarded.all() and sol.converged.all()       # restarts, then the rescue (merged)
    assert not sol.marginals.has_edge and sol.potentials.edge.shape == (6, 6)    # the shared all-zero table
    assert not sol.marginals.edge.any() and sol.marginals.edge.shape == (3, 4, 6, 6)
    assert torch.allclose(bp.objective(bp.NonProjective(), pot, energy, sol.marginals), sol.objective, atol=1e-8)


def test_the_accelerated_method_keeps_only_its_averages_edges_for_an_energy_of_node_marginals():
    """On a chain the accelerated method's objective at its averages reads their Bethe entropy, so it keeps their
    edge marginals; for an energy that reads no edges the dual offsets, prox-centre and gradient average stay 0 on
    the edges, and the last and best oracle points' edges are recomputed where it returns to them (convergence,
    restarts).  It takes the same steps as with every edge copy kept: the same energy with all-zero edge
    measurements (an edge gradient of 0) forces that path."""
    g = torch.Generator().manual_seed(1)
    b, n, c, j = 5, 7, 4, 6
    theta = bp.ChainPotentials(torch.randn(b, n, c, generator=g, dtype=torch.float64) * 2,
                               torch.randn(c, c, generator=g, dtype=torch.float64), torch.tensor([7, 6, 5, 3, 1]))
    a, off = torch.randn(j, c, generator=g, dtype=torch.float64), torch.rand(j, generator=g, dtype=torch.float64)
    psi = torch.rand(1, j, generator=g, dtype=torch.float64) * 5
    node_only = LinearMeasurements(node=a, offset=off, psi=psi)
    zero_edges = LinearMeasurements(node=a, edge=torch.zeros(j, c, c, dtype=torch.float64), offset=off, psi=psi)

    def state(energy):
        return SolverState(bp.LinearChain(), theta, energy, "accelerated", tol=1e-9, beta=0.0, step=1.0,
                           lipschitz=1.0, max_backtracks=40, trust_region=10.0, warm_start=None)

    lean_state = state(node_only)
    assert lean_state.need_edges and lean_state.mu_edge.shape == (b, n - 1, c, c)
    assert all(e is None for e in (lean_state.nu_edge, lean_state.delta_edge, lean_state.anchor_edge,
                                   lean_state.gbar_edge, lean_state.best_edge, lean_state.best_de))
    assert state(zero_edges).delta_edge.shape == (b, n - 1, c, c)

    lean = bp.solve(bp.LinearChain(), theta, node_only, method="accelerated", max_iter=100, tol=1e-9)
    full = bp.solve(bp.LinearChain(), theta, zero_edges, method="accelerated", max_iter=100, tol=1e-9)
    assert torch.equal(lean.iterations, full.iterations) and torch.equal(lean.converged, full.converged)
    assert (lean.iterations > 40).any()                          # restarts (every 20 steps) happened
    assert lean.converged.all()
    assert torch.allclose(lean.marginals.node, full.marginals.node, rtol=0, atol=1e-13)
    assert torch.allclose(lean.marginals.edge, full.marginals.edge, rtol=0, atol=1e-13)
    assert torch.allclose(lean.objective, full.objective, rtol=1e-13, atol=1e-13)
    assert lean.potentials.edge.shape == (c, c)                  # the shared table: no edge offsets to add
    exact = bp.LinearChain().marginals(lean.potentials)          # converged: the returned point is an oracle point
    assert torch.allclose(lean.marginals.edge, exact.edge, rtol=0, atol=1e-13)
