"""Second-order parsing: vectorised Turbo Parser #1 loopy BP against the factor-graph reference and brute force,
mean-field parsing (Bethe-RDA), pruning, features, learning on a treebank that needs grandparents, storage."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from betheproj.data.conllu import Sentence
from betheproj.factor_graphs import FactorGraph, Tree, belief_propagation
from betheproj.oracles.base import PairwisePotentials
from betheproj.parsing import DependencyParser
from betheproj.parsing.part_features import SecondOrderFeatures
from betheproj.parsing.pruning import prune
from betheproj.parsing.second_order import SecondOrderParser
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


def _reference_bp(theta, s, g, n, damping, iters):
    """The same model built with betheproj.factor_graphs (per-message Python BP)."""
    arcs = _arcs(theta, n)
    graph = FactorGraph()
    var = {a: graph.add_variable(2, [0.0, float(theta[a])]) for a in arcs}
    graph.add_factor(Tree([var[a] for a in arcs], arcs, n))
    for h in range(n + 1):
        for m, s_ in itertools.combinations(range(1, n + 1), 2):
            if (h, m) in var and (h, s_) in var:
                graph.add_dense([var[(h, m)], var[(h, s_)]], [[0.0, 0.0], [0.0, float(s[h, m, s_] + s[h, s_, m])]])
    for gp, h, m in itertools.permutations(range(n + 1), 3):
        if m >= 1 and (gp, h) in var and (h, m) in var:
            graph.add_dense([var[(gp, h)], var[(h, m)]], [[0.0, 0.0], [0.0, float(g[gp, h, m])]])
    res = belief_propagation(graph, "sum", damping=damping, tol=0.0, max_iter=iters)
    out = torch.zeros(n + 1, n + 1, dtype=torch.float64)
    for a in arcs:
        out[a] = res.variable_beliefs[var[a]][1]
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


def _sentence(forms: list[str], tags: list[str], heads: list[int]) -> Sentence:
    words = [[str(i + 1), f, f, t, t, "_", str(h), "dep", "_", "_"]
             for i, (f, t, h) in enumerate(zip(forms, tags, heads, strict=True))]
    return Sentence(words=words)


# ----------------------------------------------------------------------------------------------- loopy BP

@pytest.mark.parametrize(("damping", "prune_p", "seed"), [(0.0, 0.3, 1), (0.4, 0.3, 1), (0.4, 0.6, 4)])
def test_vectorised_bp_equals_factor_graph_bp(damping, prune_p, seed):
    theta, s, g, lengths = _random_problem([4, 3, 2], seed=seed, prune_p=prune_p)   # 0.6: arcs in no / every tree
    res = loopy_bp(theta, s, g, lengths, max_iter=12, damping=damping, tol=0.0)
    assert res.iterations == 12
    for b, n in enumerate(lengths.tolist()):
        ref = _reference_bp(theta[b], s[b], g[b], n, damping, 12)
        torch.testing.assert_close(res.beliefs[b, : n + 1, : n + 1], ref, atol=1e-8, rtol=0)
    assert res.beliefs[1, 4:].abs().max() == 0 and res.beliefs[2, :, 3:].abs().max() == 0     # padding


@pytest.mark.parametrize("single_root", [False, True])
def test_damped_bp_keeps_arcs_in_no_tree_and_every_tree_exact(single_root):
    """Word 2's only head is 3 and word 3's heads are 0 and 2: the arc 2 -> 3 is in no tree, 3 -> 2 and 0 -> 3
    in every tree.  Damping mixed those exact verdicts with old messages, so they only shrank by the damping
    factor per iteration and BP never met a tight tolerance."""
    theta, s, g, lengths = _random_problem([4], seed=3)
    theta[0, :, 2] = -torch.inf
    theta[0, 3, 2] = 0.3
    theta[0, :, 3] = -torch.inf
    theta[0, 0, 3], theta[0, 2, 3] = 0.2, 1.5
    theta[0, 0, 1] = theta[0, 0, 4] = -torch.inf                 # (and so 0 -> 3 is the only root arc)
    res = loopy_bp(theta, s, g, lengths, max_iter=300, damping=0.5, tol=1e-10, single_root=single_root)
    assert res.converged and res.iterations < 200
    assert res.beliefs[0, 2, 3] == 0.0 and res.beliefs[0, 3, 2] == 1.0 and res.beliefs[0, 0, 3] == 1.0
    ref = _reference_bp(theta[0], s[0], g[0], 4, 0.5, res.iterations)
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


def test_bp_bad_inputs():
    theta, s, g, lengths = _random_problem([3], seed=5)
    with pytest.raises(ValueError, match="head-major"):
        loopy_bp(theta[0], s, g, lengths)
    with pytest.raises(ValueError, match="sibling must be"):
        loopy_bp(theta, s[:, :2], g, lengths)
    with pytest.raises(ValueError, match="damping"):
        loopy_bp(theta, s, g, lengths, damping=1.0)
    with pytest.raises(ValueError, match="decode_on"):
        loopy_bp_parse(PairwisePotentials(theta[:, :, 1:].transpose(1, 2), theta.new_zeros(4, 4), lengths), s, g,
                       decode_on="max")


# ----------------------------------------------------------------------------------------------- features, pruning

def _grandparent_treebank(copies: int = 12) -> list[Sentence]:
    """``G F H F M F H``: M attaches to the left H under grandparent form ``g1`` and to the right H under ``g2``.
    The two arcs into M look the same to the arc-factored features except for their direction (G's form is
    neither head, modifier, neighbour nor an in-between tag), so only grandparent parts can tell them apart."""
    tags = ["G", "F", "H", "F", "M", "F", "H"]
    out = []
    for g, m_head in (("g1", 3), ("g2", 7)):
        forms = [g, "f", "h", "f", "m", "f", "h"]
        out += [_sentence(forms, tags, [0, 1, 1, 1, m_head, 1, 1]) for _ in range(copies)]
    return out


def test_features_and_pruning():
    sents = _grandparent_treebank(1)
    feats = SecondOrderFeatures(bits=12, context=False)
    tok, starts = feats.tokens(sents)
    assert len(tok["w"]) == 2 * 8 and starts.tolist() == [0, 8]
    a = feats.sibling(tok, starts[[0, 1]], np.array([1, 1]), np.array([3, 3]), np.array([7, 7]))
    b = feats.grandparent(tok, starts[[0, 1]], np.array([1, 1]), np.array([3, 3]), np.array([5, 5]))
    assert a.shape[0] == 2 and a.min() >= 0 and a.max() < 4096
    assert (a[0] != a[1]).sum() == 1                 # the head is G (g1 / g2): only the template with its form
    assert (b[0] != b[1]).sum() == 2                 # the two templates with the grandparent's form
    # the context templates come after the same base ids; the grandparent's form also in ("gw", "mp", "dirs")
    ctx = SecondOrderFeatures(bits=12)
    assert ctx.context and ctx.config()["context"]
    tok_c, _ = ctx.tokens(sents)
    ac = ctx.sibling(tok_c, starts[[0, 1]], np.array([1, 1]), np.array([3, 3]), np.array([7, 7]))
    bc = ctx.grandparent(tok_c, starts[[0, 1]], np.array([1, 1]), np.array([3, 3]), np.array([5, 5]))
    assert (ac[:, : a.shape[1]] == a).all() and (bc[:, : b.shape[1]] == b).all()
    assert ac.shape[1] > a.shape[1] and bc.shape[1] > b.shape[1]
    assert (ac[0] != ac[1]).sum() == 1 and (bc[0] != bc[1]).sum() == 3
    # neighbouring tags: the tag before the first word and after the last is the sentence boundary (a root)
    assert tok_c["q"][1] == tok_c["p"][0] and tok_c["n"][7] == tok_c["p"][8] and tok_c["n"][15] == tok_c["p"][0]
    assert tok_c["q"][2] == tok_c["p"][1] and tok_c["n"][2] == tok_c["p"][3] and tok_c["q"][8] != tok_c["p"][7]
    # a different tag after the earlier sibling m changes exactly the ("hp", "mp", "sp", "mn", "side") id
    other = [_sentence(["g1", "f", "h", "f", "m", "f", "h"], ["G", "F", "H", "X", "M", "F", "H"],
                       [0, 1, 1, 1, 5, 1, 1])]
    tok_o, _ = ctx.tokens(other)
    ao = ctx.sibling(tok_o, np.array([0]), np.array([1]), np.array([3]), np.array([7]))
    assert (ao[0] != ac[0]).sum() == 1
    first = DependencyParser(bits=10)
    first.weights = torch.randn(1025, generator=torch.Generator().manual_seed(0))
    cands = prune(first, first.weights.double(), sents, top_k=2, gold=True)
    assert cands.recall == 1.0
    for i, s in enumerate(sents):
        r = cands.rows(i)
        per_word = np.bincount(cands.mod[r], minlength=len(s))
        assert (per_word >= 1).all() and (per_word <= 2 + 2).all()       # top-2 plus MAP plus gold
    with pytest.raises(ValueError, match="top_k"):
        prune(first, first.weights.double(), sents, top_k=0)


# ----------------------------------------------------------------------------------------------- learning

def test_learning_needs_grandparents_and_fits(tmp_path):
    train = _grandparent_treebank()
    arc = DependencyParser(bits=12)
    arc.fit(train, loss="crf", epochs=5)
    arc_uas = arc.evaluate(train)
    assert arc_uas <= 100 * 13 / 14 + 1e-9            # the arc into M is a coin toss for an arc-factored model
    first = DependencyParser(bits=12)
    first.weights = torch.zeros(first.features.num_features + 1)   # prune nothing: uniform first-order marginals
    parser = SecondOrderParser(first, bits=12, top_k=7, min_prob=0.0)
    parser.fit(train, epochs=12, lr=0.3, lr_first=0.3, train_iter=5, max_batch=8, dev=train[:4], eval_every=10 ** 6)
    assert [s for s, _ in parser.info["dev_history"]] == [parser.info["steps"]]     # the last step is evaluated
    for method in ("mean_field", "loopy_bp"):
        assert parser.evaluate(train, method=method) == 100.0
    assert parser.info["steps"] > 0 and parser.info["train_recall"] == 1.0
    path = tmp_path / "so.pt"
    parser.save(path)
    again = SecondOrderParser.load(path)
    for a, b in zip(again.predict(train[:3], method="loopy_bp"), parser.predict(train[:3], method="loopy_bp"),
                    strict=True):
        assert (a == b).all()
    torch.testing.assert_close(again.w2, parser.w2)
    # a model saved before the context templates (no "context" key) loads without them
    state = torch.load(path, weights_only=False)
    del state["features"]["context"]
    assert not SecondOrderParser.from_state(state).features.context


def test_parser_bad_inputs(tmp_path):
    first = DependencyParser(bits=10)
    with pytest.raises(ValueError, match="not trained"):
        SecondOrderParser(first)
    first.weights = torch.zeros(1025)
    parser = SecondOrderParser(first, bits=10)
    with pytest.raises(ValueError, match="method"):
        parser.predict(_grandparent_treebank(1), method="exact")
    with pytest.raises(ValueError, match="no training"):
        parser.fit([])
    with pytest.raises(FileNotFoundError):
        SecondOrderParser.load(tmp_path / "missing.pt")
    with pytest.raises(ValueError, match="bits"):
        SecondOrderFeatures(bits=3)
