"""Energies: closed-form gradients equal autograd and pass gradcheck; values against hand computations."""

import numpy as np
import pytest
import torch

import betheproj as bp
from betheproj.energies import (
    LOSSES,
    BigramExclusion,
    FunctionEnergy,
    LinearMeasurements,
    Loss,
    MeanField,
    NearestPrototype,
    Poisson,
    Precedence,
    PrototypeDistance,
    autograd_gradient,
)
from betheproj.oracles.base import Marginals

DT = torch.float64


def _marginals(b=3, n=4, c=3, lengths=(4, 2, 1)):
    pot = bp.ChainPotentials(torch.randn(b, n, c, dtype=DT), torch.randn(b, n - 1, c, c, dtype=DT),
                             torch.tensor(lengths[:b]))
    return bp.LinearChain().marginals(pot)


def _einsum_operand_sizes(monkeypatch) -> list[int]:
    """The sizes (numel) of every operand of every ``torch.einsum`` call from now on, appended as they come."""
    operands: list[int] = []
    einsum = torch.einsum

    def spy(spec, *args):
        operands.extend(x.numel() for x in args)
        return einsum(spec, *args)

    monkeypatch.setattr(torch, "einsum", spy)
    return operands


def _energies(mu):
    b, n, c = mu.node.shape
    protos_w = torch.rand(5, n, c, dtype=DT)
    shared = torch.rand(2, c, dtype=DT)
    return {
        "linear-counts": LinearMeasurements(node=torch.randn(6, c, dtype=DT), offset=0.3, loss="smoothed_hinge",
                                            psi=torch.rand(b, 6, dtype=DT)),
        "linear-position": LinearMeasurements(node=torch.randn(4, n, c, dtype=DT), loss="squared",
                                              psi=torch.rand(b, dtype=DT)),
        "linear-edge": LinearMeasurements(edge=torch.randn(3, c, c, dtype=DT), offset=torch.randn(3, dtype=DT),
                                          loss="squared_hinge"),
        "linear-edge-position": LinearMeasurements(edge=torch.randn(b, 2, n - 1, c, c, dtype=DT),
                                                   loss="smoothed_abs", psi=torch.rand(1, 2, dtype=DT)),
        "poisson": Poisson(torch.randint(0, 5, (b, n, c)).to(DT), rate=0.7, scale=torch.rand(b, dtype=DT) + 1),
        "unigram": NearestPrototype(torch.rand(7, c, dtype=DT) * 3, psi=2.0),
        "word": NearestPrototype(protos_w, psi=torch.rand(b, dtype=DT), statistic="word",
                                 prototype_lengths=torch.tensor([4, 2, 2, 1, 3])),
        "mean-field": MeanField(torch.tensor([[0, 2], [1, 3], [0, 3]]), torch.randn(3, c, c, dtype=DT)),
        # offsets keep the finite differences off the hinge's kinks at V = b and V = b + width
        "precedence": Precedence(torch.rand(4, c, dtype=DT), torch.rand(4, c, dtype=DT),
                                 offset=torch.tensor([-0.3, 0.2, 0.45, -2.0], dtype=DT),
                                 psi=torch.rand(b, 4, dtype=DT)),
        "bigram": BigramExclusion(torch.rand(3, c, dtype=DT), torch.rand(3, c, dtype=DT),
                                  torch.tensor([[0, 1], [1, 2], [0, 2]]), offset=torch.tensor([-0.3, 0.02, -1.0],
                                                                                              dtype=DT),
                                  psi=torch.rand(b, 3, dtype=DT)),
        # patterns that share vectors, and two equal patterns (the same cell of the G x G neighbour counts)
        "bigram-shared": BigramExclusion(shared[[0, 0, 1, 0]], shared[[1, 1, 0, 0]],
                                         torch.tensor([[0, 2], [1, 3], [2, 3]]),
                                         offset=torch.tensor([-0.3, 0.02, -1.0], dtype=DT),
                                         psi=torch.rand(b, 3, dtype=DT)),
    }


@pytest.mark.parametrize("name", ["linear-counts", "linear-position", "linear-edge", "linear-edge-position",
                                  "poisson", "unigram", "word", "mean-field", "precedence", "bigram",
                                  "bigram-shared"])
def test_closed_form_gradient_equals_autograd(name):
    mu = _marginals()
    energy = _energies(mu)[name]
    energy.validate(mu)
    closed, auto = energy.grad(mu), autograd_gradient(energy, mu)
    mask = mu.node_mask()[..., None]
    closed_node = closed.node if closed.node is not None else torch.zeros_like(mu.node)
    assert torch.allclose(torch.where(mask, closed_node, 0.0), torch.where(mask, auto.node, 0.0), atol=1e-10)
    if auto.edge is not None:
        emask = mu.edge_mask()[..., None, None]
        assert torch.allclose(torch.where(emask, closed.edge, 0.0), torch.where(emask, auto.edge, 0.0), atol=1e-10)
    else:
        assert closed.edge is None


