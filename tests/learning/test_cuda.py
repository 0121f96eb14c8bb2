"""The learners on an accelerator agree with the CPU: CRF likelihood, the loss family, the psi modules, NonLocalCRF
(Algorithms 2 and 3), Algorithm 1 and the perceptron's MAP routine (the ``accelerator`` fixture: CUDA, else skip)."""

import copy

import numpy as np
import pytest
import torch

import betheproj as bp
from betheproj.energies import FunctionEnergy, NearestPrototype
from betheproj.learning import (
    LOSSES,
    ConstantPsi,
    LinearChainCRF,
    MeanMapPsi,
    NonLocalCRF,
    RandomFourierFeatures,
    SparseChainCRF,
    SparseExample,
    character_accuracy,
    crf_nll,
    fit_crf,
    fit_online,
    loss_and_gradient,
    sequence_score,
    structured_loss,
    sufficient_statistics,
    surrogate_nll,
)
from betheproj.learning.perceptron import oracle_map, predict, structured_perceptron
from tests.devices import agree
from tests.learning.test_perceptron import _labelled_tree_data

F64, F32 = torch.float64, torch.float32
TOL = {F64: dict(rtol=1e-8, atol=1e-10), F32: dict(rtol=1e-4, atol=1e-5)}
PARENTS = [-1, 0, 0, 1, 1]                  # a tree over N = 5 nodes


def _agree(ref, out, device: torch.device, dtype: torch.dtype = F64) -> None:
    """``out`` (from the accelerator run) agrees with the CPU's ``ref`` to the dtype's tolerance."""
    agree(ref, out, device, **TOL[dtype])


