"""Dependency-tree oracles (matrix-tree / Chu-Liu-Edmonds and Eisner) against enumeration of all trees (float64)."""

import functools
import itertools
import math

import pytest
import torch

import betheproj as bp
from betheproj.energies import MeanField
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
    nonprojective,
)
from betheproj.oracles.dependency import _mask_head_major
from betheproj.oracles.nonprojective import _exact_matrix_tree, _fast_matrix_tree
from tests.trees import reaches_root

from ._spy import record_shapes

DT = torch.float64
INF = float("inf")
ORACLES = [(NonProjective, False), (NonProjective, True), (Projective, False), (Projective, True)]


@functools.cache
def _trees(n: int, projective: bool, single_root: bool) -> torch.Tensor:
    """Every dependency tree of ``n`` words as heads [K, n] (position m-1 holds the head of word m)."""
    out = []
    for heads in itertools.product(range(n + 1), repeat=n):
        if any(h == m + 1 for m, h in enumerate(heads)):
            continue
        if single_root and heads.count(0) != 1:
            continue
        if not reaches_root(heads):
            continue
        if projective:
            spans = [(min(h, m + 1), max(h, m + 1)) for m, h in enumerate(heads)]
            if any(a1 < a2 < b1 < b2 for (a1, b1), (a2, b2) in itertools.permutations(spans, 2)):
                continue
        out.append(heads)
    return torch.tensor(out, dtype=torch.long).reshape(-1, n)


def _brute(scores: torch.Tensor, n: int, projective: bool, single_root: bool):
    """log Z, head-major marginals [n+1, n+1], best score and entropy of one sentence by enumeration."""
    trees = _trees(n, projective, single_root)
    mods = torch.arange(1, n + 1)
    tree_scores = scores[trees, mods].sum(-1)
    log_z = torch.logsumexp(tree_scores, 0)
    p = torch.exp(tree_scores - log_z)
    marg = torch.zeros(n + 1, n + 1, dtype=scores.dtype)
    marg.index_put_((trees.flatten(), mods.repeat(len(trees))), p.repeat_interleave(n), accumulate=True)
    ent = -torch.where(p > 0, p * (tree_scores - log_z), torch.zeros_like(p)).sum()
    return log_z, marg, tree_scores.max(), ent


def _scores(b, n, scale=1.0, forbid=0.0, dtype=DT):
    s = torch.randn(b, n + 1, n + 1, dtype=dtype) * scale
    if forbid:
        s[:, 1:, :][torch.rand(b, n, n + 1) < forbid] = -INF          # some word -> word arcs
    return s


def _is_tree(heads: torch.Tensor, n: int) -> bool:
    h = heads[:n].tolist()
    if any(x < 0 or x > n or x == m + 1 for m, x in enumerate(h)):
        return False
    return reaches_root(h) and bool((heads[n:] == -1).all())


def _check_against_brute(cls, single_root, scores, lengths, atol=1e-9):
    projective = cls is Projective
    oracle = cls(single_root=single_root)
    pot = arc_potentials(scores, lengths)
    mu = oracle.marginals(pot)
    heads = oracle.map(pot)
    ent = oracle.entropy(mu)
    core = (eisner if projective else matrix_tree)(scores, lengths, single_root)
    for i, n in enumerate(lengths.tolist()):
        log_z, marg, best, h = _brute(scores[i, : n + 1, : n + 1], n, projective, single_root)
        assert abs(mu.log_partition[i] - log_z) <= atol * max(1.0, abs(log_z))
        assert torch.allclose(mu.node[i, :n, : n + 1], marg[:, 1:].t(), atol=atol, rtol=0)
        assert (mu.node[i, n:] == 0).all() and (mu.node[i, :, n + 1:] == 0).all()
        assert torch.allclose(core[1][i, : n + 1, : n + 1], marg, atol=atol, rtol=0)
        assert (core[1][i, n + 1:] == 0).all() and (core[1][i, :, n + 1:] == 0).all()
        assert abs(core[0][i] - log_z) <= atol * max(1.0, abs(log_z))
        assert _is_tree(heads[i], n)
        assert (heads[i, :n] == 0).sum() == 1 or not single_root
        tree_score = scores[i, heads[i, :n], torch.arange(1, n + 1)].sum()
        assert abs(tree_score - best) <= atol * max(1.0, abs(best))
        assert abs(ent[i] - h) <= atol * max(1.0, abs(h))
    return mu


@pytest.mark.parametrize("cls,single_root", ORACLES)
@pytest.mark.parametrize("scale", [0.5, 2.0])
def test_match_brute_force_with_padding(cls, single_root, scale):
    lengths = torch.tensor([5, 3, 1, 4, 2])
    for _ in range(3):
        _check_against_brute(cls, single_root, _scores(5, 5, scale), lengths)


@pytest.mark.parametrize("cls,single_root", ORACLES)
def test_forbidden_arcs(cls, single_root):
    lengths = torch.tensor([5, 4, 3, 5])
    done = 0
    while done < 3:
        s = _scores(4, 5, forbid=0.4)
        if single_root or cls is Projective:            # keep only batches where every sentence has a tree
            if any(not torch.isfinite(_brute(s[i, : n + 1, : n + 1], n, cls is Projective, single_root)[0])
                   for i, n in enumerate(lengths.tolist())):
                continue
        mu = _check_against_brute(cls, single_root, s, lengths)
        forbidden = ~torch.isfinite(arc_potentials(s, lengths).node)
        assert (mu.node[forbidden] == 0).all()
        done += 1


@pytest.mark.parametrize("cls,single_root", ORACLES)
def test_six_words(cls, single_root):
    _check_against_brute(cls, single_root, _scores(2, 6, 1.5), torch.tensor([6, 5]))


@pytest.mark.parametrize("cls,single_root", ORACLES)
def test_large_magnitudes_are_finite_and_exact(cls, single_root):
    scores = _scores(4, 5, 1000.0)
    lengths = torch.tensor([5, 4, 2, 5])
    mu = _check_against_brute(cls, single_root, scores, lengths, atol=1e-9)
    assert torch.isfinite(mu.node).all() and torch.isfinite(mu.log_partition).all()
    valid = torch.arange(5)[None] < lengths[:, None]
    assert torch.allclose(mu.node.sum(-1), valid.to(DT), atol=1e-12)


@pytest.mark.parametrize("cls,single_root", ORACLES)
def test_a_huge_constant_column_only_rescales_z(cls, single_root):
    torch.manual_seed(3)
    scores = torch.randn(1, 5, 5, dtype=DT)
    scores[:, :, 2] = 0.0
    ref = cls(single_root=single_root)
    huge = scores.clone()
    huge[:, :, 2] = -1e30                         # every tree has exactly one arc into word 2
    oracle = cls(single_root=single_root)
    mu = oracle.marginals(arc_potentials(huge))
    assert torch.allclose(mu.node, ref.marginals(arc_potentials(scores)).node, atol=1e-12)
    assert torch.equal(oracle.map(arc_potentials(huge)), ref.map(arc_potentials(scores)))


@pytest.mark.parametrize("cls,single_root", ORACLES)
def test_huge_column_shifts_that_cancel_leave_log_z_its_o1_part(cls, single_root):
    # each word's arcs lifted by +-1e15, the lifts summing to 0: every tree keeps an O(1) score, but the column
    # maxima, summed plainly, rounded 2e15 + x to a multiple of 0.25 before -1e15 came in
    from fractions import Fraction

    n = 4
    lift = torch.tensor([0.0, 1.0, 1.0, -1.0, -1.0], dtype=DT)           # by column (modifier); 0: the root's
    for seed in range(6):
        gen = torch.Generator().manual_seed(seed)
        scores = torch.randn(1, n + 1, n + 1, generator=gen, dtype=DT) + 1e15 * lift
        trees = _trees(n, cls is Projective, single_root)
        exact = [sum(Fraction(float(scores[0, h, m + 1])) for m, h in enumerate(heads.tolist())) for heads in trees]
        rel = torch.tensor([float(t - max(exact)) for t in exact], dtype=DT)
        log_z = float(max(exact)) + float(torch.logsumexp(rel, 0))
        p = torch.softmax(rel, 0)
        marg = torch.zeros(n + 1, n + 1, dtype=DT)
        marg.index_put_((trees.flatten(), torch.arange(1, n + 1).repeat(len(trees))), p.repeat_interleave(n),
                        accumulate=True)
        mu = cls(single_root=single_root).marginals(arc_potentials(scores))
        assert abs(float(mu.log_partition[0]) - log_z) < 1e-12 * max(1.0, abs(log_z))
        assert torch.allclose(mu.node[0], marg[:, 1:].t(), atol=1e-12, rtol=0)
        direct = (matrix_tree if cls is NonProjective else eisner)(scores, torch.tensor([n]), single_root)[0]
        assert abs(float(direct[0]) - log_z) < 1e-12 * max(1.0, abs(log_z))


