"""The NumPy small-problem path of map_counts against the generic batched solver."""

import numpy as np
import torch

from betheproj.cgm import default_model, map_counts, simulate
from betheproj.cgm.fast import _Chain, mirror_descent
from betheproj.energies import Poisson
from betheproj.inference import solve
from betheproj.oracles import ChainPotentials, LinearChain


def _generic(potentials, observed, rate, population):
    return solve(LinearChain(), potentials, Poisson(observed, rate, population), method="md", tol=1e-6, max_iter=300)


def test_same_iterates_as_the_generic_mirror_descent():
    inst = simulate(default_model(4, 7, seed=2), population=30_000, rate=0.4, seasons=2, noise=0.5, seed=2)
    lengths = torch.tensor([7, 5])
    potentials = ChainPotentials(inst.potentials.node, inst.potentials.edge, lengths)
    observed = inst.observed * (torch.arange(7) < lengths[:, None])[..., None]
    fast = map_counts(potentials, observed, 0.4, 30_000)
    ref = _generic(potentials, observed, 0.4, 30_000)
    assert torch.equal(fast.iterations, ref.iterations) and bool(fast.converged.all())
    assert torch.allclose(fast.objective, ref.objective, rtol=1e-12, atol=0)
    assert torch.allclose(fast.counts, 30_000 * ref.marginals.node, atol=1e-6)
    # the dual iterate reproduces the marginals (Proposition 1) and the flows add up to the counts
    again = LinearChain().marginals(fast.potentials)
    assert torch.allclose(30_000 * again.node, fast.counts, atol=1e-6)
    assert torch.allclose(fast.flows().sum(-1)[0], fast.counts[0, :-1], atol=1e-6)


def test_reports_which_examples_needed_step_size_control():
    """The NumPy path says which examples had a step rejected, as the generic solver does (here two of four)."""
    inst = simulate(default_model(3, 5, seed=1), population=100, rate=0.05, seasons=4, seed=1)
    fast = map_counts(inst.potentials, inst.observed, 0.05, 100)
    ref = _generic(inst.potentials, inst.observed, 0.05, 100)
    assert torch.equal(fast.iterations, ref.iterations)
    assert torch.equal(fast.solution.safeguarded, ref.safeguarded)
    assert fast.solution.safeguarded.tolist() == [True, False, True, False]


def test_forbidden_moves_fall_back_to_the_generic_solver():
    inst = simulate(default_model(3, 5, seed=1), population=5_000, rate=0.5, seed=1)
    edge = inst.potentials.full_edge().clone()
    edge[:, :, 0, 8] = float("-inf")                          # no jump from one corner to the other
    potentials = ChainPotentials(inst.potentials.node, edge)
    node, full = potentials.node[0].numpy(), edge[0].numpy()
    assert mirror_descent(node, full, inst.observed[0].numpy(), 0.5, 5_000, 1e-6, 300) is None
    res = map_counts(potentials, inst.observed, 0.5, 5_000)
    ref = _generic(potentials, inst.observed, 0.5, 5_000)
    assert torch.allclose(res.objective, ref.objective, rtol=1e-12, atol=0)


def test_mirror_descent_never_ends_above_its_start():
    """Observations a million times rate x population: the first iteration runs out of backtracks (a step
    2^-44 is needed), and the last, still rising step used to be taken (51,630 -> 56,487); then it stopped at
    its start.  It now goes on from the halved step, as the generic solver does, to the optimum (25,192)."""
    node = np.array([[-13.68376, -0.000195, -8.54774, -25.75749], [0.0, 0.0, 0.0, 0.0]])
    edge = np.array([[[-5.3e-07, -14.47773, -17.97901, -32.39646], [-0.011295, -4.48902, -17.99030, -22.40776],
                      [-0.000343, -14.47807, -7.97935, -22.39680], [-0.011638, -4.48937, -7.99065, -12.40810]]])
    y = np.array([[1008.0, 976.0, 954.0, 990.0], [1024.0, 1021.0, 986.0, 993.0]])
    start = mirror_descent(node, edge, y, 1e-4, 3.0, 1e-6, 0)[2]
    for iters in (1, 50):
        assert mirror_descent(node, edge, y, 1e-4, 3.0, 1e-6, iters)[2] <= start
    potentials = ChainPotentials(torch.tensor(node)[None], torch.tensor(edge)[None])
    observed = torch.tensor(y)[None]
    fast = map_counts(potentials, observed, 1e-4, 3.0, max_iter=3000)
    ref = solve(LinearChain(), potentials, Poisson(observed, 1e-4, 3.0), method="md", tol=1e-6, max_iter=3000)
    assert bool(fast.converged) and bool(ref.converged) and int(fast.iterations) == int(ref.iterations)
    assert torch.allclose(fast.objective, ref.objective, rtol=1e-12, atol=0)
    assert float(fast.objective) < 25_192.42


