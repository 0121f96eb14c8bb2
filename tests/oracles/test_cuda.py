"""Every oracle on the accelerator agrees with the CPU: marginals, log Z and its gradient, MAP, entropies, degrees,
the fast and log-space paths of each, and the dependency cores (skipped without CUDA; ``BETHEPROJ_TEST_DEVICE=cpu``
runs them on the CPU)."""

import pytest
import torch

import betheproj as bp
from betheproj.oracles import (
    Marginals,
    NonProjective,
    PairwisePotentials,
    Projective,
    arc_potentials,
    arcs_to_heads,
    chu_liu_edmonds,
    eisner,
    eisner_map,
    heads_to_arcs,
    log_arc_marginals,
    matrix_tree,
)
from betheproj.oracles import chain as chain_module
from betheproj.oracles import nonprojective as nonprojective_module
from tests.devices import agree as _agree
from tests.devices import to_device as _to

DT = torch.float64
INF = float("inf")
TOL = {torch.float64: {"atol": 1e-9, "rtol": 1e-11}, torch.float32: {"atol": 1e-4, "rtol": 1e-5}}
PARENTS = [-1, 0, 0, 1, 1, 2]
DEPENDENCY = [(NonProjective, False), (NonProjective, True), (Projective, False), (Projective, True)]


def _on_both(fn, inputs, accelerator, dtype=DT, **tol):
    """Run ``fn(*inputs)`` on the CPU and on the inputs moved to the accelerator; check they agree."""
    cpu = fn(*inputs)
    dev = fn(*_to(inputs, accelerator))
    _agree(cpu, dev, accelerator, **{**TOL[dtype], **tol})
    return cpu


def _pairwise_outputs(oracle, node, edge, lengths):
    """Everything the oracle protocol returns for these potentials, in one dict.  An ``edge`` [B, 1, C, C] is one
    table per example, viewed over the positions with stride 0 (expanded here, on its device)."""
    b, n, c = node.shape
    per_example = edge.dim() == 4 and edge.shape[1] == 1 and n > 2

    def full(e):
        return e.expand(b, n - 1, c, c) if per_example else e

    pot = PairwisePotentials(node, full(edge), lengths)
    m = oracle.marginals(pot)
    out = {"node": m.node, "edge": m.edge, "log_z": m.log_partition, "edge_total": m.edge_total(),
           "entropy": oracle.entropy(m), "map": oracle.map(pot), "degree": oracle.degree(pot.lengths, node.shape[1]),
           "node_mask": m.node_mask(), "edge_mask": m.edge_mask()}
    if m.edge_sum is not None:
        w = torch.linspace(-1.0, 2.0, node.shape[0], dtype=node.dtype, device=node.device)
        out["edge_sum"] = m.edge_sum(w)
    # log Z is differentiable: its gradient is the marginals (the shared-edge gradient the fused edge sum)
    x, e = node.clone().requires_grad_(True), edge.clone().requires_grad_(True)
    lz = oracle.log_partition(PairwisePotentials(x, full(e), lengths))
    weights = torch.linspace(0.5, 1.5, node.shape[0], dtype=node.dtype, device=node.device)
    out["grad_node"], out["grad_edge"] = torch.autograd.grad((lz * weights).sum(), (x, e))
    out["log_z_autograd"] = lz.detach()
    return out


def _chain_inputs(case, scale, dtype, gen):
    b, n, c = 6, 7, 4
    node = torch.randn(b, n, c, generator=gen, dtype=DT) * scale
    if case == "shared":
        edge = torch.randn(c, c, generator=gen, dtype=DT) * scale
        edge[0, 1] = -INF                                                   # a forbidden transition
    elif case == "per-example":                                             # one table per example, stride 0
        edge = torch.randn(b, 1, c, c, generator=gen, dtype=DT) * scale
        edge[3, 0, 2, 1] = -INF
    else:
        edge = torch.randn(b, n - 1, c, c, generator=gen, dtype=DT) * scale
        edge[:, :, 0, 1] = -INF
        edge[1, 2, :, 3] = -INF                                             # label 3 unreachable at position 3
    node[2, 0, 1:] = -INF                                                   # example 2 starts with label 0
    lengths = torch.tensor([7, 5, 1, 3, 7, 2])
    return node.to(dtype), edge.to(dtype), lengths


