"""LinearChain against brute-force enumeration (float64), plus float32, extremes and the fast/slow paths."""

import math

import pytest
import torch

import betheproj as bp
from betheproj.energies import LinearMeasurements, Poisson

from ._spy import record_shapes
from .test_brute_force import HUGE, TOL, assert_exact, cancelling, penalised, two_part_atol

DT = torch.float64
INF = float("inf")


def _chain(b, n, c, scale=1.0, shared=False, lengths=None, dtype=DT):
    node = torch.randn(b, n, c, dtype=dtype) * scale
    edge = torch.randn(c, c, dtype=dtype) * scale if shared else torch.randn(b, n - 1, c, c, dtype=dtype) * scale
    return bp.ChainPotentials(node, edge, lengths)


def _assert_matches_brute_force(pot, atol=1e-6):
    chain, brute = bp.LinearChain(), bp.BruteForce()
    m, ref = chain.marginals(pot), brute.marginals(pot)
    assert torch.allclose(m.node, ref.node, atol=atol, rtol=0)
    assert torch.allclose(m.edge, ref.edge, atol=atol, rtol=0)
    rel = (m.log_partition - ref.log_partition).abs() / ref.log_partition.abs().clamp_min(1.0)
    assert rel.max() < atol
    assert torch.allclose(chain.entropy(m), brute.exact_entropy(pot), atol=atol, rtol=0)
    assert torch.equal(chain.map(pot), brute.map(pot))


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("scale", [0.3, 1.0, 5.0])
def test_random_chains_match_brute_force(shared, scale):
    for _ in range(5):
        pot = _chain(4, 5, 3, scale=scale, shared=shared, lengths=torch.tensor([5, 3, 1, 4]))
        _assert_matches_brute_force(pot)


@pytest.mark.parametrize("shared", [False, True])
def test_magnitudes_of_1e3(shared):
    pot = _chain(4, 5, 3, scale=1e3, shared=shared, lengths=torch.tensor([5, 2, 1, 4]))
    _assert_matches_brute_force(pot, atol=1e-9)


def test_magnitudes_of_1e4_are_finite_and_exact():
    pot = _chain(3, 6, 3, scale=1e4, lengths=torch.tensor([6, 4, 1]))
    _assert_matches_brute_force(pot, atol=1e-9)


def test_forbidden_transitions():
    pot = _chain(4, 5, 3, lengths=torch.tensor([5, 5, 2, 3]))
    pot.edge[0, :, 0, 1] = -INF                    # never 0 -> 1
    pot.edge[1, 1] = -INF
    pot.edge[1, 1, 2, 2] = 0.0                     # at step 1 only 2 -> 2 allowed
    pot.node[2, 0, :2] = -INF                      # first label forced to 2
    pot.edge[3, 0, :, :] = -INF
    pot.edge[3, 0, torch.arange(3), torch.arange(3)] = 0.0     # identity transition
    _assert_matches_brute_force(pot)
    m = bp.LinearChain().marginals(pot)
    assert m.edge[0, :, 0, 1].abs().max() == 0
    assert torch.allclose(m.node[1, 1:3, 2], torch.ones(2, dtype=DT))


def test_forbidden_with_large_magnitudes_dead_ends():
    # a dead end: the best prefix cannot continue, so the fast path must hand over to log space
    pot = bp.ChainPotentials(torch.tensor([[[0.0, 300.0], [0.0, 0.0], [0.0, 0.0]]], dtype=DT),
                             torch.tensor([[0.0, 0.0], [-INF, 0.0]], dtype=DT))
    pot.node[0, 1, 1] = -INF
    _assert_matches_brute_force(pot, atol=1e-12)


def test_length_one_and_single_position():
    _assert_matches_brute_force(_chain(3, 1, 4))
    _assert_matches_brute_force(_chain(3, 4, 4, lengths=torch.tensor([1, 1, 1])))


def test_single_label():
    pot = _chain(2, 3, 1, lengths=torch.tensor([3, 2]))
    m = bp.LinearChain().marginals(pot)
    assert torch.allclose(m.node[0], torch.ones(3, 1, dtype=DT))
    _assert_matches_brute_force(pot)


def test_padding_is_ignored_and_zero():
    pot = _chain(2, 5, 3, lengths=torch.tensor([5, 2]))
    other = pot.node.clone()
    other[1, 2:] = torch.randn(3, 3, dtype=DT) * 100
    other[1, 3, 0] = -INF
    edge = pot.edge.clone()
    edge[1, 1:] = -INF
    m1 = bp.LinearChain().marginals(pot)
    m2 = bp.LinearChain().marginals(bp.ChainPotentials(other, edge, pot.lengths))
    assert torch.equal(m1.node, m2.node) and torch.equal(m1.log_partition, m2.log_partition)
    assert (m1.node[1, 2:] == 0).all() and (m1.edge[1, 1:] == 0).all()
    labels = bp.LinearChain().map(pot)
    assert (labels[1, 2:] == -1).all() and (labels[0] >= 0).all()


