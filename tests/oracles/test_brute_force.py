"""The enumeration reference itself: float32 at large magnitudes agrees with float64 on the same inputs."""

import pytest
import torch

import betheproj as bp


@pytest.mark.parametrize("parents", [None, [-1, 0, 0, 1, 1]], ids=["chain", "tree"])
def test_float32_at_magnitude_1e4_matches_float64(parents):
    # each labelling's raw score is about 9e4, where float32's spacing is 0.008: scores are summed after the
    # per-position maximum is taken out, as the exact oracles do
    gen = torch.Generator().manual_seed(0)
    node = (torch.randn(2, 5, 3, generator=gen, dtype=torch.float64) + 1e4).float()
    edge = (torch.randn(3, 3, generator=gen, dtype=torch.float64) + 1e4).float()
    lengths = torch.tensor([5, 3])
    p32, p64 = bp.ChainPotentials(node, edge, lengths), bp.ChainPotentials(node.double(), edge.double(), lengths)
    oracle = bp.BruteForce(parents)
    m32, m64 = oracle.marginals(p32), oracle.marginals(p64)
    assert m32.node.dtype == torch.float32
    assert torch.allclose(m32.node.double(), m64.node, atol=2e-6)
    assert torch.allclose(m32.edge.double(), m64.edge, atol=2e-6)
    assert torch.allclose(m32.log_partition.double(), m64.log_partition, rtol=1e-7)
    assert torch.allclose(oracle.exact_entropy(p32).double(), oracle.exact_entropy(p64), atol=2e-6)
    assert torch.equal(oracle.map(p32), oracle.map(p64))


def test_bad_max_states_and_marginals_of_another_size_are_clear_errors():
    with pytest.raises(TypeError, match="max_states"):
        bp.oracles.BruteForce(max_states="x")
    with pytest.raises(ValueError, match="max_states"):
        bp.oracles.BruteForce(max_states=0)
    oracle = bp.oracles.BruteForce(parents=[-1, 0, 0])
    pot = bp.oracles.PairwisePotentials(torch.randn(1, 4, 2, dtype=torch.float64),
                                        torch.randn(1, 3, 2, 2, dtype=torch.float64))
    marginals = bp.oracles.BruteForce().marginals(pot)
    with pytest.raises(ValueError, match="marginals have N=4 positions but the tree has 3 nodes"):
        oracle.entropy(marginals)
