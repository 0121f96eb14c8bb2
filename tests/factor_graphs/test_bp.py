"""Loopy BP: exact on tree-shaped factor graphs (marginals, log Z, max-marginals, MAP), convergence, damping."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from betheproj.factor_graphs import NAND, OR, XOR, Dense, FactorGraph, OROut, Tree, belief_propagation, decode_map

from ._brute import graph_reference
from ._graphs import mixed_graph, tree_factor_graph


def max_marginals(ref, graph):
    """Exact max-marginals exp(max_{y: y_i = s} score(y) - MAP)."""
    joint = ref["joint"]
    n = joint.ndim
    return [np.exp(joint.max(axis=tuple(j for j in range(n) if j != i)) - ref["map_score"]) for i in range(n)]


GRAPHS = {"mixed": mixed_graph, "tree_factor": tree_factor_graph,
          "tree_factor_single_root": lambda seed=0: tree_factor_graph(seed, single_root=True)}
_REFS: dict = {}


def _ref(name):
    if name not in _REFS:
        g = GRAPHS[name]()
        _REFS[name] = (g, graph_reference(g))
    return _REFS[name]


@pytest.mark.parametrize("name", list(GRAPHS))
@pytest.mark.parametrize("schedule", ["parallel", "sequential"])
def test_sum_product_exact_on_tree_shaped_graphs(name, schedule):
    g, ref = _ref(name)
    assert g.is_tree()
    res = belief_propagation(g, "sum", schedule=schedule, tol=1e-12, max_iter=100)
    assert res.converged and res.max_change < 1e-12 and res.iterations <= 20
    np.testing.assert_allclose(res.log_partition, ref["log_z"], atol=1e-9)
    assert res.bethe_free_energy == -res.log_partition
    for got, want in zip(res.variable_beliefs, ref["marginals"], strict=True):
        np.testing.assert_allclose(got, want, atol=1e-9)
    for got, want in zip(res.factor_beliefs, ref["factors"], strict=True):
        np.testing.assert_allclose(got, want, atol=1e-9)


@pytest.mark.parametrize("name", list(GRAPHS))
@pytest.mark.parametrize("schedule", ["parallel", "sequential"])
def test_max_product_exact_on_tree_shaped_graphs(name, schedule):
    g, ref = _ref(name)
    res = belief_propagation(g, "max", schedule=schedule, tol=1e-12, max_iter=100)
    assert res.converged
    assert res.log_partition is None
    np.testing.assert_array_equal(decode_map(res), ref["map"])
    np.testing.assert_array_equal(res.decode(), ref["map"])
    assert g.score(res.decode()) == pytest.approx(ref["map_score"])
    for got, want in zip(res.variable_beliefs, max_marginals(ref, g), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-9)
    assert res.ties() == []


@pytest.mark.parametrize("normalize", ["sum", "max"])
def test_normalisation_does_not_change_beliefs(normalize):
    g, ref = _ref("mixed")
    for mode in ("sum", "max"):
        a = belief_propagation(g, mode, tol=1e-12)
        b = belief_propagation(g, mode, tol=1e-12, normalize=normalize)
        for x, y in zip(a.variable_beliefs, b.variable_beliefs, strict=True):
            np.testing.assert_allclose(x, y, atol=1e-10)
        for m in b.messages:
            for msg in m:
                top = msg.max() if normalize == "max" else np.log(np.exp(msg).sum())
                assert abs(top) < 1e-12


def test_pairwise_helper_matches_enumeration():
    """FactorGraph.pairwise with per-variable label sets (2, 3, 4, 2 labels) on a star: exact BP."""
    rng = np.random.default_rng(5)
    cards = [2, 3, 4, 2]
    unary = [torch.tensor(rng.normal(size=c)) for c in cards]
    edges = [(0, 1), (0, 2), (3, 0)]
    tables = [rng.normal(size=(cards[i], cards[j])) for i, j in edges]
    g = FactorGraph.pairwise(unary, edges, tables)
    assert g.cardinalities == tuple(cards) and g.num_factors == 3 and g.degree(0) == 3
    ref = graph_reference(g)
    res = belief_propagation(g, "sum")
    np.testing.assert_allclose(res.log_partition, ref["log_z"], atol=1e-9)
    np.testing.assert_array_equal(belief_propagation(g, "max").decode(), ref["map"])
    shared = FactorGraph.pairwise([np.zeros(2)] * 3, [(0, 1), (1, 2)], np.array([[1.0, 0.0], [0.0, 1.0]]))
    assert shared.num_factors == 2


def _k4(seed: int, scale: float = 2.0) -> FactorGraph:
    rng = np.random.default_rng(seed)
    edges = [(i, j) for i in range(4) for j in range(i + 1, 4)]
    unary = [rng.normal(scale=0.5, size=2) for _ in range(4)]
    tables = []
    for _ in edges:
        coupling = rng.normal(scale=scale)
        tables.append(np.array([[coupling, -coupling], [-coupling, coupling]]))
    return FactorGraph.pairwise(unary, edges, tables)


def test_loopy_graph_converges_and_approximates():
    g = _k4(1, scale=0.3)
    assert not g.is_tree()
    ref = graph_reference(g)
    fixed_points = []
    for schedule in ("parallel", "sequential"):
        res = belief_propagation(g, "sum", schedule=schedule, tol=1e-10)
        assert res.converged and res.max_change < 1e-10 and len(res.history) == res.iterations
        # the Bethe approximation, close but not exact (measured: 2.4e-3 in log Z, 1.1e-3 in the marginals;
        # beliefs from the unary factors alone are 0.04 off, a log Z from them 0.08)
        assert 1e-6 < abs(res.log_partition - ref["log_z"]) < 1e-2
        for got, want in zip(res.variable_beliefs, ref["marginals"], strict=True):
            np.testing.assert_allclose(got, want, atol=5e-3)
        fixed_points.append(res)
    a, b = fixed_points                                   # both schedules find the same fixed point
    assert abs(a.log_partition - b.log_partition) < 1e-8
    for x, y in zip(a.variable_beliefs, b.variable_beliefs, strict=True):
        np.testing.assert_allclose(x, y, atol=1e-8)
    for schedule in ("parallel", "sequential"):
        mp = belief_propagation(g, "max", schedule=schedule)
        assert mp.converged
        np.testing.assert_array_equal(mp.decode(), ref["map"])


def test_damping_makes_oscillating_bp_converge():
    g = _k4(35)
    plain = belief_propagation(g, "sum", max_iter=60, tol=1e-10)
    assert not plain.converged and plain.iterations == 60 and plain.max_change > 1.0
    damped = belief_propagation(g, "sum", damping=0.5, max_iter=400, tol=1e-10)
    assert damped.converged
    # a fixed point of damped BP is a fixed point of plain BP: a warm start does not move
    warm = belief_propagation(g, "sum", max_iter=3, tol=1e-8, init_messages=damped)
    assert warm.converged and warm.iterations == 1 and warm.history[0] < 1e-8
    np.testing.assert_allclose(warm.log_partition, damped.log_partition, atol=1e-8)


def _strong_loop(scale: float, seed: int = 0) -> FactorGraph:
    """Five ternary variables on a cycle with a chord, unaries and pairwise tables of size ``scale``: the graphs
    of ``benchmarks/bp_damping.py``."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    try:
        from bp_damping import loop_graph
    finally:
        sys.path.pop(0)
    return loop_graph(scale, seed)