def test_float32_agrees_with_float64():
    pot64 = _chain(64, 14, 26, scale=2.0, shared=True, lengths=torch.randint(1, 15, (64,)))
    pot32 = bp.ChainPotentials(pot64.node.float(), pot64.edge.float(), pot64.lengths)
    m64, m32 = bp.LinearChain().marginals(pot64), bp.LinearChain().marginals(pot32)
    assert m32.node.dtype == torch.float32
    assert torch.allclose(m32.node.double(), m64.node, atol=2e-5)
    assert torch.allclose(m32.edge.double(), m64.edge, atol=2e-5)
    assert torch.allclose(m32.log_partition.double(), m64.log_partition, rtol=1e-5)


def test_float32_extreme_scores_stay_finite_and_exact():
    # float32 scores of magnitude 1e4 carry ~1e-3 of rounding, so compare with float64 arithmetic on the
    # same (float32-rounded) scores: the remaining differences come from float32 accumulation alone
    # (log Z ~ 1e5 here, so float32 resolves it to ~1e-2 and marginals to a few 1e-2; at 1e3 to ~1e-3)
    for scale, atol in ((1e4, 5e-2), (1e3, 5e-3)):
        pot32 = _chain(16, 8, 5, scale=scale, lengths=torch.randint(1, 9, (16,)), dtype=torch.float32)
        pot32.edge[:, :, 0, 1] = -INF
        pot64 = bp.ChainPotentials(pot32.node.double(), pot32.edge.double(), pot32.lengths)
        m32, m64 = bp.LinearChain().marginals(pot32), bp.LinearChain().marginals(pot64)
        assert torch.isfinite(m32.node).all() and torch.isfinite(m32.log_partition).all()
        assert torch.allclose(m32.node.sum(-1), m64.node.sum(-1).float(), atol=1e-6)
        assert torch.allclose(m32.edge.sum((-1, -2)), m64.edge.sum((-1, -2)).float(), atol=1e-6)
        assert torch.allclose(m32.node.double(), m64.node, atol=atol)
        assert torch.allclose(m32.log_partition.double(), m64.log_partition, rtol=1e-6)
        assert torch.equal(bp.LinearChain().map(pot32), bp.LinearChain().map(pot64))


@pytest.mark.parametrize("dtype, big", [(torch.float32, 1e4), (torch.float32, 1e8), (torch.float64, 1e20)])
def test_viterbi_is_not_absorbed_by_a_large_constant(dtype, big):
    # a running sum of raw scores rounded the O(1) differences away: 13 of 64 positions fell to label 0
    node = torch.full((1, 64, 2), big, dtype=dtype)
    node[..., 1] += 0.03 if big < 1e5 else 0.0
    node[0, -1] = torch.tensor([0.0, 1.0])      # the last position alone decides when the others tie
    pot = bp.ChainPotentials(node, torch.zeros(2, 2, dtype=dtype))
    want = torch.ones(1, 64, dtype=torch.long) if big < 1e5 else bp.Tree(list(range(-1, 63))).map(pot)
    assert torch.equal(bp.LinearChain().map(pot), want)
    assert int(bp.LinearChain().map(pot)[0, -1]) == 1


def test_viterbi_of_scores_whose_sum_overflows():
    # each score finite, their sum not: the MAP is still defined (Tree and BruteForce answer it)
    pot = bp.ChainPotentials(torch.tensor([[[1e308, 0.0], [1e308, 0.0], [0.0, 1.0]]], dtype=torch.float64),
                             torch.zeros(2, 2, dtype=torch.float64))
    assert bp.LinearChain().map(pot).tolist() == [[0, 0, 1]]


@pytest.mark.parametrize("layout", ["shared", "per-example", "per-position"])
def test_viterbi_backtrace_finds_a_best_labelling_among_ties(layout):
    # no back-pointers are kept: the backtrace redoes the forward pass's sums for the label chosen next, so on
    # scores in {-1, 0, 1} (ties everywhere) with forbidden entries (never label 0's, so every labelling of 0s is
    # allowed) it must still land on a labelling of the best score
    gen = torch.Generator().manual_seed(3)
    b, n, c = 12, 6, 3
    for _ in range(20):
        node = torch.randint(-1, 2, (b, n, c), generator=gen).to(DT)
        node[..., 1:][torch.rand(b, n, c - 1, generator=gen) < 0.1] = -INF
        table = torch.randint(-1, 2, (b, n - 1, c, c), generator=gen).to(DT)
        table[torch.rand(b, n - 1, c, c, generator=gen) < 0.2] = -INF
        table[..., 0, 0] = 0.0
        edges = {"shared": table[0, 0], "per-example": table[:, :1].expand(b, n - 1, c, c),
                 "per-position": table}[layout]
        pot = bp.ChainPotentials(node, edges, torch.randint(1, n + 1, (b,), generator=gen))
        labels, full = bp.LinearChain().map(pot), pot.full_edge()
        for k, row in enumerate(labels.tolist()):
            length = int(pot.lengths[k])
            assert row[length:] == [-1] * (n - length)
            y = row[:length]
            score = sum(float(node[k, t, y[t]]) for t in range(length))
            score += sum(float(full[k, t, y[t], y[t + 1]]) for t in range(length - 1))
            assert score == float(bp.BruteForce()._joint(pot, k)[1].max())


