"""Algorithm 1 (aggressive online learning, Turbo Parsers section 5) on small linear-chain problems."""

import math

import pytest
import torch

import betheproj as bp
from betheproj.learning.losses import structured_loss
from betheproj.learning.online import SparseExample, fit_online, sparse_potentials

DT = torch.float64
C, F, K = 3, 12, 4          # labels, observation features, features per position
D = F * C                   # weight ids: feature f with label c -> f * C + c


def _data(m, seed=0, n_max=6):
    """Examples whose labels are the MAP of a random model with the same features: separable by construction."""
    gen = torch.Generator().manual_seed(seed)
    w_true = torch.randn(D + 1 + C * C, generator=gen, dtype=DT) * 2
    w_true[D] = 0
    examples = []
    for _ in range(m):
        n = int(torch.randint(2, n_max + 1, (1,), generator=gen))
        feats = torch.stack([torch.randperm(F, generator=gen)[:K] for _ in range(n)])       # [N, K]
        ids = feats[:, None, :] * C + torch.arange(C)[None, :, None]                      # [N, C, K]
        ids[:, :, -1] = D                                                                 # one unused slot
        ex = SparseExample(ids, torch.zeros(n, dtype=torch.long))
        ex.gold = bp.LinearChain().map(sparse_potentials(w_true, [ex], D, C))[0]
        examples.append(ex)
    return examples


def _errors(weights, examples):
    pred = bp.LinearChain().map(sparse_potentials(weights, examples, D, C))
    gold = torch.full_like(pred, -1)
    for b, ex in enumerate(examples):
        gold[b, : len(ex.gold)] = ex.gold
    return int(((pred != gold) & (gold >= 0)).sum())


@pytest.mark.parametrize("loss", ["svm", "softmax_margin", "crf"])
def test_separable_chains_are_learned(loss):
    examples = _data(40)
    result = fit_online(bp.LinearChain(), examples, D, loss=loss, lam=1e-3, epochs=15, transitions=C)
    assert _errors(result.weights, examples) <= (0 if loss == "svm" else 3)
    assert result.steps == 40 * 15
    assert result.losses[-1] < 0.5 * result.losses[0]
    assert result.weights[D] == 0                       # the unused slot stays zero


def test_perceptron_loss_never_leaves_zero():
    # at w = 0 every structure ties, so L_{inf,0} = max_y' s(y') - s(y) = 0 and the step L / ||g||^2 is 0:
    # Algorithm 1 with the perceptron loss needs a margin (gamma > 0) or a non-zero start to move at all
    examples = _data(10)
    result = fit_online(bp.LinearChain(), examples, D, loss="perceptron", epochs=2, transitions=C)
    assert result.updates == 0 and (result.weights == 0).all()


def test_generalises_to_held_out_chains():
    examples = _data(250, seed=1)
    result = fit_online(bp.LinearChain(), examples[:150], D, loss="svm", lam=1e-3, epochs=8, transitions=C)
    tokens = sum(len(ex.gold) for ex in examples[150:])
    assert _errors(result.weights, examples[150:]) / tokens < 0.1


def _reference(examples, beta, gamma, lam, epochs, seed):
    """Dense Algorithm 1 with autograd gradients and explicit averaging of w_2 .. w_{T+1}."""
    m = len(examples)
    w = torch.zeros(D + 1 + C * C, dtype=DT)
    iterates, etas = [], []
    gen = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        for i in torch.randperm(m, generator=gen).tolist():
            ex = examples[i]
            w_var = w.clone().requires_grad_(True)
            ex = SparseExample(ex.global_ids(), ex.gold)
            value = structured_loss(bp.LinearChain(), sparse_potentials(w_var, [ex], D, C), ex.gold[None],
                                    beta, gamma).sum()
            value.backward()
            g = w_var.grad.clone()
            g[D] = 0
            eta = min(1 / (lam * m), value.item() / float(g @ g)) if value.item() > 0 else 0.0
            etas.append(eta)
            w = w - eta * g
            iterates.append(w)
    return torch.stack(iterates).mean(0), w, etas


