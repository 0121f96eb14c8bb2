"""The second-order decoders: vectorised Turbo Parser #1 loopy BP against the factor-graph reference and brute
force, and mean-field parsing (Bethe-RDA)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from betheproj.factor_graphs import FactorGraph, Tree, belief_propagation
from betheproj.oracles import chu_liu_edmonds
from betheproj.oracles.base import PairwisePotentials
from betheproj.parsing.second_order_decoding import loopy_bp, loopy_bp_parse, mean_field_parse
from tests.trees import reaches_root

# ----------------------------------------------------------------------------------------------- helpers


def _random_problem(lengths: list[int], seed: int, scale: float = 0.7, prune_p: float = 0.0):
    """Head-major theta [B, C, C] (-inf at some pruned arcs, keeping the chain 0 -> 1 -> 2 ... as a tree), S, G."""
    gen = torch.Generator().manual_seed(seed)
    b, c = len(lengths), max(lengths) + 1
    theta = torch.randn(b, c, c, generator=gen, dtype=torch.float64)
    if prune_p:
        drop = torch.rand(b, c, c, generator=gen) < prune_p
        chain = torch.zeros(c, c, dtype=torch.bool)
        chain[torch.arange(c - 1), torch.arange(1, c)] = True
        theta = theta.masked_fill(drop & ~chain, -torch.inf)
    s = scale * torch.randn(b, c, c, c, generator=gen, dtype=torch.float64)
    g = scale * torch.randn(b, c, c, c, generator=gen, dtype=torch.float64)
    return theta, s, g, torch.tensor(lengths)


def _arcs(theta: torch.Tensor, n: int) -> list[tuple[int, int]]:
    return [(h, m) for h in range(n + 1) for m in range(1, n + 1) if h != m and theta[h, m] > -torch.inf]


def _reference_bp(theta, s, g, n, damping, iters, single_root=False, log_odds=False, damping_space="probability"):
    """The same model built with betheproj.factor_graphs (per-message Python BP): beliefs ``b(y_hm = 1)``, or with
    ``log_odds`` ``log b(1) - log b(0)`` (``nan`` at absent arcs and where a belief is 0 or 1)."""
    arcs = _arcs(theta, n)
    graph = FactorGraph()
    var = {a: graph.add_variable(2, [0.0, float(theta[a])]) for a in arcs}
    graph.add_factor(Tree([var[a] for a in arcs], arcs, n, single_root=single_root))
    for h in range(n + 1):
        for m, s_ in itertools.combinations(range(1, n + 1), 2):
            if (h, m) in var and (h, s_) in var:
                graph.add_dense([var[(h, m)], var[(h, s_)]], [[0.0, 0.0], [0.0, float(s[h, m, s_] + s[h, s_, m])]])
    for gp, h, m in itertools.permutations(range(n + 1), 3):
        if m >= 1 and (gp, h) in var and (h, m) in var:
            graph.add_dense([var[(gp, h)], var[(h, m)]], [[0.0, 0.0], [0.0, float(g[gp, h, m])]])
    res = belief_propagation(graph, "sum", damping=damping, tol=0.0, max_iter=iters, damping_space=damping_space)
    out = torch.full((n + 1, n + 1), math.nan if log_odds else 0.0, dtype=torch.float64)
    for a in arcs:
        b0, b1 = res.variable_beliefs[var[a]]
        out[a] = (math.log(b1) - math.log(b0) if 0 < b1 < 1 else math.nan) if log_odds else b1
    return out


def _brute_marginals(theta, s, g, n):
    """Exact arc marginals of p(y) ∝ exp(theta.y + sum_{m<s} (S+S^T) y_hm y_hs + sum G y_gh y_hm), all trees."""
    cands = [[h for h in range(n + 1) if h != m and theta[h, m] > -torch.inf] for m in range(1, n + 1)]
    weights, trees = [], []
    for heads in itertools.product(*cands):
        if not reaches_root(heads):
            continue
        par = (0,) + heads
        score = sum(float(theta[par[m], m]) for m in range(1, n + 1))
        for m, s_ in itertools.combinations(range(1, n + 1), 2):
            if par[m] == par[s_]:
                score += float(s[par[m], m, s_] + s[par[m], s_, m])
        for m in range(1, n + 1):
            h = par[m]
            if h >= 1:
                score += float(g[par[h], h, m])
        weights.append(score)
        trees.append(par)
    p = torch.softmax(torch.tensor(weights, dtype=torch.float64), 0)
    out = torch.zeros(n + 1, n + 1, dtype=torch.float64)
    for w, par in zip(p, trees, strict=True):
        for m in range(1, n + 1):
            out[par[m], m] += w
    return out


def _is_tree(heads: np.ndarray) -> bool:
    n = len(heads)
    if (heads < 0).any() or (heads > n).any() or (heads == np.arange(1, n + 1)).any():
        return False
    return reaches_root(heads.tolist())


# ----------------------------------------------------------------------------------------------- loopy BP

@pytest.mark.parametrize("space", ["probability", "log"])
@pytest.mark.parametrize(("damping", "prune_p", "seed"), [(0.0, 0.3, 1), (0.4, 0.3, 1), (0.4, 0.6, 4)])
def test_vectorised_bp_equals_factor_graph_bp(damping, prune_p, seed, space):
    theta, s, g, lengths = _random_problem([4, 3, 2], seed=seed, prune_p=prune_p)   # 0.6: arcs in no / every tree
    res = loopy_bp(theta, s, g, lengths, max_iter=12, damping=damping, tol=0.0, damping_space=space)
    assert res.iterations == 12
    for b, n in enumerate(lengths.tolist()):
        ref = _reference_bp(theta[b], s[b], g[b], n, damping, 12, damping_space=space)
        torch.testing.assert_close(res.beliefs[b, : n + 1, : n + 1], ref, atol=1e-8, rtol=0)
    assert res.beliefs[1, 4:].abs().max() == 0 and res.beliefs[2, :, 3:].abs().max() == 0     # padding


@pytest.mark.parametrize("space", ["probability", "log"])
@pytest.mark.parametrize("single_root", [False, True])
def test_damped_bp_keeps_arcs_in_no_tree_and_every_tree_exact(single_root, space):
    """Word 2's only head is 3 and word 3's heads are 0 and 2: the arc 2 -> 3 is in no tree, 3 -> 2 and 0 -> 3
    in every tree.  Damping mixed those exact verdicts with old messages, so they only shrank by the damping
    factor per iteration and BP never met a tight tolerance."""
    theta, s, g, lengths = _random_problem([4], seed=3)
    theta[0, :, 2] = -torch.inf
    theta[0, 3, 2] = 0.3
    theta[0, :, 3] = -torch.inf
    theta[0, 0, 3], theta[0, 2, 3] = 0.2, 1.5
    theta[0, 0, 1] = theta[0, 0, 4] = -torch.inf                 # (and so 0 -> 3 is the only root arc)
    res = loopy_bp(theta, s, g, lengths, max_iter=300, damping=0.5, tol=1e-10, single_root=single_root,
                   damping_space=space)
    assert res.converged and res.iterations < 200
    assert res.beliefs[0, 2, 3] == 0.0 and res.beliefs[0, 3, 2] == 1.0 and res.beliefs[0, 0, 3] == 1.0
    ref = _reference_bp(theta[0], s[0], g[0], 4, 0.5, res.iterations, damping_space=space)
    torch.testing.assert_close(res.beliefs[0], ref, atol=1e-9, rtol=0)


def test_bp_exact_without_second_order_factors():
    """Only the TREE factor: a tree-shaped factor graph, BP = the exact (enumerated) tree marginals."""
    theta, s, g, lengths = _random_problem([4], seed=2, prune_p=0.2)
    res = loopy_bp(theta, 0 * s, None, lengths, max_iter=3)
    assert res.converged
    torch.testing.assert_close(res.beliefs[0], _brute_marginals(theta[0], 0 * s[0], 0 * g[0], 4), atol=1e-10, rtol=0)


def test_bp_exact_when_every_loop_passes_a_forced_arc():
    """Word 1 can only attach to the root and every pairwise factor involves the arc 0 -> 1, so every cycle of the
    factor graph (TREE - 0->1 - pair factor - other arc - TREE) runs through a variable fixed to 1: loopy BP is
    exact there, checked against the enumeration of all trees."""
    theta, s, g, lengths = _random_problem([3], seed=3, scale=1.0)
    theta[0, 2:, 1] = -torch.inf                                  # word 1: root only
    keep_s = torch.zeros_like(s, dtype=torch.bool)
    keep_s[0, 0, 1, 2:] = keep_s[0, 0, 2:, 1] = True              # siblings (0; 1, s)
    keep_g = torch.zeros_like(g, dtype=torch.bool)
    keep_g[0, 0, 1, 2:] = True                                    # grandparents 0 -> 1 -> m
    s, g = torch.where(keep_s, s, 0.0), torch.where(keep_g, g, 0.0)
    res = loopy_bp(theta, s, g, lengths, max_iter=50, tol=1e-12)
    assert res.converged
    torch.testing.assert_close(res.beliefs[0], _brute_marginals(theta[0], s[0], g[0], 3), atol=1e-9, rtol=0)
    # with all second-order factors the graph is loopy and BP only approximates the marginals
    theta, s, g, lengths = _random_problem([3], seed=3, scale=1.0)
    loopy = loopy_bp(theta, s, g, lengths, max_iter=200, damping=0.5, tol=1e-12).beliefs[0]
    assert (loopy - _brute_marginals(theta[0], s[0], g[0], 3)).abs().max() > 1e-4


@pytest.mark.parametrize("single_root", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bp_log_odds_of_unlikely_arcs_match_the_factor_graph(single_root, seed):
    """Arc scores of scale 20 put arcs that close a cycle with near-certain arcs at marginals e^-30 to e^-80,
    which the matrix-tree's closed form gives only to ~1e-16 absolutely: their TREE logits read log(tiny) = -708
    (600 nats off), and the pairwise factors carried the error to other arcs.  They match the factor-graph BP,
    whose TREE factor takes such arcs' ratios from determinants."""
    theta, s, g, lengths = _random_problem([6], seed=seed, scale=3.0)
    theta = 20.0 * theta
    res = loopy_bp(theta, s, g, lengths, max_iter=15, tol=0.0, single_root=single_root)
    ref = _reference_bp(theta[0], s[0], g[0], 6, 0.0, 15, single_root, log_odds=True)
    arcs = torch.isfinite(ref)
    assert (ref[arcs] < -30.0).any()
    torch.testing.assert_close(res.log_odds[0][arcs], ref[arcs], atol=1e-6, rtol=1e-9)


