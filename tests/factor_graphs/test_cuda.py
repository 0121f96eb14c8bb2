"""Factor graphs built from accelerator tensors agree with the same graphs built from CPU tensors.

The factor-graph engine runs in NumPy on the host: device tensors (potentials, incoming messages, ratios,
configurations, warm-start messages) are accepted wherever CPU tensors are, and the results are the same NumPy
arrays.  Skipped without CUDA; ``BETHEPROJ_TEST_DEVICE=cpu`` runs them on the CPU (see ``tests/conftest.py``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from betheproj.factor_graphs import (
    IMPLY,
    NAND,
    OR,
    XOR,
    Dense,
    FactorGraph,
    OROut,
    Tree,
    XOROut,
    belief_propagation,
    decode_map,
    lp_map,
)
from tests.factor_graphs._graphs import mixed_graph

DTYPES = [torch.float64, torch.float32]


def _close(a, b):
    """NumPy results from the same float64 inputs: equal up to rounding (``None`` entries alike)."""
    if b is None:
        assert a is None
        return
    assert isinstance(a, np.ndarray) and a.dtype == b.dtype
    np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


def _build(kind: str, to, dtype) -> FactorGraph:
    """A factor graph whose potentials are tensors passed through ``to`` (to the CPU or the accelerator)."""
    gen = torch.Generator().manual_seed(7)

    def rnd(*shape):
        return to(torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype))

    if kind == "pairwise":                       # loopy 2 x 3 grid, label sets of 2 and 3, one forbidden pair
        cards = [2, 3, 2, 3, 2, 2]
        edges = [(0, 1), (1, 2), (3, 4), (4, 5), (0, 3), (1, 4), (2, 5)]
        tables = [rnd(cards[i], cards[j]) for i, j in edges]
        tables[2][0, 1] = -torch.inf
        return FactorGraph.pairwise([rnd(c) for c in cards], edges, tables)
    if kind == "shared":                         # a frustrated cycle with one shared table
        return FactorGraph.pairwise([rnd(3) for _ in range(4)], [(0, 1), (1, 2), (2, 3), (3, 0)], rnd(3, 3))
    if kind in ("hard", "hard_loop"):            # every hard factor kind and a ternary Dense table (tree-shaped)
        g = mixed_graph(rnd=rnd)
        if kind == "hard_loop":
            g.add_dense((13, 0), rnd(2, 2))
        return g
    arcs = Tree.all_arcs(3)                      # "tree": a TREE factor with sibling-like pairwise factors
    g = FactorGraph([2] * len(arcs))
    for v in range(len(arcs)):
        u = rnd(2)
        u[0] = 0.0
        g.set_unary(v, u)
    g.add_factor(Tree(range(len(arcs)), arcs, single_root=kind == "tree_single_root"))
    for a, b in [((0, 1), (0, 2)), ((2, 1), (2, 3)), ((1, 2), (2, 3))]:
        g.add_dense((arcs.index(a), arcs.index(b)), rnd(2, 2))
    return g


KINDS = ["pairwise", "shared", "hard", "hard_loop", "tree", "tree_single_root"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", KINDS)
def test_graph_from_device_tensors(accelerator, kind, dtype):
    graphs = [_build(kind, lambda t: t, dtype), _build(kind, lambda t: t.to(accelerator), dtype)]
    ref, g = graphs
    assert g.cardinalities == ref.cardinalities and g.num_factors == ref.num_factors
    assert g.is_tree() == ref.is_tree() == (kind == "hard")
    for v in range(g.num_variables):
        _close(g.unary(v), ref.unary(v))
    for f, f_ref in zip(g.factors, ref.factors, strict=True):
        if isinstance(f, Dense):
            _close(f.table, f_ref.table)
    y = decode_map(belief_propagation(ref, "max", max_iter=30))
    assert g.score(torch.from_numpy(y).to(accelerator)) == ref.score(y)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("mode", "options"), [("sum", {}), ("sum", {"schedule": "sequential", "damping": 0.3}),
                                               ("max", {}), ("max", {"schedule": "sequential"})])
def test_belief_propagation(accelerator, kind, mode, options):
    graphs = [_build(kind, lambda t: t, torch.float64), _build(kind, lambda t: t.to(accelerator), torch.float64)]
    ref, res = (belief_propagation(g, mode, tol=1e-10, max_iter=25, **options) for g in graphs)
    assert (res.iterations, res.converged) == (ref.iterations, ref.converged)
    for a, b in zip(res.variable_beliefs + res.factor_beliefs, ref.variable_beliefs + ref.factor_beliefs,
                    strict=True):
        _close(a, b)
    if mode == "sum":
        assert res.log_partition == pytest.approx(ref.log_partition, rel=1e-12, abs=1e-12)
    else:
        assert np.array_equal(res.decode(), ref.decode())
    # a warm start from device tensors: the messages of the CPU run, moved
    warm = [[torch.from_numpy(m).to(accelerator) for m in row] for row in ref.messages]
    again = belief_propagation(graphs[1], mode, tol=1e-10, max_iter=3, init_messages=warm, **options)
    cpu = belief_propagation(graphs[0], mode, tol=1e-10, max_iter=3, init_messages=ref.messages, **options)
    for a, b in zip(again.variable_beliefs, cpu.variable_beliefs, strict=True):
        _close(a, b)


@pytest.mark.parametrize("kind", KINDS)
def test_lp_map(accelerator, kind):
    ref, res = (lp_map(_build(kind, to, torch.float64)) for to in (lambda t: t, lambda t: t.to(accelerator)))
    assert res.objective == pytest.approx(ref.objective, rel=1e-12, abs=1e-12)
    assert np.array_equal(res.assignment, ref.assignment)
    assert (res.integral, res.fractional_variables, res.fractional_factors) == (
        ref.integral, ref.fractional_variables, ref.fractional_factors)
    for a, b in zip(res.variable_marginals + res.factor_marginals, ref.variable_marginals + ref.factor_marginals,
                    strict=True):
        _close(a, b)


FACTORS = {"xor": lambda: XOR([0, 1, 2, 3]), "or_negated": lambda: OR([0, 1, 2], negated=[True, False, True]),
           "or_out": lambda: OROut([0, 1, 2, 3]), "nand": lambda: NAND([0, 1, 2]), "imply": lambda: IMPLY([0, 1]),
           "xor_out": lambda: XOROut([0, 1, 2]), "dense": lambda: Dense([0, 1, 2], torch.randn(2, 3, 2)),
           "tree": lambda: Tree(range(9), Tree.all_arcs(3)),
           "tree_single_root": lambda: Tree(range(9), Tree.all_arcs(3), single_root=True)}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(FACTORS))
def test_factor_messages_from_device_tensors(accelerator, name, dtype):
    factor = FACTORS[name]()
    cards = factor._cardinalities()
    incoming = [torch.randn(c, dtype=torch.float64).to(dtype) for c in cards]
    incoming[0][0] = -torch.inf                                         # a clamped input
    moved = [m.to(accelerator) for m in incoming]
    for mode in ("sum", "max"):
        for a, b in zip(factor.messages(moved, mode), factor.messages(incoming, mode), strict=True):
            _close(a, b)
    belief, ref = factor.belief(moved), factor.belief(incoming)
    _close(belief.marginals, ref.marginals)
    assert (belief.entropy, belief.energy, belief.log_partition) == pytest.approx(
        (ref.entropy, ref.energy, ref.log_partition), rel=1e-12, abs=1e-12)
    config = torch.randint(0, 2, (len(cards),))
    assert factor.log_potential(config.to(accelerator)) == factor.log_potential(config.tolist())
    if isinstance(factor, Dense):
        _close(factor.max_belief(moved), factor.max_belief(incoming))
        return
    ratios = torch.randn(len(cards), dtype=torch.float64).to(dtype)
    for mode in ("sum", "max"):
        _close(factor.ratio_messages(ratios.to(accelerator), mode), factor.ratio_messages(ratios, mode))
    assert factor.allows(config.to(accelerator)) == factor.allows(config.tolist())
