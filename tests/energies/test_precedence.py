"""Precedence (order) energy: hand-counted violations, padding, psi-gradients, and the order it imposes."""

import pytest
import torch

import betheproj as bp
from betheproj.energies import Precedence
from tests.energies.vertices import one_hot

DT = torch.float64


def test_hand_counted_violations():
    # labels a=0, b=1, c=2; the labelling a b a b c
    mu = one_hot([[0, 1, 0, 1, 2]], 3)
    first = torch.tensor([[1.0, 0, 0], [0, 1, 0], [1, 0, 0], [1, 1, 0]], dtype=DT)
    then = torch.tensor([[0.0, 1, 0], [1, 0, 0], [0, 0, 1], [0, 0, 1]], dtype=DT)
    energy = Precedence(first, then, psi=1.0)
    # "a before b": the b at 1 precedes the a at 2 -> 1 pair; "b before a": a@0<b@1, a@0<b@3, a@2<b@3 -> 3;
    # "a before c" and "a or b before c": c is last -> 0
    assert energy.measurements(mu).tolist() == [[1.0, 3.0, 0.0, 0.0]]
    # smoothed hinge (width 1) of 1 and 3: 0.5 + 2.5
    assert energy.value(mu).item() == pytest.approx(3.0)
    assert Precedence(first, then, offset=1.0, psi=torch.tensor([[1.0, 2.0, 0.0, 0.0]], dtype=DT)).value(mu).item() \
        == pytest.approx(0 + 2 * 1.5)


def test_padding_is_ignored():
    first, then = torch.tensor([[1.0, 0]], dtype=DT), torch.tensor([[0.0, 1]], dtype=DT)
    mu = one_hot([[1, 0], [1]], 2, n=3)
    mu.node[1, 1:, 0] = 1.0                                      # mass past the second example's length
    energy = Precedence(first, then)
    assert energy.measurements(mu).flatten().tolist() == [1.0, 0.0]
    g = energy.grad(mu).node
    assert (g[1, 1:] == 0).all() and g[0].abs().sum() > 0


def test_gradient_is_differentiable_in_psi():
    mu = bp.LinearChain().marginals(bp.ChainPotentials(torch.randn(2, 5, 3, dtype=DT), torch.randn(3, 3, dtype=DT)))
    psi = torch.rand(1, 2, dtype=DT, requires_grad=True)
    energy = Precedence(torch.rand(2, 3, dtype=DT), torch.rand(2, 3, dtype=DT), offset=-1.0, psi=psi)
    g = energy.grad(mu).node
    (gpsi,) = torch.autograd.grad(g.sum(), psi)
    # the gradient is linear in psi: d(sum g)/d psi_j is the sum of the gradient of term j alone
    for j in range(2):
        alone = psi.detach().clone() * 0
        alone[0, j] = 1.0
        term = Precedence(energy.first, energy.then, offset=-1.0, psi=alone).grad(mu).node.sum()
        assert gpsi[0, j].item() == pytest.approx(term.item(), rel=1e-10)


def test_solver_imposes_the_order():
    # labels x=0, y=1: the first two positions lean to y (0.5), the last two to x (3); "x before y" is cheapest
    # to meet by relabelling the first two as x
    node = torch.tensor([[[0.0, 0.5], [0.0, 0.5], [3.0, 0.0], [3.0, 0.0]]], dtype=DT)
    theta = bp.ChainPotentials(node, torch.zeros(2, 2, dtype=DT))
    assert bp.LinearChain().map(theta).tolist() == [[1, 1, 0, 0]]
    energy = Precedence(torch.tensor([[1.0, 0]], dtype=DT), torch.tensor([[0.0, 1]], dtype=DT), psi=5.0)
    sol = bp.solve(bp.LinearChain(), theta, energy, max_iter=200)
    assert bp.decode(bp.LinearChain(), sol).tolist() == [[0, 0, 0, 0]]
    assert energy.measurements(sol.marginals).item() < 0.5


@pytest.mark.parametrize("make, msg", [
    (lambda: Precedence(torch.ones(2, 3), torch.ones(3, 3)), "same shape"),
    (lambda: Precedence(torch.ones(2, 3, 1), torch.ones(2, 3, 1)), r"\[J, C\]"),
    (lambda: Precedence(torch.ones(2, 3, dtype=torch.long), torch.ones(2, 3)), "floating-point"),
    (lambda: Precedence(torch.ones(2, 3), torch.full((2, 3), float("inf"))), "then must be finite"),
    (lambda: Precedence(torch.ones(2, 3), torch.ones(2, 3), offset=torch.ones(3)), "offset must be"),
    (lambda: Precedence(torch.ones(2, 3), torch.ones(2, 3), loss="cubic"), "loss must be one of"),
])
def test_bad_arguments(make, msg):
    with pytest.raises((TypeError, ValueError), match=msg):
        make()


def test_structure_mismatch():
    pot = bp.ChainPotentials(torch.randn(3, 4, 3, dtype=DT), torch.randn(3, 3, dtype=DT))
    with pytest.raises(ValueError, match="C=3"):
        bp.solve(bp.LinearChain(), pot, Precedence(torch.ones(2, 5, dtype=DT), torch.ones(2, 5, dtype=DT)))
    with pytest.raises(ValueError, match="psi must be"):
        bp.solve(bp.LinearChain(), pot, Precedence(torch.ones(2, 3, dtype=DT), torch.ones(2, 3, dtype=DT),
                                                   psi=torch.ones(5, 2, dtype=DT)))


def test_float32_gradient_keeps_the_mass_after_late_positions():
    """The mass after position i was the total less the prefix sum: at N = 3000 in float32 the rounding of the
    total swamped it near the end (gradients 20% off); each side is now its own cumulative sum."""
    gen = torch.Generator().manual_seed(0)
    mu = torch.softmax(torch.randn(2, 3000, 6, generator=gen, dtype=torch.float64) * 4, -1)
    eye = torch.eye(6, dtype=torch.float64)
    lengths = torch.tensor([3000, 2500])
    grads = []
    for dtype in (torch.float64, torch.float32):
        energy = Precedence(eye[:3].to(dtype), eye[3:].to(dtype))
        grads.append(energy.grad(bp.Marginals(mu.to(dtype), None, None, lengths)).node.double())
    rel = (grads[1] - grads[0]).abs() / grads[0].abs().clamp_min(1e-12)
    assert rel.max() < 1e-5
