"""Sparse gradients of hashed weights (betheproj/parsing/_sparse.py) against dense autograd and torch's Adagrad."""

import pytest
import torch

from betheproj.parsing._sparse import AdaGrad, take

DT = torch.float64


def _loss(w: torch.Tensor, idx: torch.Tensor, target: torch.Tensor, gather) -> torch.Tensor:
    return ((gather(w, idx).sum(-1) - target) ** 2).sum()


def test_take_gives_the_dense_gradient_as_a_sparse_vector():
    gen = torch.Generator().manual_seed(0)
    idx = torch.randint(0, 50, (40, 3), generator=gen)                  # 2-D, with repeated entries
    target = torch.randn(40, generator=gen, dtype=DT)
    w = torch.randn(60, generator=gen, dtype=DT, requires_grad=True)
    _loss(w, idx, target, take).backward()
    assert w.grad is not None and w.grad.is_sparse
    sparse = w.grad.to_dense()
    w.grad = None
    _loss(w, idx, target, lambda v, i: v[i]).backward()
    assert torch.allclose(sparse, w.grad, rtol=1e-14, atol=1e-14)
    assert torch.equal(sparse[50:], torch.zeros(10, dtype=DT))          # entries never read


def test_take_without_grad_is_plain_indexing():
    w = torch.arange(5.0, dtype=DT)
    out = take(w, torch.tensor([[4, 0], [2, 2]]))
    assert torch.equal(out, torch.tensor([[4.0, 0.0], [2.0, 2.0]], dtype=DT)) and out.grad_fn is None
    w.requires_grad_(True)
    with torch.no_grad():
        assert take(w, torch.tensor([1])).grad_fn is None


@pytest.mark.parametrize("l2", [0.0, 0.1])
def test_adagrad_takes_torch_adagrads_steps(l2):
    """The same weights and accumulators as torch.optim.Adagrad (dense gradients) after several steps on two
    weight vectors with their own rates, each step reading a few entries (repeated ones too); with an L2 term the
    gradient is dense and every entry moves."""
    gen = torch.Generator().manual_seed(1)
    start = [torch.randn(200, generator=gen, dtype=DT), torch.randn(80, generator=gen, dtype=DT)]
    steps = [(torch.randint(0, 200, (30, 4), generator=gen), torch.randint(0, 80, (30, 2), generator=gen),
              torch.randn(30, generator=gen, dtype=DT)) for _ in range(6)]

    def train(sparse: bool) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        ws = [s.clone().requires_grad_(True) for s in start]
        opt = (AdaGrad([(ws[0], 0.05), (ws[1], 0.01)]) if sparse
               else torch.optim.Adagrad([{"params": [ws[0]], "lr": 0.05}, {"params": [ws[1]], "lr": 0.01}]))
        gather = take if sparse else (lambda v, i: v[i])
        for i1, i2, target in steps:
            opt.zero_grad()
            loss = ((gather(ws[0], i1).sum(-1) + gather(ws[1], i2).sum(-1) - target) ** 2).sum()
            if l2:
                loss = loss + 0.5 * l2 * (ws[0] * ws[0]).sum()
            loss.backward()
            opt.step()
        sums = ([g[2] for g in opt.groups] if sparse
                else [opt.state[w]["sum"] for w in ws])
        return [w.detach() for w in ws], sums

    (w_s, sum_s), (w_d, sum_d) = train(True), train(False)
    for a, b in zip(w_s + sum_s, w_d + sum_d, strict=True):
        assert torch.allclose(a, b, rtol=1e-13, atol=1e-15)
    if not l2:
        read = torch.zeros(200, dtype=torch.bool)
        for i1, _, _ in steps:
            read[i1.flatten()] = True
        assert torch.equal(w_s[0][~read], start[0][~read]) and bool((sum_s[0][~read] == 0).all())