def test_edge_totals_and_total_grad():
    mu = _marginals()
    e = _energies(mu)
    assert e["linear-edge"].edge_totals and not e["linear-edge-position"].edge_totals
    assert e["poisson"].edge_totals and e["precedence"].edge_totals
    assert (e["linear-edge"] + 2.0 * e["linear-counts"]).edge_totals
    assert not (e["linear-edge"] + e["linear-edge-position"]).edge_totals
    assert not FunctionEnergy(lambda m: m.node.sum((1, 2))).edge_totals
    # the closed-form per-example edge gradient is the per-position one at every valid position
    total = e["linear-edge"] + torch.rand(3, dtype=DT) * e["linear-counts"]
    g, tg = total.grad(mu), total.total_grad(mu)
    assert tg.edge.shape == (3, 3, 3) and torch.allclose(tg.node, g.node)
    emask = mu.edge_mask()[..., None, None]
    assert torch.allclose(torch.where(emask, tg.edge[:, None].expand_as(g.edge), 0.0), g.edge)
    # value through the chain's summed edges (shared transitions) equals value through the materialised ones
    pot = bp.ChainPotentials(torch.randn(3, 4, 3, dtype=DT), torch.randn(3, 3, dtype=DT), mu.lengths)
    shared = bp.LinearChain().marginals(pot)
    dense = Marginals(shared.node, shared.edge, None, shared.lengths)
    assert torch.allclose(e["linear-edge"].value(shared), e["linear-edge"].value(dense), atol=1e-12)


class _ClosedForm(torch.autograd.Function):
    """``L(mu)`` whose backward is the energy's closed-form gradient, so gradcheck tests that gradient."""

    @staticmethod
    def forward(ctx, node, edge, energy, lengths):
        ctx.save_for_backward(node, edge)
        ctx.energy, ctx.lengths = energy, lengths
        return energy.value(Marginals(node, edge, None, lengths))

    @staticmethod
    def backward(ctx, out):
        node, edge = ctx.saved_tensors
        g = ctx.energy.grad(Marginals(node, edge, None, ctx.lengths))
        g_node = torch.zeros_like(node) if g.node is None else g.node * out[:, None, None]
        g_edge = torch.zeros_like(edge) if g.edge is None else g.edge * out[:, None, None, None]
        return g_node, g_edge, None, None


@pytest.mark.parametrize("name", ["linear-counts", "linear-position", "linear-edge", "linear-edge-position",
                                  "poisson", "unigram", "word", "mean-field", "precedence", "bigram",
                                  "bigram-shared"])
def test_gradcheck_closed_form(name):
    mu = _marginals()
    energy = _energies(mu)[name]
    node = mu.node.clone()
    if name in ("unigram", "word"):
        node = node + 1e-3          # keep finite differences off the kinks of the L1 distance
    node.requires_grad_(True)
    edge = mu.edge.clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x, y: _ClosedForm.apply(x, y, energy, mu.lengths), (node, edge),
                                    eps=1e-6, atol=1e-5)


def test_loss_values():
    z = torch.tensor([-1.0, 0.0, 0.5, 1.0, 3.0], dtype=DT)
    assert torch.allclose(Loss("smoothed_hinge")(z), torch.tensor([0, 0, 0.125, 0.5, 2.5], dtype=DT))
    assert torch.allclose(Loss("squared_hinge")(z), torch.tensor([0, 0, 0.125, 0.5, 4.5], dtype=DT))
    assert torch.allclose(Loss("squared")(z), torch.tensor([0.5, 0, 0.125, 0.5, 4.5], dtype=DT))
    assert torch.allclose(Loss("smoothed_abs")(z), torch.tensor([0.5, 0, 0.125, 0.5, 2.5], dtype=DT))
    for name in LOSSES:
        zz = torch.linspace(-3, 3, 61, dtype=DT, requires_grad=True)
        (g,) = torch.autograd.grad(Loss(name)(zz).sum(), zz)
        assert torch.allclose(g, Loss(name).derivative(zz.detach()), atol=1e-12)


@pytest.mark.parametrize("name", ["smoothed_hinge", "smoothed_abs"])
def test_loss_width_below_the_dtype_smallest_normal(name):
    # 1e-50 is 0 in float32: the kink gave 0 / 0 = NaN; the loss is then the unsmoothed hinge / |z|
    z = torch.tensor([-1.0, 0.0, 1e-30, 1.0])
    hinge = z.clamp_min(0) if name == "smoothed_hinge" else z.abs()
    slope = torch.tensor([0.0 if name == "smoothed_hinge" else -1.0, 0.0, 1.0, 1.0])
    loss = Loss(name, 1e-50)
    assert torch.allclose(loss(z), hinge) and torch.equal(loss.derivative(z), slope)


def test_linear_measurements_hand_counted():
    # one example, 3 positions, labels (a, b): node marginals put mass 1 on a, b, a
    node = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]]], dtype=DT)
    edge = torch.tensor([[[[0.0, 1.0], [0.0, 0.0]], [[0.0, 0.0], [1.0, 0.0]]]], dtype=DT)
    mu = Marginals(node, edge, None, torch.tensor([3]))
    # count(a) - count(b) = 1; count of transitions a->b = 1; presence of label a at position 2
    e = LinearMeasurements(node=torch.tensor([[1.0, -1.0]], dtype=DT))
    assert e.measurements(mu).item() == 1.0
    e = LinearMeasurements(edge=torch.tensor([[[0.0, 1.0], [0.0, 0.0]]], dtype=DT), offset=0.5, loss="squared")
    assert e.measurements(mu).item() == 1.0 and e.value(mu).item() == 0.125
    pos = torch.zeros(1, 3, 2, dtype=DT)
    pos[0, 1, 0] = 1.0
    assert LinearMeasurements(node=pos).measurements(mu).item() == 0.0


