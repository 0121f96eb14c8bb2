"""Base CRF learning: the likelihood against brute force, its gradient, and training on synthetic data."""

import math

import pytest
import torch

import betheproj as bp
from betheproj.learning import LinearChainCRF, crf_nll, fit_crf, sequence_score, sufficient_statistics

DT = torch.float64


@pytest.mark.parametrize("parents", [None, [-1, 0, 0, 1], [-1, 0, 0, 0]], ids=["chain", "tree", "star"])
@pytest.mark.parametrize("shared", [False, True])
def test_nll_is_minus_log_probability_under_brute_force(parents, shared):
    # on a tree, edge k scores the labels of nodes parents[k+1] and k+1, not of k and k+1
    edge = torch.randn(3, 3, dtype=DT) if shared else torch.randn(3, 3, 3, 3, dtype=DT)
    pot = bp.ChainPotentials(torch.randn(3, 4, 3, dtype=DT), edge, torch.tensor([4, 2, 1]))
    labels = torch.tensor([[0, 2, 1, 1], [2, 2, -1, -1], [1, -1, -1, -1]])
    oracle = bp.LinearChain() if parents is None else bp.Tree(parents)
    nll = crf_nll(oracle, pot, labels)
    for b in range(3):
        ys, score = bp.BruteForce(parents)._joint(pot, b)
        row = (ys == labels[b, : ys.shape[1]]).all(1).nonzero().item()
        assert torch.allclose(nll[b], torch.logsumexp(score, 0) - score[row])
    assert torch.allclose(sequence_score(pot, labels)[2], pot.node[2, 0, 1])


def test_a_tree_of_another_size_is_refused():
    pot = bp.ChainPotentials(torch.randn(1, 4, 3, dtype=DT), torch.randn(3, 3, dtype=DT))
    labels = torch.zeros(1, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="N=4 positions but the oracle's tree has 3 nodes"):
        crf_nll(bp.Tree([-1, 0, 0]), pot, labels)
    with pytest.raises(ValueError, match="parents must have N=4 entries, got 3"):
        sequence_score(pot, labels, torch.tensor([-1, 0, 0]))


def test_nll_gradient_against_finite_differences():
    node = torch.randn(2, 5, 3, dtype=DT, requires_grad=True)
    edge = torch.randn(3, 3, dtype=DT, requires_grad=True)
    labels = torch.randint(0, 3, (2, 5))
    lengths = torch.tensor([5, 3])
    assert torch.autograd.gradcheck(
        lambda n, e: crf_nll(bp.LinearChain(), bp.ChainPotentials(n, e, lengths), labels), (node, edge))


def test_training_recovers_a_generating_model():
    gen = torch.Generator().manual_seed(0)
    true = LinearChainCRF(6, 4).double()
    with torch.no_grad():
        true.node.weight.copy_(torch.randn(4, 6, generator=gen, dtype=DT) * 2)
        true.transitions.copy_(torch.randn(4, 4, generator=gen, dtype=DT) * 2)
    x = torch.randn(400, 8, 6, generator=gen, dtype=DT)
    lengths = torch.randint(2, 9, (400,), generator=gen)
    labels = bp.LinearChain().map(true(x, lengths))
    model = LinearChainCRF(6, 4).double()
    history = fit_crf(model, x[:300], labels[:300], lengths[:300], l2=1e-4, max_iter=200)
    assert history[-1] < 0.5 * history[0]
    pred = bp.LinearChain().map(model(x[300:], lengths[300:]))
    valid = labels[300:] >= 0
    accuracy = (pred[valid] == labels[300:][valid]).double().mean()
    assert accuracy > 0.9                                         # measured: ~0.97


def test_bad_labels():
    pot = bp.ChainPotentials(torch.randn(2, 3, 4, dtype=DT), torch.randn(4, 4, dtype=DT))
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 4\) .* examples \[0\]"):
        crf_nll(bp.LinearChain(), pot, torch.tensor([[0, 1, 4], [0, 0, 0]]))
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 4\) .* examples \[1\]"):
        crf_nll(bp.LinearChain(), pot, torch.tensor([[0, 1, 3], [0, -1, 0]]))
    with pytest.raises(ValueError, match="labels must have shape"):
        crf_nll(bp.LinearChain(), pot, torch.zeros(2, 2, dtype=torch.long))


