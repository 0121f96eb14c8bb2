"""Input validation of potentials: clear errors naming the argument."""

import math

import pytest
import torch

import betheproj as bp
from betheproj.oracles.base import log_partition

DT = torch.float64


def _ok(b=2, n=4, c=3):
    return torch.randn(b, n, c, dtype=DT), torch.randn(b, n - 1, c, c, dtype=DT)


@pytest.mark.parametrize("make, exc, msg", [
    (lambda: bp.ChainPotentials(torch.randn(2, 4, 3, dtype=DT), torch.randn(2, 4, 3, 3, dtype=DT)), ValueError,
     r"edge must be \[B, N-1, C, C\]"),
    (lambda: bp.ChainPotentials(torch.randn(2, 4, 3, dtype=DT), torch.randn(3, 4, dtype=DT)), ValueError,
     r"edge must be \[C, C\]"),
    (lambda: bp.ChainPotentials(torch.randn(4, 3, dtype=DT), torch.randn(3, 3, dtype=DT)), ValueError,
     "node must be 3-D"),
    (lambda: bp.ChainPotentials(torch.randn(2, 4, 0, dtype=DT), torch.randn(0, 0, dtype=DT)), ValueError,
     "empty label set"),
    (lambda: bp.ChainPotentials(torch.randn(2, 0, 3, dtype=DT), torch.randn(3, 3, dtype=DT)), ValueError,
     "no positions"),
    (lambda: bp.ChainPotentials(torch.full((2, 4, 3), float("nan"), dtype=DT), torch.randn(3, 3, dtype=DT)),
     ValueError, "node contains NaN"),
    (lambda: bp.ChainPotentials(torch.randn(2, 4, 3, dtype=DT), torch.full((3, 3), float("inf"), dtype=DT)),
     ValueError, r"edge contains \+inf"),
    (lambda: bp.ChainPotentials(torch.zeros(2, 4, 3, dtype=torch.long), torch.zeros(3, 3)), TypeError,
     "node must be a float32 or float64 tensor"),
    (lambda: bp.ChainPotentials(torch.zeros(2, 4, 3, dtype=torch.float16), torch.zeros(3, 3, dtype=torch.float16)),
     TypeError, "node must be a float32 or float64 tensor"),
    (lambda: bp.ChainPotentials(*_ok(), lengths=[None, 1]), TypeError, "lengths must be an integer tensor"),
    (lambda: bp.ChainPotentials(*_ok(), lengths="ab"), TypeError, "lengths must be an integer tensor"),
    (lambda: bp.ChainPotentials(torch.randn(2, 4, 3), torch.randn(3, 3, dtype=DT)), TypeError, "dtype"),
    (lambda: bp.ChainPotentials(*_ok(), lengths=torch.tensor([5, 2])), ValueError, r"lengths must lie in \[1, N\]"),
    (lambda: bp.ChainPotentials(*_ok(), lengths=torch.tensor([0, 2])), ValueError, r"lengths must lie in \[1, N\]"),
    (lambda: bp.ChainPotentials(*_ok(), lengths=torch.tensor([2])), ValueError, r"lengths must have shape \[B\]"),
    (lambda: bp.ChainPotentials(*_ok(), lengths=torch.tensor([2.0, 1.0])), TypeError, "integer"),
    (lambda: bp.ChainPotentials([[0.0]], torch.randn(1, 1)), TypeError, "node must be a torch.Tensor"),
])
def test_bad_potentials(make, exc, msg):
    with pytest.raises(exc, match=msg):
        make()


def test_marginals_reject_other_types():
    with pytest.raises(TypeError, match="potentials must be"):
        bp.LinearChain().marginals(torch.randn(2, 3, 4))
    node, edge = _ok()
    for call in (bp.BruteForce().marginals, bp.BruteForce().map, bp.BruteForce().exact_entropy,
                 lambda p: log_partition(bp.LinearChain(), p)):
        with pytest.raises(TypeError, match="potentials must be PairwisePotentials/ChainPotentials, got tuple"):
            call((node, edge))
    for oracle in (bp.LinearChain(), bp.BruteForce()):
        with pytest.raises(TypeError, match="marginals must be Marginals"):
            oracle.entropy(node)