def test_poisson_value_matches_formula():
    mu = _marginals()
    counts = torch.randint(0, 5, mu.node.shape).to(DT)
    e = Poisson(counts, rate=0.5, scale=10.0)
    mask = mu.node_mask()[..., None]
    y = counts * mask
    mean = 0.5 * 10.0 * mu.node
    manual = (torch.where(mask, mean, 0.0) - torch.where(y > 0, y * torch.log(mean), 0.0)).sum((1, 2)) / 10.0
    assert torch.allclose(e.value(mu), manual)


def test_prototype_values():
    node = torch.tensor([[[0.8, 0.2], [0.1, 0.9], [0.0, 0.0]]], dtype=DT)
    mu = Marginals(node, None, None, torch.tensor([2]))
    uni = NearestPrototype(torch.tensor([[1.0, 1.0], [2.0, 0.0]], dtype=DT), psi=2.0)
    assert torch.allclose(uni.value(mu), torch.tensor([2.0 * 0.2], dtype=DT))      # |0.9-1| + |1.1-1|
    word = NearestPrototype(torch.tensor([[[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]], [[0.0, 1.0], [1.0, 0.0], [0, 0]]],
                                         dtype=DT), statistic="word", prototype_lengths=torch.tensor([3, 2]))
    assert torch.allclose(word.value(mu), torch.tensor([3.4], dtype=DT))   # .8+.8+.9+.9, length-2 prototype only
    none = NearestPrototype(torch.ones(1, 5, 2, dtype=DT), statistic="word", prototype_lengths=torch.tensor([5]))
    assert none.value(mu).item() == 0.0 and (none.grad(mu).node == 0).all()
    # what a prototype stores past its length is padding, whatever it holds
    padded = NearestPrototype(torch.tensor([[[0.8, 0.2], [0.1, 0.9], [5.0, 5.0]]], dtype=DT), statistic="word",
                              prototype_lengths=torch.tensor([2]))
    assert padded.value(mu).item() == 0.0 and (padded.grad(mu).node == 0).all()



def test_prototype_distance_counts_a_word_target_past_the_marginals():
    """``psi ||t - S(mu)||_1`` for a word target longer than the marginals' N: its entries past N were dropped (the
    distance to a 4-position target read as that to its first 2), while its entries past the example's length
    but inside N counted, so the same target scored differently with N = 2 and N = 3."""
    node = torch.tensor([[[0.8, 0.2], [0.1, 0.9]]], dtype=DT)
    target = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.0, 1.0]]], dtype=DT)
    mu = Marginals(node, None, None, torch.tensor([2]))
    wider = Marginals(torch.cat([node, torch.zeros(1, 1, 2, dtype=DT)], 1), None, None, torch.tensor([2]))
    energy = PrototypeDistance(target, 1.5, "word")
    want = 1.5 * (0.2 + 0.2 + 0.1 + 0.1 + 2.0)                  # positions 2 and 3 of the target hold 1 each
    for m in (mu, wider):
        assert energy.value(m).item() == pytest.approx(want, abs=1e-12)
        torch.testing.assert_close(energy.grad(m).node, autograd_gradient(energy, m).node)
    assert energy.grad(mu).node.shape == node.shape

def test_mean_field_value():
    node = torch.tensor([[[0.5, 0.5], [1.0, 0.0], [0.25, 0.75]]], dtype=DT)
    mu = Marginals(node, None, None, torch.tensor([3]))
    w = torch.tensor([[[1.0, 2.0], [3.0, 4.0]]], dtype=DT)
    e = MeanField(torch.tensor([[0, 2]]), w)
    manual = -(node[0, 0][:, None] * w[0] * node[0, 2][None, :]).sum()
    assert torch.allclose(e.value(mu), manual[None])


def test_sum_and_scale():
    mu = _marginals()
    es = _energies(mu)
    total = es["poisson"] + 2.0 * es["linear-counts"] + es["mean-field"]
    expected = es["poisson"].value(mu) + 2.0 * es["linear-counts"].value(mu) + es["mean-field"].value(mu)
    assert torch.allclose(total.value(mu), expected)
    g = total.grad(mu)
    ref = autograd_gradient(total, mu)
    assert torch.allclose(g.node * mu.node_mask()[..., None], ref.node * mu.node_mask()[..., None], atol=1e-10)
    built = sum([es["poisson"], 2.0 * es["linear-counts"], es["mean-field"]])     # Python's sum starts from 0
    assert isinstance(built, bp.energies.EnergySum) and torch.equal(built.value(mu), total.value(mu))
    assert sum([es["poisson"]]) is es["poisson"]


def test_user_energy_by_autograd_uses_edges_only_when_read():
    mu = _marginals()
    node_only = FunctionEnergy(lambda m: (m.node ** 2).sum((1, 2)))
    assert node_only.grad(mu).edge is None
    with_edge = FunctionEnergy(lambda m: (m.edge ** 2).sum((1, 2, 3)))
    g = with_edge.grad(mu)
    assert torch.allclose(g.edge, 2 * mu.edge)