def test_gold_on_a_forbidden_transition_is_refused_as_by_structured_loss():
    edge = torch.zeros(3, 3, dtype=DT)
    edge[0, 1] = -math.inf
    pot = bp.ChainPotentials(torch.randn(2, 3, 3, dtype=DT), edge)
    ok = torch.tensor([[0, 0, 2], [2, 1, 0]])
    assert torch.isfinite(crf_nll(bp.LinearChain(), pot, ok)).all()
    for fn in (crf_nll, lambda o, p, y: bp.learning.losses.structured_loss(o, p, y, loss="crf")):
        with pytest.raises(ValueError, match=r"forbidden parts \(-inf potentials\) for examples \[1\]"):
            fn(bp.LinearChain(), pot, torch.tensor([[0, 0, 2], [2, 0, 1]]))


class _NoZeroThenOne(torch.nn.Module):
    """A linear-chain CRF whose transition 0 -> 1 is forbidden (a -inf potential)."""

    def __init__(self):
        super().__init__()
        self.crf = LinearChainCRF(2, 3).double()

    def forward(self, x, n):
        p = self.crf(x, n)
        mask = torch.zeros(3, 3, dtype=DT)
        mask[0, 1] = -math.inf
        return bp.ChainPotentials(p.node, p.edge + mask, p.lengths)


def test_fit_crf_names_bad_gold_by_its_index_in_the_whole_batch():
    """fit_crf evaluates length-sorted chunks: a gold labelling on a forbidden part or heads that are no tree were
    named by their row in the sorted chunk (here example 1, not 2), and only once L-BFGS had started."""
    x, lengths = torch.randn(3, 3, 2, dtype=DT), torch.tensor([3, 1, 2])
    labels = torch.tensor([[2, 2, 2], [0, -1, -1], [0, 1, -1]])               # example 2 takes 0 -> 1
    model = _NoZeroThenOne()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    for chunk in (None, 1):
        with pytest.raises(ValueError, match=r"forbidden parts \(-inf potentials\) for examples \[2\]"):
            fit_crf(model, x, labels, lengths, max_iter=2, chunk_size=chunk)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    heads = torch.tensor([[0, 1, 1], [0, -1, -1], [2, 1, -1]])                # example 2: a cycle
    with pytest.raises(ValueError, match=r"labels\[2\] are not the heads of a tree"):
        fit_crf(LinearChainCRF(2, 4).double(), x, heads, lengths, oracle=bp.NonProjective(), max_iter=2)


