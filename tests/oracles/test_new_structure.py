"""A structure written from scratch against the Oracle protocol alone (its four methods; no base class, nothing
registered, no edits elsewhere): the solvers, the decoder and the learners drive it as they drive ``LinearChain``,
which it must then match.  This is the README's claim that a new structure is one new file."""

from __future__ import annotations

import pytest
import torch

import betheproj as bp
from betheproj.energies import LinearMeasurements
from betheproj.learning import ConstantPsi, LinearChainCRF, NonLocalCRF, fit_crf
from betheproj.oracles.base import Marginals, bethe_entropy

DT = torch.float64


class NaiveChain:
    """A linear chain the plain way: the forward algorithm by ``logsumexp``, the marginals as the gradient of
    ``log Z``, Viterbi with back-pointers."""

    @staticmethod
    def _edges(pot: bp.ChainPotentials) -> torch.Tensor:
        b, n, c = pot.node.shape
        return pot.edge.expand(b, max(n - 1, 0), c, c)     # [C, C] shared or [B, N-1, C, C]

    @staticmethod
    def _log_z(node: torch.Tensor, edge: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        alpha = node[:, 0]
        for t in range(1, node.shape[1]):
            step = (alpha[:, :, None] + edge[:, t - 1]).logsumexp(1) + node[:, t]
            alpha = torch.where((t < lengths)[:, None], step, alpha)
        return alpha.logsumexp(-1)

    def marginals(self, potentials: bp.ChainPotentials) -> Marginals:
        with torch.enable_grad():
            node = potentials.node.detach().requires_grad_(True)
            edge = self._edges(potentials).detach().clone().requires_grad_(True)
            log_z = self._log_z(node, edge, potentials.lengths)
            mu_node, mu_edge = torch.autograd.grad(log_z.sum(), (node, edge))
        return Marginals(mu_node, mu_edge, log_z.detach(), potentials.lengths)

    def map(self, potentials: bp.ChainPotentials) -> torch.Tensor:
        node, edge, lengths = potentials.node, self._edges(potentials), potentials.lengths
        b, n, c = node.shape
        keep = torch.arange(c).expand(b, c)
        score, back = node[:, 0], []
        for t in range(1, n):
            best, arg = (score[:, :, None] + edge[:, t - 1]).max(1)
            valid = (t < lengths)[:, None]
            score = torch.where(valid, best + node[:, t], score)
            back.append(torch.where(valid, arg, keep))      # past the end a label points to itself
        labels = [score.argmax(-1)]
        for arg in reversed(back):
            labels.append(arg.gather(1, labels[-1][:, None])[:, 0])
        labels = torch.stack(labels[::-1], 1)
        return labels.masked_fill(torch.arange(n) >= lengths[:, None], -1)

    def entropy(self, marginals: Marginals) -> torch.Tensor:
        return bethe_entropy(marginals.node, marginals.edge, self.degree(marginals.lengths, marginals.node.shape[1]))

    def degree(self, lengths: torch.Tensor, n: int) -> torch.Tensor:
        pos = torch.arange(n)
        return ((pos > 0) & (pos < lengths[:, None])).long() + (pos < lengths[:, None] - 1).long()


def _problem(seed: int = 0, shared: bool = True) -> tuple[bp.ChainPotentials, LinearMeasurements]:
    gen = torch.Generator().manual_seed(seed)
    b, n, c = 5, 7, 4
    node = 2 * torch.randn(b, n, c, dtype=DT, generator=gen)
    edge = torch.randn(*((c, c) if shared else (b, n - 1, c, c)), dtype=DT, generator=gen)
    theta = bp.ChainPotentials(node, edge, torch.tensor([7, 5, 1, 3, 6]))
    a = torch.zeros(2, c, dtype=DT)
    a[0, 0], a[1, 2] = -1.0, 1.0              # label 0 at least twice, label 2 at most once
    return theta, LinearMeasurements(node=a, offset=torch.tensor([-2.0, 1.0], dtype=DT), psi=6.0)


@pytest.mark.parametrize("shared", [True, False])
def test_the_scratch_oracle_is_a_chain(shared):
    theta, _ = _problem(1, shared)
    ours, ref = NaiveChain().marginals(theta), bp.LinearChain().marginals(theta)
    assert torch.allclose(ours.node, ref.node, atol=1e-12)
    assert torch.allclose(ours.edge, ref.edge, atol=1e-12)
    assert torch.allclose(ours.log_partition, ref.log_partition, atol=1e-12)
    assert torch.equal(NaiveChain().map(theta), bp.LinearChain().map(theta))


@pytest.mark.parametrize("method", ["md", "rda", "accelerated"])
@pytest.mark.parametrize("shared", [True, False])
def test_every_solver_and_the_decoder_drive_it(method, shared):
    theta, energy = _problem(2, shared)
    ours = bp.solve(NaiveChain(), theta, energy, method=method, tol=1e-9, max_iter=500)
    ref = bp.solve(bp.LinearChain(), theta, energy, method=method, tol=1e-9, max_iter=500)
    assert torch.equal(ours.converged, ref.converged)
    assert method == "rda" or bool(ours.converged.all())       # Bethe-RDA's dual average converges slowly
    assert torch.allclose(ours.objective, ref.objective, atol=1e-9)
    assert torch.allclose(ours.marginals.node, ref.marginals.node, atol=1e-6)
    labels = bp.decode(NaiveChain(), ours)
    assert torch.equal(labels, bp.decode(bp.LinearChain(), ref))
    # the energy moved the answer: label 0 now shows up where the base MAP had it less than twice
    base = bp.LinearChain().map(theta)
    assert not torch.equal(labels, base)


def _data(seed: int = 3) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    b, n, f, c = 12, 6, 5, 3
    lengths = torch.randint(2, n + 1, (b,), generator=gen)
    y = torch.randint(0, c, (b, n), generator=gen).masked_fill(torch.arange(n) >= lengths[:, None], -1)
    x = torch.eye(f, dtype=DT)[y.clamp_min(0) % f] + 0.5 * torch.randn(b, n, f, dtype=DT, generator=gen)
    return x, y, lengths


def test_the_learners_drive_it():
    x, y, lengths = _data()
    a = torch.zeros(1, 3, dtype=DT)
    a[0, 1] = -1.0                                     # label 1 at least once
    runs = []
    for oracle in (NaiveChain(), bp.LinearChain()):
        torch.manual_seed(0)
        base = LinearChainCRF(5, 3).double()
        losses = fit_crf(base, x, y, lengths, oracle=oracle, max_iter=5)
        model = NonLocalCRF(base, lambda psi: LinearMeasurements(node=a, offset=-1.0, psi=psi),
                            psi=ConstantPsi(1.0).double(), oracle=oracle)
        model.fit(x, y, lengths, epochs=2, batch_size=4, lr=1e-2, psi_lr=0.1, seed=0)
        runs.append((losses, [p.detach().clone() for p in model.parameters()], model.predict(x, lengths)))
    (l1, p1, y1), (l2, p2, y2) = runs
    assert l1 == pytest.approx(l2, rel=1e-9)
    assert all(torch.allclose(a, b, atol=1e-7) for a, b in zip(p1, p2, strict=True))
    assert not torch.allclose(p1[-1], torch.ones_like(p1[-1]))       # psi was learned, not left at its start
    assert torch.equal(y1, y2)
