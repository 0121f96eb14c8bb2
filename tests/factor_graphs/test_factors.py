"""Hard-constraint factors (Table 1 of Martins et al. 2010), the Dense factor and the TREE factor vs brute force."""

from __future__ import annotations

import itertools
import zlib

import numpy as np
import pytest
import torch

from betheproj.factor_graphs import IMPLY, NAND, OR, XOR, Dense, FactorGraph, OROut, Tree, XOROut, belief_propagation

from ._brute import (
    PREDICATES,
    all_trees,
    allowed_set,
    assert_log_close,
    exact_ratio_messages,
    factor_reference,
    log_ratio,
    negate,
)

CLASSES = {"XOR": XOR, "OR": OR, "OROut": OROut, "NAND": NAND, "IMPLY": IMPLY, "XOROut": XOROut}


def _cases():
    rng = np.random.default_rng(7)
    cases = []
    for name, arities in (("XOR", range(1, 6)), ("OR", range(1, 6)), ("OROut", range(2, 6))):
        for n in arities:
            cases.append((name, n, None))
            neg = tuple(bool(b) for b in rng.integers(0, 2, size=n))
            if not any(neg):
                neg = (True,) + neg[1:]
            cases.append((name, n, neg))
    cases += [("NAND", n, None) for n in range(1, 5)] + [("IMPLY", 2, None)]
    cases += [("XOROut", n, None) for n in range(2, 6)]
    return cases


CASES = _cases()


def _make(name, n, neg):
    cls = CLASSES[name]
    factor = cls(list(range(n)), neg) if name in ("XOR", "OR", "OROut") else cls(list(range(n)))
    pred = PREDICATES[name] if neg is None else negate(PREDICATES[name], neg)
    return factor, allowed_set(pred, n)


def _ids(case):
    name, n, neg = case
    return f"{name}-{n}" + ("" if neg is None else "-neg" + "".join(str(int(b)) for b in neg))


@pytest.mark.parametrize("case", CASES, ids=[_ids(c) for c in CASES])
def test_potential_matches_definition(case):
    factor, configs = _make(*case)
    n = case[1]
    for v in itertools.product((0, 1), repeat=n):
        assert factor.allows(v) == (v in configs)
        assert factor.log_potential(v) == (0.0 if v in configs else -np.inf)


def _compare_messages(factor, configs, incoming):
    ref = factor_reference(configs, incoming)
    for mode in ("sum", "max"):
        ours = factor.messages(incoming, mode)
        for i in range(factor.arity):
            want = log_ratio(ref[mode][i])
            got = log_ratio(ours[i]) if not np.isnan(ours[i]).any() else np.nan
            if np.isnan(want):
                continue  # contradictory incoming messages: the message is undefined
            assert_log_close([got], [want], atol=1e-9)
            # the ratio form of Table 1 agrees with the log-message form
            assert_log_close(factor.ratio_messages([log_ratio(m) for m in incoming], mode)[i:i + 1], [want],
                             atol=1e-9)
    return ref


@pytest.mark.parametrize("case", CASES, ids=[_ids(c) for c in CASES])
def test_messages_vs_brute_force(case):
    factor, configs = _make(*case)
    rng = np.random.default_rng(zlib.crc32(_ids(case).encode()))
    for _ in range(3):
        incoming = [rng.normal(scale=2.0, size=2) for _ in range(factor.arity)]
        _compare_messages(factor, configs, incoming)


@pytest.mark.parametrize("case", CASES, ids=[_ids(c) for c in CASES])
def test_messages_with_clamped_inputs(case):
    """Incoming messages with a zero entry (a clamped variable): exact, including infinite ratios."""
    factor, configs = _make(*case)
    rng = np.random.default_rng(1 + zlib.crc32(_ids(case).encode()))
    for _ in range(4):
        incoming = []
        for _ in range(factor.arity):
            m = rng.normal(size=2)
            if rng.random() < 0.35:
                m[rng.integers(0, 2)] = -np.inf
            incoming.append(m)
        _compare_messages(factor, configs, incoming)