def _batch(b=4, n=5, c=3, f=4, dtype=F64, seed=0, full=False):
    """Features [B, N, F], labels [B, N] (-1 past each length) and lengths [B] on the CPU."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(b, n, f, generator=gen, dtype=dtype)
    lengths = torch.full((b,), n) if full else torch.randint(2, n + 1, (b,), generator=gen)
    lengths[0] = n
    labels = torch.randint(0, c, (b, n), generator=gen)
    labels[torch.arange(n) >= lengths[:, None]] = -1
    return x, labels, lengths


def _potentials(shared, dtype, b=4, n=5, c=3, seed=1):
    gen = torch.Generator().manual_seed(seed)
    node = torch.randn(b, n, c, generator=gen, dtype=dtype)
    edge = torch.randn(*((c, c) if shared else (b, n - 1, c, c)), generator=gen, dtype=dtype)
    return node, edge


def _leaf(t, device):
    """A fresh copy of ``t`` on ``device`` that collects its own gradient (``.to`` alone returns ``t`` on its own
    device, whose gradient would then accumulate over the two runs)."""
    return t.to(device, copy=True).requires_grad_()


def _oracle(structure):
    return bp.LinearChain() if structure == "chain" else bp.Tree(PARENTS)


@pytest.mark.parametrize("dtype", [F64, F32])
@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("structure", ["chain", "tree"])
def test_crf_likelihood_statistics_and_gradients(accelerator, structure, shared, dtype):
    oracle = _oracle(structure)
    _, labels, lengths = _batch(full=structure == "tree")
    node, edge = _potentials(shared, dtype)
    parents = None if structure == "chain" else torch.tensor(PARENTS)
    runs = []
    for device in (torch.device("cpu"), accelerator):
        nd, ed = _leaf(node, device), _leaf(edge, device)
        pot = bp.PairwisePotentials(nd, ed, lengths.to(device))
        y = labels.to(device)
        nll = crf_nll(oracle, pot, y)
        nll.sum().backward()
        stats = sufficient_statistics(pot, y, parents)
        runs.append([nll, nd.grad, ed.grad, sequence_score(pot, y, parents), stats.node, stats.edge])
    _agree(*runs, accelerator, dtype)


@pytest.mark.parametrize("dtype", [F64, F32])
@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("loss", list(LOSSES))
def test_loss_family_values_and_gradients(accelerator, loss, shared, dtype):
    _, labels, lengths = _batch()
    node, edge = _potentials(shared, dtype)
    runs = []
    for device in (torch.device("cpu"), accelerator):
        nd, ed = _leaf(node, device), _leaf(edge, device)
        pot = bp.PairwisePotentials(nd, ed, lengths.to(device))
        y = labels.to(device)
        value = structured_loss(bp.LinearChain(), pot, y, loss=loss)
        value.sum().backward()
        lg = loss_and_gradient(bp.LinearChain(), pot, y, loss=loss)
        runs.append([value, nd.grad, ed.grad, lg.loss, lg.node, lg.edge, lg.prediction])
    _agree(*runs, accelerator, dtype)
    # autograd and the explicit gradient are one gradient, on the accelerator too
    _agree(runs[1][1].cpu(), runs[1][4], accelerator, dtype)


def _module(kind, dtype):
    return (SparseChainCRF(9, 3) if kind == "sparse" else LinearChainCRF(4, 3)).to(dtype)     # zero-initialised


def _sparse_features(x):
    """Long feature indices [B, N, 2] in [0, 9) from real features (index 0 is padding)."""
    return torch.stack([(x[..., 0] > 0).long() + 1, (x[..., 1] * 2).floor().clamp(-3, 3).long() + 5], -1)


@pytest.mark.parametrize("kind, structure, loss, chunk, dtype", [
    ("dense", "chain", "crf", None, F64),
    ("dense", "chain", "softmax_margin", 2, F64),
    ("dense", "tree", "crf", 3, F64),
    ("sparse", "chain", "crf", 2, F64),
    ("dense", "chain", "crf", None, F32),
])
def test_crf_modules_and_fit_crf(accelerator, kind, structure, loss, chunk, dtype):
    x, labels, lengths = _batch(b=6, dtype=dtype, full=structure == "tree")
    features = _sparse_features(x) if kind == "sparse" else x
    runs = []
    for device in (torch.device("cpu"), accelerator):
        model = _module(kind, dtype).to(device)
        data = features.to(device), labels.to(device), lengths.to(device)
        before = model(data[0], data[2])
        history = fit_crf(model, *data, oracle=_oracle(structure), l2=1e-2, max_iter=3 if dtype == F32 else 5,
                          chunk_size=chunk, loss=loss)
        after = model(data[0], data[2])
        runs.append([before.node, before.edge, before.lengths, history, after.node, after.edge,
                     dict(model.named_parameters())])
    _agree(*runs, accelerator, dtype)


@pytest.mark.parametrize("dtype", [F64, F32])
def test_psi_modules(accelerator, dtype):
    x, _, lengths = _batch(dtype=dtype)
    modules = [ConstantPsi(torch.tensor([0.5, 2.0], dtype=dtype)), MeanMapPsi(4, 16, bandwidth=1.5, init=0.7),
               MeanMapPsi(4, 16, outputs=2, seed=3)]
    with torch.no_grad():
        for m in modules[1:]:
            m.linear.weight.normal_()
    modules = [m.to(dtype) for m in modules]
    rff = RandomFourierFeatures(4, 8, bandwidth=2.0, seed=1)
    runs = []
    for device in (torch.device("cpu"), accelerator):
        xd, nd = x.to(device), lengths.to(device)
        out = [rff.to(device)(xd)]
        for module in copy.deepcopy(modules):
            module.to(device)
            psi = module(xd, nd)
            psi.square().sum().backward()
            out += [psi, [p.grad for p in module.parameters()]]
        runs.append(out)
    _agree(*runs, accelerator, dtype)


def _count_energy(psi):
    """``psi/2 ||U(mu) - t||^2`` (autograd only), its targets on psi's device."""
    targets = torch.tensor([2.0, 1.5, 1.0], dtype=psi.dtype, device=psi.device)
    return FunctionEnergy(lambda m: 0.5 * psi * ((m.node.sum(1) - targets) ** 2).sum(-1))


def _prototype_energy(psi):
    """The nearest-prototype energy over words (closed-form subgradient), its prototypes on psi's device."""
    gen = torch.Generator().manual_seed(7)
    protos = torch.eye(3, dtype=psi.dtype)[torch.randint(0, 3, (6, 5), generator=gen)]
    plen = torch.tensor([2, 3, 4, 5, 5, 3])
    return NearestPrototype(protos.to(psi.device), psi, "word", plen.to(psi.device))