def _random_batch(seed: int, b: int, n: int, f: int, c: int):
    """Features [b, n, f], lengths in 1..n, labels in [0, c) padded with -1."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(b, n, f, generator=gen, dtype=DT)
    lengths = torch.randint(1, n + 1, (b,), generator=gen)
    labels = torch.randint(0, c, (b, n), generator=gen)
    labels[torch.arange(n) >= lengths[:, None]] = -1
    return x, lengths, labels


def test_chunked_training_is_the_same_objective():
    x, lengths, labels = _random_batch(1, 40, 7, 3, 4)
    runs = []
    for chunk in (None, 6):
        model = LinearChainCRF(3, 4).double()
        runs.append((fit_crf(model, x, labels, lengths, l2=1e-2, max_iter=5, chunk_size=chunk), model))
    assert runs[0][0] == pytest.approx(runs[1][0], rel=1e-10)
    assert torch.allclose(runs[0][1].transitions, runs[1][1].transitions, atol=1e-8)
    with pytest.raises(ValueError, match="chunk_size"):
        fit_crf(LinearChainCRF(3, 4).double(), x, labels, lengths, chunk_size=0)


def test_softmax_margin_objective_and_bad_arguments():
    x, lengths, labels = _random_batch(2, 60, 6, 3, 4)
    # gamma = 0 is the likelihood: the same objective, evaluation for evaluation
    runs = [fit_crf(LinearChainCRF(3, 4).double(), x, labels, lengths, max_iter=5, **kw)
            for kw in ({}, {"loss": "softmax_margin", "gamma": 0.0})]
    assert runs[0] == pytest.approx(runs[1], rel=1e-10)
    # at zero weights every labelling scores 0: the loss is log sum_y' exp(gamma * hamming(y', y)), per sequence
    model = LinearChainCRF(3, 4).double()
    history = fit_crf(model, x, labels, lengths, l2=0.0, max_iter=1, loss="softmax_margin", gamma=2.0)
    expected = (lengths.double() * torch.log(torch.tensor(1.0 + 3.0 * torch.e ** 2, dtype=DT))).mean()
    assert history[0] == pytest.approx(float(expected), rel=1e-10)
    with pytest.raises(ValueError, match="loss must be 'crf' or 'softmax_margin'"):
        fit_crf(LinearChainCRF(3, 4).double(), x, labels, lengths, loss="svm")
    with pytest.raises(ValueError, match="gamma applies to loss='softmax_margin' only"):
        fit_crf(LinearChainCRF(3, 4).double(), x, labels, lengths, gamma=1.0)
    with pytest.raises(ValueError, match="gamma must be a finite number"):
        fit_crf(LinearChainCRF(3, 4).double(), x, labels, lengths, loss="softmax_margin", gamma=-1.0)


def test_softmax_margin_keeps_a_margin_the_likelihood_need_not():
    # separable toy data: feature k says label k; both fits predict the training labels, and the
    # softmax-margin fit pushes the gold score at least ~gamma above each one-label change
    gen = torch.Generator().manual_seed(3)
    labels = torch.randint(0, 3, (50, 5), generator=gen)
    x = torch.nn.functional.one_hot(labels, 3).to(DT) + 0.1 * torch.randn(50, 5, 3, generator=gen, dtype=DT)
    lengths = torch.full((50,), 5)
    margins = {}
    for loss, gamma in (("crf", None), ("softmax_margin", 3.0)):
        model = LinearChainCRF(3, 3).double()
        fit_crf(model, x, labels, lengths, l2=1e-3, max_iter=100, loss=loss, gamma=gamma)
        with torch.no_grad():
            pot = model(x, lengths)
            assert (bp.LinearChain().map(pot) == labels).all()
            node = pot.node.gather(2, labels[..., None]).squeeze(-1)[..., None] - pot.node
            node[torch.nn.functional.one_hot(labels, 3).bool()] = float("inf")
            margins[loss] = float(node.min())
    assert margins["softmax_margin"] > margins["crf"]


def test_progress_bar_counts_the_evaluations_and_changes_nothing(capsys):
    pytest.importorskip("tqdm")
    x, lengths, labels = _random_batch(2, 20, 5, 3, 4)
    runs = [fit_crf(LinearChainCRF(3, 4).double(), x, labels, lengths, max_iter=4, progress=p) for p in (False, True)]
    assert runs[0] == runs[1]
    err = capsys.readouterr().err
    assert "L-BFGS evaluations" in err and f"{len(runs[1])}/5" in err


def test_fit_crf_checks_its_arguments_against_each_other():
    from betheproj.learning import SparseChainCRF

    x, lengths, labels = _random_batch(3, 8, 5, 3, 2)
    fit = lambda **kw: fit_crf(LinearChainCRF(3, 2).double(), **{"features": x, "labels": labels,  # noqa: E731
                                                                  "lengths": lengths, **kw})
    with pytest.raises(ValueError, match=r"lengths must be a \[B\]=\(8,\)"):
        fit(lengths=lengths[:7])                      # used to train on the first 7 sequences silently
    with pytest.raises(ValueError, match=r"labels must be a \[B, N\]=\(8, 5\)"):
        fit(labels=labels[:, :4])
    with pytest.raises(ValueError, match="no training examples"):
        fit(features=x[:0], labels=labels[:0], lengths=lengths[:0])
    for max_iter in (0, -5):                          # used to evaluate once and return untrained
        with pytest.raises(ValueError, match="max_iter must be an int >= 1"):
            fit(max_iter=max_iter)
    with pytest.raises(TypeError, match="max_iter"):
        fit(max_iter=2.5)
    for tolerance in (-1.0, float("nan"), float("inf")):   # -1 used to become tolerance_change = 1
        with pytest.raises(ValueError, match="tolerance must be a finite number >= 0"):
            fit(tolerance=tolerance)
    for l2 in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="l2 must be a finite number >= 0"):
            fit(l2=l2)
    with pytest.raises(TypeError, match="labels must be an integer tensor"):
        fit(labels=labels > 0)                        # bool labels used to pass as 0/1
    assert len(fit(max_iter=1, tolerance=0.0)) >= 1
    with pytest.raises(ValueError, match="num_features must be an int >= 1"):
        SparseChainCRF(0, 2)
    with pytest.raises(ValueError, match="num_labels must be an int >= 1"):
        SparseChainCRF(5, 0)


def test_features_of_the_wrong_kind_or_range_are_named():
    from betheproj.demo import tagging_instance
    from betheproj.learning import LinearChainCRF, SparseChainCRF

    crf = SparseChainCRF(5, 2)
    with pytest.raises(ValueError, match=r"features must be indices in \[0, 5\) \(0: padding\), got values in"):
        crf(torch.tensor([[[1, 5]]]), torch.tensor([1]))
    with pytest.raises(TypeError, match="features must be a tensor"):
        crf([[[1]]], torch.tensor([1]))
    with pytest.raises(TypeError, match="features must be a tensor"):
        LinearChainCRF(3, 2)([1, 2])
    theta, _ = tagging_instance(batch=4, length=1)               # lengths drawn from [1, 1], never 0
    assert theta.lengths.tolist() == [1, 1, 1, 1]


def test_sparse_crf_takes_an_empty_batch_and_positions_without_features():
    """B = 0 was a RuntimeError from reshape (a -1 size it could not infer), K = 0 one from EmbeddingBag."""
    from betheproj.learning import NonLocalCRF, SparseChainCRF

    crf = SparseChainCRF(5, 3)
    with torch.no_grad():
        crf.bias.copy_(torch.tensor([0.5, -1.0, 2.0]))
    empty = crf(torch.zeros(0, 4, 2, dtype=torch.long), torch.zeros(0, dtype=torch.long))
    assert empty.node.shape == (0, 4, 3)
    assert NonLocalCRF(crf).score(torch.zeros(0, 4, 2, dtype=torch.long), torch.zeros(0, 4, dtype=torch.long),
                                  torch.zeros(0, dtype=torch.long)).shape == (0,)
    bare = crf(torch.zeros(2, 4, 0, dtype=torch.long), torch.tensor([4, 2]))
    assert torch.equal(bare.node, crf(torch.zeros(2, 4, 1, dtype=torch.long), torch.tensor([4, 2])).node)
    assert torch.equal(bare.node[1, 3], crf.bias.detach())


def test_a_tree_trains_on_examples_shorter_than_the_tree():
    """Training trims a batch to its longest example only on a chain: a tree's potentials keep all its nodes."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(8, 4, 5, generator=gen, dtype=DT)
    labels = torch.randint(0, 3, (8, 4), generator=gen)
    lengths = torch.tensor([3, 2, 3, 2, 3, 3, 2, 2])          # none as long as the tree
    tree = bp.Tree([-1, 0, 0, 1])
    histories = []
    for chunk_size in (None, 3):
        torch.manual_seed(0)
        model = LinearChainCRF(5, 3).double()
        histories.append(fit_crf(model, x, labels, lengths, oracle=tree, max_iter=5, chunk_size=chunk_size))
    assert histories[0][0] == pytest.approx(histories[1][0], abs=1e-12)      # the same objective, chunked or not
    torch.manual_seed(0)
    untrained = LinearChainCRF(5, 3).double()
    with torch.no_grad():
        first = float(crf_nll(tree, untrained(x, lengths), labels).mean()
                      + 0.5e-3 * sum((p * p).sum() for p in untrained.parameters()))
    assert histories[0][0] == pytest.approx(first, abs=1e-12)
    assert histories[0][-1] < histories[0][0]