@pytest.mark.parametrize("scale", [1e3, 1e17, 1e30])
def test_undamped_bp_parse_at_huge_magnitudes(scale):
    """Second-order scores of scale 0.7 beside arc scores of scale 1e3 to 1e30 leave the first-order best tree; at
    1e30 the TREE logits floored at +-708 left beliefs of 0.2 to 0.6 and another tree."""
    theta, s, g, lengths = _random_problem([6, 5], seed=5)
    theta = scale * theta
    node = theta[:, :, 1:].transpose(1, 2).contiguous()
    heads, res = loopy_bp_parse(PairwisePotentials(node, node.new_zeros(7, 7), lengths), s, g, max_iter=20)
    assert res.converged
    assert (torch.minimum(res.beliefs, 1.0 - res.beliefs) < 1e-12).all()
    for b, n in enumerate(lengths.tolist()):
        assert heads[b, :n].tolist() == chu_liu_edmonds(theta[b, : n + 1, : n + 1]).tolist()


def test_log_space_damping_converges_at_large_scores():
    """Arc scores of scale 1e3: damped in probability space, a log-odds message that must fall by D nats moves by
    about log(1/damping) a step, and BP had not converged after 200 iterations; damped in log space it converges
    to undamped BP's beliefs and tree."""
    theta, s, g, lengths = _random_problem([6, 5], seed=5)
    theta = 1e3 * theta
    node = theta[:, :, 1:].transpose(1, 2).contiguous()
    pot = PairwisePotentials(node, node.new_zeros(7, 7), lengths)
    plain_heads, plain = loopy_bp_parse(pot, s, g, max_iter=200)
    heads, log = loopy_bp_parse(pot, s, g, max_iter=200, damping=0.5, damping_space="log")
    _, prob = loopy_bp_parse(pot, s, g, max_iter=200, damping=0.5)
    assert plain.converged and log.converged and log.iterations < 100 and not prob.converged
    assert torch.equal(heads, plain_heads)
    torch.testing.assert_close(log.beliefs, plain.beliefs, atol=1e-9, rtol=0)
    with pytest.raises(ValueError, match="damping_space must be one of"):
        loopy_bp_parse(pot, s, g, damping=0.5, damping_space="logs")


