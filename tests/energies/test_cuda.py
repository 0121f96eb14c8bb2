"""Every energy on the accelerator agrees with the CPU: value, closed-form and autograd gradients, per-example edge
totals, measurements, and the psi-gradient of eq. (15), with the energy's tensors on the accelerator or left on the
CPU (skipped without CUDA; ``BETHEPROJ_TEST_DEVICE=cpu`` runs them on the CPU)."""

import pytest
import torch

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
    SecondOrderArcs,
    autograd_gradient,
)
from betheproj.energies.second_order import second_order_masks
from betheproj.oracles import LinearChain, Marginals, NonProjective, PairwisePotentials
from tests.devices import agree as _agree

DT = torch.float64
TOL = {torch.float64: {"atol": 1e-9, "rtol": 1e-11}, torch.float32: {"atol": 1e-4, "rtol": 1e-5}}
B, N, C, J = 3, 5, 3, 4
LENGTHS = [5, 3, 1]
ARC_LENGTHS = [4, 2, 1]                                    # words of the second-order energies' sentences


def _data(name, dtype, gen):
    """The energy's tensors (CPU, ``dtype``) and the names of those to differentiate (psi-gradient)."""
    def r(*shape):
        return torch.rand(*shape, generator=gen, dtype=DT).to(dtype)

    def n(*shape):
        return torch.randn(*shape, generator=gen, dtype=DT).to(dtype)

    tables = {
        "linear-counts": ({"a": n(J, C), "psi": r(B, J)}, ["a", "psi"]),
        "linear-position": ({"a": n(J, N, C), "psi": r(B)}, ["a", "psi"]),
        "linear-edge": ({"a": n(J, C, C), "b": n(J)}, ["a", "b"]),
        "linear-edge-position": ({"a": n(B, J, N - 1, C, C), "psi": r(1, J), "b": n(B, J) * 0.3}, ["psi", "b"]),
        "linear-both": ({"a": n(B, J, N, C), "e": n(J, N - 1, C, C), "psi": r(B, J)}, ["psi", "e"]),
        "poisson": ({"y": torch.randint(0, 4, (B, N, C), generator=gen).to(dtype), "rate": r(B) + 0.5,
                     "scale": r(B) + 1.0}, ["rate", "scale"]),
        "unigram": ({"w": r(7, C) * 3, "psi": r(()) + 1}, ["psi", "w"]),
        "word": ({"w": r(5, N, C), "psi": r(B), "lens": torch.tensor([5, 3, 3, 1, 2])}, ["psi"]),
        "distance-unigram": ({"t": r(B, C) * 2, "psi": r(B)}, ["psi"]),
        "distance-word": ({"t": r(B, N - 1, C), "psi": r(())}, ["psi"]),
        "mean-field": ({"w": n(3, C, C)}, ["w"]),
        "mean-field-per-example": ({"w": n(B, 3, C, C)}, ["w"]),
        "precedence": ({"f": r(J, C), "t": r(J, C), "b": torch.tensor([-0.3, 0.2, 0.45, -2.0], dtype=dtype),
                        "psi": r(B, J)}, ["psi", "b"]),
        "bigram": ({"l": r(3, C), "r": r(3, C), "b": torch.tensor([-0.3, 0.02, -1.0], dtype=dtype),
                    "psi": r(B, 3)}, ["psi"]),
        "scaled-sum": ({"a": n(J, C), "w": r(B) + 0.5, "y": torch.randint(0, 4, (B, N, C), generator=gen).to(dtype)},
                       ["w"]),
        "function": ({"p": r(()) + 1}, ["p"]),
        "second-order": ({"s": n(B, N, N, N), "g": n(B, N, N, N)}, ["s", "g"]),
        "second-order-parts": ({"s": n(B, N, N, N), "g": n(B, N, N, N)}, ["s", "g"]),
    }
    return tables[name]