@pytest.mark.parametrize("beta,gamma", [(1.0, 0.0), (1.0, 1.0), (math.inf, 1.0)])
@pytest.mark.parametrize("lam", [1e-3, 10.0])           # the loss-driven step and the capped step 1/(lambda m)
@pytest.mark.parametrize("compact", [False, True])
def test_steps_and_averaging_match_a_dense_reference(beta, gamma, lam, compact):
    examples = _data(5, seed=2)
    if compact:
        examples = [ex.compact() for ex in examples]
        assert torch.equal(examples[0].global_ids(), _data(5, seed=2)[0].ids)
    result = fit_online(bp.LinearChain(), examples, D, loss=None, beta=beta, gamma=gamma, lam=lam, epochs=3,
                        transitions=C, seed=7, record_steps=True)
    avg, last, etas = _reference(examples, beta, gamma, lam, 3, 7)
    assert torch.allclose(torch.tensor(result.etas, dtype=DT), torch.tensor(etas, dtype=DT), atol=1e-10)
    assert torch.allclose(result.last, last, atol=1e-10)
    assert torch.allclose(result.weights, avg, atol=1e-10)
    if lam == 10.0:
        assert max(etas) == pytest.approx(1 / (10.0 * 5))


def test_first_crf_step_by_hand():
    ex = _data(1, seed=3)[0]
    n = len(ex.gold)
    result = fit_online(bp.LinearChain(), [ex], D, loss="crf", lam=1e-6, epochs=1, transitions=C, record_steps=True)
    # at w = 0: L = log C^n, g = F(x)(1/C - onehot(y)) plus the transition part (n-1)/C^2 - pair indicators
    g = torch.zeros(D + 1 + C * C, dtype=DT)
    for t in range(n):
        for c in range(C):
            for k in range(K):
                g[ex.ids[t, c, k]] += 1 / C - float(c == int(ex.gold[t]))
    g[D] = 0
    g[D + 1:] += (n - 1) / C ** 2
    for t in range(n - 1):
        g[D + 1 + ex.gold[t] * C + ex.gold[t + 1]] -= 1
    assert result.etas[0] == pytest.approx(n * math.log(C) / float(g @ g))
    assert torch.allclose(result.last, -result.etas[0] * g)


def test_validation():
    examples = _data(3)
    with pytest.raises(ValueError, match="lam"):
        fit_online(bp.LinearChain(), examples, D, lam=0.0, transitions=C)
    with pytest.raises(ValueError, match="epochs"):
        fit_online(bp.LinearChain(), examples, D, epochs=0, transitions=C)
    with pytest.raises(ValueError, match="no training examples"):
        fit_online(bp.LinearChain(), [], D)
    with pytest.raises(ValueError, match="feature ids must lie"):
        fit_online(bp.LinearChain(), examples, D - 1, transitions=C)
    with pytest.raises(ValueError, match="transitions=4"):
        fit_online(bp.LinearChain(), examples, D, transitions=4)
    with pytest.raises(ValueError, match="beta must be a number > 0"):
        fit_online(bp.LinearChain(), examples, D, loss=None, beta=-1.0, gamma=0.0, transitions=C)
    with pytest.raises(ValueError, match="gold must be"):
        SparseExample(torch.zeros(2, 3, 1, dtype=torch.long), torch.zeros(3, dtype=torch.long))


def test_compact_tables_must_be_strictly_increasing():
    ids = torch.tensor([[[0], [1]], [[2], [0]]], dtype=torch.int32)
    for table in ([5, 1, 2], [1, 1, 2]):                # pad not last: a wrong step; duplicates: split gradients
        with pytest.raises(ValueError, match="table must be strictly increasing"):
            SparseExample(ids, torch.tensor([0, 1]), None, torch.tensor(table))
    compact = SparseExample(torch.tensor([[[5], [1]], [[2], [5]]]), torch.tensor([0, 1])).compact()
    assert compact.table.tolist() == [1, 2, 5]