def test_bp_parse_and_mean_field_parse_return_trees():
    theta, s, g, lengths = _random_problem([6, 4, 1, 5], seed=4, prune_p=0.4)
    node = theta[:, :, 1:].transpose(1, 2).contiguous()
    pot = PairwisePotentials(node, node.new_zeros(7, 7), lengths)
    heads_bp, res = loopy_bp_parse(pot, s, g, max_iter=30, damping=0.3)
    heads_mf, sol = mean_field_parse(pot, s, g, max_iter=30)
    heads_mu, _ = mean_field_parse(pot, s, g, max_iter=30, decode_on="marginals")
    for heads in (heads_bp, heads_mf, heads_mu):
        for b, n in enumerate(lengths.tolist()):
            h = heads[b, :n].numpy()
            assert _is_tree(h)
            assert all(theta[b, h[m - 1], m] > -torch.inf for m in range(1, n + 1))      # no pruned arc
            assert (heads[b, n:] == -1).all()
    assert sol.iterations.max() <= 30


@pytest.mark.parametrize("single_root", [False, True])
def test_bp_parse_decodes_log_odds_of_arcs_in_every_tree(single_root):
    """Damped BP gives an arc in every tree the exact log-odds +inf; decoding on the log-odds refused it
    ("node contains +inf").  Every tree holds that arc, so it decodes as the tree of the largest finite log-odds."""
    theta, s, g, lengths = _random_problem([6, 4, 1, 5], seed=4, prune_p=0.4)
    theta[3, :, 2] = -torch.inf
    theta[3, 4, 2] = 0.5                                          # word 2 of sentence 3: head 4 only
    node = theta[:, :, 1:].transpose(1, 2).contiguous()
    pot = PairwisePotentials(node, node.new_zeros(7, 7), lengths)
    heads, res = loopy_bp_parse(pot, s, g, max_iter=30, damping=0.3, decode_on="log_odds", single_root=single_root)
    assert res.log_odds[2, 0, 1] == torch.inf and res.log_odds[3, 4, 2] == torch.inf
    assert heads[2, 0] == 0 and heads[3, 1] == 4
    for b, n in enumerate(lengths.tolist()):
        h = heads[b, :n].numpy()
        assert _is_tree(h) and (not single_root or (h == 0).sum() == 1)
        forced = res.log_odds[b, :, 1:].transpose(0, 1)[:n] == torch.inf       # [n, C]: the arcs in every tree
        best = -torch.inf
        for tree in itertools.product(range(n + 1), repeat=n):                # the best tree by brute force
            t = np.array(tree)
            if _is_tree(t) and (not single_root or (t == 0).sum() == 1):
                score = sum(0.0 if forced[m, t[m]] else float(res.log_odds[b, t[m], m + 1]) for m in range(n))
                best = max(best, score)
        got = sum(0.0 if forced[m, h[m]] else float(res.log_odds[b, h[m], m + 1]) for m in range(n))
        assert got == pytest.approx(best, abs=1e-9)