def _energy(name, p):
    """The energy ``name`` built from the tensors ``p``."""
    if name == "linear-counts":
        return LinearMeasurements(node=p["a"], offset=0.3, loss="smoothed_hinge", psi=p["psi"])
    if name == "linear-position":
        return LinearMeasurements(node=p["a"], loss="squared", psi=p["psi"])
    if name == "linear-edge":
        return LinearMeasurements(edge=p["a"], offset=p["b"], loss="squared_hinge")
    if name == "linear-edge-position":
        return LinearMeasurements(edge=p["a"], offset=p["b"], loss="smoothed_abs", psi=p["psi"])
    if name == "linear-both":
        return LinearMeasurements(node=p["a"], edge=p["e"], offset=0.1, loss=Loss("smoothed_hinge", 0.5), psi=p["psi"])
    if name == "poisson":
        return Poisson(p["y"], rate=p["rate"], scale=p["scale"])
    if name == "unigram":
        return NearestPrototype(p["w"], psi=p["psi"])
    if name == "word":
        return NearestPrototype(p["w"], psi=p["psi"], statistic="word", prototype_lengths=p["lens"])
    if name == "distance-unigram":
        return PrototypeDistance(p["t"], p["psi"])
    if name == "distance-word":
        return PrototypeDistance(p["t"], p["psi"], "word")
    if name.startswith("mean-field"):
        return MeanField(torch.tensor([[0, 2], [1, 3], [4, 0]]), p["w"])
    if name == "precedence":
        return Precedence(p["f"], p["t"], offset=p["b"], psi=p["psi"])
    if name == "bigram":
        return BigramExclusion(p["l"], p["r"], torch.tensor([[0, 1], [1, 2], [0, 2]]), offset=p["b"], psi=p["psi"])
    if name == "scaled-sum":
        return p["w"] * LinearMeasurements(node=p["a"], psi=2.0) + 0.5 * Poisson(p["y"], rate=0.7, scale=3.0)
    if name == "function":
        return FunctionEnergy(lambda m: p["p"] * (m.node ** 2).sum((1, 2)) - (m.edge ** 3).sum((1, 2, 3)))
    if name == "second-order":
        return SecondOrderArcs(p["s"], p["g"])
    if name == "second-order-parts":
        masks = second_order_masks(torch.tensor(ARC_LENGTHS), N)
        keep = [m & (torch.rand(m.shape, generator=torch.Generator().manual_seed(k)) < 0.5)
                for k, m in enumerate(masks)]
        return SecondOrderArcs(p["s"], p["g"], parts=tuple(torch.stack(torch.nonzero(m, as_tuple=True)) for m in keep))
    raise KeyError(name)


NAMES = ["linear-counts", "linear-position", "linear-edge", "linear-edge-position", "linear-both", "poisson",
         "unigram", "word", "distance-unigram", "distance-word", "mean-field", "mean-field-per-example", "precedence",
         "bigram", "scaled-sum", "function", "second-order", "second-order-parts"]


def _marginals(name, dtype, device):
    """Chain marginals [B, N, C] (arc marginals [B, N-1, N] for the second-order energies) on ``device``."""
    gen = torch.Generator().manual_seed(11)
    if name.startswith("second-order"):
        node = torch.randn(B, N - 1, N, generator=gen, dtype=DT).to(device, dtype)
        pot = PairwisePotentials(node, node.new_zeros(N, N), torch.tensor(ARC_LENGTHS, device=device))
        return NonProjective().marginals(pot)
    node = torch.randn(B, N, C, generator=gen, dtype=DT).to(device, dtype)
    edge = torch.randn(C, C, generator=gen, dtype=DT).to(device, dtype)
    return LinearChain().marginals(PairwisePotentials(node, edge, torch.tensor(LENGTHS, device=device)))


