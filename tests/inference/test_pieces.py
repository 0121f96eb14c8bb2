"""Global search over the convex pieces of a min-of-pieces energy (NearestPrototype): exact optima in closed form."""

import pytest
import torch

import betheproj as bp
from betheproj.energies import NearestPrototype, PrototypeDistance
from betheproj.energies.base import FunctionEnergy
from betheproj.inference import objective, solve_global

DT = torch.float64
C = 3


def _theta(lengths=(4, 3, 2)):
    torch.manual_seed(3)
    b, n = len(lengths), max(lengths)
    return bp.ChainPotentials(torch.randn(b, n, C, dtype=DT), torch.randn(C, C, dtype=DT), torch.tensor(lengths))


def _words(words):
    width = max(len(w) for w in words)
    protos = torch.zeros(len(words), width, C, dtype=DT)
    for i, w in enumerate(words):
        protos[i, torch.arange(len(w)), torch.tensor(w)] = 1.0
    return protos, torch.tensor([len(w) for w in words])


WORDS = [(0, 1, 2, 0), (2, 2, 1, 0), (1, 0, 1), (0, 0, 2), (2, 1, 0), (1, 2)]


def test_word_energy_global_minimum_in_closed_form():
    # For a one-hot target t the piece is linear: 2 psi sum_n (1 - mu_n(t_n)), so its minimum over the polytope is
    # 2 psi n - log Z(theta + 2 psi onehot(t)), and the global minimum is the least of these over same-length words.
    theta, psi = _theta(), 0.7
    protos, lengths = _words(WORDS)
    chain = bp.LinearChain()
    sol = solve_global(chain, theta, NearestPrototype(protos, psi, "word", lengths), max_iter=500, tol=1e-10)
    for b, n in enumerate(theta.lengths.tolist()):
        best = float("inf")
        for w, m in zip(protos, lengths.tolist(), strict=True):
            if m != n:
                continue
            one = theta.index(torch.tensor([b]))
            shifted = one.shifted(2 * psi * w[None, : one.node.shape[1]], None)
            best = min(best, 2 * psi * n - chain.marginals(shifted).log_partition.item())
        assert sol.objective[b].item() == pytest.approx(best, abs=1e-8)


def test_reported_objective_is_the_objective_of_the_returned_marginals():
    theta, psi = _theta(), 0.9
    protos, lengths = _words(WORDS)
    chain = bp.LinearChain()
    energy = NearestPrototype(protos, psi, "word", lengths)
    sol = solve_global(chain, theta, energy, max_iter=500, tol=1e-10)
    again = objective(chain, theta, energy, sol.marginals)
    assert torch.allclose(again, sol.objective, atol=1e-7)
    local = bp.solve(chain, theta, energy, max_iter=500)
    assert bool((sol.objective <= local.objective + 1e-9).all())