@pytest.mark.parametrize("oracle", [bp.LinearChain(), bp.Tree([-1, 0, 1, 2]), bp.BruteForce()])
def test_overflow_is_told_apart_from_infeasibility(oracle):
    """float32 scores whose sum overflows give +inf log Z: an overflow error, not "no labelling"."""
    node = torch.zeros(2, 4, 2)
    node[1, :, 0] = 1e38
    pot = bp.ChainPotentials(node, torch.zeros(2, 2))
    with pytest.raises(ValueError, match=r"scores overflow float32 .* or use float64\) for examples \[1\]"):
        oracle.marginals(pot)
    big = bp.ChainPotentials(node.double() * 1e270, torch.zeros(2, 2, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"scores overflow float64 \(log Z or a best score is not finite; rescale "
                                         r"them\) for examples \[1\]"):           # it said "or use float64"
        oracle.marginals(big)
    node[1, :, 0] = 0.0
    edge = torch.zeros(2, 3, 2, 2)
    edge[1, 1] = -float("inf")
    with pytest.raises(ValueError, match=r"no labelling of finite score .* for examples \[1\]"):
        oracle.marginals(bp.ChainPotentials(node, edge))


def test_shared_edge_expands():
    node, _ = _ok()
    pot = bp.ChainPotentials(node, torch.randn(3, 3, dtype=DT))
    assert pot.shared_edge and pot.full_edge().shape == (2, 3, 3, 3)


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("oracle", [bp.LinearChain(), bp.Tree([-1, 0, 1, 1, 2]), bp.BruteForce()])
def test_log_partition_gradient_is_the_marginals(oracle, shared):
    node = torch.randn(3, 5, 3, dtype=DT, requires_grad=True)
    edge = torch.randn(*((3, 3) if shared else (3, 4, 3, 3)), dtype=DT, requires_grad=True)
    lengths = torch.tensor([5, 3, 1])
    assert torch.autograd.gradcheck(lambda n, e: oracle.log_partition(bp.ChainPotentials(n, e, lengths)),
                                    (node, edge))
    ref = bp.BruteForce([-1, 0, 1, 1, 2] if isinstance(oracle, bp.Tree) else None)
    mu = ref.marginals(bp.ChainPotentials(node.detach(), edge.detach(), lengths))
    (g_node,) = torch.autograd.grad(oracle.log_partition(bp.ChainPotentials(node, edge, lengths)).sum(), node)
    assert torch.allclose(g_node, mu.node, atol=1e-10)


def test_log_partition_gradient_with_forbidden_entries_is_finite():
    node = torch.randn(2, 4, 3, dtype=DT)
    edge = torch.randn(3, 3, dtype=DT)
    edge[0, 1] = -float("inf")
    edge.requires_grad_(True)
    bp.LinearChain().log_partition(bp.ChainPotentials(node, edge)).sum().backward()
    assert torch.isfinite(edge.grad).all() and edge.grad[0, 1] == 0


def test_brute_force_map_and_entropy_raise_when_no_labelling_is_finite():
    pot = bp.ChainPotentials(torch.zeros(1, 2, 2, dtype=DT), torch.full((2, 2), -float("inf"), dtype=DT))
    for call in (bp.BruteForce().map, bp.BruteForce().exact_entropy, bp.BruteForce().marginals):
        with pytest.raises(ValueError, match="no labelling"):
            call(pot)


def test_to_converts_dtype_and_keeps_lengths_and_shared_edges():
    node, edge = torch.randn(2, 4, 3, dtype=DT), torch.randn(3, 3, dtype=DT)
    edge[0, 1] = -torch.inf
    pot = bp.ChainPotentials(node, edge, torch.tensor([4, 2]))
    assert pot.to("cpu") is pot and pot.to(dtype=DT) is pot
    low = pot.to(dtype=torch.float32)
    assert low.node.dtype == low.edge.dtype == torch.float32 and low.shared_edge
    assert torch.equal(low.lengths, pot.lengths) and low.edge[0, 1] == -torch.inf
    assert torch.allclose(bp.LinearChain().marginals(low).node.double(), bp.LinearChain().marginals(pot).node,
                          atol=1e-5)
    with pytest.raises(TypeError, match="node must be a float32 or float64 tensor"):
        pot.to(dtype=torch.float16)


def test_to_float32_refuses_scores_beyond_its_range():
    node, edge = _ok()
    node[1, 2, 0] = -1e39                          # finite in float64, -inf in float32
    with pytest.raises(ValueError, match="node holds finite scores beyond the range of torch.float32"):
        bp.ChainPotentials(node, edge).to(dtype=torch.float32)
    node[1, 2, 0], edge[0, 1, 2, 2] = 0.0, 1e40
    with pytest.raises(ValueError, match="edge holds finite scores beyond the range of torch.float32"):
        bp.ChainPotentials(node, edge).to(dtype=torch.float32)


@pytest.mark.parametrize("oracle", [bp.LinearChain(), bp.Tree([-1, 0, 0, 1]), bp.NonProjective(), bp.Projective()])
def test_second_derivatives_of_log_z_are_an_error_not_zero(oracle):
    """log Z's gradient comes from the oracle: differentiated again it read as 0 (a Hessian of zeros from
    torch.autograd.functional.hessian, where the truth is the marginals' covariance)."""
    gen = torch.Generator().manual_seed(0)
    node = torch.randn(2, 4, 5 if isinstance(oracle, (bp.NonProjective, bp.Projective)) else 3, generator=gen,
                       dtype=torch.float64)
    edge = torch.zeros(node.shape[-1], node.shape[-1], dtype=torch.float64)
    value = lambda n: oracle.log_partition(bp.PairwisePotentials(n, edge)).sum()          # noqa: E731
    with pytest.raises(RuntimeError, match="second derivatives of log Z are not implemented"):
        torch.autograd.functional.hessian(value, node)
    x = node.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(value(x), x, create_graph=True)                   # first order alone still works
    assert torch.allclose(g, oracle.marginals(bp.PairwisePotentials(node, edge)).node, atol=1e-12)


def test_detach_cuts_the_graph_and_keeps_values():
    node, edge = torch.randn(2, 3, 4, requires_grad=True), torch.randn(4, 4)
    pot = bp.PairwisePotentials(node, edge, torch.tensor([3, 2]))
    cut = pot.detach()
    assert not cut.node.requires_grad and torch.equal(cut.node, node) and torch.equal(cut.lengths, pot.lengths)
    assert cut.edge is pot.edge                                  # nothing to cut there
    plain = bp.PairwisePotentials(torch.randn(2, 3, 4), edge)
    assert plain.detach() is plain


def test_bethe_entropy_is_the_same_with_and_without_a_gradient_and_its_gradient_is_finite_at_zero():
    """Without autograd ``p log p`` is one ``xlogy`` (edge-sized marginals: two passes, not six); with it the masked
    form whose gradient at an exact 0 is finite (``xlogy``'s is ``-inf``).  Both give 0 at 0 and at rounding-level
    negative entries, and the same value at subnormal ones to far below any entropy's rounding."""
    from betheproj.oracles.base import bethe_entropy

    node = torch.tensor([[[0.5, 0.5, 0.0], [0.25, 0.75, -1e-300], [1.0, 5e-324, 0.0]]], dtype=DT)
    edge = torch.tensor([[[[0.25, 0.25, 0.0], [0.0, 0.5, 0.0], [0.0, 0.0, 0.0]],
                          [[0.25, 0.0, 0.0], [0.75, 0.0, 0.0], [0.0, 0.0, 1e-310]]]], dtype=DT)
    degree = torch.tensor([[1, 2, 1]])
    plain = bethe_entropy(node, edge, degree)
    leaves = node.clone().requires_grad_(True), edge.clone().requires_grad_(True)
    tracked = bethe_entropy(*leaves, degree)
    h_edges = -3 * 0.25 * math.log(0.25) - 0.5 * math.log(0.5) - 0.75 * math.log(0.75)
    expected = h_edges - (-0.25 * math.log(0.25) - 0.75 * math.log(0.75))        # the middle node has degree 2
    assert torch.allclose(plain, torch.tensor([expected], dtype=DT), rtol=1e-15, atol=0)
    assert torch.allclose(tracked.detach(), plain, rtol=1e-15, atol=0)
    tracked.sum().backward()
    assert all(torch.isfinite(x.grad).all() for x in leaves)


def test_edge_total_sums_each_examples_valid_positions_and_ignores_padding():
    """Marginals without oracle-provided totals sum their per-position edges over each example's valid positions (one
    matrix product with the mask): padding, even non-zero, is left out, and a chain of one position has none."""
    edge = torch.rand(3, 4, 2, 2, dtype=DT)
    m = bp.Marginals(torch.rand(3, 5, 2, dtype=DT), edge, None, torch.tensor([5, 2, 1]))
    expected = torch.stack([edge[0].sum(0), edge[1, :1].sum(0), torch.zeros(2, 2, dtype=DT)])
    torch.testing.assert_close(m.edge_total(), expected, rtol=1e-15, atol=0)
    single = bp.Marginals(torch.rand(2, 1, 3, dtype=DT), torch.zeros(2, 0, 3, 3, dtype=DT), None, torch.tensor([1, 1]))
    assert torch.equal(single.edge_total(), torch.zeros(2, 3, 3, dtype=DT))


def test_entropy_helpers_and_degree_name_an_argument_of_the_wrong_type():
    from betheproj.oracles import bethe_entropy, edge_row_ends

    mu = bp.LinearChain().marginals(bp.ChainPotentials(torch.randn(2, 3, 4, dtype=torch.float64),
                                                       torch.randn(4, 4, dtype=torch.float64), torch.tensor([3, 2])))
    degree = bp.LinearChain().degree(mu.lengths, 3)
    assert torch.equal(bethe_entropy(mu.node, mu.edge, degree), bp.LinearChain().entropy(mu))
    with pytest.raises(TypeError, match="^edge must be a tensor, got NoneType"):
        bethe_entropy(mu.node, None, degree)
    with pytest.raises(ValueError, match=r"^node \[B, N, C\], edge \[B, E, C, C\] and degree \[B, N\] must agree"):
        bethe_entropy(mu.node, mu.edge, degree[:, :2])
    assert torch.equal(edge_row_ends(mu.node, None), mu.node[:, :-1])
    assert torch.equal(edge_row_ends(mu.node, torch.tensor([-1, 0, 0])), mu.node[:, [0, 0]])
    with pytest.raises(TypeError, match=r"^x must be a tensor \[B, N, ...\], got str"):
        edge_row_ends("x", None)
    with pytest.raises(TypeError, match="^parents must be None or an integer tensor"):
        edge_row_ends(mu.node, torch.zeros(3))
    with pytest.raises(ValueError, match=r"^parents must be \[N\] with N = 3"):
        edge_row_ends(mu.node, torch.tensor([-1, 0]))
    for oracle in (bp.LinearChain(), bp.Tree([-1, 0, 0]), bp.BruteForce(), bp.NonProjective()):
        with pytest.raises(TypeError, match="^lengths must be an integer tensor"):
            oracle.degree([3, 2], 3)
        with pytest.raises(TypeError, match="^lengths must be an integer tensor"):
            oracle.degree(torch.tensor([3.0, 2.0]), 3)
        with pytest.raises(TypeError, match="^n must be an int"):
            oracle.degree(torch.tensor([3, 2]), 3.0)
        with pytest.raises(ValueError, match="^n must be an int >= 0, got -1$"):
            oracle.degree(torch.tensor([3, 2]), -1)