@pytest.mark.parametrize("dtype", [DT, torch.float32])
@pytest.mark.parametrize("scale", [1.0, 1000.0])
@pytest.mark.parametrize("case", ["per-position", "shared", "per-example"])
def test_linear_chain(accelerator, monkeypatch, case, scale, dtype):
    calls = []
    exact = chain_module._log_forward_backward
    monkeypatch.setattr(chain_module, "_log_forward_backward", lambda pot: calls.append(pot.node.device) or exact(pot))
    node, edge, lengths = _chain_inputs(case, scale, dtype, torch.Generator().manual_seed(1))
    tol = {"rtol": 1e-5} if dtype == torch.float32 and scale > 1 else {}
    out = _on_both(lambda *a: _pairwise_outputs(bp.LinearChain(), *a), (node, edge, lengths), accelerator, dtype,
                   **tol)
    # the fast path certifies O(1) scores; scores of 1000 leave it for the exact log-space path, on both devices
    if scale > 1:
        assert {d.type for d in calls} == {"cpu", accelerator.type}
    else:
        assert not calls
    assert out["entropy"].min() >= -1e-6 and (out["map"][2, 1:] == -1).all()


def test_linear_chain_reuses_its_cached_edge_factors(accelerator):
    # large enough for the cache; the second call on the other device must not reuse the first one's factors
    gen = torch.Generator().manual_seed(2)
    node, edge = torch.randn(3, 40, 6, generator=gen, dtype=DT), torch.randn(3, 39, 6, 6, generator=gen, dtype=DT)
    chain = bp.LinearChain()
    cpu = chain.marginals(bp.ChainPotentials(node, edge))
    for _ in range(2):
        dev = chain.marginals(bp.ChainPotentials(node.to(accelerator), edge.to(accelerator)))
        _agree((cpu.node, cpu.edge, cpu.log_partition), (dev.node, dev.edge, dev.log_partition), accelerator)
    again = chain.marginals(bp.ChainPotentials(node, edge))
    assert torch.equal(again.log_partition, cpu.log_partition)


@pytest.mark.parametrize("dtype", [DT, torch.float32])
@pytest.mark.parametrize("shared", [False, True])
def test_tree(accelerator, shared, dtype):
    gen = torch.Generator().manual_seed(3)
    b, n, c = 4, len(PARENTS), 3
    node = torch.randn(b, n, c, generator=gen, dtype=DT) * 2
    edge = torch.randn(c, c, generator=gen, dtype=DT) if shared else torch.randn(b, n - 1, c, c, generator=gen,
                                                                                  dtype=DT)
    edge[..., 2, 0] = -INF
    node[1, 3, :2] = -INF
    lengths = torch.tensor([6, 4, 1, 5])
    _on_both(lambda *a: _pairwise_outputs(bp.Tree(PARENTS), *a), (node.to(dtype), edge.to(dtype), lengths),
             accelerator, dtype)


@pytest.mark.parametrize("parents", [None, PARENTS])
def test_brute_force(accelerator, parents):
    gen = torch.Generator().manual_seed(4)
    b, n, c = 3, 6, 3
    node = torch.randn(b, n, c, generator=gen, dtype=DT)
    edge = torch.randn(b, n - 1, c, c, generator=gen, dtype=DT)
    edge[:, 1, 1, :2] = -INF
    lengths = torch.tensor([6, 3, 1])

    def outputs(node, edge, lengths):
        brute = bp.BruteForce(parents)
        pot = PairwisePotentials(node, edge, lengths)
        return {**_pairwise_outputs(brute, node, edge, lengths), "exact_entropy": brute.exact_entropy(pot)}

    out = _on_both(outputs, (node, edge, lengths), accelerator)
    assert torch.allclose(out["entropy"], out["exact_entropy"], atol=1e-10)          # exact on chains and trees


@pytest.mark.parametrize("oracle", [bp.LinearChain(), bp.Tree([-1, 0, 1]), bp.BruteForce(), bp.BruteForce([-1, 0, 0])])
def test_infeasible_potentials_raise_value_error_on_the_device(accelerator, oracle):
    node = torch.zeros(3, 3, 2, dtype=DT, device=accelerator)
    node[1, 2] = -INF                                      # example 1 has no labelling
    pot = PairwisePotentials(node, torch.zeros(2, 2, dtype=DT, device=accelerator))
    with pytest.raises(ValueError, match=r"no labelling of finite score .*for examples \[1\]"):
        oracle.marginals(pot)
    with pytest.raises(ValueError, match=r"no labelling of finite score .*for examples \[1\]"):
        oracle.map(pot)
    if isinstance(oracle, bp.BruteForce):
        with pytest.raises(ValueError, match=r"examples \[1\]"):
            oracle.exact_entropy(pot)