@pytest.mark.parametrize("cls", [NonProjective, Projective])
@pytest.mark.parametrize("big", [1e10, 1e17, 1e100])
def test_a_huge_root_row_constant_only_rescales_z_with_one_root_child(cls, big):
    """With one root child every tree takes exactly one root arc, so a constant on the root row (a root penalty or
    bonus) only rescales Z, as a column's does.  The root row's arcs were shifted by their columns' maxima only:
    at +-1e17 every tree paid the constant on a word arc or the root arc, and the marginals were off by 0.5, the
    entropy by 1e16, and MAP chose worse trees.  Here with column lifts of the same size too, against enumeration
    of the scores less the lifts (subtracted exactly)."""
    n = 5
    oracle, projective = cls(single_root=True), cls is Projective
    for seed in range(6):
        gen = torch.Generator().manual_seed(seed)
        root, cols = big if seed % 2 else -big, big * torch.randn(n, generator=gen, dtype=DT).sign()
        lift = torch.zeros(1, n + 1, n + 1, dtype=DT)
        lift[:, 0, 1:] = root
        lift[:, :, 1:] += cols
        huge = torch.randn(1, n + 1, n + 1, generator=gen, dtype=DT) + lift
        ref = huge - lift
        log_z, marg, best, ent = _brute(ref[0], n, projective, True)
        pot = arc_potentials(huge)
        mu = oracle.marginals(pot)
        assert torch.allclose(mu.node[0], marg[:, 1:].t(), atol=1e-12, rtol=0)
        assert abs(float(oracle.entropy(mu)[0] - ent)) < 1e-12
        total = float(log_z) + root + float(cols.sum())
        assert abs(float(mu.log_partition[0]) - total) <= 1e-15 * max(1.0, abs(total)) + 1e-12
        heads = oracle.map(pot)[0]
        assert abs(float(ref[0, heads, torch.arange(1, n + 1)].sum() - best)) < 1e-12
        if cls is NonProjective:
            got = log_arc_marginals(huge, torch.tensor([n]), True)[1][0]
            want = _brute_log_marginals(ref[0], n, True)
            assert torch.equal(torch.isinf(got), torch.isinf(want))
            assert torch.allclose(got[torch.isfinite(want)], want[torch.isfinite(want)], atol=1e-6)
            assert torch.equal(chu_liu_edmonds(huge[0], single_root=True), heads)


@pytest.mark.parametrize("seed", range(5))
def test_single_root_map_with_a_huge_constant_column(seed):
    # attractive root arcs: the unconstrained optimum has several root children, so single-root CLE ranks one
    # candidate per root child by its total, which a raw sum with 1e20 in it could not tell apart
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randn(1, 5, 5, dtype=DT, generator=gen)
    scores[:, 0, 2:] += 3.0
    scores[:, :, 1] = 0.0
    *_, best, _ = _brute(scores[0], 4, False, True)
    assert (chu_liu_edmonds(scores[0]) == 0).sum() > 1
    huge = scores.clone()
    huge[:, :, 1] = 1e20                          # every tree has exactly one arc into word 1
    heads = NonProjective(single_root=True).map(arc_potentials(huge))[0]
    assert (heads == 0).sum() == 1
    assert abs(float(scores[0, heads, torch.arange(1, 5)].sum() - best)) < 1e-12


@pytest.mark.parametrize("seed", range(5))
def test_single_root_map_tries_only_root_children_that_can_win(monkeypatch, seed):
    # two strong root arcs make the unconstrained optimum take both; the other 8 root children score too low to
    # win whatever the rest of the tree (before: one Chu-Liu-Edmonds run per root child, 11 runs in all)
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randn(11, 11, dtype=DT, generator=gen)
    scores[0] = -30.0
    scores[0, 3] = scores[0, 7] = 8.0
    assert (chu_liu_edmonds(scores) == 0).sum() > 1
    runs = record_shapes(monkeypatch, nonprojective, "_cle")
    heads = chu_liu_edmonds(scores, single_root=True)
    assert len(runs) <= 3
    monkeypatch.undo()
    cols = torch.arange(1, 11)
    best = -INF
    for r in range(1, 11):                      # the reference: every root child, the others' root arcs removed
        one = scores.clone()
        one[0] = -INF
        one[0, r] = scores[0, r]
        best = max(best, float(scores[chu_liu_edmonds(one), cols].sum()))
    assert (heads == 0).sum() == 1 and float(scores[heads, cols].sum()) == best


@pytest.mark.parametrize("single_root", [False, True])
def test_fast_and_exact_matrix_tree_agree(single_root):
    scores = _scores(6, 7, 1.0)
    lengths = torch.tensor([7, 6, 1, 2, 5, 7])
    s = _mask_head_major(scores, lengths)
    lz_fast, m_fast, ok = _fast_matrix_tree(s, lengths, single_root)
    lz_exact, m_exact = _exact_matrix_tree(s, lengths, single_root)
    assert ok.all()
    assert torch.allclose(lz_fast, lz_exact, atol=1e-11, rtol=0)
    assert torch.allclose(m_fast, m_exact, atol=1e-11, rtol=0)
    # the cancellation case the fast path must reject: a two-cycle of strong arcs, weak root arcs
    hard = torch.tensor([[[0.0, 0.0, 0.0], [0.0, 0.0, 1000.0], [0.0, 1000.0, 0.0]]], dtype=DT)
    log_z, marg = matrix_tree(hard, torch.tensor([2]), single_root)
    assert torch.allclose(log_z, torch.tensor([1000.0 + torch.log(torch.tensor(2.0)).item()], dtype=DT))
    assert torch.allclose(marg[0, 0, 1:], torch.tensor([0.5, 0.5], dtype=DT))


def test_single_root_exact_log_z_eliminates_a_word_that_reaches_every_word_last():
    """The exact single-root log Z is one elimination (O(n^3), was one determinant per root child, O(n^4)) with
    the root weights carried as a second excess; the pivot order matters: words 1 and 2 point only at each
    other and at 3, so eliminating 1 and 2 before 3 meets a zero pivot; 1 (or 2) must come last."""
    s = torch.full((1, 4, 4), -INF, dtype=DT)
    s[0, 0, 1] = s[0, 0, 2] = -1000.0
    s[0, 1, 2] = s[0, 2, 1] = 0.0
    s[0, :3, 3] = 0.0
    # one root child: 1 or 2 (e^-1000), the other below it, word 3 under 1 or 2: 4 trees
    assert float(_exact_matrix_tree(s, torch.tensor([3]), True)[0][0]) == pytest.approx(-1000.0 + math.log(4.0),
                                                                                          abs=1e-12)
    s[0, 1, 2] = -INF                                             # 1 -> 2 gone: only 2 reaches every word
    lz, marg = _exact_matrix_tree(s, torch.tensor([3]), True)
    assert float(lz[0]) == pytest.approx(-1000.0 + math.log(2.0), abs=1e-12)
    assert float(marg[0, 0, 2]) == pytest.approx(1.0, abs=1e-12) and float(marg[0, 2, 1]) == pytest.approx(1.0)
    s[0, 2, 1] = -INF                                             # no word reaches both others: no such tree
    assert float(_exact_matrix_tree(s, torch.tensor([3]), True)[0][0]) == -INF
    # and on 40 words, against the LU path
    torch.manual_seed(3)
    scores = _mask_head_major(_scores(3, 40, 1.0), torch.tensor([40, 33, 7]))
    lz_fast, m_fast, ok = _fast_matrix_tree(scores, torch.tensor([40, 33, 7]), True)
    lz_exact, m_exact = _exact_matrix_tree(scores, torch.tensor([40, 33, 7]), True)
    assert ok.all()
    assert torch.allclose(lz_exact, lz_fast, rtol=1e-13, atol=0) and torch.allclose(m_exact, m_fast, atol=1e-11)