@pytest.mark.parametrize("case", CASES, ids=[_ids(c) for c in CASES])
def test_belief_entropy_vs_brute_force(case):
    factor, configs = _make(*case)
    rng = np.random.default_rng(2 + zlib.crc32(_ids(case).encode()))
    incoming = [rng.normal(scale=1.5, size=2) + 3.0 for _ in range(factor.arity)]
    ref = factor_reference(configs, incoming)
    bel = factor.belief(incoming)
    np.testing.assert_allclose(bel.marginals, ref["z"], atol=1e-10)
    np.testing.assert_allclose(bel.entropy, ref["entropy"], atol=1e-10)
    np.testing.assert_allclose(bel.log_partition, ref["log_z"], atol=1e-10)
    assert bel.energy == 0.0
    # MARG_i / (1 - MARG_i) = m_{C->i} m_{i->C} (Table 1's top row)
    out = factor.messages(incoming, "sum")
    for i in range(factor.arity):
        z = ref["z"][i]
        if 1e-12 < z < 1 - 1e-12:
            np.testing.assert_allclose(np.log(z / (1 - z)), log_ratio(out[i]) + log_ratio(incoming[i]), atol=1e-8)


@pytest.mark.parametrize("case", CASES, ids=[_ids(c) for c in CASES])
def test_dense_table_of_a_hard_factor_reports_its_belief(case):
    """A hard factor and the Dense 0 / -inf table of the same constraint report the same belief, log Z_C
    included (the Dense one had summed unnormalised messages)."""
    factor, configs = _make(*case)
    table = np.full((2,) * factor.arity, -np.inf)
    for c in configs:
        table[c] = 0.0
    rng = np.random.default_rng(5 + zlib.crc32(_ids(case).encode()))
    incoming = [rng.normal(scale=1.5, size=2) + 3.0 for _ in range(factor.arity)]
    hard, dense = factor.belief(incoming), Dense(tuple(range(factor.arity)), table).belief(incoming)
    np.testing.assert_allclose(dense.log_partition, hard.log_partition, atol=1e-10)
    np.testing.assert_allclose(dense.entropy, hard.entropy, atol=1e-10)
    marg = [dense.marginals.sum(axis=tuple(j for j in range(factor.arity) if j != i))[1] for i in range(factor.arity)]
    np.testing.assert_allclose(marg, hard.marginals, atol=1e-10)


def test_belief_with_clamped_input():
    f = OROut([0, 1, 2])
    incoming = [np.array([0.0, -np.inf]), np.array([0.3, -0.2]), np.array([-0.5, 0.5])]
    ref = factor_reference(allowed_set(PREDICATES["OROut"], 3), incoming)
    bel = f.belief(incoming)
    np.testing.assert_allclose(bel.marginals, ref["z"], atol=1e-12)
    np.testing.assert_allclose(bel.entropy, ref["entropy"], atol=1e-12)


def test_xor_entropy_closed_form():
    """Table 1: H_XOR = -sum_i (m_i / sum_j m_j) log(m_i / sum_j m_j)."""
    rng = np.random.default_rng(3)
    incoming = [rng.normal(size=2) for _ in range(4)]
    m = np.exp([log_ratio(x) for x in incoming])
    q = m / m.sum()
    assert np.isclose(XOR(range(4)).belief(incoming).entropy, -np.sum(q * np.log(q)))


def test_named_negated_variants():
    assert NAND([0, 1, 2]).negated == (True, True, True)
    assert IMPLY([4, 5]).negated == (True, False)
    assert XOROut([0, 1, 2]).negated == (False, False, True)
    assert "negated" in repr(IMPLY([0, 1]))


def test_dense_messages_and_belief():
    rng = np.random.default_rng(4)
    table = rng.normal(size=(2, 3, 2))
    table[0, 1, 1] = -np.inf
    factor = Dense((0, 1, 2), table)
    incoming = [rng.normal(size=c) for c in (2, 3, 2)]
    configs = list(itertools.product(range(2), range(3), range(2)))
    ref = factor_reference(configs, incoming, [table[c] for c in configs])
    for mode in ("sum", "max"):
        for got, want in zip(factor.messages(incoming, mode), ref[mode], strict=True):
            np.testing.assert_allclose(got - got.max(), want - want.max(), atol=1e-12)
    bel = factor.belief(incoming)
    np.testing.assert_allclose(bel.marginals.reshape(-1), ref["belief"], atol=1e-12)
    np.testing.assert_allclose(bel.entropy, ref["entropy"], atol=1e-12)
    np.testing.assert_allclose(bel.log_partition, ref["log_z"], atol=1e-12)     # messages normalised first
    energy = float(sum(b * table[c] for b, c in zip(ref["belief"], configs, strict=True) if b > 0))
    np.testing.assert_allclose(bel.energy, energy, atol=1e-12)