def test_bp_bad_inputs():
    theta, s, g, lengths = _random_problem([3], seed=5)
    with pytest.raises(ValueError, match="head-major"):
        loopy_bp(theta[0], s, g, lengths)
    with pytest.raises(ValueError, match="sibling must be"):
        loopy_bp(theta, s[:, :2], g, lengths)
    with pytest.raises(ValueError, match="damping"):
        loopy_bp(theta, s, g, lengths, damping=1.0)
    nan = theta.clone()
    nan[0, 0, 1] = float("nan")                       # not a pruned arc: an error
    with pytest.raises(ValueError, match="without NaN"):
        loopy_bp(nan, s, g, lengths)
    with pytest.raises(ValueError, match="decode_on"):
        loopy_bp_parse(PairwisePotentials(theta[:, :, 1:].transpose(1, 2), theta.new_zeros(4, 4), lengths), s, g,
                       decode_on="max")


def test_bp_refuses_second_order_scores_that_are_not_finite_floats():
    """A bool ``S`` summed ``S + S^T`` as a logical or (a silently different model); a ``-inf`` part score ran
    without an error (and, damped, failed inside the matrix-tree theorem on NaN messages naming no argument)."""
    theta, s, g, lengths = _random_problem([3], seed=5)
    with pytest.raises(TypeError, match="sibling must be a floating-point"):
        loopy_bp(theta, s > 0, g, lengths)
    for damping in (0.0, 0.5):
        bad = s.clone()
        bad[0, 0, 1, 2] = -torch.inf
        with pytest.raises(ValueError, match="sibling scores must be finite"):
            loopy_bp(theta, bad, g, lengths, damping=damping)
        bad = g.clone()
        bad[0, 0, 1, 2] = float("nan")
        with pytest.raises(ValueError, match="grandparent scores must be finite"):
            loopy_bp(theta, s, bad, lengths, damping=damping)
    inf = theta.clone()
    inf[0, 0, 1] = torch.inf
    with pytest.raises(ValueError, match="theta must be"):
        loopy_bp(inf, s, g, lengths)
    with pytest.raises(ValueError, match="tol"):
        loopy_bp(theta, s, g, lengths, tol=-1.0)
    with pytest.raises(ValueError, match="lengths"):
        loopy_bp(theta, s, g, torch.tensor([3, 3]))


def test_both_parse_decoders_refuse_a_non_zero_edge_table():
    """loopy_bp_parse ignored potentials.edge and parsed anyway; mean_field_parse and the oracles refuse it."""
    theta, sib, _, lengths = _random_problem([3], seed=0)
    node = theta[:, :, 1:].transpose(1, 2).contiguous()                            # node[b, m-1, h]
    potentials = PairwisePotentials(node, torch.ones(4, 4, dtype=torch.float64), lengths)
    for decode in (loopy_bp_parse, mean_field_parse):
        with pytest.raises(ValueError, match="potentials.edge must be all zeros"):
            decode(potentials, sib, None)
    heads, _ = loopy_bp_parse(PairwisePotentials(node, torch.zeros(4, 4, dtype=torch.float64), lengths), sib, None)
    assert reaches_root(heads[0].tolist())