ENERGIES = {"count": _count_energy, "prototype": _prototype_energy}


@pytest.mark.parametrize("energy", list(ENERGIES))
def test_surrogate_likelihood_and_its_theta_and_psi_gradients(accelerator, energy):
    _, labels, lengths = _batch()
    node, edge = _potentials(True, F64)
    runs = []
    for device in (torch.device("cpu"), accelerator):
        nd, ed = _leaf(node, device), _leaf(edge, device)
        psi = torch.tensor([0.5, 1.0, 1.5, 2.0], dtype=F64, device=device, requires_grad=True)
        pot = bp.PairwisePotentials(nd, ed, lengths.to(device))
        sol = bp.solve(bp.LinearChain(), pot, ENERGIES[energy](psi.detach()), method="md", max_iter=50)
        nll = surrogate_nll(bp.LinearChain(), pot, ENERGIES[energy](psi), sol.marginals, labels.to(device))
        nll.sum().backward()
        runs.append([sol.marginals.node, nll, nd.grad, ed.grad, psi.grad])
    _agree(*runs, accelerator)


# NonLocalCRF variants: (energy, psi module, method, search); psi=None is the default ConstantPsi built on theta's
# device, which only a model built on the accelerator (not moved there) exercises
MODELS = {
    "crf": (None, None, "md", "local"),
    "count": (_count_energy, None, "md", "local"),
    "mean map": (_count_energy, "mean map", "md", "local"),
    "prototype": (_prototype_energy, "constant", "rda", "global"),
}


def _nonlocal(name, device, dtype=F64):
    energy, psi, method, search = MODELS[name]
    torch.manual_seed(0)
    theta = LinearChainCRF(4, 3).to(dtype)
    with torch.no_grad():
        theta.node.weight.normal_()
        theta.transitions.normal_()
    psi = {None: None, "constant": ConstantPsi(torch.tensor(0.8, dtype=dtype)),
           "mean map": MeanMapPsi(4, 16, bandwidth=2.0, init=0.5).to(dtype)}[psi]
    theta.to(device)                                 # theta first: the default psi must follow it
    return NonLocalCRF(theta, energy, None if psi is None else psi.to(device), method=method, max_iter=20,
                       search=search)


@pytest.mark.parametrize("name", list(MODELS))
def test_nonlocal_crf_inference_loss_score_and_predict(accelerator, name):
    x, labels, lengths = _batch(b=5)
    runs = []
    for device in (torch.device("cpu"), accelerator):
        model = _nonlocal(name, device)
        data = x.to(device), labels.to(device), lengths.to(device)
        sol = model.infer(data[0], data[2])
        loss = model.loss(*data)
        loss.backward()
        out = [loss, {k: p.grad for k, p in model.named_parameters()}, model.score(*data),
               model.predict(data[0], data[2], batch_size=2)]
        if sol is not None:
            out += [sol.objective, sol.marginals.node, sol.potentials.node, sol.iterations, sol.converged]
        runs.append(out)
    _agree(*runs, accelerator)


@pytest.mark.parametrize("name", ["crf", "count", "prototype"])
@pytest.mark.parametrize("algorithm", ["doubly_stochastic", "em"])
def test_nonlocal_crf_fit(accelerator, algorithm, name):
    x, labels, lengths = _batch(b=10)
    options = (dict(epochs=2, batch_size=4, lr=0.1, l2=1e-3, average=True, eval_every=2, train_iter=10)
               if algorithm == "doubly_stochastic" else dict(rounds=2, m_steps=2, batch_size=4, lr=0.1, psi_l2=1e-3))
    runs = []
    for device in (torch.device("cpu"), accelerator):
        model = _nonlocal(name, device)
        data = x.to(device), labels.to(device), lengths.to(device)
        valid = tuple(t[:4] for t in data)
        model.fit(*data, algorithm=algorithm, valid=valid, **options)
        hist = model.history_
        runs.append([hist.loss, hist.valid, hist.best, hist.best_step, hist.steps, dict(model.named_parameters()),
                     model.predict(data[0], data[2])])
    _agree(*runs, accelerator)