@pytest.mark.parametrize("make, msg", [
    (lambda: Poisson(-torch.ones(1, 2, 2, dtype=DT)), "non-negative"),
    (lambda: Poisson(torch.ones(1, 2, 2, dtype=DT), rate=0.0), "rate must be a finite number > 0"),
    (lambda: Poisson(torch.ones(1, 2, 2, dtype=DT), scale=-1.0), "scale must be a finite number > 0"),
    (lambda: Poisson(torch.ones(2, 2, dtype=DT)), r"counts must be \[B, N, C\]"),
    (lambda: LinearMeasurements(), "needs node and/or edge"),
    (lambda: LinearMeasurements(node=torch.ones(2, 3), loss="cubic"), "loss must be one of"),
    (lambda: LinearMeasurements(node=torch.ones(2, 3), edge=torch.ones(3, 3, 3)), "J=2 measurements"),
    (lambda: NearestPrototype(torch.ones(2, 3), statistic="bigram"), "statistic must be"),
    (lambda: NearestPrototype(torch.ones(2, 3, 3), statistic="word"), "prototype_lengths"),
    (lambda: NearestPrototype(torch.ones(1, 2, 3), statistic="word", prototype_lengths=torch.tensor([4])),
     "prototype_lengths must be at most M=2"),
    (lambda: MeanField(torch.tensor([[0, 1, 2]]), torch.ones(1, 2, 2)), r"pairs must be an integer tensor \[K, 2\]"),
    (lambda: MeanField(torch.tensor([[True, False]]), torch.ones(1, 2, 2)),   # read as nodes 1 and 0
     r"pairs must be an integer tensor \[K, 2\], got torch.bool"),
    (lambda: MeanField(torch.tensor([[0.0, 1.0]]), torch.ones(1, 2, 2)), "got torch.float32"),
    (lambda: NearestPrototype(torch.ones(2, 3), psi=float("nan")), "psi must be a finite number"),
    (lambda: Poisson(torch.ones(1, 2, 2, dtype=torch.long)), "counts must be a floating-point tensor"),
    (lambda: Poisson(torch.full((1, 2, 2), float("inf"), dtype=DT)), "counts must be finite"),
    (lambda: Poisson(torch.ones(1, 2, 2, dtype=DT), rate=torch.tensor([1, 2])), "rate must be a float or a floating"),
    (lambda: Poisson(torch.ones(1, 2, 2, dtype=DT), rate=torch.tensor([1.0, float("nan")])), "rate must be finite"),
    (lambda: Poisson(torch.ones(1, 2, 2, dtype=DT), scale="3"), "scale must be a float or a tensor"),
    (lambda: Poisson(torch.ones(1, 2, 2, dtype=DT), rate=True), "rate must be a float or a tensor"),
    (lambda: MeanField(torch.zeros(0, 2, dtype=torch.long), torch.ones(0, 2, 2)), "at least one pair"),
    (lambda: MeanField(torch.tensor([[0, -1]]), torch.ones(1, 2, 2)), "non-negative node indices"),
    (lambda: MeanField(torch.tensor([[0, 1]]), torch.ones(1, 2, 2, dtype=torch.long)), "floating-point tensor"),
    (lambda: MeanField(torch.tensor([[0, 1]]), torch.ones(2, 2, 2)), r"weights must be \[K, C, C\]"),
    (lambda: MeanField(torch.tensor([[0, 1]]), torch.full((1, 2, 2), float("nan"))), "weights must be finite"),
    (lambda: Loss("smoothed_hinge", float("inf")), "width must be a finite number > 0"),
    (lambda: Loss("smoothed_abs", 0.0), "width must be a finite number > 0"),
    (lambda: Loss("smoothed_hinge", "1"), "width must be a real number, got str"),
    # complex targets lost their imaginary part with a warning, bool/int ones were read as 0/1 counts, a list was
    # a ValueError; NearestPrototype and Poisson refuse them likewise
    (lambda: PrototypeDistance(torch.ones(2, 3, dtype=torch.complex128)), "targets must be a floating-point tensor"),
    (lambda: PrototypeDistance(torch.ones(2, 3, dtype=torch.bool)), "targets must be a floating-point tensor"),
    (lambda: PrototypeDistance(torch.ones(2, 3, dtype=torch.long)), "targets must be a floating-point tensor"),
    (lambda: PrototypeDistance([[1.0, 0.0]]), "targets must be a floating-point tensor, got list"),
])
def test_bad_energy_arguments(make, msg):
    with pytest.raises((ValueError, TypeError), match=msg):
        make()


@pytest.mark.parametrize("energy, msg", [
    (Poisson(torch.ones(3, 4, 5, dtype=DT)), "counts have shape"),
    (LinearMeasurements(node=torch.ones(2, 5, dtype=DT)), "5 labels"),
    (LinearMeasurements(node=torch.ones(2, 6, 3, dtype=DT)), "6 positions"),
    (NearestPrototype(torch.ones(2, 4, dtype=DT)), "4 labels"),
    (MeanField(torch.tensor([[0, 9]]), torch.ones(1, 3, 3, dtype=DT)), "N=4"),
    (MeanField(torch.tensor([[0, 1]]), torch.ones(1, 2, 2, dtype=DT)), "weights have 2 labels"),
    (MeanField(torch.tensor([[0, 1]]), torch.ones(2, 1, 3, 3, dtype=DT)), "weights have B=2"),
    (Poisson(torch.ones(3, 4, 3, dtype=DT), rate=torch.ones(2, dtype=DT)), "rate"),
])
def test_energy_structure_mismatch(energy, msg):
    pot = bp.ChainPotentials(torch.randn(3, 4, 3, dtype=DT), torch.randn(3, 3, dtype=DT))
    with pytest.raises(ValueError, match=msg):
        bp.solve(bp.LinearChain(), pot, energy)


