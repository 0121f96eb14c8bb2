"""SecondOrderArcs: eq. (9) mean field on sibling / grandparent parts of dependency trees."""

from __future__ import annotations

import pytest
import torch

from betheproj import solve
from betheproj.energies.base import autograd_gradient
from betheproj.energies.second_order import SecondOrderArcs, second_order_masks
from betheproj.oracles.base import Marginals, PairwisePotentials
from betheproj.oracles.nonprojective import NonProjective


def _setup(seed: int = 0, b: int = 3, n: int = 5):
    gen = torch.Generator().manual_seed(seed)
    c = n + 1
    lengths = torch.tensor([n, 3, 1][:b])
    node = torch.randn(b, n, c, generator=gen, dtype=torch.float64)
    pot = PairwisePotentials(node, node.new_zeros(c, c), lengths)
    mu = NonProjective().marginals(pot)
    s = torch.randn(b, c, c, c, generator=gen, dtype=torch.float64)
    g = torch.randn(b, c, c, c, generator=gen, dtype=torch.float64)
    return pot, mu, s, g


def _brute_value(mu: Marginals, s: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    out = []
    for b in range(mu.node.shape[0]):
        n = int(mu.lengths[b])

        def arc(h: int, m: int, b: int = b) -> float:
            return float(mu.node[b, m - 1, h])

        total = 0.0
        for h in range(n + 1):
            for m in range(1, n + 1):
                for s_ in range(1, n + 1):
                    if len({h, m, s_}) == 3:
                        total -= float(s[b, h, m, s_]) * arc(h, m) * arc(h, s_)
        for gp in range(n + 1):
            for h in range(1, n + 1):
                for m in range(1, n + 1):
                    if len({gp, h, m}) == 3:
                        total -= float(g[b, gp, h, m]) * arc(gp, h) * arc(h, m)
        out.append(total)
    return torch.tensor(out, dtype=torch.float64)


def test_value_matches_brute_force_definition():
    _, mu, s, g = _setup()
    e = SecondOrderArcs(s, g)
    torch.testing.assert_close(e.value(mu), _brute_value(mu, s, g), rtol=1e-12, atol=1e-12)
    only_s = SecondOrderArcs(s, None).value(mu)
    only_g = SecondOrderArcs(None, g).value(mu)
    torch.testing.assert_close(only_s + only_g, e.value(mu), rtol=1e-12, atol=1e-12)


def test_closed_form_gradient_matches_autograd():
    _, mu, s, g = _setup(1)
    for energy in (SecondOrderArcs(s, g), SecondOrderArcs(s, None), SecondOrderArcs(None, g)):
        ref = autograd_gradient(energy, mu, create_graph=False).node
        got = energy.grad(mu).node
        torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)
        # padding rows (past each length) get no gradient
        assert got[1, 3:].abs().max() == 0 and got[2, 1:].abs().max() == 0


def test_scores_outside_parts_are_ignored():
    _, mu, s, g = _setup(2)
    sib, grand = second_order_masks(mu.lengths, s.shape[1])
    noise = torch.randn_like(s)
    e1 = SecondOrderArcs(s, g)
    e2 = SecondOrderArcs(torch.where(sib, s, noise), torch.where(grand, g, noise))
    torch.testing.assert_close(e1.value(mu), e2.value(mu))
    torch.testing.assert_close(e1.grad(mu).node, e2.grad(mu).node)


def test_differentiable_in_the_scores():
    """The closed-form gradient is a torch expression in S and G (needed for eqs. 14-15)."""
    _, mu, s, g = _setup(3, b=2, n=3)
    s = s.clone().requires_grad_(True)
    g = g.clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda s_, g_: SecondOrderArcs(s_, g_).value(mu), (s, g))
    fixed = Marginals(mu.node, None, None, mu.lengths)
    assert torch.autograd.gradcheck(lambda s_, g_: SecondOrderArcs(s_, g_).grad(fixed).node, (s, g))


def test_bethe_rda_solves_problem_2_and_lowers_the_objective():
    pot, mu, s, g = _setup(4)
    energy = SecondOrderArcs(0.25 * s, 0.25 * g)
    sol = solve(NonProjective(), pot, energy, method="rda", max_iter=400, tol=2e-3)
    assert sol.converged.all()
    assert (sol.objective <= sol.objectives[:, 0] + 1e-9).all()
    # Bethe-RDA converges like O(1/t); mirror descent reaches the same stationary point much faster
    md = solve(NonProjective(), pot, energy, method="md", max_iter=100, tol=1e-6)
    assert md.converged.all()
    torch.testing.assert_close(sol.objective, md.objective, atol=1e-4, rtol=0)
    # Proposition 1: the solution is the tree marginals of theta - grad L(mu*)
    shifted = pot.shifted(-energy.grad(md.marginals).node, None)
    torch.testing.assert_close(NonProjective().marginals(shifted).node, md.marginals.node, atol=1e-5, rtol=0)