@pytest.mark.parametrize("single_root", [False, True])
def test_matrix_tree_exact_path_with_huge_columns(single_root):
    # strong arcs 1 <-> 2 over weak root arcs (the fast path refuses the Laplacian), in columns offset by +-1e15:
    # trees 0->1->2 and 0->2->1 score 1000 each, word 3 takes head 0, 1 or 2 (score 0); matrix_tree ran the exact
    # path on the raw scores, whose O(1) parts the 1e15s rounded (log Z 1001.8486 for 1000 + log 6 = 1001.7918)
    s = torch.full((1, 4, 4), -INF, dtype=DT)
    s[0, 0, 1], s[0, 2, 1], s[0, 0, 2], s[0, 1, 2] = 1e15, 1e15 + 1000, -1e15, -1e15 + 1000
    s[0, :3, 3] = 0.0
    log_z, marg = matrix_tree(s, torch.tensor([3]), single_root)
    expected = 1000.0 + math.log(4.0 if single_root else 6.0)
    assert abs(float(log_z[0]) - expected) < 1e-12
    word3 = torch.tensor([0.0, 0.5, 0.5] if single_root else [1 / 3] * 3, dtype=DT)
    assert torch.allclose(marg[0, :3, 3], word3, atol=1e-12, rtol=0)
    # at 1e300 the exact path on raw scores gave word 3's heads [0.5, 0.25, 0.25] (NaN at 1.5e308 with one root child)
    for off in (1e300, 1e307):
        s = torch.full((1, 4, 4), -INF, dtype=DT)
        s[0, 2, 1] = s[0, 1, 2] = off
        s[0, 0, 1] = s[0, 0, 2] = off - off / 100
        s[0, :3, 3] = -off
        log_z, marg = matrix_tree(s, torch.tensor([3]), single_root)
        assert torch.allclose(marg[0, :3, 3], word3, atol=1e-12, rtol=0)
        mu = NonProjective(single_root=single_root).marginals(arc_potentials(s))
        assert torch.equal(log_z, mu.log_partition) and torch.equal(marg[0, :, 1:].t(), mu.node[0])


@pytest.mark.parametrize("single_root", [False, True])
def test_closed_form_marginals_are_the_gradient_of_log_det(single_root):
    scores = _scores(3, 6, 1.0)
    lengths = torch.tensor([6, 4, 6])
    _, marg = matrix_tree(scores, lengths, single_root)
    for i, n in enumerate(lengths.tolist()):
        x = scores[i, : n + 1, : n + 1].clone().requires_grad_(True)
        a = torch.exp(x) * (1 - torch.eye(n + 1, dtype=DT))
        words, root = a[1:, 1:], a[0, 1:]
        lap = torch.diag(words.sum(0) + (0 if single_root else root)) - words
        if single_root:
            lap = torch.cat([root[None], lap[1:]], 0)                   # Koo et al. 2007: first row = root scores
        (grad,) = torch.autograd.grad(torch.linalg.slogdet(lap)[1], x)
        grad[:, 0] = 0
        assert torch.allclose(marg[i, : n + 1, : n + 1], grad, atol=1e-12, rtol=0)


@pytest.mark.parametrize("cls,single_root", ORACLES)
def test_log_partition_is_differentiable(cls, single_root):
    scores = _scores(3, 4).requires_grad_(True)
    lengths = torch.tensor([4, 2, 3])
    core = eisner if cls is Projective else matrix_tree
    log_z, marg = core(scores, lengths, single_root)
    (grad,) = torch.autograd.grad(log_z.sum(), scores)
    assert torch.equal(grad, marg)
    pot = arc_potentials(scores.detach(), lengths)
    node = pot.node.clone().requires_grad_(True)
    lz = cls(single_root=single_root).log_partition(PairwisePotentials(node, pot.edge, lengths))
    (g,) = torch.autograd.grad(lz.sum(), node)
    assert torch.allclose(g, cls(single_root=single_root).marginals(pot).node, atol=1e-14)


@pytest.mark.parametrize("cls,single_root", ORACLES)
def test_marginals_carry_no_wrong_gradient(cls, single_root):
    # the marginals' log Z and the entropy are not differentiable (as the chain's); they carried the gradient of
    # the column shifts (one-hot at each word's best head), not the marginals, silently
    oracle = cls(single_root=single_root)
    node = arc_potentials(_scores(2, 4), torch.tensor([4, 3])).node.clone().requires_grad_(True)
    mu = oracle.marginals(PairwisePotentials(node, torch.zeros(5, 5, dtype=DT), torch.tensor([4, 3])))
    assert not mu.log_partition.requires_grad and not mu.node.requires_grad
    assert not oracle.entropy(mu).requires_grad


@pytest.mark.parametrize("cls,single_root", ORACLES)
def test_entropy_of_plain_marginals_is_the_conjugate(cls, single_root):
    oracle = cls(single_root=single_root)
    lengths = torch.tensor([4, 2, 3])
    pot1, pot2 = arc_potentials(_scores(3, 4, forbid=0.2), lengths), arc_potentials(_scores(3, 4, 2.0), lengths)
    pot1.node[~torch.isfinite(pot2.node)] = -INF                   # the same support for both
    pot2.node[~torch.isfinite(pot1.node)] = -INF
    m1, m2 = oracle.marginals(pot1), oracle.marginals(pot2)
    exact = oracle.entropy(m1)
    plain = oracle.entropy(Marginals(m1.node.clone(), None, None, lengths))
    assert torch.allclose(plain, exact, atol=1e-10, rtol=0)
    # the accelerated solver's averaged iterates: H is concave, and the maximiser of the entropy with these
    # marginals is arc-factored, so H(mix) is at least the entropy of the mixture's arc-factored members
    mix = Marginals(0.5 * (m1.node + m2.node), None, None, lengths)
    h_mix = oracle.entropy(mix)
    assert (h_mix >= 0.5 * (oracle.entropy(m1) + oracle.entropy(m2)) - 1e-10).all()


@pytest.mark.parametrize("cls", [Projective, NonProjective])
def test_conjugate_entropy_moves_arcs_of_tiny_curvature(cls):
    # for Projective, arcs 4 -> 3 and 2 -> 4 occur only together, each with marginal 7e-8: at log mu their curvature
    # (5e-15) lay below the eigenvalue cut, Newton never moved them, and it stopped 1.2e-6 above the entropy with
    # the gradient at 7e-8
    s = torch.tensor([[[-7.757, -1.020, -0.0307, 1.172, -INF],
                       [5.629, -7.987, 1.426, -10.319, -INF],
                       [5.875, -INF, -4.510, -INF, -3.303],
                       [-3.923, -INF, 3.451, 3.671, 8.238],
                       [0.295, -INF, -4.720, -1.795, 0.862]]], dtype=DT)
    oracle = cls()
    mu = oracle.marginals(arc_potentials(s))
    plain = oracle.entropy(Marginals(mu.node.clone(), None, None, mu.lengths))
    assert abs(float(plain[0] - oracle.entropy(mu)[0])) < 1e-12


def test_conjugate_entropy_ignores_rounding_mass_on_arcs_in_no_tree():
    s = torch.tensor([[0.0, -INF, -2.458, -INF],                 # -inf arcs leave one tree: 0->2, 2->1, 1->3
                      [0.0, 0.0, 2.637, 1.840],
                      [0.0, 0.548, 0.0, -INF],
                      [0.0, 3.283, 4.989, 0.0]], dtype=DT)[None]
    mu = NonProjective().marginals(arc_potentials(s))
    plain = Marginals(mu.node.clone(), None, None, mu.lengths)   # may hold ~1e-13 on arcs 1->2 and 3->2
    assert abs(float(NonProjective().entropy(plain))) < 1e-10


def test_conjugate_entropy_of_near_deterministic_marginals():
    s = torch.tensor([[[-1331.0949, -81.4503, 123.2838, -16.8059],
                       [-760.4981, 1761.6567, -342.1495, 260.6731],
                       [-229.4624, -134.0889, -59.3491, -137.9842],
                       [-145.4790, -1250.9449, -628.6511, 521.7807]]], dtype=DT)
    oracle = Projective(single_root=True)
    mu = oracle.marginals(arc_potentials(s))                     # one alternative tree of probability 7e-7
    conj = oracle.entropy(Marginals(mu.node.clone(), None, None, mu.lengths))
    assert torch.allclose(conj, oracle.entropy(mu), rtol=1e-6, atol=1e-15)


@pytest.mark.parametrize("single_root", [False, True])
def test_entropy_of_marginals_on_no_tree_of_the_structure_is_named(single_root):
    # the arcs of a non-projective tree (3 -> 1 and 4 -> 2 cross), given to Projective: before, the Newton start
    # raised "no valid dependency tree (every tree uses a -inf arc) for examples [0]", about scores never passed
    heads = torch.tensor([[3, 4, 0, 3], [2, 0, 2, 3]])
    mu = Marginals(heads_to_arcs(heads), None, None, torch.tensor([4, 4]))
    with pytest.raises(ValueError, match=r"not arc marginals of Projective.*no tree lies on .* examples \[0\]"):
        Projective(single_root=single_root).entropy(mu)
    assert torch.equal(NonProjective(single_root=single_root).entropy(mu), torch.zeros(2, dtype=DT))