def test_per_position_edge_vectors_with_j_not_b():
    """``edge`` [J, N-1, C, C] (one vector per position) is 4-D like per-example node vectors but is not per-example:
    it solves for any J != B; per-example [B, J, N-1, C, C] vectors with the wrong B are rejected."""
    pot = bp.ChainPotentials(torch.randn(3, 4, 2, dtype=DT), torch.randn(2, 2, dtype=DT))
    e = LinearMeasurements(edge=torch.randn(2, 3, 2, 2, dtype=DT), loss="squared")
    mu = bp.LinearChain().marginals(pot)
    e.validate(mu)
    sol = bp.solve(bp.LinearChain(), pot, e, method="md", max_iter=20)
    assert torch.isfinite(sol.objective).all()
    with pytest.raises(ValueError, match="per-example edge measurement vectors have B=5"):
        LinearMeasurements(edge=torch.randn(5, 2, 3, 2, 2, dtype=DT), loss="squared").validate(mu)
    with pytest.raises(ValueError, match="per-example node measurement vectors have B=2"):
        LinearMeasurements(node=torch.randn(2, 2, 4, 2, dtype=DT), loss="squared").validate(mu)


def test_poisson_closed_form_gradient_differentiates_in_rate_and_scale_where_mu_is_0():
    """The closed form's derivative in (rate, scale) (eq. 15) equals autograd's, also with mu = 0 entries (padding
    and a forbidden label), where the unselected 0/0 branch used to give NaN."""
    pot = bp.ChainPotentials(torch.randn(2, 3, 3, dtype=DT), torch.randn(3, 3, dtype=DT), torch.tensor([3, 2]))
    mu = bp.LinearChain().marginals(pot)
    node = mu.node.clone()
    node[:, :, 2] = 0.0                                         # label 2 forbidden: mu = 0, its count 0
    node = node / node.sum(-1, keepdim=True).clamp_min(1e-300) * mu.node_mask()[..., None]
    mu = Marginals(node, None, None, mu.lengths)
    counts = torch.ones(2, 3, 3, dtype=DT)
    counts[:, :, 2] = 0.0
    rate = torch.tensor([0.5, 0.7], dtype=DT, requires_grad=True)
    scale = torch.tensor([2.0, 3.0], dtype=DT, requires_grad=True)
    with torch.enable_grad():
        mask = mu.node_mask()[..., None]
        g = Poisson(counts, rate=rate, scale=scale).grad(mu).node * mask
        ga = autograd_gradient(Poisson(counts, rate=rate, scale=scale), mu, create_graph=True).node * mask
        probe = torch.randn_like(g)
        closed = torch.autograd.grad((g * probe).sum(), (rate, scale))
        auto = torch.autograd.grad((ga * probe).sum(), (rate, scale))
    for c, a in zip(closed, auto, strict=True):
        assert torch.isfinite(c).all()
        torch.testing.assert_close(c, a, rtol=1e-10, atol=1e-12)


def test_prototype_lengths_are_rounded_not_truncated():
    protos = torch.tensor([[0.7, 0.1, 0.2]], dtype=DT) * 3
    lengths = protos.sum(-1)                                   # 2.9999999999999996
    assert lengths.item() != 3.0
    e = NearestPrototype(protos, 1.0, "unigram", lengths)
    assert e.prototype_lengths.dtype == torch.long and e.prototype_lengths.tolist() == [3]
    mu = bp.LinearChain().marginals(bp.ChainPotentials(torch.randn(1, 3, 3, dtype=DT), torch.randn(3, 3, dtype=DT)))
    ref = NearestPrototype(protos, 1.0, "unigram", torch.tensor([3]))
    assert e.value(mu).item() > 0
    torch.testing.assert_close(e.value(mu), ref.value(mu))
    assert NearestPrototype(protos, 1.0, "unigram", torch.tensor([3.0], dtype=torch.float32)).prototype_lengths == 3
    for bad in (torch.tensor([2.5]), torch.tensor([3.001], dtype=DT), torch.tensor([float("nan")])):
        with pytest.raises(ValueError, match="prototype_lengths"):
            NearestPrototype(protos, 1.0, "unigram", bad)
    with pytest.raises(ValueError, match="prototype_lengths must be non-negative"):
        NearestPrototype(protos, 1.0, "unigram", torch.tensor([-1]))
    with pytest.raises(TypeError, match="prototype_lengths"):
        NearestPrototype(protos, 1.0, "unigram", torch.tensor([True]))
    with pytest.raises(ValueError, match=r"prototype_lengths must have shape \[P\]"):
        NearestPrototype(protos, 1.0, "unigram", torch.tensor([3, 3]))


@pytest.mark.parametrize("offset, msg", [
    (torch.zeros(5, 2, dtype=DT), r"offset must be a float, \[J\] or \[B, J\]=\(3, 2\), got shape \(5, 2\)"),
    (torch.zeros(1, 1, 2, dtype=DT), r"offset must be a float, \[J\] or \[B, J\] with J=2, got shape \(1, 1, 2\)"),
    (torch.zeros(3, 1, dtype=DT), r"offset must be .* with J=2, got shape \(3, 1\)"),
    (torch.tensor([0.0, float("nan")], dtype=DT), "offset must be finite"),
    (torch.tensor([0, 1]), "offset must be a float or a floating-point tensor"),
])
def test_linear_offset_shape_checked(offset, msg):
    pot = bp.ChainPotentials(torch.randn(3, 4, 3, dtype=DT), torch.randn(3, 3, dtype=DT))
    with pytest.raises((ValueError, TypeError), match=msg):
        bp.solve(bp.LinearChain(), pot, LinearMeasurements(node=torch.randn(2, 3, dtype=DT), offset=offset,
                                                           loss="squared"))