def test_dense_accepts_torch_table():
    f = Dense([0], torch.tensor([0.5, -1.0], dtype=torch.float32))
    assert f.table.dtype == np.float64 and f.table.shape == (2,)


# --------------------------------------------------------------------------------------------- TREE factor

def _tree_case(n, single_root, prune, rng):
    arcs = Tree.all_arcs(n)
    if prune:
        keep = [a for a in arcs if rng.random() < 0.8 or a[0] == 0]
        arcs = keep
    factor = Tree(list(range(len(arcs))), arcs, n=n, single_root=single_root)
    index = {a: k for k, a in enumerate(arcs)}
    configs = []
    for heads in all_trees(n, single_root):
        if all((h, m + 1) in index for m, h in enumerate(heads)):
            v = [0] * len(arcs)
            for m, h in enumerate(heads):
                v[index[(h, m + 1)]] = 1
            configs.append(tuple(v))
    return factor, configs


TREE_CASES = [(n, sr, pr) for n in (2, 3, 4) for sr in (False, True) for pr in (False, True) if not (n == 2 and pr)]


@pytest.mark.parametrize("n,single_root,prune", TREE_CASES)
def test_tree_factor_vs_brute_force(n, single_root, prune):
    rng = np.random.default_rng(10 * n + 2 * single_root + prune)
    factor, configs = _tree_case(n, single_root, prune, rng)
    assert configs
    for v in configs[:20]:
        assert factor.allows(v)
    incoming = [rng.normal(scale=1.5, size=2) for _ in range(factor.arity)]
    ref = _compare_messages(factor, configs, incoming)
    bel = factor.belief(incoming)
    np.testing.assert_allclose(bel.marginals, ref["z"], atol=1e-9)
    np.testing.assert_allclose(bel.entropy, ref["entropy"], atol=1e-9)
    np.testing.assert_allclose(bel.log_partition, ref["log_z"], atol=1e-9)


@pytest.mark.parametrize("single_root", [False, True])
def test_tree_factor_clamped_arcs(single_root):
    """Arcs clamped on (+inf ratio) or off (-inf): exact messages to every arc (cavities) and beliefs."""
    rng = np.random.default_rng(11 + single_root)
    factor, configs = _tree_case(3, single_root, False, rng)
    arcs = factor.arcs
    incoming = [rng.normal(size=2) for _ in arcs]
    incoming[arcs.index((2, 1))][0] = -np.inf      # 2 -> 1 forced on
    incoming[arcs.index((0, 3))][1] = -np.inf      # 0 -> 3 forced off
    ref = _compare_messages(factor, configs, incoming)
    bel = factor.belief(incoming)
    np.testing.assert_allclose(bel.marginals, ref["z"], atol=1e-9)
    np.testing.assert_allclose(bel.entropy, ref["entropy"], atol=1e-9)


def test_tree_factor_rejects_non_trees():
    f = Tree(range(4), Tree.all_arcs(2), n=2)
    arcs = f.arcs
    cyc = [1 if a in ((1, 2), (2, 1)) else 0 for a in arcs]
    assert not f.allows(cyc)
    two_heads = [1 if a in ((0, 1), (0, 2), (2, 1)) else 0 for a in arcs]
    assert not f.allows(two_heads)
    both_root = [1 if a in ((0, 1), (0, 2)) else 0 for a in arcs]
    assert f.allows(both_root)
    assert not Tree(range(4), arcs, n=2, single_root=True).allows(both_root)


# --------------------------------------------------------------------------------------------- bad inputs