@pytest.mark.parametrize("mode", ["sum", "max"])
def test_log_space_damping_converges_at_any_scale_to_the_undamped_fixed_point(mode):
    """Damped in probability space, a message entry that must fall by D nats moves by log(damping) a step: at
    scores of 1e3 it had not converged after 500 iterations.  Mixed in log space, every gap shrinks by the factor
    damping a step, so it converges in as many iterations at 1e3 and 1e6 as at 1, to the fixed point of plain BP."""
    for scale in (1.0, 1e3, 1e6):
        g = _strong_loop(scale)
        plain = belief_propagation(g, mode, max_iter=500, tol=1e-10)
        log = belief_propagation(g, mode, damping=0.5, damping_space="log", max_iter=500, tol=1e-10)
        assert plain.converged and log.converged and log.iterations < 100
        for a, b in zip(plain.variable_beliefs, log.variable_beliefs, strict=True):
            np.testing.assert_allclose(a, b, atol=1e-8)
        if mode == "sum":
            assert log.log_partition == pytest.approx(plain.log_partition, rel=1e-9, abs=1e-8)
        if scale > 1.0:
            prob = belief_propagation(g, mode, damping=0.5, max_iter=500, tol=1e-10)
            assert not prob.converged


def test_log_space_damping_makes_oscillating_bp_converge():
    g = _k4(35)
    damped = belief_propagation(g, "sum", damping=0.5, damping_space="log", max_iter=400, tol=1e-10)
    assert damped.converged
    warm = belief_propagation(g, "sum", max_iter=3, tol=1e-8, init_messages=damped)     # a plain BP fixed point
    assert warm.converged and warm.iterations == 1
    prob = belief_propagation(g, "sum", damping=0.5, max_iter=400, tol=1e-10)
    assert damped.log_partition == pytest.approx(prob.log_partition, abs=1e-8)