def test_counts_where_the_prior_is_astronomically_small():
    """A base marginal of e^-300 under observed counts: both paths bound each dual entry's move by half the trust
    region and agree iterate for iterate (67 iterations; 427 when one step size served every entry, steps below
    1e-20 then)."""
    node = torch.tensor([[[0.0, -300.0], [0.0, 0.0]]], dtype=torch.float64)
    potentials = ChainPotentials(node, torch.zeros(1, 1, 2, 2, dtype=torch.float64))
    observed = torch.full((1, 2, 2), 5.0, dtype=torch.float64)
    fast = map_counts(potentials, observed, 0.5, 20.0, max_iter=1000)
    ref = solve(LinearChain(), potentials, Poisson(observed, 0.5, 20.0), method="md", tol=1e-6, max_iter=1000)
    assert bool(fast.converged) and int(fast.iterations) == int(ref.iterations) < 100
    assert torch.allclose(fast.objective, ref.objective, rtol=1e-12, atol=0)


def test_an_unfinished_run_reports_the_residual_of_the_point_it_returns():
    """Cut off after a few iterations, both paths report the residual at the counts returned (and the same one)."""
    from betheproj.inference.state import _residual

    inst = simulate(default_model(4, 7, seed=2), population=30_000, rate=0.4, seasons=2, noise=0.5, seed=2)
    for max_iter in (1, 4):
        fast = map_counts(inst.potentials, inst.observed, 0.4, 30_000, max_iter=max_iter)
        ref = solve(LinearChain(), inst.potentials, Poisson(inst.observed, 0.4, 30_000), method="md", tol=1e-6,
                    max_iter=max_iter)
        assert not fast.converged.any() and not ref.converged.any()
        torch.testing.assert_close(fast.solution.residual, ref.residual, rtol=1e-9, atol=1e-12)
        mu = fast.solution.marginals
        grad = Poisson(inst.observed, 0.4, 30_000).grad(mu).node
        expected = _residual(fast.potentials.node - inst.potentials.node, grad, mu.node, 1)
        torch.testing.assert_close(fast.solution.residual, expected, rtol=1e-7, atol=1e-12)
        again = map_counts(inst.potentials, inst.observed, 0.4, 30_000, max_iter=1, warm_start=fast.potentials)
        assert not torch.equal(again.potentials.node, fast.potentials.node)    # it stepped: not converged


def test_an_objective_that_overflows_at_the_start_is_left_to_the_generic_solver():
    """observed / population beyond float64 (1e6 counts of a population of 1e-300) made the fast path return an
    objective of inf, unconverged, where the generic solver refuses the instance."""
    import pytest

    with torch.no_grad():
        potentials = default_model(2, 2, seed=3).potentials(1)
    observed = torch.full((1, 2, 4), 1e6, dtype=torch.float64)
    args = (potentials.node[0].numpy(), potentials.full_edge()[0].numpy(), observed[0].numpy(), 1.0, 1e-300, 1e-6, 50)
    assert mirror_descent(*args) is None
    for method in ("md", "rda"):
        with pytest.raises(ValueError, match="the objective is not finite at the base marginals"):
            map_counts(potentials, observed, 1.0, 1e-300, method=method)


def test_the_recursion_is_not_trusted_where_it_underflows_or_overflows():
    """The scaled forward-backward hands over (None) where a forward sum is 0 (label 1 after step 0 is reachable
    only from label 1, whose score underflowed), where a dual offset overflows, or is NaN; the same chain's buffers
    then serve a good call unchanged."""
    node = np.array([[0.0, -800.0], [0.0, 0.0]])
    chain = _Chain(node, np.array([[[-800.0, -800.0], [-800.0, 0.0]]]))
    with np.errstate(all="ignore"):                      # as map_counts calls it
        assert chain.marginals(np.zeros((2, 2))) is None
        chain = _Chain(np.zeros((3, 2)), np.zeros((2, 2, 2)))
        good = chain.marginals(np.zeros((3, 2)))
        assert chain.marginals(np.array([[0.0, 0.0], [np.inf, 0.0], [0.0, 0.0]])) is None
        assert chain.marginals(np.array([[0.0, 0.0], [np.nan, 0.0], [0.0, 0.0]])) is None
        again = chain.marginals(np.zeros((3, 2)))
    assert np.array_equal(good[0], np.full((3, 2), 0.5)) and np.array_equal(again[0], good[0])
    assert good[1] == again[1] == 3 * np.log(2.0)