@pytest.mark.parametrize("cls,single_root", DEPENDENCY)
def test_no_dependency_tree_raises_value_error_on_the_device(accelerator, cls, single_root):
    scores = torch.zeros(2, 4, 4, dtype=DT, device=accelerator)
    scores[1, :, 2] = -INF                                 # no head for word 2 in sentence 1
    oracle = cls(single_root=single_root)
    with pytest.raises(ValueError, match="no valid dependency tree"):
        oracle.marginals(arc_potentials(scores))
    with pytest.raises(ValueError, match="no valid dependency tree"):
        oracle.map(arc_potentials(scores))


def _dependency_scores(b, n, scale, gen, forbid=0.0):
    s = torch.randn(b, n + 1, n + 1, generator=gen, dtype=DT) * scale
    if forbid:
        s[:, 2:, 1:][torch.rand(b, n - 1, n, generator=gen) < forbid] = -INF   # word -> word arcs; word 1 heads all
    return s


def _dependency_outputs(oracle, scores, lengths):
    pot = arc_potentials(scores, lengths)
    m = oracle.marginals(pot)
    x = pot.node.clone().requires_grad_(True)
    lz = oracle.log_partition(PairwisePotentials(x, pot.edge, pot.lengths))
    (grad,) = torch.autograd.grad((lz * torch.arange(1, len(lz) + 1, device=lz.device)).sum(), x)
    return {"node": m.node, "log_z": m.log_partition, "entropy": oracle.entropy(m), "map": oracle.map(pot),
            "support": oracle.support(pot), "degree": oracle.degree(pot.lengths, pot.node.shape[1]),
            "grad": grad, "lz": lz.detach(), "shift": m.shift, "theta": m.theta, "edge": m.edge,
            "edge_sum": m.edge_sum(torch.ones(len(lz), dtype=scores.dtype, device=scores.device))}


@pytest.mark.parametrize("dtype", [DT, torch.float32])
@pytest.mark.parametrize("cls,single_root", DEPENDENCY)
def test_dependency_oracles(accelerator, cls, single_root, dtype):
    scores = _dependency_scores(5, 6, 2.0, torch.Generator().manual_seed(5), forbid=0.3).to(dtype)
    lengths = torch.tensor([6, 4, 1, 2, 5])
    _on_both(lambda *a: _dependency_outputs(cls(single_root=single_root), *a), (scores, lengths), accelerator, dtype)


@pytest.mark.parametrize("cls,single_root", DEPENDENCY)
def test_dependency_conjugate_entropy(accelerator, cls, single_root):
    # marginals that are no oracle output (the accelerated solver's averages): Newton on the conjugate
    gen = torch.Generator().manual_seed(6)
    s1, s2 = _dependency_scores(2, 4, 1.0, gen, forbid=0.3), _dependency_scores(2, 4, 2.0, gen)
    s2[~torch.isfinite(s1)] = -INF
    lengths = torch.tensor([4, 3])

    def entropy(s1, s2, lengths):
        oracle = cls(single_root=single_root)
        m1, m2 = oracle.marginals(arc_potentials(s1, lengths)), oracle.marginals(arc_potentials(s2, lengths))
        return oracle.entropy(Marginals(0.5 * (m1.node + m2.node), None, None, m1.lengths))

    _on_both(entropy, (s1, s2, lengths), accelerator, atol=1e-8)


@pytest.mark.parametrize("single_root", [False, True])
@pytest.mark.parametrize("scale", [1.0, 1000.0])
def test_matrix_tree_fast_and_exact_paths(accelerator, monkeypatch, single_root, scale):
    calls = []
    exact = nonprojective_module._exact_matrix_tree
    monkeypatch.setattr(nonprojective_module, "_exact_matrix_tree",
                        lambda s, *a: calls.append(s.device) or exact(s, *a))
    scores = _dependency_scores(4, 5, scale, torch.Generator().manual_seed(7), forbid=0.2).requires_grad_(True)
    lengths = torch.tensor([5, 3, 1, 4])

    def core(scores, lengths):
        x = scores.detach().clone().requires_grad_(True)
        log_z, marg = matrix_tree(x, lengths, single_root)
        (grad,) = torch.autograd.grad(log_z.sum(), x)
        return log_z.detach(), marg, grad

    _on_both(core, (scores.detach(), lengths), accelerator)
    # O(1) scores: the LU path; scores of 1000: ill-conditioned Laplacians, the exact log-space elimination
    assert ({d.type for d in calls} == {"cpu", accelerator.type}) if scale > 1 else not calls