def test_bad_factor_inputs():
    with pytest.raises(TypeError, match="variables"):
        XOR(3)
    with pytest.raises(ValueError, match="variables"):
        XOR([0, 0])
    with pytest.raises(ValueError, match="variables"):
        OROut([0])
    with pytest.raises(ValueError, match="variables"):
        IMPLY([0, 1, 2])
    with pytest.raises(ValueError, match="negated"):
        OR([0, 1], negated=[True])
    with pytest.raises(TypeError, match=r"variables\[1\]"):
        XOR([0, 1.5])
    with pytest.raises(ValueError, match="table"):
        Dense((0, 1), np.zeros(3))
    with pytest.raises(ValueError, match="table"):
        Dense((0,), [np.nan, 0.0])
    with pytest.raises(ValueError, match="table"):
        Dense((0,), [np.inf, 0.0])
    with pytest.raises(TypeError, match="table"):
        Dense((0,), ["a", "b"])
    with pytest.raises(ValueError, match="arcs"):
        Tree([0, 1], [(0, 1)])
    with pytest.raises(ValueError, match="arcs"):
        Tree([0], [(1, 1)])
    with pytest.raises(TypeError, match="arcs must be a sequence of"):
        Tree([0], 5)
    with pytest.raises(ValueError, match=r"arcs\[0\] must be a pair"):
        Tree([0], [(0,)])
    with pytest.raises(ValueError, match="arcs must not repeat an arc"):
        Tree([0, 1], [(0, 1), (0, 1)])
    with pytest.raises(ValueError, match="n must be at least 2"):
        Tree([0, 1], [(0, 1), (0, 2)], n=1)
    with pytest.raises(TypeError, match="single_root must be a bool"):
        Tree([0], [(0, 1)], single_root=1)
    with pytest.raises(ValueError, match=r"config must be 2 integer states in the ranges \(2, 2\)"):
        Tree([0, 1], [(0, 1), (0, 2)]).allows([1])
    assert repr(Tree([0, 1], [(0, 1), (0, 2)])) == "Tree(n=2, arcs=2, single_root=False)"
    with pytest.raises(ValueError, match="mode"):
        XOR([0, 1]).messages([np.zeros(2), np.zeros(2)], "avg")
    with pytest.raises(ValueError, match="incoming"):
        XOR([0, 1]).messages([np.zeros(2)])
    with pytest.raises(ValueError, match=r"incoming\[1\]"):
        XOR([0, 1]).messages([np.zeros(2), np.zeros(3)])


def test_bad_graph_inputs():
    g = FactorGraph([2, 3, 2])
    with pytest.raises(ValueError, match="binary"):
        g.add_factor(XOR([0, 1]))
    with pytest.raises(ValueError, match="binary"):
        g.add_factor(Tree([0, 1], [(0, 1), (2, 1)]))
    with pytest.raises(ValueError, match=r"factor.variables\[1\] = 7"):
        g.add_factor(OR([0, 7]))
    with pytest.raises(ValueError, match=r"table must have shape \(2, 3\)"):
        g.add_factor(Dense((0, 1), np.zeros((3, 2))))
    with pytest.raises(TypeError, match="factor"):
        g.add_factor("xor")
    with pytest.raises(ValueError, match="unary"):
        g.set_unary(1, [0.0, 1.0])
    with pytest.raises(ValueError, match="variable = 5"):
        g.set_unary(5, [0.0, 1.0])
    with pytest.raises(ValueError, match="cardinality"):
        g.add_variable(0)
    with pytest.raises(TypeError, match=r"cardinalities\[0\]"):
        FactorGraph([2.0])
    with pytest.raises(ValueError, match="assignment"):
        g.score([0, 3, 0])
    assert g.num_factors == 0


def test_configs_are_integer_states_not_truncated_or_wrapped():
    """allows() cast configs to int64 first (XOR.allows([1.7, 0]) was True), and Dense.log_potential indexed
    its table with them ([-1] read the last entry, [5] was a bare IndexError)."""
    for f in (lambda: XOR([0, 1]).allows([1.7, 0]), lambda: XOR([0, 1]).log_potential([1.7, 0]),
              lambda: Tree([0], [(0, 1)]).allows([1.9]), lambda: Dense((0,), [0.0, 1.0]).log_potential([-1]),
              lambda: Dense((0,), [0.0, 1.0]).log_potential([5]), lambda: Dense((0,), [0.0, 1.0]).log_potential([1.0])):
        with pytest.raises(ValueError, match="config must be 1 integer states|config must be 2 integer states"):
            f()
    assert XOR([0, 1]).allows([1, 0]) and XOR([0, 1]).allows(np.array([False, True]))
    assert Dense((0, 1), np.arange(6.0).reshape(2, 3)).log_potential([1, 2]) == 5.0