def test_linear_chain_crf_ignores_padding_features_and_names_bad_valid_ones():
    torch.manual_seed(0)
    model = LinearChainCRF(4, 3).double()
    x = torch.randn(2, 5, 4, dtype=torch.float64)
    lengths = torch.tensor([5, 3])
    y = x.clone()
    y[1, 3:] = float("nan")                              # padding: was 'node contains NaN'
    chain = bp.LinearChain()
    assert torch.equal(chain.marginals(model(x, lengths)).node, chain.marginals(model(y, lengths)).node)
    # ... and its weight gradient: NaN * 0 made every weight NaN after one training step
    labels = torch.tensor([[0, 1, 2, 0, 1], [2, 1, 0, -1, -1]])
    grads = [torch.autograd.grad(crf_nll(chain, model(f, lengths), labels).sum(), list(model.parameters()))
             for f in (x, y)]
    for clean, padded in zip(*grads, strict=True):
        assert torch.equal(clean, padded)
    y[1, 1, 2] = float("inf")
    with pytest.raises(ValueError, match="features give NaN or infinite node scores at valid positions"):
        model(y, lengths)
    with pytest.raises(ValueError, match="features give NaN or infinite node scores"):
        model(y)


def test_scores_take_parents_as_a_list_and_name_a_wrong_potentials_argument():
    """parents=[-1, 0, 0] (a list) was a bare AttributeError ('list' has no 'to'), and crf_nll with a string for
    the potentials an AttributeError too."""
    import betheproj as bp
    from betheproj.learning import crf_nll, sequence_score, sufficient_statistics

    pot = bp.ChainPotentials(torch.randn(2, 3, 2, dtype=torch.float64), torch.randn(2, 2, dtype=torch.float64))
    labels = torch.tensor([[0, 1, 1], [1, 0, 1]])
    star = torch.tensor([-1, 0, 0])
    assert torch.equal(sequence_score(pot, labels, [-1, 0, 0]), sequence_score(pot, labels, star))
    stats = sufficient_statistics(pot, labels, [-1, 0, 0])
    assert torch.equal(stats.edge, sufficient_statistics(pot, labels, star).edge)
    for fn in (crf_nll, sufficient_statistics):
        with pytest.raises(TypeError, match="potentials must be PairwisePotentials, got"):
            fn(bp.LinearChain(), "x", labels) if fn is crf_nll else fn(torch.zeros(1, 2, 2), labels)
    with pytest.raises(ValueError, match="parents must have N=3 entries"):
        sequence_score(pot, labels, [-1, 0])