@pytest.mark.parametrize("single_root", [False, True])
@pytest.mark.parametrize(("scale", "dtype"), [(1.0, torch.float64), (20.0, torch.float64), (300.0, torch.float64),
                                              (20.0, torch.float32)])
def test_log_arc_marginals(accelerator, monkeypatch, single_root, scale, dtype):
    """The certified closed form, the column elimination in linear space and its log-space fallback (scale 300),
    and the forced log Z per arc with one root child, each on the device."""
    fallbacks = []
    log_space = nonprojective_module._eliminate_log
    monkeypatch.setattr(nonprojective_module, "_eliminate_log", lambda f, e: fallbacks.append(f.device) or
                        log_space(f, e))
    scores = _dependency_scores(6, 6, scale, torch.Generator().manual_seed(5), forbid=0.2).to(dtype)
    lengths = torch.tensor([6, 3, 1, 5, 6, 2])
    log_z, log_marg = _on_both(lambda s, n: log_arc_marginals(s, n, single_root), (scores, lengths), accelerator,
                               dtype)
    assert (log_marg[torch.isfinite(log_marg)] < -25.0).any() if scale > 1 else True
    if dtype == torch.float64:                    # (float32's subnormal range starts at e^-87: scale 20 reaches it)
        assert bool(fallbacks) == (scale > 100 and not single_root)


@pytest.mark.parametrize("single_root", [False, True])
def test_eisner_cores(accelerator, single_root):
    scores = _dependency_scores(4, 6, 3.0, torch.Generator().manual_seed(8))
    lengths = torch.tensor([6, 2, 1, 5])

    def cores(scores, lengths):
        x = scores.clone().requires_grad_(True)
        log_z, marg = eisner(x, lengths, single_root)
        (grad,) = torch.autograd.grad(log_z.sum(), x)
        best, heads = eisner_map(scores, lengths, single_root)
        return log_z.detach(), marg, grad, best, heads

    _on_both(cores, (scores, lengths), accelerator)


@pytest.mark.parametrize("single_root", [False, True])
def test_chu_liu_edmonds_and_conversions(accelerator, single_root):
    gen = torch.Generator().manual_seed(9)
    scores = _dependency_scores(1, 7, 2.0, gen, forbid=0.3)[0]
    scores[0, 1:] += 2.0                                    # attractive root arcs: several root children unconstrained
    heads = torch.tensor([[2, 0, 2, 3, -1], [0, 1, -1, -1, -1]])

    def run(scores, heads):
        best = chu_liu_edmonds(scores, single_root)
        arcs = heads_to_arcs(heads)
        soft = heads_to_arcs(heads, torch.float32) * 0.7 + 0.01 * (heads >= 0)[..., None]
        return best, arcs, arcs_to_heads(arcs), arcs_to_heads(soft)

    best = _on_both(run, (scores, heads), accelerator)[0]
    assert (best == 0).sum() == 1 or not single_root


@pytest.mark.parametrize("shared", [True, False])
def test_potentials_to_the_accelerator(accelerator, shared):
    edge = torch.randn(4, 4, dtype=DT) if shared else torch.randn(3, 5, 4, 4, dtype=DT)
    pot = PairwisePotentials(torch.randn(3, 6, 4, dtype=DT), edge, torch.tensor([6, 2, 4]))
    moved = pot.to(accelerator)
    for t in (moved.node, moved.edge, moved.lengths):
        assert t.device.type == accelerator.type
    assert moved.shared_edge == shared and moved.to("cpu").node.device.type == "cpu"
    ref, got = bp.LinearChain().marginals(pot), bp.LinearChain().marginals(moved)
    torch.testing.assert_close(got.node.cpu(), ref.node, **TOL[DT])
    low = pot.to(accelerator, torch.float32)
    assert low.node.dtype == torch.float32 and low.node.device.type == accelerator.type