def test_tree_max_product_keeps_small_differences_beside_a_huge_arc_score():
    """Max-product TREE messages were the difference of two best trees' totals: beside an arc at 1e30 shared by both
    trees, 1e30 + 0.3 - (1e30 + 0.8) came out 0, so arc (0, 1) tied with (2, 1) and BP decoded two heads for word 1
    (no tree).  The messages now sum the trees' per-word differences."""
    arcs = Tree.all_arcs(2)                                      # (0, 1), (0, 2), (1, 2), (2, 1)
    tree = Tree(range(4), arcs)
    for big in (1e3, 1e30):
        l = np.array([0.3, big, -0.5, 0.8])
        out = tree.ratio_messages(l, "max")
        # the cavity of (0, 1) / (2, 1): the other head of word 1 with (0, 2) on; of (1, 2): word 1's best head
        np.testing.assert_allclose(out[[0, 3]], [-0.8, -0.3], rtol=0, atol=1e-12)
        assert out[2] == -np.inf or out[2] < -big / 2                  # (1, 2) forces out (0, 2)
        g = FactorGraph([2] * 4)
        for v in range(4):
            g.set_unary(v, [0.0, l[v]])
        g.add_factor(tree)
        res = belief_propagation(g, "max")
        assert res.decode().tolist() == [0, 1, 0, 1] and res.variable_beliefs[0][1] == pytest.approx(np.exp(-0.5))


def test_tree_sum_product_messages_match_enumeration_at_mixed_scales():
    """Every arc's sum-product message, ``log Z(a on) - log Z(a off)`` over its cavity, against enumeration of
    the trees of 5 words, with log-ratios of scale 1 to 100: the logits of the closed-form marginals were off by
    up to 7e-9 of the message (not near 0 or 1, where exact determinants took over)."""
    from tests.trees import reaches_root

    n, rng = 5, np.random.default_rng(0)
    arcs = Tree.all_arcs(n)
    tree = Tree(range(len(arcs)), arcs)
    index = {a: k for k, a in enumerate(arcs)}
    trees = [[index[(h, m)] for m, h in enumerate(heads, 1)]
             for heads in itertools.product(range(n + 1), repeat=n)
             if all(h != m for m, h in enumerate(heads, 1)) and reaches_root(heads)]
    worst = 0.0
    for _ in range(30):
        l = rng.normal(size=len(arcs)) * rng.choice([1, 10, 30, 100])
        out = tree.ratio_messages(l, "sum")
        for k in range(len(arcs)):
            on = np.logaddexp.reduce([sum(l[j] for j in t if j != k) for t in trees if k in t])
            off = np.logaddexp.reduce([sum(l[j] for j in t) for t in trees if k not in t])
            worst = max(worst, abs(out[k] - (on - off)) / max(1.0, abs(on - off)))
    assert worst < 1e-9


def test_tree_sum_product_keeps_small_differences_beside_a_huge_arc_score():
    """A clamped or near-certain arc's sum-product message is log Z(a on) - log Z(a off): beside an arc at 1e30 in
    both, 1e30 - 1.043 - 1e30 came out 0.  Each word's best incoming score now comes off before the determinant, and
    the two shifts are differenced word by word."""
    tree = Tree(range(4), Tree.all_arcs(2))                      # (0, 1), (0, 2), (1, 2), (2, 1)
    # (0, 1) on: {(0,1), (0,2)} at 1e30 beats {(0,1), (1,2)}; off: {(0,2), (2,1)} at 1e30 - 1.043 only
    out = tree.ratio_messages([1e30, 1e30, -0.5685, -1.043], "sum")
    np.testing.assert_allclose(out[:2], [1.043, 0.5685], rtol=1e-12)
    assert out[2] == out[3] == -1e30                              # each excludes a 1e30 arc: 1e30 - 2e30
    # (0, 1) on: lse(-800, -0.5685); off: -800 - 1.043.  (1, 2) on: 1e30; off: lse(1e30 - 800, -801.043)
    out = tree.ratio_messages([1e30, -800.0, -0.5685, -1.043], "sum")
    exact = np.logaddexp(-800.0, -0.5685) + 801.043
    np.testing.assert_allclose(out[[0, 1, 2]], [exact, 0.5685, 800.0], rtol=1e-12)


@pytest.mark.parametrize("cls", [OR, NAND])
def test_or_belief_keeps_its_digits_at_huge_log_ratios(cls):
    """Table 1's MARG_i = sigma(l_i + log m_{OR->i}) adds two terms 1e30 apart: three inputs at -1e30 (one active input
    each in turn, 1/3) gave 1/2 each and an entropy of 5e29, above the factor's bound of 3 log 2."""
    sign = 1.0 if cls is OR else -1.0                            # NAND reads its inputs negated
    for big in (1e30, 1e300):
        belief = cls([0, 1, 2]).belief([np.array([0.0, -sign * big])] * 3)
        expected = np.full(3, 1 / 3) if cls is OR else np.full(3, 2 / 3)
        np.testing.assert_allclose(belief.marginals, expected, rtol=1e-15)
        assert belief.entropy == pytest.approx(np.log(3), rel=1e-15)
    # two inputs at -1e30 and one at -2.3e30: the first two share the mass, the third gets e^-1.3e30 = 0 of it
    belief = cls([0, 1, 2]).belief([np.array([0.0, -sign * x]) for x in (1e30, 1e30, 1e30 + 2.0 ** 100)])
    assert belief.marginals[2] == (0.0 if cls is OR else 1.0)
    np.testing.assert_allclose(belief.marginals[:2], 0.5, rtol=1e-15)