def test_damp_log_message_mixes_and_keeps_exact_zeros():
    from betheproj.factor_graphs._util import damp_log_message

    inf = np.inf
    new = np.array([[0.0, -2.0, -inf], [0.0, -2.0, -1.0], [-inf, -inf, -inf]])
    old = np.array([[-1.0, 0.0, -3.0], [-1.0, 0.0, -inf], [-inf, -inf, -inf]])
    # log space: linear in the logs, a new zero stays 0; a message where an old zero became non-zero is taken
    # undamped (the second); entries -inf in both (padding) stay -inf
    np.testing.assert_allclose(damp_log_message(new, old, 0.25, "log"),
                               [[-0.25, -1.5, -inf], [0.0, -2.0, -1.0], [-inf, -inf, -inf]])
    with np.errstate(divide="ignore"):
        want = np.log(0.75 * np.exp(new) + 0.25 * np.exp(old))
    want[0, 2] = -inf                                      # probability space: a new zero stays 0 as well
    np.testing.assert_allclose(damp_log_message(new, old, 0.25, "probability"), want)
    with pytest.raises(ValueError, match=r"damping_space must be one of \('probability', 'log'\), got 'geometric'"):
        belief_propagation(_strong_loop(1.0), damping=0.5, damping_space="geometric")


def test_unnormalised_messages_grow_on_loops():
    """Kulesza & Pereira (2007), section 4.1: without normalisation, max-product messages on a loop grow without
    bound; normalised (m(0) + m(1) = 1) the same iteration converges, to the same beliefs."""
    lam = 2.0
    table = np.array([[lam, 0.0], [0.0, lam]])
    g = FactorGraph.pairwise([np.array([0.0, 0.3]), np.array([0.0, -0.1]), np.zeros(2)],
                             [(0, 1), (1, 2), (2, 0)], table)
    raw = belief_propagation(g, "max", normalize="none", max_iter=30)
    assert not raw.converged and raw.max_change > 1.0
    norm = belief_propagation(g, "max", normalize="sum", max_iter=200)
    assert norm.converged
    np.testing.assert_array_equal(raw.decode(), norm.decode())
    np.testing.assert_array_equal(norm.decode(), graph_reference(g)["map"])


def test_contradictory_constraints_raise():
    g = FactorGraph([2, 2])
    g.add_factor(XOR([0, 1]))
    g.add_factor(OR([0, 1], negated=[True, True]))
    g.add_factor(XOR([0]))
    g.add_factor(XOR([1]))
    with pytest.raises(ValueError, match="contradict"):
        belief_propagation(g, "sum")


def _zero_belief() -> FactorGraph:
    g = FactorGraph([2])
    g.set_unary(0, [0.0, -np.inf])                      # the unary forbids the state that XOR([0]) forces
    g.add_factor(XOR([0]))
    return g