@pytest.mark.parametrize("cls,single_root", ORACLES)
def test_entropy_is_never_below_zero(cls, single_root):
    oracle = cls(single_root=single_root)
    gen = torch.Generator().manual_seed(0)
    for n in range(1, 7):
        scores = torch.randn(8, n + 1, n + 1, generator=gen, dtype=DT) * 3e4     # near-deterministic
        chain = torch.full((n + 1, n + 1), -INF, dtype=DT)
        chain[torch.arange(n), torch.arange(1, n + 1)] = 0.0                   # one tree: h = m - 1
        for s in (scores, scores + chain):
            h = oracle.entropy(oracle.marginals(arc_potentials(s)))
            assert (h >= 0).all() and (h < 1e-6).all()


@pytest.mark.parametrize("cls", [NonProjective, Projective])
def test_padding_is_ignored(cls):
    scores = _scores(2, 5)
    lengths = torch.tensor([5, 2])
    other = scores.clone()
    other[1, 3:] = torch.randn(3, 6, dtype=DT) * 100
    other[1, :, 3:] = -INF
    other[:, torch.arange(6), torch.arange(6)] = 7.0                 # self-loops are ignored too
    other[:, :, 0] = 3.0                                             # and arcs into the root
    a, b = cls().marginals(arc_potentials(scores, lengths)), cls().marginals(arc_potentials(other, lengths))
    assert torch.equal(a.node, b.node) and torch.equal(a.log_partition, b.log_partition)
    heads = cls().map(arc_potentials(other, lengths))
    assert (heads[1, 2:] == -1).all() and (heads[0] >= 0).all()


@pytest.mark.parametrize("cls", [NonProjective, Projective])
@pytest.mark.parametrize("offset", [0.0, 1e3, 1e4])
def test_float32_agrees_with_float64(cls, offset):
    # at |theta| = 1e4 log Z is ~9e4, rounded by float32 to 0.008: the entropy log Z - <theta, mu> must come from
    # the scores less each modifier's best one, not from that difference
    s64 = _scores(16, 9, 2.0) + offset
    lengths = torch.randint(1, 10, (16,))
    s32 = s64.float()
    m64 = cls().marginals(arc_potentials(s32.double(), lengths))
    m32 = cls().marginals(arc_potentials(s32, lengths))
    assert m32.node.dtype == torch.float32
    assert torch.allclose(m32.node.double(), m64.node, atol=1e-4)
    assert torch.allclose(m32.log_partition.double(), m64.log_partition, rtol=1e-5)
    assert torch.allclose(cls().entropy(m32).double(), cls().entropy(m64), atol=2e-5)
    assert torch.equal(cls().map(arc_potentials(s32, lengths)), cls().map(arc_potentials(s32.double(), lengths)))


@pytest.mark.parametrize("single_root", [False, True])
def test_float32_matrix_tree_runs_in_float64(monkeypatch, single_root):
    """Sentences of 40 words with scores N(0, 4) fail float32's rounding check (n kappa eps <= sqrt(eps)) and went
    to the log-space elimination, 25 times slower; in float64 the fast path passes its own check, and the result
    in float32 agrees with float64's to float32's rounding."""
    torch.manual_seed(0)
    s64 = _scores(8, 40, 2.0)
    lengths = torch.tensor([40, 40, 35, 40, 20, 40, 40, 31])
    _, _, ok32 = nonprojective._fast_matrix_tree(_mask_head_major(s64.float(), lengths), lengths, single_root)
    assert not bool(ok32.all())                                       # the case this test is about
    exact = record_shapes(monkeypatch, nonprojective, "_exact_matrix_tree")
    m32 = NonProjective(single_root).marginals(arc_potentials(s64.float(), lengths))
    m64 = NonProjective(single_root).marginals(arc_potentials(s64.float().double(), lengths))
    assert exact == []
    assert m32.node.dtype == torch.float32 and m32.log_partition.dtype == torch.float32
    assert torch.allclose(m32.node.double(), m64.node, atol=1e-6, rtol=0)
    assert torch.allclose(m32.log_partition.double(), m64.log_partition, rtol=1e-6, atol=0)


def _brute_log_marginals(scores: torch.Tensor, n: int, single_root: bool) -> torch.Tensor:
    """``log P(h -> m)`` [n+1, n+1] of one sentence by enumeration in log space (``-inf``: in no tree)."""
    trees = _trees(n, False, single_root)
    mods = torch.arange(1, n + 1)
    tree_scores = scores[trees, mods].sum(-1)
    out = torch.full((n + 1, n + 1), -INF, dtype=scores.dtype)
    for h in range(n + 1):
        for m in range(1, n + 1):
            mine = trees[:, m - 1] == h
            if mine.any():
                out[h, m] = torch.logsumexp(tree_scores[mine], 0) - torch.logsumexp(tree_scores, 0)
    return out


@pytest.mark.parametrize("single_root", [False, True])
@pytest.mark.parametrize("scale", [1.0, 20.0, 300.0])
def test_log_arc_marginals_match_enumeration_to_relative_accuracy(single_root, scale):
    """Every arc's log marginal, however small (e^-2000 at scale 300) and in examples the fast path refuses,
    against enumeration: matrix_tree's marginals are only accurate absolutely (0 or noise below ~1e-16)."""
    torch.manual_seed(int(scale) + single_root)
    scores = _scores(8, 5, scale, forbid=0.3)
    lengths = torch.tensor([5, 5, 4, 5, 3, 5, 2, 5])
    refs = [_brute_log_marginals(scores[i, : n + 1, : n + 1], n, single_root) for i, n in enumerate(lengths.tolist())]
    # the default certifies 1e-6 of each marginal; 1e-300 sends every arc to the elimination
    for rtol, tol in ((None, 1e-6), (1e-300, 1e-10)):
        log_z, log_marg = log_arc_marginals(scores, lengths, single_root, rtol=rtol)
        assert torch.allclose(log_z, matrix_tree(scores, lengths, single_root)[0], rtol=1e-12, atol=0)
        for i, n in enumerate(lengths.tolist()):
            ref, got = refs[i], log_marg[i, : n + 1, : n + 1]
            assert torch.equal(torch.isinf(got), torch.isinf(ref))               # the arcs in no tree, exactly
            finite = torch.isfinite(ref)
            assert ((got - ref)[finite].abs() <= tol * ref[finite].abs().clamp_min(1.0)).all()
            assert (log_marg[i, n + 1:] == -INF).all() and (log_marg[i, :, n + 1:] == -INF).all()
    if scale > 1:                               # the case that needs it: arcs matrix_tree puts at 0 or noise
        finite = torch.isfinite(log_marg)
        assert ((matrix_tree(scores, lengths, single_root)[1].log() - log_marg)[finite].abs() > 1.0).any()


@pytest.mark.parametrize("single_root", [False, True])
def test_log_arc_marginals_of_an_arc_closing_a_likely_cycle(single_root):
    # 1 -> 2 and 2 -> 1 both score 300, root arcs 0 (word 1) and -300 (word 2): the tree 0 -> 1 -> 2 has almost
    # all the mass, and 2 -> 1 lies only in 0 -> 2 -> 1, weight e^0: log P(2 -> 1) = -log(e^300 + 1 [+ e^-300])
    s = torch.full((1, 3, 3), -INF, dtype=DT)
    s[0, 0, 1], s[0, 1, 2], s[0, 2, 1], s[0, 0, 2] = 0.0, 300.0, 300.0, -300.0
    log_z, log_marg = log_arc_marginals(s, torch.tensor([2]), single_root)
    assert float(log_z[0]) == 300.0
    assert float(log_marg[0, 2, 1]) == -300.0 and float(log_marg[0, 0, 2]) == -300.0
    assert float(log_marg[0, 0, 1]) == 0.0 and float(log_marg[0, 1, 2]) == 0.0
    if not single_root:                          # the closed form's two terms cancel: 0 for e^-300 = 5e-131
        assert float(matrix_tree(s, torch.tensor([2]), single_root)[1][0, 2, 1]) == 0.0


@pytest.mark.parametrize("single_root", [False, True])
def test_log_arc_marginals_in_float32(single_root):
    # at scale 100 some marginals (e^-91) lie below float32's smallest normal number: they come from the
    # elimination in log space, not from the subnormal closed form (which read -87.3 = log(tiny))
    torch.manual_seed(7)
    s64 = _scores(16, 6, 100.0)
    lengths = torch.randint(1, 7, (16,))
    lz64, lm64 = log_arc_marginals(s64.float().double(), lengths, single_root)
    lz32, lm32 = log_arc_marginals(s64.float(), lengths, single_root)
    assert lm32.dtype == torch.float32
    assert torch.equal(torch.isinf(lm32), torch.isinf(lm64))
    finite = torch.isfinite(lm64)
    assert (lm64[finite] < -87.4).any()
    assert ((lm32.double() - lm64)[finite].abs() <= 1e-4 * lm64[finite].abs().clamp_min(1.0)).all()
    assert torch.allclose(lz32.double(), lz64, rtol=1e-6)