def test_gold_on_a_forbidden_part_is_refused():
    ids = torch.randint(0, 5, (3, 2, 2), generator=torch.Generator().manual_seed(0))
    allowed = torch.ones(3, 2, dtype=torch.bool)
    allowed[1, 0] = False
    bad = SparseExample(ids, torch.tensor([0, 0, 1]), allowed)
    ok = SparseExample(ids, torch.tensor([0, 1, 1]), allowed)
    for loss in ("crf", "svm"):                        # used to run with losses [inf, inf] and steps at the cap
        with pytest.raises(ValueError, match=r"examples\[1\]: gold labels lie on forbidden parts .* \[1\]"):
            fit_online(bp.LinearChain(), [ok, bad], 5, loss=loss, epochs=2)
        result = fit_online(bp.LinearChain(), [ok, ok.compact()], 5, loss=loss, epochs=2)
        assert all(math.isfinite(v) for v in result.losses)


def test_flags_are_not_counts_or_labels():
    examples = _data(2)
    with pytest.raises(TypeError, match="epochs must be an int"):
        fit_online(bp.LinearChain(), examples, D, epochs=True, transitions=C)
    with pytest.raises(TypeError, match="num_features must be an int"):
        fit_online(bp.LinearChain(), examples, True)
    with pytest.raises(ValueError, match="num_features must be an int >= 1"):
        fit_online(bp.LinearChain(), examples, 0)
    with pytest.raises(TypeError, match="lam"):
        fit_online(bp.LinearChain(), examples, D, lam="1", transitions=C)
    with pytest.raises(ValueError, match="gold must be"):
        SparseExample(torch.zeros(2, 3, 1, dtype=torch.long), torch.zeros(2, dtype=torch.bool))


def _ids(n=2, c=2, k=1):
    return torch.zeros(n, c, k, dtype=torch.long)