def _all_zero_message() -> FactorGraph:
    g = FactorGraph([2, 2])
    g.add_factor(Dense((0, 1), np.array([[-np.inf, 0.0], [-np.inf, -np.inf]])))    # only (0, 1) allowed
    g.set_unary(1, [0.0, -np.inf])                                                  # and variable 1 forced to 0
    return g


def _no_tree() -> FactorGraph:
    g = FactorGraph([2] * 4)
    g.add_factor(Tree(range(4), Tree.all_arcs(2)))      # arcs (0, 1), (0, 2), (1, 2), (2, 1)
    g.set_unary(0, [-np.inf, 0.0])                      # (0, 1) and (2, 1) both forced on: two heads for word 1
    g.set_unary(3, [-np.inf, 0.0])
    return g


@pytest.mark.parametrize("mode", ["sum", "max"])
@pytest.mark.parametrize("graph, message", [
    (_zero_belief, "every state of variable 0 has zero belief"),
    (_all_zero_message, r"factor 0 \(Dense.*sends an all-zero message to variable 0"),
    (_no_tree, r"factor 0 \(Tree.*received contradictory messages"),
], ids=["zero belief", "all-zero message", "no tree"])
def test_each_kind_of_contradiction_is_named(graph, message, mode):
    """Hard constraints that contradict each other are a ValueError saying where BP met the contradiction (a
    variable's belief, a factor's outgoing message, a factor's incoming ones), in both modes, not NaN beliefs."""
    with pytest.raises(ValueError, match=message):
        belief_propagation(graph(), mode)


def test_isolated_variables_and_empty_graph():
    g = FactorGraph([3])
    g.set_unary(0, [0.0, np.log(2.0), -np.inf])
    res = belief_propagation(g, "sum")
    assert res.converged and res.iterations == 0
    np.testing.assert_allclose(res.variable_beliefs[0], [1 / 3, 2 / 3, 0.0])
    np.testing.assert_allclose(res.log_partition, np.log(3.0))


def test_bad_bp_arguments():
    g, _ = _ref("mixed")
    with pytest.raises(TypeError, match="graph"):
        belief_propagation("g")
    with pytest.raises(ValueError, match="mode"):
        belief_propagation(g, "mean")
    with pytest.raises(ValueError, match="schedule"):
        belief_propagation(g, schedule="random")
    with pytest.raises(ValueError, match="damping"):
        belief_propagation(g, damping=1.0)
    with pytest.raises(ValueError, match="normalize"):
        belief_propagation(g, normalize="l2")
    with pytest.raises(ValueError, match="normalize='none'"):
        belief_propagation(g, normalize="none")
    with pytest.raises(ValueError, match="max_iter"):
        belief_propagation(g, max_iter=0)
    with pytest.raises(ValueError, match="tol"):
        belief_propagation(g, tol=-1.0)
    with pytest.raises(ValueError, match="init_messages"):
        belief_propagation(g, init_messages=[[]])
    chain = FactorGraph.pairwise([np.zeros(2)] * 3, [(0, 1), (1, 2)], np.eye(2))
    with pytest.raises(ValueError, match=r"init_messages\[1\]\[0\] .* with a finite entry"):
        belief_propagation(chain, init_messages=[[np.zeros(2), np.zeros(2)], [np.full(2, -np.inf), np.zeros(2)]])
    with pytest.raises(TypeError, match=r"init_messages\[0\] must be a list"):
        belief_propagation(chain, init_messages=[5, 5])
    with pytest.raises(TypeError, match=r"init_messages\[0\]\[1\] must be a real log-message"):
        belief_propagation(chain, init_messages=[[np.zeros(2), "ab"], [np.zeros(2), np.zeros(2)]])
    with pytest.raises(TypeError, match=r"init_messages\[0\]\[0\] must be a real log-message, got ndarray of bool"):
        belief_propagation(chain, init_messages=[[np.array([True, False]), np.zeros(2)], [np.zeros(2), np.zeros(2)]])
    with pytest.raises(TypeError, match="result"):
        decode_map(None)