def test_character_accuracy(accelerator):
    _, labels, lengths = _batch(b=6, seed=3)
    _, predicted, _ = _batch(b=6, seed=4)
    ref = character_accuracy(predicted, labels, lengths)
    out = character_accuracy(predicted.to(accelerator), labels.to(accelerator), lengths.to(accelerator))
    assert isinstance(out, float) and out == ref


C, FEATS, K = 3, 10, 3                 # labels, observation features, features per position (online learning)
D = FEATS * C                          # weight ids: feature f with label c -> f * C + c; D marks the unused slot


def _examples(device, compact, seed=0, m=6):
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(m):
        n = int(torch.randint(2, 6, (1,), generator=gen))
        feats = torch.stack([torch.randperm(FEATS, generator=gen)[:K] for _ in range(n)])
        ids = feats[:, None, :] * C + torch.arange(C)[None, :, None]
        ids[0, :, -1] = D
        allowed = torch.ones(n, C, dtype=torch.bool)
        gold = torch.randint(0, C, (n,), generator=gen)
        allowed[0, (gold[0] + 1) % C] = False
        ex = SparseExample(ids.to(device), gold.to(device), allowed.to(device))
        out.append(ex.compact() if compact else ex)
    return out


def _jittered_hamming(potentials, gold):
    """Hamming cost with a distinct weight per part: the cost-augmented MAP at ``w = 0`` has no ties."""
    b, n, c = potentials.node.shape
    grid = torch.arange(n * c, dtype=potentials.node.dtype, device=potentials.node.device).reshape(1, n, c)
    wrong = 1.0 - torch.nn.functional.one_hot(gold.clamp_min(0), c).to(grid)
    return wrong * (1.0 + 0.1 * torch.sin(grid + 1.0)), None, None


@pytest.mark.parametrize("dtype", [F64, F32])
@pytest.mark.parametrize("compact", [False, True])
@pytest.mark.parametrize("loss, transitions", [("crf", C), ("softmax_margin", None), ("svm", C)])
def test_online_learning(accelerator, loss, transitions, compact, dtype):
    runs = []
    for device in (torch.device("cpu"), accelerator):
        seen = []
        result = fit_online(bp.LinearChain(), _examples(device, compact), D, loss=loss, lam=0.1, epochs=2,
                            transitions=transitions, cost=_jittered_hamming, dtype=dtype, record_steps=True,
                            callback=lambda epoch, w, value, seen=seen: seen.append(w.clone()))
        runs.append([result.weights, result.last, result.losses, result.etas, result.steps, result.updates, seen])
    assert runs[0][5] > 0                               # it learned something
    _agree(*runs, accelerator, dtype)


def test_perceptron_with_a_map_routine_on_the_accelerator(accelerator):
    """The perceptron keeps its weights in NumPy; only the MAP routine can run on a device.  One returning labels on
    the accelerator ([1, N], as an oracle's map does) gives the CPU oracle's run exactly."""
    rng = np.random.default_rng(0)
    data, _ = _labelled_tree_data(rng, [-1, 0, 1, 2], 6)                 # chains of 4 nodes, 3 labels
    start = rng.normal(size=data[0][0].num_features)

    def on_accelerator(x, w):
        pot = x.potentials(w).to_pairwise_potentials()
        labels = bp.LinearChain().map(bp.PairwisePotentials(pot.node.to(accelerator), pot.edge.to(accelerator)))
        assert labels.device.type == accelerator.type
        return labels

    runs = [structured_perceptron(data, fn, epochs=4, averaged=True, initial=start)
            for fn in (oracle_map(bp.LinearChain()), on_accelerator)]
    for field in ("weights", "last", "average", "path", "update_vectors"):
        assert np.array_equal(getattr(runs[0], field), getattr(runs[1], field)), field
    assert runs[0].mistakes == runs[1].mistakes and runs[0].total_mistakes > 0
    assert predict(data, on_accelerator, runs[1].last) == predict(data, oracle_map(bp.LinearChain()), runs[0].last)