def _outputs(name, dtype, device, data, learn):
    """Everything the energy computes at chain (or arc) marginals on ``device``, and its psi-gradients."""
    mu = _marginals(name, dtype, device)
    params = {k: v.clone().requires_grad_(True) if k in learn else v for k, v in data.items()}
    energy = _energy(name, params)
    energy.validate(mu)
    value = energy.value(mu)
    g = energy.grad(mu)                              # a torch expression in psi while autograd records (eq. 15)
    auto = autograd_gradient(energy, mu, create_graph=False)
    out = {"value": value, "grad_node": g.node, "grad_edge": g.edge, "auto_node": auto.node, "auto_edge": auto.edge}
    for attr in ("measurements", "counts"):
        if callable(getattr(energy, attr, None)):
            out[attr] = getattr(energy, attr)(mu)
    if energy.edge_totals:
        total = energy.total_grad(mu)
        out["total_node"], out["total_edge"] = total.node, total.edge
        # the solvers' shared-transition marginals: per-example edge totals, no per-position edges
        sums = Marginals(mu.node, None, None, mu.lengths, edge_total=mu.edge_total())
        out["sums_value"] = energy.value(sums)
        sums_grad = autograd_gradient(energy, sums, create_graph=False)
        out["sums_auto_node"], out["sums_auto_edge"] = sums_grad.node, sums_grad.edge
    # the psi-gradient: d/dpsi of L(mu) + <grad L(mu), r> for a fixed direction r
    r = torch.linspace(-1.0, 1.0, mu.node.numel(), dtype=dtype, device=device).reshape(mu.node.shape)
    total = value.sum() + (g.node * r).sum() if g.node is not None else value.sum()
    if g.edge is not None:
        total = total + g.edge.sum()
    grads = torch.autograd.grad(total, [params[k] for k in learn], allow_unused=True)
    psi_grads = {k: (torch.zeros_like(params[k]) if gk is None else gk) for k, gk in zip(learn, grads, strict=True)}
    return {k: (v.detach() if isinstance(v, torch.Tensor) else v) for k, v in out.items()}, psi_grads


@pytest.mark.parametrize("dtype", [DT, torch.float32])
@pytest.mark.parametrize("params_on", ["accelerator", "cpu"])
@pytest.mark.parametrize("name", NAMES)
def test_energy(accelerator, name, params_on, dtype):
    data, learn = _data(name, dtype, torch.Generator().manual_seed(NAMES.index(name)))
    cpu, cpu_psi = _outputs(name, dtype, torch.device("cpu"), data, learn)
    moved = {k: v.to(accelerator) for k, v in data.items()} if params_on == "accelerator" else data
    dev, dev_psi = _outputs(name, dtype, accelerator, moved, learn)
    _agree(cpu, dev, accelerator, **TOL[dtype])
    # the psi-gradients live with the energy's tensors
    _agree(cpu_psi, dev_psi, accelerator if params_on == "accelerator" else torch.device("cpu"), **TOL[dtype])
    assert any(v.abs().sum() > 0 for v in cpu_psi.values())


def test_nearest_prototype_pieces(accelerator):
    # pieces(lengths) for the global solver: rows and the piece energy on the lengths' device, psi [B] possibly not
    gen = torch.Generator().manual_seed(12)
    protos, psi = torch.rand(5, N, C, generator=gen, dtype=DT), torch.rand(B, generator=gen, dtype=DT)
    lens = torch.tensor([5, 3, 3, 1, 2])
    cpu_rows, cpu_piece = NearestPrototype(protos, psi, "word", lens).pieces(torch.tensor(LENGTHS))
    mu_cpu = _marginals("word", DT, torch.device("cpu"))
    mu = _marginals("word", DT, accelerator)
    for energy in (NearestPrototype(protos.to(accelerator), psi.to(accelerator), "word", lens.to(accelerator)),
                   NearestPrototype(protos, psi, "word", lens)):
        rows, piece = energy.pieces(torch.tensor(LENGTHS, device=accelerator))
        _agree(cpu_rows, rows, accelerator, 0, 0)
        sub = Marginals(mu.node[rows], None, None, mu.lengths[rows])
        sub_cpu = Marginals(mu_cpu.node[cpu_rows], None, None, mu_cpu.lengths[cpu_rows])
        _agree(cpu_piece.value(sub_cpu), piece.value(sub), accelerator, **TOL[DT])
        _agree(cpu_piece.grad(sub_cpu).node, piece.grad(sub).node, accelerator, **TOL[DT])


@pytest.mark.parametrize("dtype", [DT, torch.float32])
@pytest.mark.parametrize("name", sorted(LOSSES))
def test_losses(accelerator, name, dtype):
    loss = Loss(name, width=0.5)
    z = torch.linspace(-2.0, 2.0, 41, dtype=dtype)             # through the kinks at 0 and +-width
    _agree({"l": loss(z), "d": loss.derivative(z)}, {"l": loss(z.to(accelerator)), "d": loss.derivative(
        z.to(accelerator))}, accelerator, **TOL[dtype])


def test_second_order_masks(accelerator):
    lengths = torch.tensor([4, 2, 1, 0])
    _agree(second_order_masks(lengths, 5), second_order_masks(lengths.to(accelerator), 5), accelerator, 0, 0)
