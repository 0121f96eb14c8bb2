"""The engine on CUDA agrees with the CPU (skipped where no GPU is present, as in CI)."""

import pytest
import torch

import betheproj as bp
from betheproj.energies import LinearMeasurements, Poisson

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


@pytest.mark.parametrize("method", ["rda", "md", "accelerated"])
def test_solve_on_cuda_matches_cpu(method):
    dt = torch.float64
    node, edge = torch.randn(8, 7, 5, dtype=dt), torch.randn(8, 6, 5, 5, dtype=dt)
    edge[:, :, 0, 1] = -float("inf")
    lengths = torch.randint(1, 8, (8,))
    counts = torch.randint(0, 4, (8, 7, 5)).to(dt)
    a = torch.randn(3, 5, dtype=dt)
    results = []
    for device in ("cpu", "cuda"):
        theta = bp.ChainPotentials(node.to(device), edge.to(device), lengths.to(device))
        energy = (LinearMeasurements(node=a.to(device), loss="squared_hinge", psi=2.0)
                  + Poisson(counts.to(device), rate=0.5, scale=10.0))
        sol = bp.solve(bp.LinearChain(), theta, energy, method=method, max_iter=300)
        results.append((sol.objective.cpu(), bp.decode(bp.LinearChain(), sol).cpu(), sol.marginals.node.cpu()))
        assert sol.marginals.node.device.type == device
    assert torch.allclose(results[0][0], results[1][0], rtol=1e-8)
    assert torch.allclose(results[0][2], results[1][2], atol=1e-6)
    assert torch.equal(results[0][1], results[1][1])


def test_tree_and_brute_force_on_cuda():
    pot = bp.PairwisePotentials(torch.randn(3, 5, 3, dtype=torch.float64, device="cuda"),
                                torch.randn(3, 4, 3, 3, dtype=torch.float64, device="cuda"))
    parents = [-1, 0, 0, 1, 1]
    m, ref = bp.Tree(parents).marginals(pot), bp.BruteForce(parents).marginals(pot)
    assert torch.allclose(m.node, ref.node.to(m.node.device), atol=1e-10)