def test_linear_offset_batch_checked_at_value_and_grad():
    mu = _marginals()                                          # B = 3
    e = LinearMeasurements(node=torch.randn(2, 3, dtype=DT), offset=torch.zeros(5, 2, dtype=DT), loss="squared")
    for call in (e.value, e.grad, e.total_grad, e.validate):
        with pytest.raises(ValueError, match=r"offset must be a float, \[J\] or \[B, J\]=\(3, 2\)"):
            call(mu)
    per_example = torch.randn(3, 2, dtype=DT)
    e = LinearMeasurements(node=torch.randn(2, 3, dtype=DT), offset=per_example, loss="squared")
    z = e.measurements(mu) - per_example
    torch.testing.assert_close(e.value(mu), 0.5 * (z * z).sum(-1))


@pytest.mark.parametrize("make, msg", [
    (lambda: MeanField(torch.zeros(0, 2, dtype=torch.long), torch.zeros(0, 3, 3, dtype=DT)), r"K >= 1"),
    (lambda: Precedence(torch.rand(1, 3, dtype=DT), torch.rand(1, 3, dtype=DT),
                        offset=torch.tensor([float("nan")], dtype=DT)), "offset must be finite"),
    (lambda: BigramExclusion(torch.rand(1, 3, dtype=DT), torch.rand(1, 3, dtype=DT), torch.tensor([[0, 0]]),
                             offset=torch.tensor([float("inf")], dtype=DT)), "offset must be finite"),
    (lambda: NearestPrototype(torch.tensor([[1.0, float("inf")]], dtype=DT)), "prototypes must be finite"),
    (lambda: NearestPrototype(torch.full((1, 2, 2), float("nan"), dtype=DT), statistic="word",
                              prototype_lengths=torch.tensor([2])), "prototypes must be finite"),
    (lambda: PrototypeDistance(torch.tensor([[float("nan"), 0.0]], dtype=DT)), "targets must be finite"),
])
def test_non_finite_and_empty_arguments_rejected_at_construction(make, msg):
    with pytest.raises(ValueError, match=msg):
        make()


class _NoValue(bp.energies.Energy):
    pass


def test_energy_algebra_and_wrappers_check_their_arguments():
    mu = _marginals()
    e = LinearMeasurements(node=torch.ones(1, 3, dtype=DT), loss="squared")
    with pytest.raises(TypeError, match="unsupported operand"):
        e + 3
    for other in (3, 0.0, False, torch.tensor(0)):                  # only the int 0 that sum() starts from
        with pytest.raises(TypeError, match="unsupported operand"):
            other + e
    with pytest.raises(TypeError, match="terms must be Energy instances"):
        bp.energies.EnergySum([e, 3])
    with pytest.raises(ValueError, match="terms must hold at least one Energy"):
        bp.energies.EnergySum([])                                   # failed later in solve on value()'s int 0
    with pytest.raises(TypeError, match="terms must be a list of Energy instances, got LinearMeasurements"):
        bp.energies.EnergySum(e)
    with pytest.raises(TypeError, match="energy must be an Energy, got int"):
        bp.energies.Scaled(3, 2.0)
    with pytest.raises(TypeError, match="weight must be a float or a tensor, got str"):
        2.0 * e * "x"
    # a NumPy weight vector multiplied element by element: an object array of Scaled energies, refused only later
    # by solve ("got ndarray"), and e + that array an array of sums
    with pytest.raises(TypeError, match="weight must be a float or a tensor, got ndarray"):
        np.array([1.0, 2.0, 3.0]) * e
    with pytest.raises(TypeError):
        np.array([1.0]) + e
    assert isinstance(np.float64(2.0) * e, bp.energies.Scaled)
    with pytest.raises(TypeError, match="fn must be callable"):
        FunctionEnergy(3)
    with pytest.raises(NotImplementedError, match="_NoValue must implement value"):
        _NoValue().value(mu)
    with pytest.raises(ValueError, match=r"value must return a tensor of shape \[B\]=\(3,\)"):
        autograd_gradient(FunctionEnergy(lambda m: m.node.sum()), mu)
    with pytest.raises(TypeError, match=r"FunctionEnergy.value must return a real tensor, got torch.complex128"):
        autograd_gradient(FunctionEnergy(lambda m: m.node.sum((1, 2)) * (1 + 1j)), mu)   # was autograd's RuntimeError
    constant = autograd_gradient(FunctionEnergy(lambda m: torch.ones(3, dtype=DT)), mu)
    assert torch.equal(constant.node, torch.zeros_like(mu.node)) and constant.edge is None
    scaled = torch.tensor(2.0, dtype=DT) * e                  # a 0-d weight broadcasts over the batch
    assert torch.allclose(scaled.value(mu), 2 * e.value(mu))
    named = FunctionEnergy(lambda m: m.node.sum((1, 2)), name="mass")
    assert repr(named) == "FunctionEnergy(mass)"
    assert repr(named + 0.5 * named) == "FunctionEnergy(mass) + 0.5 * FunctionEnergy(mass)"


class _EdgeTable(bp.energies.Energy):
    """``<A, sum_t mu_t>`` whose closed-form edge gradient is the one [C, C] table ``A`` (a shape the solvers take)."""

    edge_totals = True

    def __init__(self, table):
        self.table = table

    def value(self, mu):
        return (mu.edge_total() * self.table).sum((-1, -2))

    def grad(self, mu):
        return bp.energies.Gradient(None, self.table)