@pytest.mark.parametrize("single_root", [False, True])
def test_log_arc_marginals_of_float32_scores_come_from_float64(monkeypatch, single_root):
    """Float32 scores go through float64 at float32's default rtol, and come back rounded to float32: at n = 40
    float32's own rounding bound certified few marginals, and its eliminations took 10 times as long."""
    torch.manual_seed(0)
    s32 = _scores(8, 40, 2.0).float()
    lengths = torch.tensor([40, 40, 35, 40, 20, 40, 40, 31])
    rtol = torch.finfo(torch.float32).eps ** 0.5
    lz64, lm64 = log_arc_marginals(s32.double(), lengths, single_root, rtol=rtol)
    lz32, lm32 = log_arc_marginals(s32, lengths, single_root)
    assert lz32.dtype == lm32.dtype == torch.float32
    assert torch.equal(lz32, lz64.float()) and torch.equal(lm32, lm64.float())


def test_log_arc_marginals_bad_inputs():
    with pytest.raises(TypeError, match="single_root"):
        log_arc_marginals(_scores(1, 3), torch.tensor([3]), single_root=1)
    for bad in (0.0, -1e-6, math.nan, math.inf):
        with pytest.raises(ValueError, match="rtol"):
            log_arc_marginals(_scores(1, 3), torch.tensor([3]), rtol=bad)
    s = torch.full((1, 3, 3), -INF, dtype=DT)
    s[0, 1, 2] = s[0, 2, 1] = 0.0                                  # no root arc: no tree
    with pytest.raises(ValueError, match="no .*tree"):
        log_arc_marginals(s, torch.tensor([2]))


def test_chu_liu_edmonds_and_eisner_map_directly():
    s = torch.tensor([[0.0, 1.0, 1.0, 1.0], [0.0, 0.0, 10.0, 0.0], [0.0, 10.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]],
                     dtype=DT)                                       # 1 <-> 2 a strong cycle, broken once
    heads = chu_liu_edmonds(s)
    assert heads.dtype == torch.long and heads.shape == (3,)
    assert heads.tolist() in ([0, 1, 0], [2, 0, 0])
    s[0, 3] = -INF
    single = chu_liu_edmonds(s, single_root=True)
    assert (single == 0).sum() == 1 and _is_tree(single, 3)
    best, h = eisner_map(s[None], torch.tensor([3]), single_root=True)
    assert _is_tree(h[0], 3) and abs(best[0] - s[h[0], torch.arange(1, 4)].sum()) < 1e-12
    with pytest.raises(ValueError, match="no valid dependency tree"):
        chu_liu_edmonds(torch.full((3, 3), -INF, dtype=DT))


def test_eisner_names_scores_beyond_the_dtype_range():
    """Shifting a column by its maximum overflows when its scores are more than the float range apart: an
    allowed arc would read as forbidden and Eisner would report no tree (it did).  Chu-Liu-Edmonds, which once
    found one on the raw scores, now shifts them as the marginals do (a huge root row would otherwise round away
    the O(1) scores) and names the range as well."""
    s = torch.tensor([[-INF, 1e308, 1e308], [-INF, -INF, -1e308], [-INF, -1e308, -INF]], dtype=DT)
    for f in (lambda: eisner_map(s[None], torch.tensor([2]), single_root=True),
              lambda: eisner(s[None], torch.tensor([2])), lambda: chu_liu_edmonds(s, single_root=True)):
        with pytest.raises(ValueError, match="range"):
            f()


def test_every_oracle_names_scores_beyond_the_dtype_range():
    """The one tree, 0 -> 1 -> 2, scores -1e308 + 1e308 = 0, but the arc into 1 is 2e308 below 2 -> 1: the
    matrix-tree theorem's column shift and Chu-Liu-Edmonds' cycle gain read it as forbidden, and every
    non-projective path said "no valid dependency tree" (only Eisner named the range)."""
    s = torch.tensor([[-INF, -1e308, -INF], [-INF, -INF, 1e308], [-INF, 1e308, -INF]], dtype=DT)
    pot, lengths = arc_potentials(s[None]), torch.tensor([2])
    for f in (lambda: chu_liu_edmonds(s), lambda: matrix_tree(s[None], lengths), lambda: eisner(s[None], lengths),
              lambda: eisner_map(s[None], lengths), lambda: NonProjective().map(pot),
              lambda: NonProjective().marginals(pot), lambda: Projective().marginals(pot),
              lambda: Projective().map(pot), lambda: NonProjective().log_partition(pot)):
        with pytest.raises(ValueError, match="range"):
            f()


@pytest.mark.parametrize("cls", [NonProjective, Projective])
def test_log_partition_overflow_is_named(cls):
    """float32 scores whose tree score overflows: the oracles added the column shifts back after the "no tree"
    check and returned log Z = +inf silently (the chain and tree oracles name the overflow)."""
    s = torch.full((2, 13, 13), 3e37)
    s[0] = 0.0                                                       # example 0 is fine
    pot = arc_potentials(s)
    core = matrix_tree if cls is NonProjective else eisner
    for f in (lambda: cls().marginals(pot), lambda: cls().log_partition(pot), lambda: core(s, None),
              lambda: eisner_map(s, None)):
        with pytest.raises(ValueError, match=r"scores overflow float32 .* for examples \[1\]"):
            f()


@pytest.mark.parametrize("cls", [NonProjective, Projective])
def test_support_of_a_sentence_without_a_tree_is_empty(cls):
    """No arc lies in a tree of a sentence that has none (NonProjective kept the one arc its meaningless
    marginals put at 1)."""
    s = torch.zeros(2, 3, 3, dtype=DT)
    s[0, 0, :] = -INF                                                # nothing may attach to the root
    support = cls().support(arc_potentials(s))
    assert not support[0].any()
    assert support[1].tolist() == [[True, False, True], [True, True, False]]   # every non-loop arc of 2 words


@pytest.mark.parametrize("single_root", [False, True])
def test_nonprojective_structural_arcs_match_enumeration(single_root):
    """NonProjective reads the arcs in no tree and in every tree off log_arc_marginals under equal scores (one
    call, exact zeros); against enumeration of the trees, on sparse supports where many arcs are in none or all."""
    torch.manual_seed(11 + single_root)
    n_max, b = 5, 24
    lengths = torch.randint(1, n_max + 1, (b,))
    support = torch.rand(b, n_max, n_max + 1) < 0.45
    support[torch.arange(b), 0, 0] = True                          # word 1 may attach to the root
    for i in range(b):
        for m in range(1, n_max):                                  # and each word to the one before: a tree exists
            support[i, m, m] = True
    support &= _mask_head_major(torch.zeros(b, n_max + 1, n_max + 1), lengths)[:, :, 1:].transpose(1, 2) == 0
    in_none, in_all = NonProjective(single_root=single_root)._structural(support, lengths)
    for i, n in enumerate(lengths.tolist()):
        trees = _trees(n, False, single_root)
        allowed = support[i, torch.arange(n)[None, :], trees].all(1)        # the trees made of supported arcs
        used = torch.zeros(n, n + 1, dtype=torch.long)
        for t in trees[allowed]:
            used[torch.arange(n), t] += 1
        expect_none = support[i, :n, : n + 1] & (used == 0)
        expect_all = support[i, :n, : n + 1] & (used == int(allowed.sum()))
        assert torch.equal(in_none[i, :n, : n + 1], expect_none)
        assert torch.equal(in_all[i, :n, : n + 1], expect_all)
        assert not in_none[i, n:].any() and not in_all[i, n:].any()
    assert in_none.any() and in_all.any()
    none_only = NonProjective(single_root=single_root)._structural(support, lengths, in_all_too=False)
    assert torch.equal(none_only[0], in_none) and not none_only[1].any()


def _flow_lp_best(s):
    """Score of the best tree of ``s[h, m]`` by the multi-commodity flow LP (integral for arborescences)."""
    from betheproj.factor_graphs import FactorGraph, Tree, lp_map
    n = s.shape[0] - 1
    arcs = [(h, m) for h, m in Tree.all_arcs(n) if s[h, m] > -INF]
    g = FactorGraph([2] * len(arcs))
    for k, (h, m) in enumerate(arcs):
        g.set_unary(k, [0.0, float(s[h, m])])
    g.add_factor(Tree(range(len(arcs)), arcs, n=n))
    res = lp_map(g)
    assert res.integral
    return res.objective