@pytest.mark.parametrize("shared", [False, True])
def test_without_pairwise_factors_the_score_and_statistics_have_no_edge_parts(shared):
    """``pairwise_factors=False`` (a structure without them: the dependency oracles) leaves the edge scores out of
    ``<theta, S(y)>`` (its gradient there is zero, not ``None``: the edges stay in the graph, ``-inf`` ones give
    no NaN) and gives ``S(y)`` all-zero edge indicators."""
    gen = torch.Generator().manual_seed(4)
    edge = torch.randn(*((3, 3) if shared else (2, 3, 3, 3)), generator=gen, dtype=DT)
    edge[..., 0, 1] = -math.inf
    edge.requires_grad_()
    node = torch.randn(2, 4, 3, generator=gen, dtype=DT)
    labels, lengths = torch.tensor([[0, 1, 0, 2], [2, 2, 1, -1]]), torch.tensor([4, 3])
    pot = bp.ChainPotentials(node, edge, lengths)
    score = sequence_score(pot, labels, pairwise_factors=False)
    expected = [sum(float(node[b, t, labels[b, t]]) for t in range(int(lengths[b]))) for b in range(2)]
    assert score.tolist() == pytest.approx(expected, abs=1e-12)
    (grad,) = torch.autograd.grad(score.sum(), edge)
    assert torch.equal(grad, torch.zeros_like(edge))
    assert sequence_score(pot, labels)[0].item() == -math.inf                  # with them: the (0, 1) transition
    stats = sufficient_statistics(pot, labels, [-1, 0, 1, 1], pairwise_factors=False)
    assert stats.edge.shape == (2, 3, 3, 3) and not stats.edge.any()
    assert torch.equal(stats.node, sufficient_statistics(pot, labels).node)
    assert sufficient_statistics(pot, labels).edge.sum().item() == 5.0       # the default: a pairwise structure
    for fn in (sequence_score, sufficient_statistics):
        with pytest.raises(TypeError, match="pairwise_factors must be a bool"):
            fn(pot, labels, pairwise_factors=0)