def test_a_shared_edge_gradient_table_with_per_example_weights():
    # Scaled multiplied a [C, C] edge gradient by the [B] weights as if its rows were examples (silently wrong for
    # B = C), and the default total_grad took the table's first column
    mu = _marginals()                                             # B = C = 3, lengths (4, 2, 1)
    w = torch.tensor([1.0, 2.0, 3.0], dtype=DT)
    energy = w * _EdgeTable(torch.randn(3, 3, dtype=DT))
    auto, emask = autograd_gradient(energy, mu), mu.edge_mask()[..., None, None]
    g = energy.grad(mu)
    assert torch.allclose(torch.where(emask, g.edge, 0.0), auto.edge)
    assert torch.allclose(energy.total_grad(mu).edge[:2], auto.edge[:2, 0])      # example 2 has no edges
    assert torch.equal(energy.energy.total_grad(mu).edge, energy.energy.table)          # not its first column
    theta = bp.ChainPotentials(torch.randn(3, 4, 3, dtype=DT), torch.randn(3, 3, dtype=DT), torch.tensor([4, 3, 2]))
    for pot in (theta, bp.ChainPotentials(theta.node, theta.full_edge().clone(), theta.lengths)):
        ref = bp.solve(bp.LinearChain(), pot, FunctionEnergy(energy.value), tol=1e-10)
        sol = bp.solve(bp.LinearChain(), pot, energy, tol=1e-10)
        assert torch.allclose(sol.objective, ref.objective, atol=1e-9)


def test_a_per_measurement_psi_given_as_a_vector_is_told_to_be_one_row():
    mu = _marginals()                                             # B = 3
    e = LinearMeasurements(node=torch.randn(4, 3, dtype=DT), psi=torch.rand(4, dtype=DT))
    with pytest.raises(ValueError, match=r"psi\[None\]"):
        e.value(mu)


@pytest.mark.parametrize("kind", ["node", "edge"])
def test_shared_per_position_vectors_are_not_copied_per_example(monkeypatch, kind):
    """Per-position vectors shared by the batch ([J, N, C] node, [J, N-1, C, C] edge) were expanded to [B, J, ...]
    before the einsum, which materialised B copies (edge, B=64 J=20 N=40 C=20: value + grad 1.45 s and 193 MB, now
    0.07 s and 43 MB); the values and gradients are those of the per-example form."""
    b, j, n, c = 5, 3, 4, 3
    mu = _marginals(b, n, c, (4, 2, 1, 3, 4))
    shape = (j, n, c) if kind == "node" else (j, n - 1, c, c)
    vectors = torch.randn(*shape, dtype=DT)
    shared = LinearMeasurements(**{kind: vectors}, loss="squared", offset=0.1)
    per_example = LinearMeasurements(**{kind: vectors.expand(b, *shape).clone()}, loss="squared", offset=0.1)
    operands = _einsum_operand_sizes(monkeypatch)
    shared.validate(mu)
    value, g = shared.value(mu), shared.grad(mu)
    assert operands and max(operands) <= max(mu.edge.numel(), vectors.numel())      # never B * J * ...
    torch.testing.assert_close(value, per_example.value(mu))
    want = per_example.grad(mu)
    torch.testing.assert_close(getattr(g, kind), getattr(want, kind))


def test_mean_field_shared_weights_are_not_copied_per_example(monkeypatch):
    """[K, C, C] weights were expanded and masked to [B, K, C, C] (B=128, K=435 pairs of N=30, C=30: value + grad
    x3 3.3 s and +510 MB, now 0.35 s and +153 MB); pairs past an example's length still count for nothing."""
    b, n, c = 3, 4, 3
    mu = _marginals(b, n, c, (4, 2, 1))
    pairs = torch.tensor([[0, 2], [1, 3], [0, 1], [3, 3]])
    w = torch.randn(4, c, c, dtype=DT)
    energy = MeanField(pairs, w)
    operands = _einsum_operand_sizes(monkeypatch)
    value, g = energy.value(mu), energy.grad(mu)
    assert operands and max(operands) <= max(w.numel(), b * len(pairs) * c)        # never B * K * C * C
    monkeypatch.undo()
    want = torch.stack([-sum(mu.node[i, p] @ w[k] @ mu.node[i, q] for k, (p, q) in enumerate(pairs.tolist())
                             if max(p, q) < int(mu.lengths[i])) + torch.zeros((), dtype=DT) for i in range(b)])
    torch.testing.assert_close(value, want)
    mask = mu.node_mask()[..., None]
    torch.testing.assert_close(g.node * mask, autograd_gradient(energy, mu).node * mask)
    assert (g.node[~mu.node_mask()] == 0).all()


class _SquaredEdgeTotal(bp.energies.Energy):
    """``<A, sum_t mu_t>^2``, read through the edge totals, its gradient by autograd."""

    edge_totals = True

    def __init__(self, table):
        self.table = table

    def value(self, mu):
        return (mu.edge_total() * self.table).sum((-1, -2)) ** 2


def test_default_total_grad_of_single_position_marginals():
    # N = 1 (no edges): the default total_grad read position 0 of the [B, 0, C, C] edge gradient, an IndexError, also
    # inside a sum with a closed-form term; now a zero [B, C, C]
    pot = bp.ChainPotentials(torch.randn(2, 1, 3, dtype=DT), torch.randn(3, 3, dtype=DT))
    mu = bp.LinearChain().marginals(pot)
    table = torch.randn(3, 3, dtype=DT)
    g = _SquaredEdgeTotal(table).total_grad(mu)
    assert g.edge.shape == (2, 3, 3) and (g.edge == 0).all()
    total = _SquaredEdgeTotal(table) + LinearMeasurements(edge=table[None], loss="squared", offset=1.0)
    g = total.total_grad(mu)
    torch.testing.assert_close(g.edge, -table.expand(2, 3, 3))     # the closed form's: slope -1 at z = 0 - 1