@pytest.mark.parametrize("seed", range(6))
def test_chu_liu_edmonds_on_longer_sentences_with_nested_cycles(seed):
    # planted strong 2- and 3-cycles, some inside larger ones, so the contractions nest several levels deep;
    # checked against the exact LP over the arborescence polytope (n = 12, beyond enumeration)
    g = torch.Generator().manual_seed(seed)
    n = 12
    s = torch.randn(n + 1, n + 1, generator=g, dtype=DT)
    perm = (torch.randperm(n, generator=g) + 1).tolist()
    for a, b in zip(perm[0:6:2], perm[1:6:2], strict=True):
        s[a, b] = s[b, a] = 6.0                                      # 2-cycles
    x, y, z = perm[6:9]
    s[x, y] = s[y, z] = s[z, x] = 4.0                                # a 3-cycle
    s[perm[0], x] = s[x, perm[0]] = 2.0                              # joining cycles: a second level
    if seed % 2:
        s[torch.rand(n + 1, n + 1, generator=g) < 0.25] = -INF
        s[0, perm[9]] = 0.0                                          # a tree always exists through the root
        s[perm[9], perm[:9] + perm[10:]] = 0.0
    s[:, 0] = -INF
    s.fill_diagonal_(-INF)
    heads = chu_liu_edmonds(s)
    assert _is_tree(heads, n)
    score = s[heads, torch.arange(1, n + 1)].sum().item()
    assert score == pytest.approx(_flow_lp_best(s.numpy()), abs=1e-6)


def test_conversions():
    scores = _scores(2, 4)
    pot = arc_potentials(scores, torch.tensor([4, 2]))
    assert pot.node.shape == (2, 4, 5) and pot.edge.shape == (5, 5) and not pot.edge.any()
    assert pot.node[1, 2, 3] == scores[1, 3, 3] and pot.node[0, 0, 2] == scores[0, 2, 1]
    heads = NonProjective().map(pot)
    arcs = heads_to_arcs(heads, DT)
    assert arcs.shape == (2, 4, 5) and (arcs[1, 2:] == 0).all()
    assert torch.equal(arcs_to_heads(arcs), heads)
    assert repr(NonProjective(single_root=True)) == "NonProjective(single_root=True)"
    assert NonProjective().degree(torch.tensor([4, 2]), 4).tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]


@pytest.mark.parametrize("cls", [NonProjective, Projective])
def test_bad_inputs(cls):
    oracle = cls()
    with pytest.raises(TypeError, match="potentials"):
        oracle.marginals(torch.zeros(2, 3, 4))
    with pytest.raises(ValueError, match=r"\[B, N, N\+1\]"):
        oracle.marginals(PairwisePotentials(torch.zeros(2, 3, 3, dtype=DT), torch.zeros(3, 3, dtype=DT)))
    pot = arc_potentials(_scores(2, 3))
    bad_edge = PairwisePotentials(pot.node, torch.ones(4, 4, dtype=DT))
    for call in (oracle.marginals, oracle.map):
        with pytest.raises(ValueError, match="edge must be all zeros"):
            call(bad_edge)
    no_tree = pot.node.clone()
    no_tree[1, :, 0] = -INF                                          # nothing attaches to the root
    for call in (oracle.marginals, oracle.map):
        with pytest.raises(ValueError, match="no valid dependency tree"):
            call(PairwisePotentials(no_tree, pot.edge))
    with pytest.raises(TypeError, match="single_root"):
        cls(single_root=1)
    core = eisner if cls is Projective else matrix_tree
    with pytest.raises(ValueError, match="scores"):
        core(torch.zeros(2, 3, 4, dtype=DT), torch.tensor([2, 2]))
    with pytest.raises(ValueError, match="lengths"):
        core(torch.zeros(2, 4, 4, dtype=DT), torch.tensor([4, 2]))
    with pytest.raises(TypeError, match="entropy|Marginals"):
        oracle.entropy(torch.zeros(2))


def test_conversions_reject_what_is_no_tree():
    with pytest.raises(TypeError, match="heads must be an integer tensor"):
        heads_to_arcs(torch.tensor([[True, False]]))
    with pytest.raises(ValueError, match=r"heads\[0, 1\] = 2: a word cannot be its own head"):
        heads_to_arcs(torch.tensor([[0, 2, 1]]))
    with pytest.raises(TypeError, match="arcs must be a tensor"):
        arcs_to_heads([[0.0, 1.0]])
    with pytest.raises(ValueError, match=r"got shape \(1, 2, 2\)"):
        arcs_to_heads(torch.zeros(1, 2, 2))


def test_no_projective_tree_but_a_non_projective_one():
    # only the arcs 0 -> 2, 2 -> 4, 4 -> 1, 1 -> 3 are allowed: one tree, and its arcs cross
    s = torch.full((1, 5, 5), -INF, dtype=DT)
    for h, m in ((0, 2), (2, 4), (4, 1), (1, 3)):
        s[0, h, m] = 0.0
    mu = NonProjective().marginals(arc_potentials(s))
    assert torch.allclose(mu.log_partition, torch.zeros(1, dtype=DT))
    with pytest.raises(ValueError, match="no valid dependency tree"):
        Projective().marginals(arc_potentials(s))
    # the messages say which trees there are none of (before: "every tree uses a -inf arc" in all four cases)
    for cls, what in ((Projective, "projective tree"), (NonProjective, "tree")):
        oracle = cls(single_root=True)
        two = s.clone()
        two[0, 0, 1] = 0.0                       # 0 -> 1, 0 -> 2 ...: trees with two root children only
        two[0, 4, 1] = -INF
        for call in (oracle.marginals, oracle.map):
            with pytest.raises(ValueError, match=rf"every {what} with one root child uses a -inf arc"):
                call(arc_potentials(two))
    with pytest.raises(ValueError, match=r"every projective tree uses a -inf arc"):
        Projective().map(arc_potentials(s))
    with pytest.raises(ValueError, match=r"every tree with one root child uses a -inf arc"):
        chu_liu_edmonds(two[0], single_root=True)


def _mean_field_problem(b=2, n=4, scale=0.3):
    scores = _scores(b, n, 1.0)
    lengths = torch.tensor([n, n - 1])[:b]
    pairs = torch.tensor([[0, 1], [1, 2], [0, 3]])
    weights = torch.randn(3, n + 1, n + 1, dtype=DT) * scale
    return arc_potentials(scores, lengths), pairs, weights


@pytest.mark.parametrize("method", ["rda", "md", "accelerated"])
def test_solve_with_zero_energy_returns_the_oracle_marginals(method):
    theta, pairs, weights = _mean_field_problem()
    oracle = NonProjective()
    sol = bp.solve(oracle, theta, MeanField(pairs, torch.zeros_like(weights)), method=method, max_iter=20)
    assert torch.allclose(sol.marginals.node, oracle.marginals(theta).node, atol=1e-12)
    assert torch.allclose(sol.objective, -oracle.marginals(theta).log_partition, atol=1e-10)


@pytest.fixture(scope="module")
def mean_field_reference():
    torch.manual_seed(1)
    theta, pairs, weights = _mean_field_problem()
    sol = bp.solve(NonProjective(), theta, MeanField(pairs, weights), method="md", max_iter=500, tol=1e-9)
    assert sol.converged.all()
    return theta, pairs, weights, sol


@pytest.mark.parametrize("method", ["rda", "md", "accelerated"])
def test_solve_with_mean_field(method, mean_field_reference):
    theta, pairs, weights, ref = mean_field_reference
    oracle, energy = NonProjective(), MeanField(pairs, weights)
    # mirror descent converges linearly; RDA and the accelerated method (whose iterates are averages of oracle
    # outputs, so every objective evaluation needs the conjugate entropy) slowly: fewer iterations, looser bounds
    iters, tol_f = (150, 1e-8) if method == "md" else (40, 2e-3)
    sol = bp.solve(oracle, theta, energy, method=method, max_iter=iters, tol=1e-6)
    assert torch.isfinite(sol.objectives).all()
    # the objective the solver reports is that of (2) at its marginals, entropy included
    assert torch.allclose(bp.objective(oracle, theta, energy, sol.marginals), sol.objective, atol=1e-8)
    assert (sol.objective >= ref.objective - 1e-9).all() and (sol.objective - ref.objective).max() < tol_f
    gap = (sol.marginals.node - ref.marginals.node).abs().max()
    assert gap < max(1e-4, 10 * sol.residual.max().item())
    # Proposition 1 at the reference: mu* = oracle(theta - grad L(mu*))
    tilde = oracle.marginals(theta.shifted(-energy.grad(ref.marginals).node, None))
    assert (tilde.node - ref.marginals.node).abs().max() < 1e-7
    # the reference is a minimum: random points of the polytope (oracle outputs) score worse
    for _ in range(5):
        probe = oracle.marginals(theta.shifted(torch.randn_like(theta.node) * 0.5, None))
        assert (bp.objective(oracle, theta, energy, probe) >= ref.objective - 1e-9).all()
    heads = bp.decode(oracle, sol)
    for i, n in enumerate(theta.lengths.tolist()):
        assert _is_tree(heads[i], n)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("cls,single_root", ORACLES)
