"""Base CRF learning: the likelihood against brute force, its gradient, and training on synthetic data."""

import pytest
import torch

import betheproj as bp
from betheproj.learning import LinearChainCRF, crf_nll, fit_crf, sequence_score

DT = torch.float64


def test_nll_is_minus_log_probability_under_brute_force():
    pot = bp.ChainPotentials(torch.randn(3, 4, 3, dtype=DT), torch.randn(3, 3, 3, 3, dtype=DT), torch.tensor([4, 2, 1]))
    labels = torch.tensor([[0, 2, 1, 1], [2, 2, -1, -1], [1, -1, -1, -1]])
    nll = crf_nll(bp.LinearChain(), pot, labels)
    for b in range(3):
        ys, score = bp.BruteForce()._joint(pot, b)
        row = (ys == labels[b, : ys.shape[1]]).all(1).nonzero().item()
        assert torch.allclose(nll[b], torch.logsumexp(score, 0) - score[row])
    assert torch.allclose(sequence_score(pot, labels)[2], pot.node[2, 0, 1])


def test_nll_gradient_against_finite_differences():
    node = torch.randn(2, 5, 3, dtype=DT, requires_grad=True)
    edge = torch.randn(3, 3, dtype=DT, requires_grad=True)
    labels = torch.randint(0, 3, (2, 5))
    lengths = torch.tensor([5, 3])
    assert torch.autograd.gradcheck(
        lambda n, e: crf_nll(bp.LinearChain(), bp.ChainPotentials(n, e, lengths), labels), (node, edge))


def test_training_recovers_a_generating_model():
    gen = torch.Generator().manual_seed(0)
    true = LinearChainCRF(6, 4).double()
    with torch.no_grad():
        true.node.weight.copy_(torch.randn(4, 6, generator=gen, dtype=DT) * 2)
        true.transitions.copy_(torch.randn(4, 4, generator=gen, dtype=DT) * 2)
    x = torch.randn(400, 8, 6, generator=gen, dtype=DT)
    lengths = torch.randint(2, 9, (400,), generator=gen)
    labels = bp.LinearChain().map(true(x, lengths))
    model = LinearChainCRF(6, 4).double()
    history = fit_crf(model, x[:300], labels[:300], lengths[:300], l2=1e-4, max_iter=200)
    assert history[-1] < 0.5 * history[0]
    pred = bp.LinearChain().map(model(x[300:], lengths[300:]))
    valid = labels[300:] >= 0
    accuracy = (pred[valid] == labels[300:][valid]).double().mean()
    assert accuracy > 0.9                                         # measured: ~0.97


def test_bad_labels():
    pot = bp.ChainPotentials(torch.randn(2, 3, 4, dtype=DT), torch.randn(4, 4, dtype=DT))
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 4\)"):
        crf_nll(bp.LinearChain(), pot, torch.tensor([[0, 1, 4], [0, 0, 0]]))
    with pytest.raises(ValueError, match="labels must have shape"):
        crf_nll(bp.LinearChain(), pot, torch.zeros(2, 2, dtype=torch.long))


def test_chunked_training_is_the_same_objective():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(40, 7, 3, generator=gen, dtype=DT)
    lengths = torch.randint(1, 8, (40,), generator=gen)
    labels = torch.randint(0, 4, (40, 7), generator=gen)
    labels[torch.arange(7) >= lengths[:, None]] = -1
    runs = []
    for chunk in (None, 6):
        model = LinearChainCRF(3, 4).double()
        runs.append((fit_crf(model, x, labels, lengths, l2=1e-2, max_iter=5, chunk_size=chunk), model))
    assert runs[0][0] == pytest.approx(runs[1][0], rel=1e-10)
    assert torch.allclose(runs[0][1].transitions, runs[1][1].transitions, atol=1e-8)
    with pytest.raises(ValueError, match="chunk_size"):
        fit_crf(LinearChainCRF(3, 4).double(), x, labels, lengths, chunk_size=0)