def test_unigram_pieces_restricted_by_length():
    theta, psi = _theta(), 1.5
    counts = torch.tensor([[2.0, 1.0, 1.0], [0.0, 3.0, 0.0], [1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [0.0, 0.0, 2.0]],
                          dtype=DT)
    energy = NearestPrototype(counts, psi, "unigram", counts.sum(-1))
    rows, piece = energy.pieces(theta.lengths)
    pairs = {(r, tuple(t.tolist())) for r, t in zip(rows.tolist(), piece.targets, strict=True)}
    assert pairs == {(0, (2.0, 1.0, 1.0)), (1, (0.0, 3.0, 0.0)), (1, (1.0, 1.0, 1.0)), (2, (1.0, 1.0, 0.0)),
                     (2, (0.0, 0.0, 2.0))}
    chain = bp.LinearChain()
    sol = solve_global(chain, theta, energy, max_iter=300, tol=1e-10)
    # each example's objective is the least over its own pieces, each solved alone
    for b in range(3):
        idx = torch.tensor([b])
        values = [bp.solve(chain, theta.index(idx), PrototypeDistance(t[None], psi), max_iter=300,
                           tol=1e-10).objective.item() for r, t in zip(rows.tolist(), piece.targets, strict=True)
                  if r == b]
        assert sol.objective[b].item() == pytest.approx(min(values), abs=1e-6)


def test_example_without_a_candidate_keeps_the_base_marginals():
    theta = _theta()
    protos, lengths = _words([(0, 1, 2, 0)])                     # only a length-4 word: examples 1 and 2 have none
    chain = bp.LinearChain()
    sol = solve_global(chain, theta, NearestPrototype(protos, 2.0, "word", lengths), max_iter=50)
    base = chain.marginals(theta)
    assert torch.allclose(sol.marginals.node[1:], base.node[1:], atol=1e-12)
    assert torch.allclose(sol.objective[1:], -base.log_partition[1:], atol=1e-12)


def test_prototype_distance_value_and_gradient():
    theta = _theta()
    mu = bp.LinearChain().marginals(theta)
    protos, _ = _words([(0, 1, 2, 0), (1, 0, 1), (2, 2)])
    psi = torch.tensor([0.5, 1.0, 2.0], dtype=DT)
    energy = PrototypeDistance(protos, psi, "word")
    mask = mu.node_mask()
    hit = (mu.node * protos * mask[..., None]).sum((1, 2))
    assert torch.allclose(energy.value(mu), 2 * psi * (theta.lengths - hit), atol=1e-12)
    by_autograd = FunctionEnergy(lambda m: PrototypeDistance(protos, psi, "word").value(m))
    assert torch.allclose(energy.grad(mu).node, by_autograd.grad(mu).node, atol=1e-12)
    unigram = PrototypeDistance(protos.sum(1), psi, "unigram")
    expected = psi * ((mu.node * mask[..., None]).sum(1) - protos.sum(1)).abs().sum(-1)
    assert torch.allclose(unigram.value(mu), expected, atol=1e-12)


def test_bad_arguments():
    theta = _theta()
    chain = bp.LinearChain()
    with pytest.raises(TypeError, match="pieces"):
        solve_global(chain, theta, PrototypeDistance(torch.zeros(3, C, dtype=DT)))
    with pytest.raises(ValueError, match="targets"):
        PrototypeDistance(torch.zeros(3, 4, C, dtype=DT), statistic="unigram")
    with pytest.raises(ValueError, match="statistic"):
        PrototypeDistance(torch.zeros(3, C, dtype=DT), statistic="bigram")
    protos, lengths = _words(WORDS)
    with pytest.raises(ValueError, match="psi"):
        NearestPrototype(protos, torch.ones(5, dtype=DT), "word", lengths).pieces(theta.lengths)


def test_an_energy_of_another_label_set_is_named_as_solve_names_it():
    """solve_global did not validate the energy: prototypes over 4 labels met marginals over 3 in a piece, and the
    error named that piece's internal targets ("targets must have B=12 rows"), not the prototypes."""
    theta = _theta()
    for energy in (NearestPrototype(torch.rand(4, C + 1, dtype=DT)),
                   NearestPrototype(torch.rand(2, 4, C + 1, dtype=DT), 1.0, "word", torch.tensor([4, 2]))):
        for solver in (bp.solve, solve_global):
            with pytest.raises(ValueError, match=r"prototypes have 4 labels, marginals have C=3"):
                solver(bp.LinearChain(), theta, energy)


@pytest.mark.parametrize("method", ["rda", "accelerated"])
def test_solution_is_self_consistent(method):
    """The marginals returned are those each objective was measured at, with log Z of the returned potentials."""
    chain = bp.LinearChain()
    torch.manual_seed(3)
    theta = bp.ChainPotentials(torch.randn(3, 3, 3, dtype=torch.float64), torch.randn(3, 3, dtype=torch.float64))
    energy = NearestPrototype(torch.tensor([[2.0, 1.0, 0.0], [0.0, 1.0, 2.0]], dtype=torch.float64), 1.5)
    sol = solve_global(chain, theta, energy, method=method, max_iter=50)
    assert torch.allclose(sol.objective, bp.objective(chain, theta, energy, sol.marginals), atol=1e-10)
    if method == "rda":
        assert torch.allclose(sol.marginals.log_partition, chain.marginals(sol.potentials).log_partition)


@pytest.mark.parametrize("method", ["md", "accelerated"])
def test_negative_psi_examples_are_solved_locally(method):
    """With psi < 0, psi min_k d_k = max_k psi d_k is no minimum of convex pieces: solving the pieces reported
    objectives 3-5 nats below those of the returned marginals.  Such examples are now solved by ``solve`` with
    the energy itself (the energy's ``remainder``); the others keep their global minimum."""
    theta, chain = _theta(), bp.LinearChain()
    unigram = torch.tensor([[3.0, 0.0, 0.0], [0.0, 3.0, 0.0], [1.0, 1.0, 1.0]], dtype=DT)
    psi = torch.tensor([1.0, -0.5, 2.0], dtype=DT)
    options = dict(method=method, max_iter=500, tol=1e-10)
    sol = solve_global(chain, theta, NearestPrototype(unigram, psi), **options)
    torch.testing.assert_close(sol.objective, objective(chain, theta, NearestPrototype(unigram, psi), sol.marginals))
    local = bp.solve(chain, theta.index(torch.tensor([1])), NearestPrototype(unigram, psi[1:2]), **options)
    torch.testing.assert_close(sol.objective[1:2], local.objective)
    torch.testing.assert_close(sol.marginals.node[1:2], local.marginals.node)
    keep = torch.tensor([0, 2])
    alone = solve_global(chain, theta.index(keep), NearestPrototype(unigram, psi[keep]), **options)
    torch.testing.assert_close(sol.objective[keep], alone.objective)
    everywhere = solve_global(chain, theta, NearestPrototype(unigram, -1.0), **options)
    torch.testing.assert_close(everywhere.objective,
                               objective(chain, theta, NearestPrototype(unigram, -1.0), everywhere.marginals))
    assert everywhere.method == f"global-{method}" and bool(everywhere.converged.all())


@pytest.mark.parametrize("expanded", [False, True], ids=["per-position edges", "one table expanded"])
def test_the_callers_edge_scores_are_left_alone(expanded):
    """Pieces with an edge energy move the edge scores: solve_global wrote the winners' edge scores into the
    caller's per-position edge tensor, and through an ``.expand``ed one into the single table every example shares,
    so the returned potentials were the last winner's for all (their marginals 0.03 off the returned ones)."""
    from betheproj.energies import Energy, LinearMeasurements

    class NearestTransitions(Energy):
        """``min_k 5 (<vecs_k, mu_edge> - 1)^2``: transition counts pulled towards the nearer of two targets."""

        def __init__(self, vecs):
            self.vecs = vecs

        def _piece(self, vecs):
            return LinearMeasurements(edge=vecs[:, None], offset=1.0, loss="squared", psi=5.0)

        def value(self, m):
            return torch.stack([self._piece(v[None].expand(m.batch_size, *v.shape)).value(m) for v in self.vecs],
                               -1).amin(-1)

        def pieces(self, lengths):
            b, k = lengths.shape[0], self.vecs.shape[0]
            return (torch.arange(b).repeat_interleave(k),
                    self._piece(self.vecs.repeat(b, 1, 1, 1)))

    b, n, c = 2, 3, 2
    vecs = torch.zeros(2, n - 1, c, c, dtype=DT)
    vecs[0, :, 0, 1], vecs[1, :, 1, 0] = 1.0, 1.0
    torch.manual_seed(3)
    node, table = torch.randn(b, n, c, dtype=DT), torch.randn(b, n - 1, c, c, dtype=DT)
    if expanded:
        table = table[0, 0]
    edge = table.expand(b, n - 1, c, c) if expanded else table
    before = edge.clone()
    chain, energy = bp.LinearChain(), NearestTransitions(vecs)
    sol = solve_global(chain, bp.ChainPotentials(node, edge), energy, tol=1e-10)
    assert torch.equal(edge, before)
    want = solve_global(chain, bp.ChainPotentials(node, before.clone()), energy, tol=1e-10)
    torch.testing.assert_close(sol.potentials.full_edge(), want.potentials.full_edge())
    torch.testing.assert_close(chain.marginals(sol.potentials).node, sol.marginals.node)


@pytest.mark.parametrize("options, exc, match", [
    (dict(method="MD"), ValueError, r"method must be one of \('rda', 'md', 'accelerated'\), got 'MD'"),
    (dict(max_iter=-1), ValueError, "max_iter must be an int >= 0, got -1"),
    (dict(tol=float("nan")), ValueError, "tol must be a finite number >= 0"),
    (dict(max_iters=5), TypeError, "max_iters"),
])
def test_solver_options_are_checked_whether_or_not_an_example_has_a_piece(options, exc, match):
    """Options reached solve only with the rows of some piece: for a batch where no example had a candidate
    prototype, method="MD" or max_iter=-1 were taken without a word (the solution's method read "global-MD"),
    while the same call on another batch refused them."""
    theta, chain = _theta(), bp.LinearChain()
    protos, lengths = _words([(0, 1, 2, 0, 1)])                  # no example has length 5: no piece to solve
    energy = NearestPrototype(protos, 2.0, "word", lengths)
    with pytest.raises(exc, match=match):
        solve_global(chain, theta, energy, **options)
    protos, lengths = _words([(0, 1, 2, 0)])                     # example 0 has a piece
    with pytest.raises(exc, match=match):
        solve_global(chain, theta, NearestPrototype(protos, 2.0, "word", lengths), **options)


def test_a_scaled_nearest_prototype_energy_keeps_its_pieces():
    """``2 * NearestPrototype(...)`` was a Scaled energy without pieces: solve_global refused it ("solve_global needs
    an energy with pieces(lengths), got Scaled"); it is now the energy of weight 2 psi."""
    theta = _theta()
    protos, lengths = _words(WORDS)
    base = NearestPrototype(protos, 0.7, "word", lengths)
    for w in (2.0, torch.tensor(2.0, dtype=DT)):
        for scaled in (w * base, base * w):
            assert isinstance(scaled, NearestPrototype) and float(scaled.psi) == pytest.approx(1.4, abs=1e-15)
            sol = solve_global(bp.LinearChain(), theta, scaled, max_iter=300, tol=1e-10)
            ref = solve_global(bp.LinearChain(), theta, NearestPrototype(protos, 1.4, "word", lengths), max_iter=300,
                               tol=1e-10)
            assert torch.equal(sol.objective, ref.objective) and torch.equal(sol.marginals.node, ref.marginals.node)
    # a per-example weight, negative for one example: its psi changes sign, so it moves to the remainder
    w = torch.tensor([1.0, -1.0, 2.0], dtype=DT)
    scaled = w * base
    assert torch.equal(scaled.psi, 0.7 * w)
    rows, _ = scaled.pieces(theta.lengths)
    rest, _ = scaled.remainder(theta.lengths)
    assert 1 not in rows.tolist() and rest.tolist() == [1]
    mu = bp.LinearChain().marginals(theta)
    assert torch.allclose(scaled.value(mu), w * base.value(mu), rtol=1e-15, atol=0)
    with pytest.raises(ValueError, match=r"weight \[B\]=\(2,\) and psi \[B\]=\(3,\) have other batch sizes"):
        torch.ones(2, dtype=DT) * NearestPrototype(protos, torch.ones(3, dtype=DT), "word", lengths)
    with pytest.raises(ValueError, match="weight must be a float, a scalar tensor or a per-example"):
        torch.ones(3, 1, dtype=DT) * base
    with pytest.raises(ValueError, match="weight must be a finite number"):
        float("inf") * base


def test_an_explicit_scaled_energy_forwards_its_pieces():
    """``Scaled(NearestPrototype(...), w)`` (as ``lambda psi: Scaled(energy, psi)`` builds it) had no pieces:
    solve_global refused it; it now scales the wrapped energy's pieces and remainder by each example's weight."""
    theta = _theta()
    protos, lengths = _words(WORDS)
    psi = torch.tensor([0.7, -0.5, 0.3], dtype=DT)               # example 1 is the wrapped energy's remainder
    inner = NearestPrototype(protos, psi, "word", lengths)
    w = torch.tensor([2.0, 3.0, 0.0], dtype=DT)
    options = dict(max_iter=300, tol=1e-10)
    sol = solve_global(bp.LinearChain(), theta, bp.energies.Scaled(inner, w), **options)
    ref = solve_global(bp.LinearChain(), theta, NearestPrototype(protos, w * psi, "word", lengths), **options)
    assert torch.allclose(sol.objective, ref.objective, rtol=1e-12, atol=1e-12)
    assert torch.allclose(sol.marginals.node, ref.marginals.node, rtol=0, atol=1e-9)
    rows, piece = bp.energies.Scaled(inner, w).pieces(theta.lengths)
    assert torch.equal(piece.weight, w[rows])
    rest, part = bp.energies.Scaled(inner, 2.0).remainder(theta.lengths)
    assert rest.tolist() == [1] and part.weight == 2.0
    with pytest.raises(ValueError, match="weight must be non-negative for pieces"):
        solve_global(bp.LinearChain(), theta, bp.energies.Scaled(inner, -w), **options)
    with pytest.raises(ValueError, match=r"weight must be a scalar or have shape \[B\]=\(3,\)"):
        bp.energies.Scaled(inner, torch.ones(2, dtype=DT)).pieces(theta.lengths)
    plain = bp.energies.Scaled(FunctionEnergy(lambda mu: mu.node.sum((1, 2))), 2.0)
    assert getattr(plain, "pieces", None) is None and not hasattr(plain, "remainder")
    with pytest.raises(TypeError, match="solve_global needs an energy with pieces"):
        solve_global(bp.LinearChain(), theta, plain)


def test_returned_potentials_never_require_grad():
    # the transitions came back as the caller's tensor, still requiring grad
    node = torch.randn(2, 3, 3, dtype=DT, requires_grad=True)
    edge = torch.randn(3, 3, dtype=DT, requires_grad=True)
    sol = solve_global(bp.LinearChain(), bp.ChainPotentials(node, edge),
                       NearestPrototype(torch.rand(2, 3, dtype=DT), 1.0))
    assert not sol.potentials.node.requires_grad and not sol.potentials.edge.requires_grad
    assert sol.potentials.edge is not edge