def test_cuda_matches_cpu(cls, single_root):
    scores = _scores(4, 6, 3.0, forbid=0.1)
    scores[:, 0, 1:] = torch.randn(4, 6, dtype=DT)                  # root arcs stay allowed
    scores[:, 1, 1:] = 0.0                                            # and word 1 can head every word
    lengths = torch.tensor([6, 3, 1, 5])
    oracle = cls(single_root=single_root)
    cpu = oracle.marginals(arc_potentials(scores, lengths))
    gpu = oracle.marginals(arc_potentials(scores.cuda(), lengths.cuda()))
    assert gpu.node.device.type == "cuda"
    assert torch.allclose(gpu.node.cpu(), cpu.node, atol=1e-10)
    assert torch.allclose(gpu.log_partition.cpu(), cpu.log_partition, atol=1e-10)
    assert torch.equal(oracle.map(arc_potentials(scores.cuda(), lengths.cuda())).cpu(),
                       oracle.map(arc_potentials(scores, lengths)))


def test_chu_liu_edmonds_names_a_single_root_that_is_not_a_bool():
    # matrix_tree, eisner, eisner_map and the oracles refuse it; chu_liu_edmonds read "no" as True
    with pytest.raises(TypeError, match="single_root must be a bool, got str"):
        chu_liu_edmonds(torch.zeros(3, 3, dtype=DT), single_root="no")


@pytest.mark.parametrize("cls", [NonProjective, Projective])
@pytest.mark.parametrize("single_root", [False, True])
def test_check_labels_accepts_exactly_the_trees(cls, single_root):
    """Every head array of 1-4 words (plus one padded word holding garbage), against a plain reference; crossing
    arcs are allowed for Projective too (a projective parser may train on non-projective gold trees)."""
    oracle = cls(single_root=single_root)
    for n in range(1, 5):
        heads = torch.tensor(list(itertools.product(range(-1, n + 3), repeat=n)))
        labels = torch.cat([heads, torch.full((len(heads), 1), 7)], 1)      # N = n + 1, the last word padding
        lengths = torch.full((len(heads),), n)
        for row, h in zip(labels, heads.tolist(), strict=True):
            ok = all(0 <= x <= n and x != m for m, x in enumerate(h, 1)) and reaches_root(h)
            ok &= (h.count(0) == 1) if single_root else True
            if ok:
                oracle.check_labels(row[None], lengths[:1])
            else:
                with pytest.raises(ValueError, match=r"gold\[0\] are not the heads of a"):
                    oracle.check_labels(row[None], lengths[:1], "gold")
    oracle.check_labels(torch.zeros(1, 3, dtype=torch.long), torch.tensor([0]))   # no words: nothing to check


@pytest.mark.parametrize("cls", [NonProjective, Projective])
def test_check_labels_refuses_labels_that_are_no_head_arrays(cls):
    # before: heads of 2 words with lengths [3] passed (word 3 had no head), float heads were truncated, 1-D
    # labels were an IndexError
    oracle = cls()
    with pytest.raises(ValueError, match=r"lengths must lie in \[0, N\]=\[0, 2\]"):
        oracle.check_labels(torch.tensor([[0, 1]]), torch.tensor([3]))
    with pytest.raises(TypeError, match="labels must be an integer tensor"):
        oracle.check_labels(torch.tensor([[0.0, 1.7]]), torch.tensor([2]))
    with pytest.raises(TypeError, match="labels must be an integer tensor"):
        oracle.check_labels(torch.tensor([0, 1]), torch.tensor([2]))
    with pytest.raises(TypeError, match=r"lengths must be an integer tensor \[B\]"):
        oracle.check_labels(torch.tensor([[0, 1]]), torch.tensor([2, 2]))


def test_second_derivatives_of_the_tree_log_partitions_are_an_error():
    """matrix_tree's and eisner's log Z came out with a Hessian of zeros (their gradient is computed, not traced)."""
    s = torch.randn(1, 4, 4, generator=torch.Generator().manual_seed(1), dtype=DT)
    for f in (matrix_tree, eisner):
        with pytest.raises(RuntimeError, match="second derivatives of log Z are not implemented"):
            torch.autograd.functional.hessian(lambda x, f=f: f(x, None)[0].sum(), s)