def test_bad_inputs():
    _, mu, s, g = _setup()
    with pytest.raises(ValueError, match="at least one"):
        SecondOrderArcs(None, None)
    with pytest.raises(ValueError, match=r"\[B, C, C, C\]"):
        SecondOrderArcs(s[:, :, :, :3], None)
    with pytest.raises(TypeError, match="floating-point"):
        SecondOrderArcs(s.long(), None)
    with pytest.raises(ValueError, match="finite"):
        SecondOrderArcs(s.index_put((torch.tensor([0]),) * 4, torch.tensor(float("nan"), dtype=s.dtype)), None)
    with pytest.raises(ValueError, match="shapes differ"):
        SecondOrderArcs(s, g[:2])
    with pytest.raises(ValueError, match="marginals need"):
        SecondOrderArcs(s[:2], g[:2]).validate(mu)


def test_part_lists_equal_the_dense_form():
    """With ``parts`` the energy sums over listed parts only; it equals the dense form with the other scores 0,
    and still differentiates a listed part whose score is 0 (needed to learn scores that start at 0)."""
    _, mu, s, g = _setup(5)
    gen = torch.Generator().manual_seed(0)
    keep_s = torch.rand(s.shape, generator=gen) < 0.3
    keep_g = torch.rand(g.shape, generator=gen) < 0.3
    s0, g0 = torch.where(keep_s, s, 0.0), torch.where(keep_g, g, 0.0)
    sparse = SecondOrderArcs(s0, g0, parts=(keep_s.nonzero().T, keep_g.nonzero().T))
    dense = SecondOrderArcs(s0, g0)
    torch.testing.assert_close(sparse.value(mu), dense.value(mu), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(sparse.grad(mu).node, dense.grad(mu).node, rtol=1e-12, atol=1e-12)
    w = torch.zeros_like(s, requires_grad=True)
    SecondOrderArcs(w, None, parts=(keep_s.nonzero().T, None)).value(mu).sum().backward()
    valid, _ = second_order_masks(mu.lengths, s.shape[1])
    assert (keep_s & valid).sum() > 10
    assert torch.equal(w.grad != 0, keep_s & valid)          # every listed valid part, and nothing else
    with pytest.raises(ValueError, match="exactly when"):
        SecondOrderArcs(s, None, parts=(None, None))



def test_part_lists_are_checked():
    """A part list names entries of the score tensors, each once: a negative index (which would wrap to the
    other end), one past the end, a repeated part (counted twice) and a bool or float list are refused."""
    _, mu, s, _ = _setup(5)
    ok = torch.tensor([[0, 0], [0, 1], [1, 2], [2, 3]])
    SecondOrderArcs(s, None, parts=(ok, None)).value(mu)
    for bad, match in ((torch.tensor([[0], [0], [-3], [2]]), "out of range"),
                       (torch.tensor([[0], [0], [s.shape[1]], [2]]), "out of range"),
                       (torch.tensor([[s.shape[0]], [0], [1], [2]]), "out of range"),
                       (torch.tensor([[0, 0], [0, 0], [1, 1], [2, 2]]), "more than once"),
                       (ok[:3], r"\[4, P\]")):
        with pytest.raises(ValueError, match=match):
            SecondOrderArcs(s, None, parts=(bad, None))
    for bad in (ok.bool(), ok.double(), ok.tolist()):
        with pytest.raises(TypeError, match="integer tensor"):
            SecondOrderArcs(s, None, parts=(bad, None))
    SecondOrderArcs(s, None, parts=(ok[:, :0], None)).value(mu)      # no parts: allowed

@pytest.mark.parametrize("sparse", [False, True])
def test_cache_sees_in_place_score_changes(sparse):
    """Prepared scores are keyed on the score tensors and their versions: ``S.mul_(2)`` doubles the value."""
    _, mu, s, g = _setup(6)
    s, g = s.clone(), g.clone()
    parts = (torch.ones_like(s, dtype=torch.bool).nonzero().T, torch.ones_like(g, dtype=torch.bool).nonzero().T)
    e = SecondOrderArcs(s, g, parts=parts if sparse else None)
    with torch.no_grad():
        v1, g1 = e.value(mu), e.grad(mu).node
        s.mul_(2.0)
        g.mul_(2.0)
        torch.testing.assert_close(e.value(mu), 2 * v1, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(e.grad(mu).node, 2 * g1, rtol=1e-12, atol=1e-12)
        e.sibling = s / 2                                   # a new tensor object is seen as well
        torch.testing.assert_close(e.value(mu), SecondOrderArcs(s / 2, g).value(mu), rtol=1e-12, atol=1e-12)


def test_cache_reused_for_repeated_no_grad_calls():
    """The solvers' repeated calls (no autograd, same lengths) reuse the prepared scores."""
    _, mu, s, g = _setup(7)
    e = SecondOrderArcs(s, g)
    with torch.no_grad():
        e.value(mu)
        terms = e._cache[2]
        e.grad(mu)
        e.value(Marginals(mu.node.clone(), None, None, mu.lengths.clone()))    # equal lengths, another tensor
    assert e._cache[2] is terms


def test_repeated_backward_through_value_with_learnable_scores():
    """With scores that require grad, each call builds its own graph: two backward passes work and accumulate."""
    _, mu, s, _ = _setup(8)
    w = s.clone().requires_grad_(True)
    e = SecondOrderArcs(w, None)
    e.value(mu).sum().backward()
    first = w.grad.clone()
    e.value(mu).sum().backward()
    torch.testing.assert_close(w.grad, 2 * first)
    e.grad(mu).node.sum().backward()                         # the closed form too
    assert torch.isfinite(w.grad).all()