@pytest.mark.parametrize("make, err, msg", [
    (lambda: SparseExample(torch.zeros(2, 2, 1), torch.zeros(2, dtype=torch.long)), TypeError,
     "ids must be an int32 or int64 tensor"),
    (lambda: SparseExample(_ids().to(torch.uint8), torch.zeros(2, dtype=torch.long)), TypeError,
     r"ids must be an int32 or int64 tensor \[N, C, K\], got torch.uint8"),
    (lambda: SparseExample(_ids(), torch.zeros(2, dtype=torch.long), None, torch.tensor([0, 1], dtype=torch.uint8)),
     TypeError, "table must be an int32 or int64 tensor"),
    (lambda: SparseExample(_ids().to(torch.int16), torch.zeros(2, dtype=torch.long)), TypeError,
     "ids must be an int32 or int64"),
    (lambda: SparseExample(_ids(), torch.zeros(2, dtype=torch.long), torch.ones(2, 3, dtype=torch.bool)), ValueError,
     r"allowed must be a bool tensor \[N, C\]=\(2, 2\)"),
    (lambda: SparseExample(_ids(), torch.zeros(2, dtype=torch.long), None, torch.tensor([0.0])), TypeError,
     r"table must be an int32 or int64 tensor \[U\]"),
    (lambda: SparseExample(_ids(), torch.zeros(2, dtype=torch.long), None, torch.tensor([3, 1])), ValueError,
     "strictly increasing"),
    (lambda: sparse_potentials(torch.zeros(5, dtype=DT), [], 4), ValueError, "no examples"),
    # the public function checked neither its weights nor the examples' ids: an IndexError from torch, or (an id
    # past num_features but inside a longer vector) the transition block's weights read as feature weights
    (lambda: sparse_potentials(torch.zeros(4, dtype=DT), [SparseExample(_ids(), torch.zeros(2, dtype=torch.long))], 4),
     ValueError, r"weights must have at least num_features \+ 1 = 5 entries, got 4"),
    (lambda: sparse_potentials(torch.zeros(10, dtype=DT), [SparseExample(_ids(), torch.zeros(2, dtype=torch.long))],
                               4, transitions=2), ValueError,
     r"num_features \+ 1 \+ transitions\^2 = 9 entries, got 10"),
    (lambda: sparse_potentials(torch.zeros(9, dtype=DT), [SparseExample(_ids() + 5, torch.zeros(2, dtype=torch.long))],
                               4, transitions=2), ValueError, r"feature ids must lie in \[0, num_features\]=\[0, 4\]"),
    (lambda: sparse_potentials(torch.zeros(5, dtype=torch.long),
                               [SparseExample(_ids(), torch.zeros(2, dtype=torch.long))], 4), TypeError,
     "weights must be a 1-D floating-point tensor, got a 1-D torch.int64"),
    (lambda: sparse_potentials(torch.zeros(5, dtype=DT), [object()], 4), TypeError,
     r"examples must be SparseExample, got object at examples\[0\]"),
    (lambda: sparse_potentials(torch.zeros(9, dtype=DT), [SparseExample(_ids(c=3), torch.zeros(2, dtype=torch.long))],
                               4, transitions=2), ValueError, "C=3 labels but transitions=2"),
    (lambda: fit_online(bp.LinearChain(), [object()], 4), TypeError, "examples must be SparseExample"),
    (lambda: fit_online(bp.LinearChain(), [SparseExample(_ids(), torch.zeros(2, dtype=torch.long)),
                                           SparseExample(_ids(n=0), torch.zeros(0, dtype=torch.long))], 4),
     ValueError, r"examples\[1\] is empty \(N = 0 positions"),
    (lambda: fit_online(bp.LinearChain(), [SparseExample(_ids(), torch.tensor([0, 2]))], 4), ValueError,
     r"examples\[0\]: gold labels must lie in \[0, 2\)"),
    (lambda: fit_online(bp.LinearChain(), [SparseExample(_ids() + 2, torch.zeros(2, dtype=torch.long), None,
                                                         torch.tensor([0, 1]))], 4), ValueError,
     r"compact ids must index the table \(0..1\)"),
])
def test_bad_sparse_examples(make, err, msg):
    with pytest.raises(err, match=msg):
        make()


def test_compact_examples_score_as_their_global_ids_and_mixed_label_counts_pad_with_minus_inf():
    examples = _data(3)
    w = torch.randn(D + 1 + C * C, generator=torch.Generator().manual_seed(1), dtype=DT)
    w[D] = 0
    compact = [ex.compact() for ex in examples]
    assert compact[0].compact() is compact[0]
    assert torch.equal(compact[0].global_ids(), examples[0].ids)
    assert torch.equal(sparse_potentials(w, compact, D, C).node, sparse_potentials(w, examples, D, C).node)
    narrow = SparseExample(examples[0].ids[:, :2], torch.zeros(len(examples[0].gold), dtype=torch.long))
    node = sparse_potentials(w, [examples[1], narrow], D).node
    n = len(narrow.gold)
    assert torch.isinf(node[1, :n, 2]).all() and torch.isfinite(node[1, :n, :2]).all()


def test_dtype_must_be_a_float_type_torch_can_train_in():
    ex = SparseExample(torch.zeros(2, 3, 1, dtype=torch.long), torch.zeros(2, dtype=torch.long))
    for dtype in (torch.float16, torch.long):
        with pytest.raises(TypeError, match="dtype must be torch.float32 or torch.float64"):
            fit_online(bp.LinearChain(), [ex], num_features=1, dtype=dtype)