def test_fast_and_log_space_paths_agree():
    from betheproj.oracles.chain import _log_forward_backward, _log_node_marginals
    pot = _chain(32, 10, 6, scale=3.0, lengths=torch.randint(1, 11, (32,)))
    state, lz = _log_forward_backward(pot)
    m = bp.LinearChain().marginals(pot)
    assert torch.allclose(m.log_partition, lz, rtol=1e-12)
    mask = m.node_mask()[..., None]
    assert torch.allclose(m.node, torch.where(mask, _log_node_marginals(state), 0.0), atol=1e-12)


def test_edge_marginals_are_consistent():
    pot = _chain(8, 7, 4, lengths=torch.randint(1, 8, (8,)))
    m = bp.LinearChain().marginals(pot)
    ev = m.edge_mask()
    assert torch.allclose(m.edge.sum(-1)[ev], m.node[:, :-1][ev], atol=1e-12)
    assert torch.allclose(m.edge.sum(-2)[ev], m.node[:, 1:][ev], atol=1e-12)


def test_infeasible_potentials_raise():
    pot = _chain(2, 3, 2)
    pot.edge[1, 0] = -INF
    with pytest.raises(ValueError, match="no labelling"):
        bp.LinearChain().marginals(pot)
    with pytest.raises(ValueError, match="no labelling"):
        bp.LinearChain().map(pot)


@pytest.mark.parametrize("scale", [1.0, 300.0])          # 300: examples on the exact log-space path too
def test_fused_edge_sum_equals_the_weighted_edge_marginals(scale):
    pot = _chain(6, 5, 3, scale=scale, shared=True, lengths=torch.tensor([5, 3, 1, 4, 5, 2]))
    pot.edge[0, 1] = -INF
    m = bp.LinearChain().marginals(pot)
    w = torch.randn(6, dtype=DT)
    assert torch.allclose(m.edge_sum(w), torch.einsum("b,bnij->ij", w, m.edge), atol=1e-12)


def _dead_end_in_padding(shared):
    """Example 1 ends (length 2 of 4) on label 0, whose transitions are all -inf: feasible, but the
    fast path's recursion past its length is 0/0."""
    node = torch.zeros(2, 4, 2, dtype=DT)
    node[1, 1, 1] = -INF
    node[0, :, 0] = -INF
    edge = torch.tensor([[-INF, -INF], [0.0, 0.0]], dtype=DT)
    if not shared:
        edge = edge.expand(2, 3, 2, 2)                    # the stride-0 per-example view
    return bp.ChainPotentials(node, edge, torch.tensor([4, 2]))


@pytest.mark.parametrize("shared", [True, False])
def test_edge_sums_ignore_a_dead_end_in_the_padding(shared):
    pot = _dead_end_in_padding(shared)
    m, ref = bp.LinearChain().marginals(pot), bp.BruteForce().marginals(pot)
    assert torch.allclose(m.edge_total(), ref.edge.sum(1))
    if shared:
        w = torch.tensor([2.0, -1.0], dtype=DT)
        assert torch.allclose(m.edge_sum(w), torch.einsum("b,bnij->ij", w, ref.edge))
        edge = pot.edge.clone().requires_grad_(True)
        bp.LinearChain().log_partition(bp.ChainPotentials(pot.node, edge, pot.lengths)).sum().backward()
        assert torch.allclose(edge.grad, ref.edge.sum((0, 1)))


def test_shared_edge_gradient_with_an_example_on_the_log_space_path_float32():
    torch.manual_seed(0)
    edge = torch.tensor([[-200.0, 0.0], [-200.0, 0.0]], requires_grad=True)
    node = torch.randn(3, 5, 2)
    node[1, 2] = torch.tensor([0.0, -200.0])              # this example leaves the fast path
    lengths = torch.tensor([5, 5, 3])
    bp.LinearChain().log_partition(bp.ChainPotentials(node, edge, lengths)).sum().backward()
    ref = bp.BruteForce().marginals(bp.ChainPotentials(node.double(), edge.detach().double(), lengths))
    assert torch.allclose(edge.grad.double(), ref.edge.sum((0, 1)), atol=1e-5)


def test_cached_edge_factors_follow_writes_through_data():
    torch.manual_seed(0)
    node, edge = torch.randn(4, 33, 8, dtype=DT), torch.randn(4, 32, 8, 8, dtype=DT)   # large enough to cache
    chain = bp.LinearChain()
    chain.marginals(bp.ChainPotentials(node, edge))
    edge.data.mul_(3.0)                                   # bumps no version counter
    again = chain.marginals(bp.ChainPotentials(node, edge)).log_partition
    assert torch.allclose(again, bp.LinearChain().marginals(bp.ChainPotentials(node, edge)).log_partition)


def test_lazy_edge_marginals_do_not_see_later_writes_to_the_potentials():
    node = torch.tensor([[[0.0, 1.0], [0.0, -1000.0], [0.0, 2.0]]], dtype=DT)   # on the log-space path
    edge = torch.tensor([[-INF, 0.0], [-INF, 0.0]], dtype=DT)
    pot = bp.ChainPotentials(node, edge)
    ref = bp.BruteForce().marginals(pot).edge.clone()
    mu = bp.LinearChain().marginals(pot)
    edge.copy_(torch.tensor([[0.0, 0.0], [-INF, 0.0]], dtype=DT))
    node[0, 0] = torch.tensor([5.0, 0.0], dtype=DT)
    assert torch.allclose(mu.edge, ref)