@pytest.mark.parametrize(("make", "name"), [
    (lambda: LinearMeasurements(node=torch.ones(1, 3), psi=1e39), "psi = 1e\\+39"),
    (lambda: LinearMeasurements(node=torch.ones(1, 3), psi=torch.tensor([1e39, 1.0], dtype=DT)), "psi holds"),
    (lambda: LinearMeasurements(node=torch.ones(1, 3), psi=torch.tensor([[-1e39]], dtype=DT)), "psi holds"),
    (lambda: LinearMeasurements(node=torch.ones(1, 3), offset=-1e39), "offset = -1e\\+39"),
    (lambda: LinearMeasurements(node=torch.ones(1, 3), offset=torch.tensor([1e39], dtype=DT)), "offset holds"),
    (lambda: 1e39 * LinearMeasurements(node=torch.ones(1, 3)), "weight = 1e\\+39"),
    (lambda: Poisson(torch.ones(2, 4, 3), scale=1e39), "scale = 1e\\+39"),
    (lambda: NearestPrototype(torch.eye(3), torch.tensor(5e38, dtype=DT)), "psi holds"),
])
def test_a_weight_or_offset_beyond_float32_is_named(make, name):
    """psi=1e39 with float32 marginals was torch's "value cannot be converted to type float without overflow"
    (a float) or an objective "not finite ... because theta allows no mass there" (a float64 tensor cast to inf)."""
    pot = bp.ChainPotentials(torch.randn(2, 4, 3), torch.randn(3, 3), torch.tensor([4, 2]))
    with pytest.raises(ValueError, match=name + ".*beyond what torch.float32 can represent.*solve in float64"):
        bp.solve(bp.LinearChain(), pot, make(), max_iter=3)
    wide = bp.ChainPotentials(pot.node.to(DT), pot.edge.to(DT), pot.lengths)          # float64 holds them
    assert torch.isfinite(bp.solve(bp.LinearChain(), wide, make(), max_iter=3).objective).all()


def test_helpers_name_an_argument_of_the_wrong_type():
    """Found by calling every public function and method with wrong types: each gave an AttributeError or a
    RuntimeError from deep inside instead of an error naming the argument."""
    for loss in LOSSES:
        with pytest.raises(TypeError, match=f"^{loss}: z must be a tensor, got float"):
            Loss(loss)(1.5)
        with pytest.raises(TypeError, match="z must be a tensor, got list"):
            Loss(loss).derivative([1.0])
    mu = _marginals()
    energy = PrototypeDistance(torch.rand(3, 3, dtype=DT), torch.ones(3, dtype=DT))
    with pytest.raises(TypeError, match="^energy must be an Energy .*, got str"):
        autograd_gradient("x", mu)
    with pytest.raises(TypeError, match="^marginals must be Marginals"):
        autograd_gradient(energy, mu.node)
    for e in (energy, energy + energy, 2.0 * energy, FunctionEnergy(lambda m: m.node.sum((1, 2))),
              LinearMeasurements(torch.ones(2, 3, dtype=DT)), MeanField(torch.tensor([[0, 1]]), torch.ones(1, 3, 3))):
        with pytest.raises(TypeError, match="^marginals must be Marginals"):
            e.validate(mu.node)
    with pytest.raises(TypeError, match="^pairs must be an integer tensor \\[K, 2\\], got NoneType"):
        MeanField(None, torch.ones(1, 3, 3))
    g = energy.grad(mu)
    assert torch.equal(g.scale(torch.full((3,), 2.0, dtype=DT)).node, 2 * g.node)
    with pytest.raises(ValueError, match=r"^w must be a scalar or a per-example weight \[B\] \(B = 3\), got shape"):
        g.scale(torch.ones(4, dtype=DT))
    with pytest.raises(TypeError, match="^w must be a number or a tensor, got str"):
        g.scale("2")


def test_linear_measurements_name_bad_measurement_vectors():
    """The measurement tensors' shape, finiteness and label and position counts are named before a solve reads
    them: at construction or in validate."""
    with pytest.raises(ValueError, match=r"node must have 2 to 4 dims .*got shape \(1, 1, 1, 1, 3\)"):
        LinearMeasurements(node=torch.zeros(1, 1, 1, 1, 3))
    with pytest.raises(ValueError, match="node must be finite"):
        LinearMeasurements(node=torch.tensor([[0.0, float("nan"), 1.0]]))
    with pytest.raises(TypeError, match="edge must be a floating-point tensor"):
        LinearMeasurements(edge=torch.zeros(1, 3, 3, dtype=torch.long))
    mu = _marginals()                                                # B 3, N 4, C 3
    with pytest.raises(ValueError, match=r"edge measurement vectors have label dims \(2, 2\), expected \(3, 3\)"):
        LinearMeasurements(edge=torch.zeros(1, 2, 2)).validate(mu)
    with pytest.raises(ValueError, match=r"edge measurement vectors have 2 positions, marginals have N-1=3"):
        LinearMeasurements(edge=torch.zeros(1, 2, 3, 3)).validate(mu)
    assert repr(LinearMeasurements(node=torch.zeros(2, 3), loss="squared")) == "LinearMeasurements(J=2, loss=squared)"