def test_gold_heads_that_are_not_a_tree_are_named_before_the_first_step():
    """The dependency oracles' tree check ran inside the epoch: training stopped at the bad example, after the
    steps before it, naming it gold[0] (its place in a batch of one)."""
    gen = torch.Generator().manual_seed(0)

    def example(gold):
        n = len(gold)
        allowed = torch.ones(n, n + 1, dtype=torch.bool)
        allowed[torch.arange(n), torch.arange(1, n + 1)] = False              # no word heads itself
        return SparseExample(torch.randint(0, 20, (n, n + 1, 2), generator=gen), torch.tensor(gold), allowed)

    examples = [example([0, 1, 2]) for _ in range(6)] + [example([2, 3, 2])]  # example 6: a cycle 2 <-> 3
    steps = []
    with pytest.raises(ValueError, match=r"^examples\[6\]\.gold are not the heads of a tree"):
        fit_online(bp.NonProjective(), examples, 20, loss="crf", epochs=1, callback=lambda *a: steps.append(a))
    assert steps == []
    fit_online(bp.NonProjective(), examples[:6], 20, loss="crf", epochs=1)


def test_a_transition_block_over_dependency_trees_stays_at_zero():
    """The dependency oracles have no pairwise factors, so the loss's edge gradient is zero: it was ``S(y_hat) -
    S(y)`` over the heads of consecutive words, which the first step wrote into the transition block and the
    oracle refused on the next example ("potentials.edge must be all zeros").  The run is the one without the
    block, step for step."""
    gen = torch.Generator().manual_seed(1)
    examples = [SparseExample(torch.randint(1, 20, (3, 4, 2), generator=gen), torch.tensor(gold))
                for gold in ([0, 1, 2], [2, 0, 2], [0, 0, 0], [3, 0, 2])]
    with_block = fit_online(bp.NonProjective(), examples, 20, loss="svm", epochs=2, transitions=4, record_steps=True)
    without = fit_online(bp.NonProjective(), examples, 20, loss="svm", epochs=2, record_steps=True)
    assert with_block.etas == without.etas and with_block.updates > 0
    assert torch.equal(with_block.weights[:21], without.weights) and not with_block.weights[21:].any()


def test_an_oracle_class_a_non_oracle_or_a_callback_that_is_not_a_function_is_named_before_any_step():
    # the class bp.LinearChain failed at the first step ("marginals() missing 1 required positional argument"),
    # None with an AttributeError, and callback=5 with "'int' object is not callable" after a whole epoch
    examples = _data(3)
    with pytest.raises(TypeError, match=r"oracle must be an instance such as LinearChain\(\.\.\.\)"):
        fit_online(bp.LinearChain, examples, D, transitions=C)
    with pytest.raises(TypeError, match=r"oracle must provide map\(\); got NoneType"):
        fit_online(None, examples, D, loss="svm", transitions=C)
    with pytest.raises(TypeError, match="callback must be a function .* got int"):
        fit_online(bp.LinearChain(), examples, D, transitions=C, callback=5)


@pytest.mark.parametrize("name", ["record_steps", "progress"])
def test_flag_arguments_must_be_bools(name):
    # record_steps="no" was truthy (steps recorded), progress="no" showed a bar
    with pytest.raises(TypeError, match=f"{name} must be a bool, got str 'no'"):
        fit_online(bp.LinearChain(), _data(2), D, transitions=C, **{name: "no"})


def test_examples_may_be_a_generator_and_a_bad_transition_count_names_the_example():
    # a generator failed with "object of type 'generator' has no len()"
    examples = _data(12)
    from_list = fit_online(bp.LinearChain(), examples, D, loss="svm", epochs=2, transitions=C)
    from_gen = fit_online(bp.LinearChain(), (ex for ex in examples), D, loss="svm", epochs=2, transitions=C)
    assert torch.equal(from_list.weights, from_gen.weights)
    with pytest.raises(TypeError, match="examples must be a sequence of SparseExample, got SparseExample"):
        fit_online(bp.LinearChain(), examples[0], D)
    with pytest.raises(ValueError, match=r"examples\[0\] has C=3 labels but transitions=2"):
        fit_online(bp.LinearChain(), examples, D, transitions=2)