def test_log_space_path_keeps_small_scores_beside_a_huge_constant():
    edge = torch.zeros(1, 3, 2, 2, dtype=DT)
    edge[0, 0] = torch.tensor([[-INF, 0.0], [-INF, 0.0]])          # with -1000 below: on the log-space path
    node = torch.tensor([[[0.0, 1.0], [0.0, -1000.0], [0.0, 0.0], [0.0, 2.0]]], dtype=DT)
    ref = bp.LinearChain().marginals(bp.ChainPotentials(node, edge))
    node[0, 2] = -1e30                                               # a constant position only rescales Z
    mu = bp.LinearChain().marginals(bp.ChainPotentials(node, edge))
    assert torch.allclose(mu.node, ref.node) and torch.allclose(mu.edge, ref.edge)


@pytest.mark.parametrize("c", [1, 2, 8, 9, 13, 26, 97])
def test_row_max_is_amax_for_every_label_count(c):
    from betheproj.oracles.chain import _row_max

    gen = torch.Generator().manual_seed(c)
    x = torch.randn(3, 5, c, generator=gen, dtype=DT)
    x[0, 0] = -INF                                                   # a row of -inf only
    x[1, 1, -1] = 1e30                                               # the maximum in the last entry
    x[2, 2, c // 2] = 1e30                                           # and in the middle (the halves overlap there)
    assert torch.equal(_row_max(x), x.amax(-1, keepdim=True))


def test_float32_marginals_of_underflowed_products_are_recomputed():
    # alpha * beta underflowed to an exact 0 for marginals of 1e-23..1e-37 (normal float32 numbers) while the
    # absolute error bound passed; the solver then read those labels as forbidden
    from betheproj.oracles.chain import _log_forward_backward, _log_node_marginals
    torch.manual_seed(0)
    node, edge = torch.randn(4, 8, 4, dtype=DT), torch.randn(4, 7, 4, 4, dtype=DT)
    a, a_edge = torch.randn(2, 4, dtype=DT), torch.randn(2, 4, 4, dtype=DT)
    theta = bp.ChainPotentials(node[2:3, :5] * 30, edge[2:3, :4] * 30)
    energy = LinearMeasurements(node=a, edge=a_edge, offset=0.3, loss="smoothed_abs", psi=3.0)
    at = bp.solve(bp.LinearChain(), theta, energy, method="md", max_iter=300).potentials
    pot = bp.ChainPotentials(at.node.float(), at.edge.float())
    exact = _log_node_marginals(_log_forward_backward(pot)[0])
    normal = exact >= torch.finfo(torch.float32).tiny
    assert (normal & (exact < 1e-20)).sum() >= 3
    assert not (normal & (bp.LinearChain().marginals(pot).node == 0)).any()
    theta32 = bp.ChainPotentials(theta.node.float(), theta.edge.float())
    energy32 = LinearMeasurements(node=a.float(), edge=a_edge.float(), offset=0.3, loss="smoothed_abs", psi=3.0)
    out = bp.solve(bp.LinearChain(), theta32, energy32, method="md", max_iter=300)
    ref = bp.solve(bp.BruteForce(), theta32, energy32, method="md", max_iter=300)
    assert bool(out.converged.all()) and abs(float(out.objective - ref.objective)) < 1e-4


@pytest.mark.parametrize("dtype, gap", [(torch.float32, 57.5), (torch.float64, 400.0)])
def test_underflowed_marginal_is_recomputed_beside_a_dead_end_in_another_examples_padding(dtype, gap):
    # alpha_1 ~ (1, e^-gap, e^-gap) and beta_1 ~ (e^-gap, e^-gap, 1): the middle label's alpha * beta underflows to
    # 0 while its marginal (~e^-gap / 2) is a normal number.  A second example whose padding is a dead end (0/0 =
    # NaN there) made the minimum of alpha * beta NaN, which disabled the check for the whole batch: 0 came back
    row = torch.tensor([0.0, -gap, -gap], dtype=dtype)
    first = torch.stack([row.expand(3, 3), torch.stack([row[[1, 1, 1]], row[[1, 1, 1]], torch.zeros(3, dtype=dtype)])])
    node = torch.zeros(2, 3, 3, dtype=dtype)
    edge = torch.stack([first, torch.full((2, 3, 3), -INF, dtype=dtype)])
    pot = bp.ChainPotentials(node, edge, torch.tensor([3, 1]))
    ref = bp.BruteForce().marginals(bp.ChainPotentials(node[:1].double(), edge[:1].double())).node[0]
    assert float(ref[1, 1]) > torch.finfo(dtype).tiny
    mu = bp.LinearChain().marginals(pot)
    assert torch.equal(mu.node[:1], bp.LinearChain().marginals(bp.ChainPotentials(node[:1], edge[:1])).node)
    assert torch.allclose(mu.node[0].double(), ref, rtol=1e-5, atol=0)
    assert float(mu.node[0, 1, 1]) > 0


def test_an_empty_batch():
    # PairwisePotentials accepts B = 0 and Tree, BruteForce and the dependency oracles answer it; the chain's
    # underflow check took the minimum of an empty tensor (a RuntimeError)
    for edge in (torch.zeros(2, 2, dtype=DT), torch.zeros(0, 2, 2, 2, dtype=DT)):
        pot = bp.ChainPotentials(torch.zeros(0, 3, 2, dtype=DT), edge)
        chain = bp.LinearChain()
        mu = chain.marginals(pot)
        assert mu.node.shape == (0, 3, 2) and mu.edge.shape == (0, 2, 2, 2) and mu.log_partition.shape == (0,)
        assert chain.entropy(mu).shape == (0,) and chain.log_partition(pot).shape == (0,)
        assert chain.map(pot).shape == (0, 3)


@pytest.mark.parametrize("dtype, big", HUGE)
@pytest.mark.parametrize("oracle, parents", [(bp.LinearChain(), None), (bp.Tree([-1, 0, 1]), [-1, 0, 1])],
                         ids=["chain", "tree"])
def test_log_space_path_keeps_the_log_sums_of_labellings_that_all_pay_one_huge_penalty(oracle, parents, dtype, big):
    # labellings (0, 0), (0, 1) and (1, 1) of positions 0-1 score exactly -P, position 2 is independent with scores
    # [0, 1]: lse(-P, -P) = -P + log 2 rounded to -P gave [0.5, 0.5] at every position (chain and tree alike)
    node = torch.tensor([[[0.0, -big], [-big, 0.0], [0.0, 1.0]]], dtype=dtype)
    edge = torch.tensor([[[[0.0, -big], [-big, 0.0]], [[0.0, 0.0], [0.0, 0.0]]]], dtype=dtype)
    pot = bp.ChainPotentials(node, edge)
    e = math.e
    closed = torch.tensor([[2 / 3, 1 / 3], [1 / 3, 2 / 3], [1 / (1 + e), e / (1 + e)]], dtype=torch.float64)
    assert torch.allclose(oracle.marginals(pot).node[0].double(), closed, atol=TOL[dtype], rtol=0)
    assert_exact(oracle, pot, *([] if parents is None else [parents]))


@pytest.mark.parametrize("dtype, big", HUGE)
def test_log_space_path_keeps_o1_scores_beside_huge_penalties(dtype, big):
    # -P + 0.3 rounds to -P: the O(1) scores of a label that trails the best one by P were lost, and they count
    # once the best one pays P too.  Viterbi's running sums still round them (the MAP is not checked here)
    for seed in range(10):
        assert_exact(bp.LinearChain(), penalised(5, 2 + seed % 2, big, dtype, seed), map_too=False)


@pytest.mark.parametrize("dtype, big", HUGE + [(torch.float64, 1e15)])
def test_huge_shifts_that_cancel_leave_log_z_its_o1_part(dtype, big):
    # the per-position and per-table maxima were summed plainly (both paths): 1e15 + 0.3 rounds to a multiple of
    # 0.125 before -1e15 comes in, and log Z (O(1) here) was off by up to the spacing of the shifts
    from betheproj.oracles.chain import _log_forward_backward

    for seed in range(10):
        pot = cancelling(5, 2 + seed % 2, big, dtype, seed)
        assert_exact(bp.LinearChain(), pot, map_too=False, log_z_atol=two_part_atol(dtype, big))
        ref = bp.BruteForce().marginals(pot).log_partition
        assert abs(float(_log_forward_backward(pot)[1][0] - ref[0])) <= two_part_atol(dtype, big)


@pytest.mark.parametrize("dtype, gap, lift", [(torch.float64, 750.0, 656.0), (torch.float32, 110.0, 60.0)])
def test_an_underflowed_alpha_or_beta_is_recomputed(dtype, gap, lift):
    # exp(-gap) underflows to 0 in the fast path's node factor, so alpha (example 0) or beta (example 1) is 0 where
    # the exact value is positive; the marginal e^(lift-gap) / (1 + e^(lift-gap)) is a normal number, and a count
    # on it made the solver's objective infinite
    node = torch.tensor([[[0.0, 0.0], [0.0, -gap], [0.0, 0.0]], [[0.0, lift], [0.0, -gap], [0.0, 0.0]]], dtype=dtype)
    edge = torch.zeros(2, 2, 2, 2, dtype=dtype)
    edge[0, 1, 1] = lift                                             # example 0: lifted by the edge after it
    edge[1, 0] = torch.tensor([[0.0, -INF], [-INF, 0.0]])            # example 1: by the node before it
    pot = bp.ChainPotentials(node, edge, torch.tensor([3, 2]))
    r = math.exp(lift - gap)
    assert r > torch.finfo(dtype).tiny
    mu = bp.LinearChain().marginals(pot)
    for got in (mu.node[0, 1, 1], mu.node[1, 0, 1], mu.node[1, 1, 1]):
        assert math.isclose(float(got), r / (1 + r), rel_tol=1e-5)
    counts = torch.zeros(2, 3, 2, dtype=dtype)
    counts[0, 1, 1] = counts[1, 0, 1] = 1.0
    out = bp.solve(bp.LinearChain(), pot, Poisson(counts, rate=1.0, scale=1.0), max_iter=50)
    assert bool(torch.isfinite(out.objective).all())


def _underflowed_product(dtype, g, h):
    # label 1 at position 1: p_1(1) = beta_1(1) ~ e^-g (its node score and every transition out of it), so the
    # edge marginals' factor v_1(1) = p_1(1) beta_1(1) ~ e^-2g underflows; every path into label 0 pays h, so
    # z_0 ~ e^-h and xi_0(2, 1) ~ e^(h - 2g), a normal number.  Position 0 is forced to label 2
    node = torch.tensor([[[-INF, -INF, 0.0], [0.0, -g, -INF], [0.0, 0.0, 0.0]]], dtype=dtype)
    edge = torch.tensor([[0.0, 0.0, 0.0], [-g, -g, -g], [-h, 0.0, -h]], dtype=dtype)
    return node, edge


def _underflowed_transition(dtype, g, h):
    # position 0: label 1, or label 2 at e^-(h + 16); each path into position 1 pays h but 1 -> 1 pays g, whose
    # factor e^-g underflows: xi_0(1, 1) ~ e^(h - g) is a normal number (label 2 keeps alpha_1(1) positive)
    node = torch.tensor([[[-INF, 0.0, -h - 16.0], [0.0, 0.0, -INF]]], dtype=dtype)
    edge = torch.tensor([[0.0, 0.0, 0.0], [-h, -g, -INF], [-INF, 0.0, -INF]], dtype=dtype)
    return node, edge


@pytest.mark.parametrize("make, dtype, g, h", [
    (_underflowed_product, torch.float32, 57.5, 64.0),             # v = e^-115: 0
    (_underflowed_product, torch.float32, 50.0, 60.0),             # e^-100: a subnormal, 0.4% off
    (_underflowed_product, torch.float64, 380.0, 660.0),
    (_underflowed_product, torch.float64, 360.0, 660.0),           # e^-720: a subnormal, 5e-12 off
    (_underflowed_transition, torch.float32, 110.0, 64.0),         # M = e^-110: 0
    (_underflowed_transition, torch.float32, 95.0, 64.0),          # e^-95: a subnormal, 6e-6 off
    (_underflowed_transition, torch.float64, 760.0, 660.0),
], ids=lambda x: getattr(x, "__name__", None))
@pytest.mark.parametrize("layout", ["shared", "per-example", "per-position"])
def test_an_edge_marginal_on_an_underflowed_factor_is_recomputed(make, dtype, g, h, layout):
    # the fast path's edge marginal (alpha_t / z_t) v_{t+1} M rests on a factor that underflowed (v or M), and came
    # back as 0 (or with the digits that factor lost as a subnormal) while its value, 1e-20 or so, is a normal
    # number; the node marginals were right, so the nodes' checks kept the example on the fast path
    node, edge = make(dtype, g, h)
    ref = bp.BruteForce().marginals(bp.ChainPotentials(node.double(), edge.double()))
    tiny = torch.finfo(dtype).tiny
    assert float(ref.edge[ref.edge < 1e-10].max()) > 1e3 * tiny
    n = node.shape[1]
    edges = {"shared": edge, "per-example": edge[None, None].expand(1, n - 1, 3, 3),
             "per-position": edge[None, None].repeat(1, n - 1, 1, 1)}[layout]
    mu = bp.LinearChain().marginals(bp.ChainPotentials(node, edges))
    rtol = 1e-6 if dtype == torch.float32 else 1e-13
    assert torch.allclose(mu.node.double(), ref.node, rtol=rtol, atol=tiny)
    assert torch.allclose(mu.edge.double(), ref.edge, rtol=rtol, atol=tiny)
    assert torch.allclose(mu.edge_total().double(), ref.edge.sum(1), rtol=rtol, atol=tiny)
    if layout == "shared":
        assert torch.allclose(mu.edge_sum(torch.ones(1, dtype=dtype)).double(), ref.edge.sum((0, 1)), rtol=rtol,
                              atol=tiny)


@pytest.mark.parametrize("layout", ["shared", "per-example", "per-position"])
def test_underflowed_factors_that_cannot_matter_are_ruled_out_without_estimating_the_tables(monkeypatch, layout):
    # M(2, 1) = e^-710 is below float64's tiny, but the edge marginal through it is ~e^-731 (alpha(2) ~ e^-41): the
    # bound by row (alpha(2) with row 2's lost factor) rules it out, as the bound with the lost factor alone did not
    # (1 / z_t ~ e^20 here): every call then estimated every entry of the [C, C] tables, ten times the recursion's
    # work for the bird migration's 1,024 cells (8.5 s against 0.8 s at s = 1,048,576)
    import betheproj.oracles.chain as chain_module

    estimated = []
    lost_edge = chain_module._lost_edge

    def spy(alpha, p, beta, v, z, m_lost, transitions, mask):
        def recorded(k):
            estimated.append(k.tolist())
            return transitions(k)
        return lost_edge(alpha, p, beta, v, z, m_lost, recorded, mask)

    monkeypatch.setattr(chain_module, "_lost_edge", spy)
    node = torch.tensor([[[0.0, 0.0, -40.0], [-30.0, 0.0, -30.0]]], dtype=DT)
    edge = torch.tensor([[0.0, -20.0, 0.0], [0.0, -20.0, 0.0], [0.0, -710.0, 0.0]], dtype=DT)
    edges = {"shared": edge, "per-example": edge[None, None].expand(1, 1, 3, 3),
             "per-position": edge[None, None].clone()}[layout]
    mu = bp.LinearChain().marginals(bp.ChainPotentials(node, edges))
    ref = bp.BruteForce().marginals(bp.ChainPotentials(node, edge))
    assert torch.allclose(mu.node, ref.node, rtol=1e-13, atol=0)
    assert torch.allclose(mu.edge, ref.edge, rtol=1e-13, atol=0)
    assert estimated == []


@pytest.mark.parametrize("layout", ["shared", "per-example", "per-position"])
def test_viterbi_shifts_each_table_once_and_recentres_without_a_maximum_per_position(monkeypatch, layout):
    # Viterbi's shifts are exact but cost: per-example (stride-0) edges shifted as the full [B, N-1, C, C] view
    # materialised it (3.4x the decode at C = 500, as 1.5x at C = 50), and the running score re-centred by
    # _finite_max at every position (three kernels each, 1.3x at C = 5); the same labels either way
    import betheproj.oracles.chain as chain_module

    shapes = record_shapes(monkeypatch, chain_module, "_finite_max")
    gen = torch.Generator().manual_seed(0)
    b, n, c = 3, 7, 4
    node = 1e4 * torch.randn(b, n, c, generator=gen, dtype=DT)
    table = 1e4 * torch.randn(b, c, c, generator=gen, dtype=DT)
    edges = {"shared": table[0], "per-example": table[:, None].expand(b, n - 1, c, c),
             "per-position": table[:, None].repeat(1, n - 1, 1, 1)}[layout]
    lengths = torch.tensor([n, 4, 1])
    labels = bp.LinearChain().map(bp.ChainPotentials(node, edges, lengths))
    ref = bp.BruteForce().map(bp.ChainPotentials(node, table[:, None].expand(b, n - 1, c, c), lengths))
    assert torch.equal(labels, ref)
    assert len(shapes) == 2                       # node scores and edge tables, once each
    if layout == "per-example":
        assert shapes[1] == (b, 1, c, c)          # one table per example, not every position's view of it


def _pair_state_chain(layout, lengths):
    # a second-order chain over two labels as a first-order one over pair states (y_{t-1}, y_t), START = 2: the
    # states (START, y) only at position 0 (the others' node score -inf there), a transition (a, b) -> (b', c) only
    # where b = b'; no state is reachable at every position, so the fast path's marginals hold exact zeros
    states = [(2, 0), (2, 1), (0, 0), (0, 1), (1, 0), (1, 1)]
    gen = torch.Generator().manual_seed(1)
    b, n, c = len(lengths), int(max(lengths)), len(states)
    node = torch.randn(b, n, c, generator=gen, dtype=DT)
    node[:, 0, 2:] = -INF
    allowed = torch.tensor([[s[1] == t[0] for t in states] for s in states])
    table = torch.where(allowed, torch.randn(b, c, c, generator=gen, dtype=DT), -INF)
    edges = {"shared": table[0], "per-example": table[:, None].expand(b, n - 1, c, c),
             "per-position": torch.where(allowed, torch.randn(b, n - 1, c, c, generator=gen, dtype=DT), -INF)}
    return bp.ChainPotentials(node, edges[layout], torch.tensor(lengths))


@pytest.mark.parametrize("layout", ["shared", "per-example", "per-position"])
def test_reachable_labels_are_the_support_of_the_exact_marginals(layout):
    import betheproj.oracles.chain as chain_module
    from betheproj.oracles.base import _valid_node

    pot = _pair_state_chain(layout, [4, 2, 1, 3])
    ref = bp.BruteForce().marginals(pot)
    node, valid = _valid_node(pot)
    table = pot.edge[:, 0] if layout == "per-example" else pot.edge
    reach = chain_module._reachable(node, table, pot.lengths).transpose(0, 1)
    assert torch.equal(reach & valid[..., None], (ref.node > 0) & valid[..., None])
    # a forbidden label inside an example (node -inf) and a dead end at its last position
    pot.node[0, 2, 3] = -INF
    ref = bp.BruteForce().marginals(pot)
    node, _ = _valid_node(pot)
    reach = chain_module._reachable(node, table, pot.lengths).transpose(0, 1)
    assert torch.equal(reach & valid[..., None], (ref.node > 0) & valid[..., None])


@pytest.mark.parametrize("layout", ["shared", "per-example", "per-position"])
def test_unreachable_labels_skip_the_estimate_through_the_transitions(monkeypatch, layout):
    # a 0 marginal of a label that no finite labelling passes through is exact: the checks for lost marginals used to
    # estimate it in log space through the [C, C] tables at every position (O(N B C^2) with a maximum per entry: 25
    # times the recursion's cost for a second-order chain over 621 pair states), and now leave it out
    import betheproj.oracles.chain as chain_module

    through_tables = []
    lost_marginal = chain_module._lost_marginal

    def spy(alpha, beta, s, r, d, node, edge, lengths, reach):
        through_tables.append(lengths.tolist())
        return lost_marginal(alpha, beta, s, r, d, node, edge, lengths, reach)

    monkeypatch.setattr(chain_module, "_lost_marginal", spy)
    pot = _pair_state_chain(layout, [4, 2, 1, 3])
    _assert_matches_brute_force(pot, atol=1e-12)
    assert bool((bp.LinearChain().marginals(pot).node == 0).any())
    assert through_tables == []


def _dense_cheap_estimate(alpha, beta, s, r, d, node, lengths, mask):
    # the first check's estimate as a pass over all of alpha and beta [N, B, C], as it was computed before it was read
    # at the zero products only: every transition factor and neighbour taken as 1; ``mask`` the entries it reads
    n, c = alpha.shape[0], alpha.shape[-1]
    log_p = (node - node.amax(-1, keepdim=True).nan_to_num(0.0, 0.0, 0.0)).transpose(0, 1)
    tiny = torch.finfo(alpha.dtype).tiny
    log_a = torch.where(alpha > 0, torch.log(alpha.clamp_min(tiny)), log_p - torch.log(s / c)[..., None])
    log_b = torch.where(beta > 0, torch.log(beta.clamp_min(tiny)), -torch.log(r / c)[..., None])
    valid = (torch.arange(n)[:, None] < lengths)[..., None]
    lost = torch.where(valid & mask, log_a + log_b - torch.log(d)[..., None], -INF)
    return lost.amax(-1).amax(0)


@pytest.mark.parametrize("scale", [3.0, 300.0, 3000.0])
def test_the_cheap_check_read_at_the_zeros_equals_the_dense_one(monkeypatch, scale):
    # the first check for lost marginals reads alpha and beta at the zero products only; it must give what a dense
    # pass over all of them gives, with forbidden labels and transitions, scores large enough to underflow, and
    # examples of different lengths; its first call must see every zero product
    import betheproj.oracles.chain as chain_module

    seen = []
    lost_at = chain_module._lost_at

    def spy(alpha, beta, s, r, d, node, node_max, lengths, at):
        sparse = lost_at(alpha, beta, s, r, d, node, node_max, lengths, at)
        mask = torch.zeros_like(alpha, dtype=torch.bool)
        mask[at] = True
        if not seen or seen[-1][0] is not alpha:                # the first call of a marginals() call
            assert torch.equal(mask, alpha * beta == 0)
        dense = _dense_cheap_estimate(alpha, beta, s, r, d, node, lengths, mask)
        seen.append((alpha, bool(torch.isfinite(dense).any())))
        torch.testing.assert_close(sparse, dense, rtol=0, atol=0, equal_nan=True)     # NaN: mass all lost, both
        return sparse

    monkeypatch.setattr(chain_module, "_lost_at", spy)
    gen = torch.Generator().manual_seed(int(scale))
    for _ in range(6):
        b, n, c = 7, 9, 5
        node = scale * torch.randn(b, n, c, generator=gen, dtype=torch.float64)
        edge = scale * torch.randn(c, c, generator=gen, dtype=torch.float64)
        node[torch.rand(b, n, c, generator=gen) < 0.15] = -INF
        edge[torch.rand(c, c, generator=gen) < 0.3] = -INF
        node[:, :, 0] = node[:, :, 0].clamp_min(-scale)             # label 0 keeps every position alive
        edge[0, 0] = 0.0
        lengths = torch.randint(1, n + 1, (b,), generator=gen)
        lengths[0] = n
        pot = bp.ChainPotentials(node, edge, lengths)
        assert torch.isfinite(bp.LinearChain().marginals(pot).node).all()
    assert seen and any(finite for _, finite in seen)     # zeros were there, and some were estimated as finite


def test_a_bio_chain_with_forbidden_transitions_stays_on_the_fast_path(monkeypatch):
    # the common forbidden structure (I-f only after B-f or I-f, never first): its zeros are exact, and the cheap
    # check must see that without the estimate through the tables, the support passes or the log-space recursion
    import betheproj.oracles.chain as chain_module

    calls = []
    def spy(name):
        real = getattr(chain_module, name)

        def called(*args, **kwargs):
            calls.append(name)
            return real(*args, **kwargs)
        return called

    for name in ("_lost_marginal", "_reachable", "_log_forward_backward"):
        monkeypatch.setattr(chain_module, name, spy(name))
    fields, b, n = 3, 4, 6
    c = 2 * fields + 1
    gen = torch.Generator().manual_seed(7)
    node = 2 * torch.randn(b, n, c, generator=gen, dtype=torch.float64)
    node[:, 0, fields + 1:] = -INF
    allowed = torch.ones(c, c, dtype=torch.bool)
    inside = torch.arange(fields + 1, c)
    allowed[:, inside] = False
    allowed[inside - fields, inside] = True
    allowed[inside, inside] = True
    edge = torch.where(allowed, torch.randn(c, c, generator=gen, dtype=torch.float64), -INF)
    pot = bp.ChainPotentials(node, edge, torch.tensor([6, 4, 1, 5]))
    marg = bp.LinearChain().marginals(pot)
    assert calls == []
    assert bool((marg.node[:, 0, fields + 1:] == 0).all())
    _assert_matches_brute_force(pot, atol=1e-12)
