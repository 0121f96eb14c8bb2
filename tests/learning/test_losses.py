"""The loss family L_{beta,gamma} (Turbo Parsers, Figure 4, eq. 22) against brute-force enumeration."""

import math

import pytest
import torch

import betheproj as bp
from betheproj.learning import crf_nll, sequence_score
from betheproj.learning.losses import LOSSES, loss_and_gradient, resolve_loss, structured_loss
from tests.trees import reaches_root

DT = torch.float64
INF = math.inf


def _problem(seed=0, b=3, n=4, c=3, shared=False, scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    node = torch.randn(b, n, c, generator=gen, dtype=DT) * scale
    shape = (c, c) if shared else (b, n - 1, c, c)
    edge = torch.randn(*shape, generator=gen, dtype=DT)
    lengths = torch.tensor([n, n - 1, 1][:b])
    gold = torch.randint(0, c, (b, n), generator=gen)
    gold[torch.arange(n) >= lengths[:, None]] = -1
    return bp.ChainPotentials(node, edge * scale, lengths), gold


STAR = [-1, 0, 0, 1]          # a tree that is no chain: edge k couples STAR[k+1] with k+1


def _oracle(parents):
    return bp.LinearChain() if parents is None else bp.Tree(parents)


def _brute(pot, gold, beta, gamma, parents=None):
    out = []
    for b in range(pot.node.shape[0]):
        ys, score = bp.BruteForce(parents)._joint(pot, b)
        y = gold[b, : ys.shape[1]]
        s_gold = score[(ys == y).all(1)].item()
        cost = (ys != y).sum(1).to(DT)
        arg = score - s_gold + gamma * cost
        out.append(arg.max() if math.isinf(beta) else torch.logsumexp(beta * arg, 0) / beta)
    return torch.stack(out)


@pytest.mark.parametrize("beta,gamma", [(1.0, 0.0), (1.0, 1.0), (0.5, 2.0), (3.0, 0.5), (INF, 1.0), (INF, 0.0),
                                        (INF, 2.5)])
@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("parents", [None, STAR], ids=["chain", "tree"])
def test_loss_matches_brute_force(beta, gamma, shared, parents):
    pot, gold = _problem(shared=shared)
    expected = _brute(pot, gold, beta, gamma, parents)
    got = structured_loss(_oracle(parents), pot, gold, beta, gamma)
    assert torch.allclose(got, expected, atol=1e-10)
    lg = loss_and_gradient(_oracle(parents), pot, gold, beta, gamma)
    assert torch.allclose(lg.loss, expected, atol=1e-10)
    assert (lg.prediction is not None) == math.isinf(beta)


@pytest.mark.parametrize("beta,gamma", [(1.0, 0.0), (1.0, 1.0), (0.7, 2.0), (4.0, 0.3)])
def test_gradient_against_finite_differences(beta, gamma):
    pot, gold = _problem(seed=1)
    node = pot.node.clone().requires_grad_(True)
    edge = pot.edge.clone().requires_grad_(True)
    assert torch.autograd.gradcheck(
        lambda n, e: structured_loss(bp.LinearChain(), bp.ChainPotentials(n, e, pot.lengths), gold, beta, gamma),
        (node, edge))


@pytest.mark.parametrize("beta,gamma", [(1.0, 1.0), (2.0, 0.0), (INF, 1.0), (INF, 0.0)])
@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("parents", [None, STAR], ids=["chain", "tree"])
def test_explicit_gradient_equals_autograd(beta, gamma, shared, parents):
    pot, gold = _problem(seed=2, shared=shared)
    node = pot.node.clone().requires_grad_(True)
    edge = pot.edge.clone().requires_grad_(True)
    structured_loss(_oracle(parents), bp.ChainPotentials(node, edge, pot.lengths), gold, beta, gamma).sum().backward()
    lg = loss_and_gradient(_oracle(parents), pot, gold, beta, gamma)
    assert torch.allclose(lg.node, node.grad, atol=1e-10)
    assert torch.allclose(lg.edge, edge.grad, atol=1e-10)
    valid = torch.arange(4) < pot.lengths[:, None]
    assert (lg.node[~valid] == 0).all()
    if math.isinf(beta):                 # subgradient S(y_hat) - S(y) at the cost-augmented MAP
        assert set(lg.node.unique().tolist()) <= {-1.0, 0.0, 1.0}


def test_presets_and_their_properties():
    pot, gold = _problem(seed=3)
    oracle = bp.LinearChain()
    assert resolve_loss("crf") == (1.0, 0.0) and resolve_loss("svm") == (INF, 1.0)
    assert resolve_loss("softmax_margin") == (1.0, 1.0) and resolve_loss("perceptron") == (INF, 0.0)
    losses = {name: structured_loss(oracle, pot, gold, loss=name) for name in LOSSES}
    # CRF loss = negative log-likelihood
    assert torch.allclose(losses["crf"], crf_nll(oracle, pot, gold))
    # perceptron loss = s(MAP) - s(gold) >= 0
    y_map = oracle.map(pot)
    assert torch.allclose(losses["perceptron"], sequence_score(pot, y_map) - sequence_score(pot, gold))
    # SVM (structured hinge) upper-bounds the Hamming cost of the MAP prediction
    hamming = ((y_map != gold) & (gold >= 0)).sum(1).to(DT)
    assert (losses["svm"] >= hamming - 1e-12).all()
    # every member is >= 0, and the loss grows with gamma (softmax-margin >= CRF, SVM >= perceptron)
    for value in losses.values():
        assert (value >= -1e-12).all()
    assert (losses["softmax_margin"] >= losses["crf"] - 1e-12).all()
    assert (losses["svm"] >= losses["perceptron"] - 1e-12).all()


def test_finite_beta_converges_to_the_limit():
    pot, gold = _problem(seed=4)
    oracle = bp.LinearChain()
    for gamma in (0.0, 1.0):
        limit = structured_loss(oracle, pot, gold, INF, gamma)
        previous = None
        log_y = math.log(3 ** 4)
        for beta in (0.5, 1.0, 4.0, 16.0, 64.0, 1e3):
            value = structured_loss(oracle, pot, gold, beta, gamma)
            # L_inf <= L_beta <= L_inf + log|Y| / beta, and L_beta decreases with beta
            assert (value >= limit - 1e-9).all() and (value <= limit + log_y / beta + 1e-9).all()
            if previous is not None:
                assert (value <= previous + 1e-9).all()
            previous = value
        assert torch.allclose(previous, limit, atol=1e-2)


def test_loss_is_zero_on_a_confident_correct_model():
    pot, gold = _problem(seed=5, b=2)
    gold = gold.clamp_min(0)
    big = torch.nn.functional.one_hot(gold, 3).to(DT) * 50.0
    sure = bp.ChainPotentials(big, torch.zeros(3, 3, dtype=DT), pot.lengths)
    assert (structured_loss(bp.LinearChain(), sure, gold, loss="svm") == 0).all()       # margin 50 > cost 1
    assert (structured_loss(bp.LinearChain(), sure, gold, loss="crf") < 1e-15).all()


def test_custom_cost_and_validation():
    pot, gold = _problem(seed=6)

    def double_hamming(potentials, y):           # the paper's p = 1 - 2 mu(y), q = 1^T mu(y): twice the errors
        onehot = torch.nn.functional.one_hot(y.clamp_min(0), 3).to(DT)
        valid = (torch.arange(4) < potentials.lengths[:, None]).to(DT)[..., None]
        return (1 - 2 * onehot) * valid, None, (onehot * valid).sum((1, 2))

    got = structured_loss(bp.LinearChain(), pot, gold, 1.0, 1.0, cost=double_hamming)
    assert torch.allclose(got, _brute(pot, gold, 1.0, 2.0))
    with pytest.raises(ValueError, match="beta must be a number > 0"):
        structured_loss(bp.LinearChain(), pot, gold, 0.0, 1.0)
    with pytest.raises(ValueError, match="beta must be a number > 0"):
        resolve_loss(beta=-1.0, gamma=0.0)
    with pytest.raises(ValueError, match="gamma must be a finite number >= 0"):
        resolve_loss(beta=1.0, gamma=-0.5)
    with pytest.raises(ValueError, match="gamma must be a finite number >= 0"):
        resolve_loss("svm", gamma=INF)
    with pytest.raises(ValueError, match="loss must be one of"):
        resolve_loss("hinge")
    with pytest.raises(ValueError, match="give a loss name"):
        structured_loss(bp.LinearChain(), pot, gold)
    with pytest.raises(ValueError, match="cost must be one of"):
        structured_loss(bp.LinearChain(), pot, gold, loss="svm", cost="zero-one")
    with pytest.raises(ValueError, match="labels must lie"):
        structured_loss(bp.LinearChain(), pot, torch.full((3, 4), 7), loss="crf")


def _trees(n, projective):
    """All dependency trees of n words (heads of words 1..n, 0 = root)."""
    import itertools

    out = []
    for heads in itertools.product(range(n + 1), repeat=n):
        if any(h == m for m, h in enumerate(heads, 1)):
            continue
        ok = reaches_root(heads)
        arcs = [(min(h, m), max(h, m)) for m, h in enumerate(heads, 1)]
        if ok and projective:
            ok = not any(a < c < b < d for a, b in arcs for c, d in arcs)
        if ok:
            out.append(heads)
    return torch.tensor(out)


@pytest.mark.parametrize("projective", [False, True])
@pytest.mark.parametrize("beta,gamma", [(1.0, 0.0), (1.0, 1.0), (2.0, 0.5), (INF, 1.0), (INF, 0.0)])
def test_loss_over_dependency_trees_matches_enumeration(projective, beta, gamma):
    from betheproj.oracles.dependency import arc_potentials
    from betheproj.oracles.nonprojective import NonProjective
    from betheproj.oracles.projective import Projective

    gen = torch.Generator().manual_seed(7)
    n = 4
    scores = torch.randn(2, n + 1, n + 1, generator=gen, dtype=DT)
    pot = arc_potentials(scores, torch.tensor([n, n]))
    trees = _trees(n, projective)
    gold = trees[torch.tensor([3, len(trees) - 1])]
    oracle = Projective() if projective else NonProjective()
    got = structured_loss(oracle, pot, gold, beta, gamma)
    for b in range(2):
        s = pot.node[b, torch.arange(n), trees].sum(1)                       # [T]
        s_gold = pot.node[b, torch.arange(n), gold[b]].sum()
        arg = s - s_gold + gamma * (trees != gold[b]).sum(1).to(DT)
        expected = arg.max() if math.isinf(beta) else torch.logsumexp(beta * arg, 0) / beta
        assert torch.allclose(got[b], expected, atol=1e-9)
    lg = loss_and_gradient(oracle, pot, gold, beta, gamma, edge=False)
    assert torch.allclose(lg.loss, got, atol=1e-9)
    assert torch.allclose(lg.node.sum(-1), torch.zeros(2, n, dtype=DT), atol=1e-9)   # mu - onehot rows sum to 0


def test_flags_and_strings_are_not_beta_or_gamma():
    for kw in ({"beta": True, "gamma": 0.0}, {"beta": "2", "gamma": 0.0}, {"beta": 1.0, "gamma": False},
               {"loss": "crf", "gamma": "1"}):
        with pytest.raises(TypeError, match="(beta|gamma) must be a real number"):
            resolve_loss(**kw)
    assert resolve_loss(beta=2, gamma=0) == (2.0, 0.0)


@pytest.mark.parametrize("loss", list(LOSSES))
def test_gold_on_a_forbidden_part_is_refused(loss):
    pot, gold = _problem(shared=True)
    node = pot.node.clone()
    node[0, 1, gold[0, 1]] = -INF                      # example 0's gold label is forbidden at position 1
    forbidden = bp.ChainPotentials(node, pot.edge, pot.lengths)
    for fn in (structured_loss, loss_and_gradient):    # used to return an infinite loss
        with pytest.raises(ValueError, match=r"gold labels lie on forbidden parts .* examples \[0\]"):
            fn(bp.LinearChain(), forbidden, gold, loss=loss)
    node[0, 1, (gold[0, 1] + 1) % 3] = -INF            # a forbidden non-gold part is fine
    node[0, 1, gold[0, 1]] = 0.0
    ok = bp.ChainPotentials(node, pot.edge, pot.lengths)
    assert torch.isfinite(structured_loss(bp.LinearChain(), ok, gold, loss=loss)).all()
    assert torch.isfinite(loss_and_gradient(bp.LinearChain(), ok, gold, loss=loss).loss).all()


def test_a_cost_of_another_dtype_is_a_type_error():
    pot, gold = _problem()
    pot32 = bp.ChainPotentials(pot.node.float(), pot.edge.float(), pot.lengths)
    cost = lambda p, g: (torch.ones(p.node.shape, dtype=DT), None, None)  # noqa: E731
    with pytest.raises(TypeError, match="cost returned p_node of dtype torch.float64 for torch.float32 potentials"):
        structured_loss(bp.LinearChain(), pot32, gold, loss="softmax_margin", cost=cost)


def test_a_cost_of_the_wrong_shape_or_with_nan_is_named_and_potentials_are_checked():
    pot, gold = _problem(shared=True)
    b, n, c = pot.node.shape
    chain = bp.LinearChain()
    good = torch.zeros(b, n - 1, c, c, dtype=DT)                     # a per-example edge cost on a shared table
    structured_loss(chain, pot, gold, loss="softmax_margin", cost=lambda p, g: (torch.zeros_like(p.node), good, None))
    for parts, error, message in [
            ((None, None, None), TypeError, "p_node of type NoneType"),
            ((torch.zeros(b, n, c + 1, dtype=DT), None, None), ValueError, r"p_node of shape \(3, 4, 4\)"),
            ((torch.zeros(b, n, c, dtype=DT), torch.zeros(2, 2, dtype=DT), None), ValueError, "p_edge of shape"),
            ((torch.zeros(b, n, c, dtype=DT), None, torch.zeros(b + 1, dtype=DT)), ValueError, "q of shape"),
            ((torch.full((b, n, c), math.nan, dtype=DT), None, None), ValueError, "p_node with NaN"),
            ((torch.zeros(b, n, c, dtype=DT), None, torch.full((b,), math.inf, dtype=DT)), ValueError, "q with NaN")]:
        for f in (structured_loss, loss_and_gradient):
            with pytest.raises(error, match=f"cost returned {message}"):
                f(chain, pot, gold, loss="softmax_margin", cost=lambda p, g, parts=parts: parts)
    for f in (structured_loss, loss_and_gradient):
        with pytest.raises(TypeError, match="potentials must be PairwisePotentials"):
            f(chain, pot.node, gold, loss="crf")


@pytest.mark.parametrize("oracle", [bp.NonProjective(), bp.Projective()])
def test_gold_heads_that_are_not_a_tree_are_refused(oracle):
    """Dependency oracles mask self-loops and heads past the length (their raw scores are still there), and no
    score sees a cycle: such gold heads gave finite losses, a self-loop of score 50 a loss of -45."""
    scores = torch.randn(1, 4, 4, generator=torch.Generator().manual_seed(0), dtype=DT)
    scores[0, 2, 2] = 50.0
    for gold, n in (([0, 2, 1], 3), ([2, 3, 1], 3), ([3, 0, 0], 2)):   # a self-loop, a cycle, a head past the end
        gold, pot = torch.tensor([gold]), bp.arc_potentials(scores, torch.tensor([n]))
        for fn in (structured_loss, loss_and_gradient):
            with pytest.raises(ValueError, match=r"gold\[0\] are not the heads of a"):
                fn(oracle, pot, gold, loss="svm")
        with pytest.raises(ValueError, match=r"labels\[0\] are not the heads of a"):
            crf_nll(oracle, pot, gold)
    pot = bp.arc_potentials(scores, torch.tensor([3]))
    assert torch.isfinite(structured_loss(oracle, pot, torch.tensor([[0, 1, 2]]), loss="crf")).all()


def test_a_cost_is_checked_whatever_gamma_and_must_return_a_triple():
    """cost="hammming" (a typo) passed silently where gamma = 0 leaves the cost unused, and a cost returning two
    parts failed with "not enough values to unpack" naming no argument."""
    pot, gold = _problem(seed=6)
    for fn in (structured_loss, loss_and_gradient):
        with pytest.raises(ValueError, match="cost must be one of"):
            fn(bp.LinearChain(), pot, gold, loss="crf", cost="hammming")
        with pytest.raises(TypeError, match=r"cost must return the triple \(p_node, p_edge, q\), got tuple of len"):
            fn(bp.LinearChain(), pot, gold, loss="svm", cost=lambda p, y: (torch.zeros_like(p.node), None))


def test_character_accuracy_is_exact_beyond_float32():
    """The fraction was a float32 division: 3/5 came out 0.6000000238418579."""
    from betheproj.learning import character_accuracy

    labels = torch.zeros(1, 5, dtype=torch.long)
    predicted = torch.tensor([[0, 0, 0, 1, 1]])
    assert character_accuracy(predicted, labels, torch.tensor([5])) == 3 / 5


@pytest.mark.parametrize("oracle", [bp.NonProjective(), bp.Projective()], ids=repr)
@pytest.mark.parametrize("loss", list(LOSSES))
@pytest.mark.parametrize("shared", [False, True])
def test_dependency_losses_have_a_zero_edge_gradient(oracle, loss, shared):
    """A dependency oracle has no pairwise factors: its marginals' edges are all-zero placeholders and it refuses
    non-zero edge potentials.  The edge gradient was ``mu_edge - S(y)_edge`` with ``S(y)`` pairing the heads of
    consecutive words (|.|_1 = 6 for crf, 8 for svm on this batch), and a step along it gave potentials the oracle
    refused; it is zero now, explicitly and through autograd, and the node gradient is unchanged."""
    n = 4
    scores = torch.randn(2, n + 1, n + 1, generator=torch.Generator().manual_seed(2), dtype=DT)
    pot = bp.arc_potentials(scores)
    edge = pot.edge if shared else pot.edge.expand(2, n - 1, n + 1, n + 1).clone()
    edge = edge.clone().requires_grad_()
    pot = bp.PairwisePotentials(pot.node.clone().requires_grad_(), edge, pot.lengths)
    gold = torch.tensor([[2, 0, 4, 2], [0, 1, 2, 3]])
    lg = loss_and_gradient(oracle, pot, gold, loss=loss)
    assert lg.edge.shape == edge.shape and not lg.edge.any()
    oracle.marginals(bp.PairwisePotentials(pot.node.detach(), edge.detach() - lg.edge, pot.lengths))   # accepted
    value = structured_loss(oracle, pot, gold, loss=loss)
    g_node, g_edge = torch.autograd.grad(value.sum(), (pot.node, edge))
    assert not g_edge.any()
    assert torch.allclose(lg.loss, value.detach(), atol=1e-12)
    assert torch.allclose(lg.node, g_node, atol=1e-9)
    assert torch.allclose(lg.node, loss_and_gradient(oracle, pot, gold, loss=loss, edge=False).node, atol=0)


@pytest.mark.parametrize("dtype, beta", [(torch.float32, 1e-300), (torch.float64, 1e-320)])
def test_a_loss_past_the_dtypes_range_is_refused(dtype, beta):
    # log Z / beta overflowed to inf with a tiny beta (the oracles refuse an overflowing log-partition)
    gen = torch.Generator().manual_seed(0)
    pot = bp.ChainPotentials(torch.randn(2, 4, 3, generator=gen, dtype=dtype), torch.randn(3, 3, generator=gen,
                                                                                             dtype=dtype))
    gold = torch.zeros(2, 4, dtype=torch.long)
    with pytest.raises(ValueError, match=rf"the loss overflows {dtype} for examples \[0, 1\]: beta = "):
        structured_loss(bp.LinearChain(), pot, gold, beta=beta, gamma=0.0)
    with pytest.raises(ValueError, match=rf"the loss overflows {dtype}"):
        loss_and_gradient(bp.LinearChain(), pot, gold, beta=beta, gamma=0.0)
    big = structured_loss(bp.LinearChain(), pot, gold, beta=1e-30, gamma=0.0)   # in range: (1/beta) log |Y| and up
    assert bool(torch.isfinite(big).all()) and float(big.min()) >= 1e30 * math.log(3 ** 4) * (1 - 1e-6)


def test_the_edge_flag_of_loss_and_gradient_must_be_a_bool():
    # edge="no" was truthy: the edge gradient was computed and returned
    pot = bp.ChainPotentials(torch.randn(1, 3, 2, dtype=torch.float64), torch.zeros(2, 2, dtype=torch.float64))
    with pytest.raises(TypeError, match="edge must be a bool, got str 'no'"):
        loss_and_gradient(bp.LinearChain(), pot, torch.zeros(1, 3, dtype=torch.long), loss="crf", edge="no")