def test_turbo_parser_graph():
    """Smith & Eisner's loopy graph (Martins et al. 2010, Fig. 1): a TREE factor plus pairwise sibling factors."""
    from betheproj.factor_graphs import Tree, lp_map
    rng = np.random.default_rng(0)
    arcs = Tree.all_arcs(3)
    g = FactorGraph([2] * len(arcs))
    for k in range(len(arcs)):
        g.set_unary(k, [0.0, rng.normal()])
    g.add_factor(Tree(range(len(arcs)), arcs))
    for h in range(4):
        mods = [m for m in range(1, 4) if m != h]
        for i in range(len(mods)):
            for j in range(i + 1, len(mods)):
                g.add_dense((arcs.index((h, mods[i])), arcs.index((h, mods[j]))), [[0.0, 0.0], [0.0, rng.normal()]])
    assert not g.is_tree()
    ref = graph_reference(g)
    res = belief_propagation(g, "sum", tol=1e-10)
    assert res.converged
    assert abs(res.log_partition - ref["log_z"]) < 0.2
    z = res.factor_beliefs[0]                      # the TREE factor's arc marginals: each word has one head
    for m in range(1, 4):
        assert sum(z[k] for k, a in enumerate(arcs) if a[1] == m) == pytest.approx(1.0)
    mp = belief_propagation(g, "max", tol=1e-10)
    assert mp.converged and np.isfinite(g.score(mp.decode()))
    assert lp_map(g).objective >= ref["map_score"] - 1e-8     # the relaxation bounds the MAP from above


@pytest.mark.parametrize("factor, u0, u1, log_z", [
    (OR([0, 1]), [0.0, -np.inf], [0.0, -800.0], -800.0),          # v0 off, so v1 on at a cost of 800
    (NAND([0, 1]), [-np.inf, 0.0], [0.0, 800.0], 0.0),            # at most one on: v0 on, so v1 off
    (OROut([0, 1]), [0.0, -800.0], [-np.inf, 0.0], -800.0),       # output on, so the input on at 800
])
def test_or_family_sum_product_beyond_exp_underflow(factor, u0, u1, log_z):
    graph = FactorGraph([2, 2])
    graph.set_unary(0, u0)
    graph.set_unary(1, u1)
    graph.add_factor(factor)
    res = belief_propagation(graph, "sum")                 # raised "contradictory constraints" before
    assert res.converged and res.log_partition == pytest.approx(log_z, abs=1e-9)
    assert res.log_partition == pytest.approx(graph_reference(graph)["log_z"], abs=1e-9)


@pytest.mark.parametrize("space", ["probability", "log"])
@pytest.mark.parametrize("mode", ["sum", "max"])
def test_damping_keeps_hard_zeros_and_converges(mode, space):
    graph = FactorGraph([2, 2])
    graph.set_unary(0, [-np.inf, 0.0])                     # v0 clamped on, so XOR turns v1 off exactly
    graph.add_factor(XOR([0, 1]))
    res = belief_propagation(graph, mode, damping=0.5, max_iter=100, damping_space=space)
    assert res.converged                                   # the zero only halved each iteration before
    assert np.allclose(res.variable_beliefs[1], [1.0, 0.0])


def test_ties_names_a_bad_tolerance():
    # "can't multiply sequence by non-int" for a str; NaN returned [] whatever the beliefs
    g = FactorGraph([2, 2])
    g.set_unary(0, [0.0, 1.0])
    res = belief_propagation(g)
    assert res.ties() == [1]
    for tol, error in (("a", TypeError), (None, TypeError), (float("nan"), ValueError), (-1.0, ValueError)):
        with pytest.raises(error, match="tol must be"):
            res.ties(tol)


def test_an_empty_graph_scores_the_empty_assignment_and_a_ragged_table_is_named():
    # [] read as a float array was refused as "not integer labels"; a ragged table gave numpy's message alone
    from betheproj.factor_graphs import Dense

    assert FactorGraph().score([]) == 0.0
    with pytest.raises(ValueError, match=r"table must be a rectangular array \("):
        Dense([0, 1], [[1.0], [1.0, 2.0]])