def test_xor_belief_keeps_its_digits_at_huge_log_ratios():
    """Table 1's sigma(l_i + log m_{XOR->i}) adds two terms 1e30 apart: three inputs at -1e30 gave MARG = 1/2 each,
    summing to 3/2 on a one-hot constraint, and an entropy of 5e29 (bound log 3).  MARG is now softmax(l)."""
    for big in (1e30, -1e30, 1e300):
        belief = XOR([0, 1, 2]).belief([np.array([0.0, big])] * 3)
        np.testing.assert_allclose(belief.marginals, np.full(3, 1 / 3), rtol=1e-15)
        assert belief.entropy == pytest.approx(np.log(3), rel=1e-15)
    # XOROut in its own coordinates: the output on and one of the two inputs, each half the time
    belief = XOROut([0, 1, 2]).belief([np.array([0.0, 1e30])] * 3)
    np.testing.assert_allclose(belief.marginals, [0.5, 0.5, 1.0], rtol=1e-15)
    assert belief.entropy == pytest.approx(np.log(2), rel=1e-15)
    # inputs float64 tells apart at that size (2^47 apart, its spacing there): all the mass on the largest
    l = -1e30 + np.array([0.0, 2.0 ** 47, 2.0 ** 48])
    np.testing.assert_array_equal(XOR([0, 1, 2]).belief([np.array([0.0, x]) for x in l]).marginals, [0, 0, 1])


def test_or_with_output_belief_keeps_its_digits_at_huge_log_ratios():
    """OROut = the output on with probability sigma(T) and then OR's exact belief over the inputs; Table 1's
    sigma(l_i + log m_{C->i}) gave (1/2, 0) for an input at 1e30 and an output at -1e30, against out = in."""
    cases = [([1e30, -1e30], [0.5, 0.5], np.log(2)),            # (0, 0) and (1, 1) tie
             ([-1e30, -1e30, 1e30], [1 / 3, 1 / 3, 2 / 3], np.log(3)),   # (0,0,0), (1,0,1), (0,1,1) tie
             ([1e30, -1e30, -1e30], [0.5, 0.0, 0.5], np.log(2)),
             ([1e30, 1e30, -1e30], [1.0, 1.0, 1.0], 0.0)]
    for l, marg, entropy in cases:
        belief = OROut(list(range(len(l)))).belief([np.array([0.0, x]) for x in l])
        np.testing.assert_allclose(belief.marginals, marg, rtol=1e-15, atol=0)
        assert belief.entropy == pytest.approx(entropy, rel=1e-15, abs=0)


@pytest.mark.parametrize("factor", [OR([0, 1, 2]), NAND([0, 1, 2]), OROut([0, 1, 2])], ids=repr)
def test_hard_factor_beliefs_with_clamped_inputs_match_brute_force(factor):
    # each input clamped on or off in turn, the others at moderate log-ratios: exact 0 / 1 and a finite entropy
    gen = np.random.default_rng(0)
    for _ in range(20):
        l = gen.normal(0, 3, 3)
        for k, clamp in itertools.product(range(3), (np.inf, -np.inf)):
            incoming = [np.array([0.0, x]) for x in l]
            incoming[k] = np.array([-np.inf, 0.0]) if clamp > 0 else np.array([0.0, -np.inf])
            ok = [v for v in itertools.product([0, 1], repeat=3) if factor.allows(v) and v[k] == (clamp > 0)]
            if not ok:
                with pytest.raises(ValueError, match="contradictory"):
                    factor.belief(incoming)
                continue
            w = np.array([np.exp(sum(l[j] * v[j] for j in range(3) if j != k)) for v in ok])
            w /= w.sum()
            belief = factor.belief(incoming)
            np.testing.assert_allclose(belief.marginals, w @ np.array(ok, dtype=float), atol=1e-14, rtol=0)
            assert belief.marginals[k] == (1.0 if clamp > 0 else 0.0)
            assert belief.entropy == pytest.approx(-np.sum(w * np.log(w)), abs=1e-13)


