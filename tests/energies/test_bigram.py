"""Bigram exclusion energy: hand-counted patterns, padding, and the format it imposes."""

import pytest
import torch

import betheproj as bp
from betheproj.energies import BigramExclusion
from tests.energies.vertices import one_hot

DT = torch.float64


def indicator(*ids, c=3):
    v = torch.zeros(len(ids), c, dtype=DT)
    v[torch.arange(len(ids)), torch.tensor(ids)] = 1.0
    return v


def test_hand_counted_patterns():
    # patterns: (0 then 1), (1 then 0), (2 then 2); labelling 0 1 0 1 2 2 2
    left, right = indicator(0, 1, 2), indicator(1, 0, 2)
    energy = BigramExclusion(left, right, torch.tensor([[0, 1], [0, 2], [1, 2]]))
    mu = one_hot([[0, 1, 0, 1, 2, 2, 2], [0, 1, 2]], 3)
    assert energy.counts(mu).tolist() == [[2.0, 1.0, 2.0], [1.0, 0.0, 0.0]]
    # products 2, 4, 2 and 0, 0, 0; smoothed hinge (width 1): 1.5 + 3.5 + 1.5
    assert energy.value(mu).tolist() == pytest.approx([6.5, 0.0])
    # padding past a length holds no pattern even if it holds mass
    mu.node[1, 3:, 1] = 1.0
    assert energy.counts(mu)[1].tolist() == [1.0, 0.0, 0.0]


def test_solver_keeps_one_format():
    # labels a=0, b=1, c=2: positions 0-1 clearly "a b", positions 2-3 lean to "b a" (0.3) over "a b";
    # patterns (a then b) and (b then a) exclude each other, so the weak pair follows the strong one
    node = torch.tensor([[[4.0, 0, -9], [0, 4, -9], [-9, -9, 5], [0, 0.3, -9], [0.3, 0, -9]]], dtype=DT)
    theta = bp.ChainPotentials(node, torch.zeros(3, 3, dtype=DT))
    assert bp.LinearChain().map(theta).tolist() == [[0, 1, 2, 1, 0]]
    energy = BigramExclusion(indicator(0, 1), indicator(1, 0), torch.tensor([[0, 1]]), psi=3.0)
    sol = bp.solve(bp.LinearChain(), theta, energy, max_iter=200)
    assert bp.decode(bp.LinearChain(), sol).tolist() == [[0, 1, 2, 0, 1]]


@pytest.mark.parametrize("make, msg", [
    (lambda: BigramExclusion(torch.ones(2, 3), torch.ones(3, 3), torch.tensor([[0, 1]])), "same shape"),
    (lambda: BigramExclusion(torch.ones(2, 3), torch.ones(2, 3), torch.tensor([[0, 2]])), "index the 2 patterns"),
    (lambda: BigramExclusion(torch.ones(2, 3), torch.ones(2, 3), torch.tensor([0, 1])), r"\[J, 2\]"),
    (lambda: BigramExclusion(torch.ones(2, 3), torch.ones(2, 3), torch.tensor([[True, False]])),   # read as 1, 0
     r"pairs must be an integer tensor \[J, 2\], got torch.bool"),
    (lambda: BigramExclusion(torch.ones(2, 3), torch.ones(2, 3), [[0, 1]]), "got list"),
    (lambda: BigramExclusion(torch.ones(2, 3, dtype=torch.long), torch.ones(2, 3), torch.tensor([[0, 1]])),
     "floating-point"),
    (lambda: BigramExclusion(torch.ones(2, 3), torch.ones(2, 3), torch.tensor([[0, 1]]), offset=torch.ones(2)),
     "offset must be"),
])
def test_bad_arguments(make, msg):
    with pytest.raises((TypeError, ValueError), match=msg):
        make()


def test_structure_mismatch():
    pot = bp.ChainPotentials(torch.randn(2, 4, 3, dtype=DT), torch.randn(3, 3, dtype=DT))
    with pytest.raises(ValueError, match="C=3"):
        bp.solve(bp.LinearChain(), pot, BigramExclusion(torch.ones(2, 5, dtype=DT), torch.ones(2, 5, dtype=DT),
                                                        torch.tensor([[0, 1]])))