@pytest.mark.parametrize("cls", [NonProjective, Projective])
def test_entropy_checks_the_marginals_it_is_given(cls):
    """NaN or an all-zero row read as "no valid dependency tree", and a negative entry gave 0.0 silently."""
    oracle = cls()
    ok = torch.tensor([[[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]], dtype=DT)               # 0 -> 1 -> 2
    assert oracle.entropy(bp.Marginals(ok, None, None, torch.tensor([2]))).item() == pytest.approx(0.0, abs=1e-9)
    for rows in ([[float("nan"), 1.0, 0.0], [1.0, 0.0, 0.0]], [[0.0, 0.0, 0.0], [1.0, 0.0, 0.0]],
                 [[1.5, -0.5, 0.0], [1.0, 0.0, 0.0]], [[0.5, 0.5, 0.5], [1.0, 0.0, 0.0]]):
        with pytest.raises(ValueError, match="marginals.node must hold arc marginals"):
            oracle.entropy(bp.Marginals(torch.tensor([rows], dtype=DT), None, None, torch.tensor([2])))
    padded = torch.zeros(1, 3, 4, dtype=DT)
    padded[0, :2, :3], padded[0, 2] = ok[0], 7.0                                   # a padded word: ignored
    assert oracle.entropy(bp.Marginals(padded, None, None, torch.tensor([2]))).item() == pytest.approx(0.0, abs=1e-9)


def _enumerated_covariance(scores: torch.Tensor, n: int, single_root: bool) -> torch.Tensor:
    """Cov(arcs) [n (n+1), n (n+1)] of one sentence (node layout: index ``(m-1) (n+1) + h``) by enumeration."""
    trees = _trees(n, False, single_root)
    p = torch.softmax(scores[trees, torch.arange(1, n + 1)].sum(-1), 0)
    z = torch.zeros(len(trees), n, n + 1, dtype=scores.dtype)
    z[torch.arange(len(trees))[:, None], torch.arange(n), trees] = 1.0
    z = z.reshape(len(trees), -1)
    mean = p @ z
    return (z * p[:, None]).T @ z - mean[:, None] * mean[None]


@pytest.mark.parametrize("single_root", [False, True])
def test_nonprojective_newton_hessian_in_closed_form_matches_enumeration(monkeypatch, single_root):
    """The conjugate entropy's Hessian Cov(arcs): from the inverse Laplacian where the matrix-tree fast path
    certifies the example (it was one inference per supported arc for every example), one inference per arc
    (the base class) for the others."""
    oracle = NonProjective(single_root=single_root)
    gen = torch.Generator().manual_seed(4)
    lengths = torch.tensor([5, 3, 5, 4, 5, 5])
    s = torch.randn(6, 6, 6, generator=gen, dtype=DT) * torch.tensor([1.0, 2.0, 30.0, 1.0, 30.0, 30.0])[:, None, None]
    s[3, 2, 4] = s[3, 4, 1] = -INF
    s = _mask_head_major(s, lengths)
    mu = oracle.marginals(arc_potentials(s, lengths))
    support = mu.node > 0
    support &= ~oracle._structural(support, lengths)[0]
    theta = torch.where(support, mu.theta, -INF)
    certified = nonprojective._fast_matrix_tree(s, lengths, single_root)[2]
    assert certified[:2].all() and not certified.all()             # both kinds in the batch
    per_arc = []
    base = nonprojective._DependencyOracle._covariance

    def recorded(self, theta, *args):
        per_arc.append(theta.shape[0])
        return base(self, theta, *args)

    monkeypatch.setattr(nonprojective._DependencyOracle, "_covariance", recorded)
    cov = oracle._covariance(theta, mu.node, support, lengths)
    assert per_arc == [int((~certified).sum())]
    for i, n in enumerate(lengths.tolist()):
        ref = _enumerated_covariance(s[i, : n + 1, : n + 1], n, single_root)
        sup = support[i, :n, : n + 1].reshape(-1)
        ref = torch.where(sup[:, None] & sup[None], ref, 0.0)
        got = cov[i].reshape(5, 6, 5, 6)[:n, : n + 1, :n, : n + 1].reshape(n * (n + 1), n * (n + 1))
        assert torch.allclose(got, ref, atol=1e-11 if certified[i] else 1e-9, rtol=0)
        assert (cov[i].reshape(5, 6, 5, 6)[n:] == 0).all() and (cov[i].reshape(5, 6, 5, 6)[:, :, n:] == 0).all()


def _newton_calls(monkeypatch, oracle) -> list[int]:
    """Records the batch size of each Newton iteration's Hessian of ``oracle``'s conjugate entropy."""
    calls: list[int] = []
    original = oracle._covariance

    def recorded(theta, *args):
        calls.append(theta.shape[0])
        return original(theta, *args)

    monkeypatch.setattr(oracle, "_covariance", recorded)
    return calls


@pytest.mark.parametrize("cls,single_root", ORACLES)
def test_conjugate_entropy_starts_from_marginals_near(monkeypatch, cls, single_root):
    """``Marginals.near``: potentials whose marginals lie close, the accelerated solver's latest oracle point.
    The Newton iteration starts there (it started from log mu, several times as many iterations): the same
    entropy in fewer iterations.  A start that forbids an arc the marginals give mass to is none."""
    oracle = cls(single_root=single_root)
    gen = torch.Generator().manual_seed(1)
    lengths = torch.tensor([6, 4, 5])
    scores = torch.randn(3, 7, 7, generator=gen, dtype=DT) * 2
    pots = [arc_potentials(scores + 0.3 * torch.randn(3, 7, 7, generator=gen, dtype=DT), lengths) for _ in range(2)]
    mix = 0.5 * oracle.marginals(pots[0]).node + 0.5 * oracle.marginals(pots[1]).node      # points a solver nears
    calls = _newton_calls(monkeypatch, oracle)
    cold = oracle.entropy(Marginals(mix, None, None, lengths))
    n_cold = sum(calls)
    calls.clear()
    warm = oracle.entropy(Marginals(mix, None, None, lengths, near=pots[0]))
    assert torch.allclose(warm, cold, atol=1e-11, rtol=0)
    assert 0 < sum(calls) < n_cold
    forbidding = PairwisePotentials(pots[0].node.clone(), pots[0].edge, lengths)
    forbidding.node[1, 2, 0] = -INF                                    # example 1 starts from log mu
    assert torch.allclose(oracle.entropy(Marginals(mix, None, None, lengths, near=forbidding)), cold, atol=1e-11,
                          rtol=0)
    with pytest.raises(TypeError, match=r"marginals.near must be PairwisePotentials or None, got Tensor"):
        oracle.entropy(Marginals(mix, None, None, lengths, near=pots[0].node))
    with pytest.raises(ValueError, match=r"marginals.near.node must have the marginals' shape \(3, 6, 7\), got "
                                         r"\(2, 6, 7\)"):
        oracle.entropy(Marginals(mix, None, None, lengths, near=pots[0].index(torch.tensor([0, 1]))))


@pytest.mark.parametrize("cls", [NonProjective, Projective])
def test_conjugate_entropy_of_float32_marginals(cls):
    """The Newton iteration runs in float64 (tolerances at float32's rounding): in float32 the eigensolver
    failed to converge on these Hessians (torch's _LinAlgError reached the caller) for most such sentences."""
    oracle = cls()
    gen = torch.Generator().manual_seed(0)
    s1, s2 = (torch.randn(2, 11, 11, generator=gen, dtype=torch.float32) * 300 for _ in range(2))
    lengths = torch.tensor([10, 10])
    mix = 0.7 * oracle.marginals(arc_potentials(s1)).node + 0.3 * oracle.marginals(arc_potentials(s2)).node
    h = oracle.entropy(Marginals(mix, None, None, lengths))
    exact = 0.7 * oracle.marginals(arc_potentials(s1.double())).node \
        + 0.3 * oracle.marginals(arc_potentials(s2.double())).node
    assert h.dtype == torch.float32
    assert torch.allclose(h.double(), oracle.entropy(Marginals(exact, None, None, lengths)), atol=2e-3, rtol=0)


def test_the_accelerated_solver_hands_its_averages_their_oracle_point(monkeypatch):
    from betheproj.energies.second_order import SecondOrderArcs

    gen = torch.Generator().manual_seed(0)
    pot = arc_potentials(torch.randn(2, 6, 6, generator=gen, dtype=DT), torch.tensor([5, 4]))
    energy = SecondOrderArcs(torch.randn(2, 6, 6, 6, generator=gen, dtype=DT), None)
    oracle = Projective()
    seen = []
    original = oracle.entropy

    def recorded(marginals):
        seen.append(marginals.near)
        return original(marginals)

    monkeypatch.setattr(oracle, "entropy", recorded)
    sol = bp.solve(oracle, pot, energy, method="accelerated", max_iter=30)
    assert seen and all(isinstance(p, PairwisePotentials) for p in seen)
    assert torch.allclose(bp.objective(Projective(), pot, energy, sol.marginals), sol.objective, atol=1e-8)


def test_chu_liu_edmonds_names_a_wrong_type():
    for scores in ([[0.0, 1.0], [0.0, 0.0]], torch.zeros(3, 3, dtype=torch.long),
                   torch.zeros(3, 3, dtype=torch.float16)):
        with pytest.raises(TypeError, match="scores must be a float32 or float64 tensor"):
            chu_liu_edmonds(scores)
    with pytest.raises(ValueError, match=r"scores must be a tensor \[n\+1, n\+1\] with n >= 1, got \(2, 3\)"):
        chu_liu_edmonds(torch.zeros(2, 3))


@pytest.mark.parametrize("cls", [NonProjective, Projective])
def test_a_trees_statistics_have_no_edge_parts_as_its_marginals_have_none(cls):
    """The dependency oracles have no pairwise factors (``pairwise_factors`` is False): their marginals' edges are
    all-zero placeholders, and so are the edge parts of a tree's S(y) built with the oracle's structure.  S(y) had
    the indicators of the heads of consecutive words: on a sentence with one tree (mu = S(y)) an energy reading
    edge marginals gave 0.0 on mu and 3.0 on S(y)."""
    from betheproj.energies import FunctionEnergy
    from betheproj.learning import sufficient_statistics
    from betheproj.oracles import has_pairwise_factors, tree_parents

    oracle = cls()
    assert oracle.pairwise_factors is False and has_pairwise_factors(oracle) is False
    assert all(has_pairwise_factors(o) for o in (bp.LinearChain(), bp.Tree([-1, 0, 0]), bp.BruteForce()))
    gold, lengths = torch.tensor([[2, 0, 4, 2], [0, 1, 2, -1]]), torch.tensor([4, 3])
    scores = torch.full((2, 5, 5), -INF, dtype=DT)
    for b, n in enumerate(lengths.tolist()):
        scores[b, gold[b, :n], torch.arange(1, n + 1)] = 0.0                 # the gold tree is the only tree
    pot = arc_potentials(scores, lengths)
    mu = oracle.marginals(pot)
    stats = sufficient_statistics(pot, gold, tree_parents(oracle, 4), pairwise_factors=has_pairwise_factors(oracle))
    assert torch.allclose(mu.node, stats.node, atol=1e-12, rtol=0)
    assert stats.edge.shape == mu.edge.shape and not stats.edge.any() and not mu.edge.any()
    energy = FunctionEnergy(lambda m: m.edge.sum((1, 2, 3)) + m.node[..., 0].sum(-1))
    assert torch.allclose(energy.value(stats), energy.value(mu), atol=1e-12, rtol=0)
    assert energy.value(stats).tolist() == [1.0, 1.0]


def test_dependency_marginals_check_their_shift():
    """``shift`` is [B, N+1] since the root row has a constant of its own (it was [B, N]): the old shape is an
    error, not a silently misread entropy; without it the entropy is log Z - <theta, mu> unshifted."""
    from betheproj.oracles.dependency import DependencyMarginals

    torch.manual_seed(0)
    oracle = NonProjective(single_root=True)
    mu = oracle.marginals(arc_potentials(torch.randn(2, 4, 4, dtype=DT)))
    args = (mu.node, mu.log_partition, mu.lengths, mu.theta, mu.structure)
    with pytest.raises(ValueError, match=r"shift must be \[B, N\+1\]=\(2, 4\)"):
        DependencyMarginals(*args, mu.shift[:, 1:], mu.shifted_log_partition)
    with pytest.raises(ValueError, match="together"):
        DependencyMarginals(*args, mu.shift)
    plain = DependencyMarginals(*args)
    assert torch.allclose(oracle.entropy(plain), oracle.entropy(mu), atol=1e-12)