# incoming log-ratios that clamp in all but name (e^-1e30 = 0 in float64), beside O(1) ones
HUGE_POOL = [-np.inf, -2e30, -1e30, -1e30 + 2.0 ** 47, -1e10 - 1.0, -0.7, 0.0, 0.3, 1e10, 1e30, 2e30, np.inf]


@pytest.mark.parametrize("case", CASES, ids=[_ids(c) for c in CASES])
def test_messages_at_huge_log_ratios_match_exact_brute_force(case):
    """Sum- and max-product messages against an enumeration whose scores are summed exactly: where the exact message is
    O(1) (the huge inputs cancel) its digits must survive, and a huge message must be right to its last few places."""
    factor, configs = _make(*case)
    rng = np.random.default_rng(3 + zlib.crc32(_ids(case).encode()))
    for _ in range(40):
        l = rng.choice(HUGE_POOL, size=factor.arity)
        l = np.where(rng.random(factor.arity) < 0.3, rng.normal(size=factor.arity), l)
        for mode in ("sum", "max"):
            want = exact_ratio_messages(configs, l, mode)
            got = factor.ratio_messages(l, mode)
            keep = ~np.isnan(want)                       # NaN: contradictory clamps, the message is undefined
            assert_log_close(got[keep], want[keep], atol=1e-12, rtol=1e-15)


def test_or_with_output_sum_messages_keep_their_digits_at_huge_log_ratios():
    """OROut's sum-product messages took s = log prod_j (1 + m_j) back from log s: exp(log 1e30) is 1e30 to 17 places in
    the last digit, so the message to the output from an input at 1e30 was 1e30 - 2.4e15, and an input's message
    -l_n - s with l_n = -1e30 came out -2.4e15 for the exact -log 2 (BP then put the output off where out = in ties)."""
    f = OROut([0, 1])
    assert f.ratio_messages([1e30, -1e30], "sum")[1] == 1e30
    out = OROut([0, 1, 2]).ratio_messages([1e30, 0.3, -1e30], "sum")
    assert out[1] == pytest.approx(-np.log(2), rel=1e-15) and out[2] == 1e30
    # l_n + sum_j max(l_j, 0) is formed exactly: with 1e30 and 0.3 in the cavity the 0.3 is kept
    out = OROut([0, 1, 2, 3]).ratio_messages([1e30, 0.3, 0.0, -1e30], "sum")
    assert out[2] == pytest.approx(-np.logaddexp(0.0, -np.logaddexp(0.0, 0.3)), rel=1e-15)
    # BP on the factor alone is exact.  Out = in with the input at 1e30 and the output at -1e30: (0, 0) and (1, 1) tie,
    # where the output had been put off.  With a second input at 0.3, (0, 0, 0) and (1, 0, 1) weigh 1 each, (1, 1, 1)
    # e^0.3: that input's belief (it had been off) is exact; the other two, 1e30 + (-1e30 + 0.85), cannot be
    for unary, want in (([1e30, -1e30], [0.5, 0.5]),
                        ([1e30, 0.3, -1e30], [None, np.exp(0.3) / (2.0 + np.exp(0.3)), None])):
        g = FactorGraph([2] * len(unary))
        for v, x in enumerate(unary):
            g.set_unary(v, [0.0, x])
        g.add_factor(OROut(list(range(len(unary)))))
        beliefs = belief_propagation(g, "sum").variable_beliefs
        for b, w in zip(beliefs, want, strict=True):
            if w is not None:
                assert b[1] == pytest.approx(w, rel=1e-14)


def test_or_with_output_max_messages_keep_their_digits_at_huge_log_ratios():
    """OROut's max-product message to input i is min(l_n + sum_{j != i,n} max(l_j, 0), ...): the sum ran through 1e30 +
    (2^47 - 0.5), which rounds to the next float 1e30 + 2^47, before l_n = -(1e30 + 2^47) met it, so the exact -0.25
    and -0.5 came out 0.  l_n now meets the exact sum (as in the sum-product message)."""
    l = [1e30, 2.0 ** 47 - 0.5, 0.25, 0.0, -(1e30 + 2.0 ** 47)]
    configs = allowed_set(PREDICATES["OROut"], 5)
    for mode in ("sum", "max"):
        assert_log_close(OROut(range(5)).ratio_messages(l, mode), exact_ratio_messages(configs, l, mode), atol=1e-15,
                         rtol=1e-15)
    np.testing.assert_array_equal(OROut(range(5)).ratio_messages(l, "max")[2:4], [-0.5, -0.25])