@pytest.mark.parametrize("oracle", [bp.NonProjective(), bp.Projective()], ids=repr)
def test_a_chain_model_trained_over_dependency_trees_keeps_its_edge_table_at_zero(oracle):
    """The dependency oracles refuse non-zero edge potentials and have no edge marginals, and the likelihood's
    edge gradient (``mu - S(y)``) is zero for them: it was ``-S(y)``, the indicators of the heads of consecutive
    words, so L-BFGS moved a learned [C, C] table off zero and the oracle refused it ("potentials.edge must be all
    zeros")."""
    gen = torch.Generator().manual_seed(5)
    n = 4
    x = torch.randn(6, n, 3, generator=gen, dtype=DT)
    heads = torch.tensor([[2, 0, 4, 2], [0, 1, 2, 3]] * 3)
    lengths = torch.full((6,), n)
    model = LinearChainCRF(3, n + 1).double()
    (grad,) = torch.autograd.grad(crf_nll(oracle, model(x, lengths), heads).sum(), model.transitions)
    assert torch.equal(grad, torch.zeros_like(grad))
    history = fit_crf(model, x, heads, lengths, oracle=oracle, max_iter=10)
    assert history[-1] < history[0]
    assert not model.transitions.detach().any()


def test_fit_crf_over_dependency_trees_keeps_each_chunks_full_width():
    """A dependency tree's labels are head positions (C = N + 1): a chunk of short sentences trimmed to its own
    width gave a model with N + 1 columns potentials the oracle refused ("potentials.node must be [B, N, N+1]")."""
    x = torch.randn(4, 5, 3, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    lengths = torch.tensor([5, 5, 2, 2])
    heads = torch.tensor([[0, 1, 2, 3, 4], [2, 0, 2, 3, 4], [0, 1, -1, -1, -1], [2, 0, -1, -1, -1]])
    whole = fit_crf(LinearChainCRF(3, 6).double(), x, heads, lengths, oracle=bp.NonProjective(), max_iter=3)
    chunked = fit_crf(LinearChainCRF(3, 6).double(), x, heads, lengths, oracle=bp.NonProjective(), max_iter=3,
                      chunk_size=2)
    assert chunked == pytest.approx(whole, rel=1e-12)


class _ProtocolOnly:
    """An oracle with just the methods of the Oracle protocol (marginals, map, entropy, degree): no log_partition."""

    def __init__(self):
        self.inner = bp.LinearChain()

    def marginals(self, potentials):
        return self.inner.marginals(potentials)

    def map(self, potentials):
        return self.inner.map(potentials)

    def entropy(self, marginals):
        return self.inner.entropy(marginals)

    def degree(self, lengths, n):
        return self.inner.degree(lengths, n)


def test_the_likelihood_needs_only_the_oracle_protocol():
    # crf_nll called oracle.log_partition, which the protocol does not ask for: AttributeError in crf_nll, fit_crf
    # and every NonLocalCRF.fit (the surrogate likelihood is a crf_nll), where structured_loss worked
    gen = torch.Generator().manual_seed(0)
    node = torch.randn(3, 4, 3, dtype=DT, generator=gen, requires_grad=True)
    edge = torch.randn(3, 3, dtype=DT, generator=gen, requires_grad=True)
    lengths = torch.tensor([4, 2, 1])
    labels = torch.tensor([[0, 2, 1, 1], [2, 2, -1, -1], [1, -1, -1, -1]])
    pot = bp.ChainPotentials(node, edge, lengths)
    got, want = crf_nll(_ProtocolOnly(), pot, labels), crf_nll(bp.LinearChain(), pot, labels)
    assert torch.allclose(got, want)
    assert all(torch.allclose(a, b) for a, b in zip(torch.autograd.grad(got.sum(), (node, edge)),
                                                      torch.autograd.grad(want.sum(), (node, edge)), strict=True))
    x, y = torch.randn(3, 4, 2, dtype=DT, generator=gen), labels.clamp_min(0)
    history = fit_crf(LinearChainCRF(2, 3).double(), x, y, lengths, oracle=_ProtocolOnly(), max_iter=3)
    assert history == fit_crf(LinearChainCRF(2, 3).double(), x, y, lengths, max_iter=3)


def test_fit_crf_names_an_oracle_that_is_a_class_or_no_oracle():
    # the class failed in the first evaluation ("log_partition() missing 1 required positional argument"), a
    # string with "AttributeError: 'str' object has no attribute 'log_partition'"
    x, y, n = torch.randn(2, 3, 2, dtype=DT), torch.zeros(2, 3, dtype=torch.long), torch.tensor([3, 2])
    with pytest.raises(TypeError, match=r"oracle must be an instance such as LinearChain\(\.\.\.\)"):
        fit_crf(LinearChainCRF(2, 2).double(), x, y, n, oracle=bp.LinearChain)
    with pytest.raises(TypeError, match=r"oracle must provide marginals\(\); got str"):
        fit_crf(LinearChainCRF(2, 2).double(), x, y, n, oracle="chain")


def test_fit_crf_progress_must_be_a_bool():
    x, y, n = torch.randn(2, 3, 2, dtype=DT), torch.zeros(2, 3, dtype=torch.long), torch.tensor([3, 2])
    with pytest.raises(TypeError, match="progress must be a bool, got str 'no'"):      # was truthy: a bar
        fit_crf(LinearChainCRF(2, 2).double(), x, y, n, progress="no")


def test_fit_crf_names_a_model_that_is_not_a_module_or_is_a_non_local_crf():
    # a function failed with AttributeError 'parameters', a NonLocalCRF with "missing the required forward"
    x, y, n = torch.randn(2, 3, 2, dtype=DT), torch.zeros(2, 3, dtype=torch.long), torch.tensor([3, 2])
    crf = LinearChainCRF(2, 2).double()
    with pytest.raises(TypeError, match="model must be a torch.nn.Module .* got function"):
        fit_crf(lambda f, m: crf(f, m), x, y, n)
    with pytest.raises(TypeError, match=r"got NonLocalCRF .*fit_crf\(model.theta"):
        fit_crf(bp.learning.NonLocalCRF(crf), x, y, n)


@pytest.mark.parametrize("l2", [0.0, 1e-3])
def test_a_forbidden_transition_parameter_stays_forbidden_through_training(l2):
    # transitions[2, 2] = -inf: the penalty 0.5 l2 ||p||^2 was inf (NaN for l2 = 0), its gradient NaN, and L-BFGS
    # stopped with "edge contains NaN"; now the entry stays -inf and the others train
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(20, 5, 3, generator=gen, dtype=DT)
    lengths = torch.randint(1, 6, (20,), generator=gen)
    labels = torch.randint(0, 2, (20, 5), generator=gen)          # never 2 -> 2
    model = LinearChainCRF(3, 3).double()
    with torch.no_grad():
        model.transitions[2, 2] = -math.inf
    history = fit_crf(model, x, labels, lengths, l2=l2, max_iter=20)
    assert all(math.isfinite(v) for v in history) and history[-1] < history[0]
    assert model.transitions[2, 2] == -math.inf
    assert torch.isfinite(model.transitions.flatten()[:-1]).all() and model.transitions.flatten()[:-1].any()


def test_fit_crf_keeps_the_full_width_for_a_model_that_reads_every_position():
    # a linear layer over the flattened [N, F] features: the length-sorted chunks were trimmed to their longest
    # member and the model refused them ('mat1 and mat2 shapes cannot be multiplied'); now they keep N
    class Flat(torch.nn.Module):
        def __init__(self, n, f, c):
            super().__init__()
            self.n, self.c = n, c
            self.lin = torch.nn.Linear(n * f, n * c, dtype=torch.float64)
            self.transitions = torch.nn.Parameter(torch.zeros(c, c, dtype=torch.float64))

        def forward(self, x, lengths):
            node = self.lin(x.reshape(x.shape[0], -1)).reshape(x.shape[0], self.n, self.c)
            return bp.ChainPotentials(node, self.transitions, lengths)

    torch.manual_seed(0)
    b, n, f, c = 6, 5, 3, 2
    x = torch.randn(b, n, f, dtype=torch.float64)
    lengths = torch.tensor([5, 3, 4, 2, 5, 1])
    y = torch.randint(0, c, (b, n))
    y[torch.arange(n) >= lengths[:, None]] = -1
    model = Flat(n, f, c)
    history = fit_crf(model, x, y, lengths, max_iter=5, chunk_size=2)
    assert all(math.isfinite(v) for v in history) and history[-1] < history[0]


def test_fit_crf_checks_gamma_and_tolerance_as_numbers():
    from betheproj.learning import LinearChainCRF, fit_crf

    x, y, n = torch.randn(2, 3, 4, dtype=torch.float64), torch.zeros(2, 3, dtype=torch.long), torch.tensor([3, 2])
    with pytest.raises(TypeError, match="^gamma must be"):
        fit_crf(LinearChainCRF(4, 2).double(), x, y, n, gamma=torch.zeros(2))
    fit_crf(LinearChainCRF(4, 2).double(), x, y, n, max_iter=2, tolerance=1e308)     # tolerance^2 overflowed