@pytest.mark.parametrize("n,single_root", [(2, False), (3, False), (3, True), (4, False)])
def test_tree_belief_at_huge_log_ratios_equals_the_clamped_one(n, single_root):
    """Arcs of one tree at 1e10 .. 2e30 and arcs off it at -1e10 .. -2e30 (clamped in all but name) beside O(1) ones:
    marginals, entropy and log Z_C as with those arcs clamped (+-inf), by brute force on the reduced problem.  Table 1's
    entropy log Z_C - sum_a [z_a log p_a(1) + (1 - z_a) log p_a(0)] differenced a log Z_C of 1e30 - 1e30 + O(1)
    against sum_a log p_a(0) = -1e30: 2.8 for a belief with one tree (0), and 1e10 + 0.06 beside an arc at 1e10."""
    rng = np.random.default_rng(20 * n + single_root)
    arcs = Tree.all_arcs(n)
    factor = Tree(range(len(arcs)), arcs, single_root=single_root)
    trees = all_trees(n, single_root)
    configs = [tuple(int(arc[0] == heads[arc[1] - 1]) for arc in arcs) for heads in trees]
    for _ in range(12):
        heads = trees[rng.integers(len(trees))]
        on = np.array([h == heads[m - 1] for h, m in arcs])
        l = rng.normal(scale=1.5, size=len(arcs))
        big = rng.random(len(arcs)) < 0.5
        l[big] = np.where(on, 1.0, -1.0)[big] * rng.choice([1e10, 1e30, 2e30], size=int(big.sum()))
        clamped = np.where(big, np.where(on, np.inf, -np.inf), l)
        ref = factor_reference(configs, [np.array([-np.inf, 0.0]) if x == np.inf else np.array([0.0, x])
                                         for x in clamped])
        belief = factor.belief([np.array([0.0, x]) for x in l])
        np.testing.assert_allclose(belief.marginals, ref["z"], atol=1e-12, rtol=0)
        assert belief.entropy == pytest.approx(ref["entropy"], abs=1e-12)
        assert belief.log_partition == pytest.approx(ref["log_z"], abs=1e-12)


@pytest.mark.parametrize("single_root", [False, True])
def test_tree_factor_clamps_that_leave_no_tree(single_root):
    """Incoming clamps that no dependency tree satisfies (two arcs forced into one word, every arc into a word
    forbidden, a forced cycle, and with a single root two forced root arcs): the outgoing messages are undefined (NaN
    in both modes, as brute force's are, rather than a finite message from a tree that breaks a clamp) and the belief
    is a ValueError that says the messages contradict each other; malformed log-ratios are named."""
    inf = np.inf
    arcs = Tree.all_arcs(2)                                      # (0, 1), (0, 2), (1, 2), (2, 1)
    tree = Tree(range(4), arcs, single_root=single_root)
    cases = [[inf, 0.3, -0.2, inf], [-inf, 0.1, 0.2, -inf], [-inf, -inf, inf, inf]]
    if single_root:
        cases.append([inf, inf, 0.1, 0.2])
    for l in cases:
        l = np.array(l)
        clamped = np.isinf(l)
        configs = [v for v in itertools.product([0, 1], repeat=4)
                   if tree.allows(v) and np.array_equal(np.array(v)[clamped], (l[clamped] > 0).astype(int))]
        assert configs == []                                     # brute force agrees: no tree is left
        for mode in ("sum", "max"):
            assert np.isnan(tree.ratio_messages(l, mode)).all()
        incoming = [np.array([0.0, x]) if np.isfinite(x) else np.array([-inf, 0.0] if x > 0 else [0.0, -inf])
                    for x in l]
        with pytest.raises(ValueError, match="no dependency tree is compatible .*contradictory"):
            tree.belief(incoming)
    with pytest.raises(ValueError, match="in_ratios must be 4 log-ratios without NaN"):
        tree.ratio_messages([np.nan, 0.0, 0.0, 0.0])
    with pytest.raises(ValueError, match="in_ratios must be 4 log-ratios"):
        tree.ratio_messages([0.0, 0.0])
