"""The structured perceptron (Collins 2002) over exact, LP-relaxed and oracle MAP routines: separable chain and
tree data with the LinearChain/Tree oracles, averaging, the step size, fractional LP updates (Kulesza & Pereira
2007, section 5.1) and bad inputs."""

import numpy as np
import pytest
import torch

import betheproj as bp
from betheproj.learning.perceptron import mrf_map, oracle_map, predict, structured_perceptron
from betheproj.mrf import LinearPairwiseMRF, LocalMarginals, exact_map, lp_map, triangle_model


def _labelled_tree_data(rng, parents, num, c=3, k=3):
    """Node features e_y (x) x_t (c * k) plus transition indicators (c * c); labels by exact MAP under w*."""
    n = len(parents)
    d = c * k + c * c
    edges = [(parents[i], i) for i in range(1, n)]
    trans = np.zeros((c, c, d))
    for a in range(c):
        for b in range(c):
            trans[a, b, c * k + a * c + b] = 1.0
    w_star = rng.normal(size=d)
    data = []
    for _ in range(num):
        nf = []
        for _t in range(n):
            x = rng.normal(size=k)
            f = np.zeros((c, d))
            for y in range(c):
                f[y, y * k:(y + 1) * k] = x
            nf.append(f)
        model = LinearPairwiseMRF([c] * n, edges, nf, [trans] * (n - 1))
        data.append((model, exact_map(model.potentials(w_star)).labels))
    return data, w_star


def test_perceptron_separates_chain_data_with_the_linear_chain_oracle():
    rng = np.random.default_rng(0)
    data, _ = _labelled_tree_data(rng, [-1, 0, 1, 2, 3, 4], 15)
    chain = oracle_map(bp.LinearChain())
    for x, _ in data[:5]:                                       # the adapter agrees with enumeration
        w = rng.normal(size=x.num_features)
        assert np.array_equal(chain(x, w), exact_map(x.potentials(w)).labels)
    res = structured_perceptron(data, chain, epochs=100)
    assert res.converged and res.mistakes[-1] == 0
    assert all(predict(data, chain, res.last))
    assert all(predict(data, mrf_map("exact"), res.last))
    assert res.path.shape == (res.steps + 1, data[0][0].num_features)
    assert np.allclose(res.average, res.path[1:].mean(0))        # Collins' averaged parameters
    avg = structured_perceptron(data, chain, epochs=100, averaged=True)
    assert np.allclose(avg.weights, avg.average) and np.allclose(avg.last, res.last)
    # from w = 0 the predictions are scale-invariant: the step only scales the path
    twice = structured_perceptron(data, chain, epochs=100, step=2.0)
    assert np.allclose(twice.path, 2.0 * res.path) and twice.mistakes == res.mistakes


def test_perceptron_with_the_tree_oracle_and_per_node_label_sets():
    rng = np.random.default_rng(1)
    parents = [-1, 0, 0, 1, 1, 2]
    data, _ = _labelled_tree_data(rng, parents, 12)
    tree = oracle_map(bp.Tree(parents))
    res = structured_perceptron(data, tree, epochs=100, shuffle=True, seed=3)
    assert res.converged and all(predict(data, tree, res.last))
    again = structured_perceptron(data, tree, epochs=100, shuffle=True, seed=3)
    assert np.array_equal(again.path, res.path)
    # a node with a smaller label set is padded with -inf for the oracle and never gets a padded label
    model = LinearPairwiseMRF([3, 2, 3], [(0, 1), (1, 2)], [np.ones((3, 1)), np.array([[0.0], [5.0]]),
                                                           np.ones((3, 1))])
    assert oracle_map(bp.LinearChain())(model, np.ones(1)).tolist()[1] == 1
    # parents given as a generator: read once, not once per example (the second call saw it exhausted and
    # failed with 'parents must have length 6 ..., got []')
    once = oracle_map(bp.Tree(parents), parents=(v for v in parents))
    assert all(np.array_equal(once(x, res.last), tree(x, res.last)) for x, _ in data[:3])


def test_fractional_lp_prediction_updates_with_expected_features():
    x = (4.0, 3.0, 3.0)
    model = triangle_model(x)
    gold = exact_map(model.potentials(np.ones(3))).labels
    res = structured_perceptron([(model, gold)], mrf_map("lp"), epochs=1, initial=np.ones(3),
                                stop_when_separated=False)
    assert res.fractional_updates == 1 and res.mistakes == [1]
    # Phi(x, gold) = (4, 0, 0); Phi(x, mu = 1/2) = (4, 3, 3) / 2
    assert np.allclose(res.update_vectors[0], [2.0, -1.5, -1.5])
    assert np.allclose(res.last, [3.0, -0.5, -0.5])
    # a LocalMarginals prediction is accepted too, and an integral one equal to the gold is no mistake
    point = model.structure.one_hot(gold)
    res = structured_perceptron([(model, gold)], lambda m, w: point, epochs=3, num_features=3)
    assert res.converged and res.total_mistakes == 0
    half = lp_map(model.potentials(np.ones(3))).marginals
    assert isinstance(half, LocalMarginals) and not predict([(model, gold)], lambda m, w: half, np.ones(3))[0]


def test_oracle_outputs_as_tensors_are_accepted():
    rng = np.random.default_rng(2)
    data, _ = _labelled_tree_data(rng, [-1, 0, 1], 5)

    def tensor_map(x, w):
        return torch.as_tensor(exact_map(x.potentials(w)).labels)[None]      # [1, N], like an oracle

    res = structured_perceptron(data, tensor_map, epochs=50)
    assert res.converged


def test_bad_inputs():
    model = triangle_model((4.0, 3.0, 3.0))
    ok = [(model, np.array([1, 0, 0]))]
    run = mrf_map("exact")
    with pytest.raises(ValueError, match="examples is empty"):
        structured_perceptron([], run)
    with pytest.raises(TypeError, match="examples must be a sequence"):
        structured_perceptron("abc", run)
    with pytest.raises(ValueError, match=r"examples\[0\] must be an \(x, gold\) pair"):
        structured_perceptron([model], run)
    with pytest.raises(TypeError, match="map_fn must be callable"):
        structured_perceptron(ok, "exact")
    with pytest.raises(ValueError, match="epochs must be an int >= 1"):
        structured_perceptron(ok, run, epochs=0)
    with pytest.raises(ValueError, match="step must be a finite number > 0"):
        structured_perceptron(ok, run, step=-1.0)
    with pytest.raises(ValueError, match="initial must have shape"):
        structured_perceptron(ok, run, initial=np.zeros(2), num_features=3)
    with pytest.raises(ValueError, match="cannot tell the number of features"):
        structured_perceptron([(object(), [0])], lambda x, w: [0])
    with pytest.raises(ValueError, match=r"examples\[0\]: the gold labelling must be integral"):
        structured_perceptron([(model, lp_map(model.potentials(np.ones(3))).marginals)], run)
    for gold, error, message in [(np.array([1, -1, 0]), ValueError, "must hold labels >= 0"),
                                 (np.array([1.0, 0.0, 0.0]), TypeError, "must be a 1-D array of integer labels"),
                                 (np.array([[1, 0, 0]]), TypeError, "must be a 1-D array of integer labels")]:
        with pytest.raises(error, match=rf"examples\[1\]: the gold labelling {message}"):
            structured_perceptron(ok + [(model, gold)], run)
    with pytest.raises(ValueError, match="features returned shape"):
        structured_perceptron(ok, run, features=lambda x, z: np.zeros(2), initial=np.array([0.0, 1.0, 1.0]))
    with pytest.raises(TypeError, match="a prediction must be integer labels"):
        structured_perceptron(ok, lambda x, w: np.array([0.5, 0.5, 0.5]), num_features=3)
    with pytest.raises(ValueError, match="method must be one of"):
        mrf_map("gibbs")
    with pytest.raises(TypeError, match="x must be a LinearPairwiseMRF"):
        run("x", np.zeros(3))
    with pytest.raises(TypeError, match="oracle must have a map"):
        oracle_map(object())
    with pytest.raises(ValueError, match="a tree on 3 nodes has 2"):
        oracle_map(bp.LinearChain())(model, np.ones(3))
    with pytest.raises(ValueError, match=r"z must hold 3 integer label indices"):
        structured_perceptron(ok, lambda x, w: np.array([0, 0]), num_features=3)
    # -1 inside a prediction was dropped like padding, so [1, -1, 0, 0] matched the gold [1, 0, 0]: no mistake
    for bad in (np.array([1, -1, 0, 0]), np.array([1, 0, 0, -2])):
        with pytest.raises(ValueError, match="followed only by the oracles' -1 padding"):
            structured_perceptron(ok, lambda x, w, z=bad: z, num_features=3)
        with pytest.raises(ValueError, match="followed only by the oracles' -1 padding"):
            predict(ok, lambda x, w, z=bad: z, np.zeros(3))
    assert predict(ok, lambda x, w: np.array([1, 0, 0, -1, -1]), np.zeros(3)) == [True]   # trailing padding
    with pytest.raises(TypeError, match="map_fn must be callable"):   # "'str' object is not callable"
        predict(ok, "exact", np.zeros(3))
    with pytest.raises(TypeError, match="w must be a vector of weights, got str"):    # "could not convert string"
        predict(ok, run, "abc")
    assert predict(ok, run, torch.tensor([1.0, 0.0, 0.0])) == [True]
    with pytest.raises(ValueError, match=r"examples\[0\]: the gold labelling must hold labels >= 0"):
        predict([(model, np.array([-1, 0, 0]))], run, np.zeros(3))     # predict reads gold as training does


def test_predict_checks_the_gold_labels_against_the_label_sets_as_training_does():
    """predict counted a gold label outside its node's label set (2 of a binary node), or a gold labelling of the
    wrong length, silently as a mistake ([False]); training refused it, but only at its first update and naming the
    features' argument 'z'.  Both now refuse it up front, naming the example."""
    model = triangle_model((4.0, 3.0, 3.0))                         # three binary nodes
    ok = [(model, np.array([1, 0, 0]))]
    run = mrf_map("exact")
    for gold, message in [(np.array([2, 0, 0]), r"has label indices outside the label sets \(sizes \(2, 2, 2\)\)"),
                          (np.array([1, 0]), "must hold 3 integer label indices"),
                          (np.array([1, 0, 0, 0]), "must hold 3 integer label indices")]:
        with pytest.raises(ValueError, match=rf"examples\[1\]: the gold labelling {message}"):
            predict(ok + [(model, gold)], run, np.zeros(3))
        with pytest.raises(ValueError, match=rf"examples\[1\]: the gold labelling {message}"):
            structured_perceptron(ok + [(model, gold)], lambda x, w: 1 / 0, num_features=3)   # before any MAP call
    assert predict(ok, run, np.zeros(3)) == [False] and predict(ok, run, np.array([1.0, 0.0, 0.0])) == [True]


def test_mistake_bound_without_a_positive_margin_is_infinite():
    from betheproj.learning.perceptron import MistakeBound

    assert MistakeBound(0.5, 1.0, 2.0, 3.0).bound_lower == pytest.approx(4.0)
    assert MistakeBound(0.5, 1.0, 2.0, 3.0).bound_upper == pytest.approx(36.0)
    for g_lo, g_hi in [(-1.0, 0.0), (-2.3, -2.3)]:     # used to divide by zero / give a finite 4.69
        bound = MistakeBound(g_lo, g_hi, 5.0, 5.8)
        assert bound.bound_lower == float("inf") and bound.bound_upper == float("inf")
    tiny = MistakeBound(1e-200, 1e-200, 1.0, 1.0)        # R^2 / gamma^2 beyond the float range: inf, no OverflowError
    assert tiny.bound_lower == float("inf") and tiny.bound_upper == float("inf")


def test_flags_must_be_bools():
    """shuffle="no" shuffled (a non-empty string is truthy), averaged=1 averaged: flags are bools, as elsewhere."""
    model = triangle_model((4.0, 3.0, 3.0))
    ok = [(model, np.array([1, 0, 0]))]
    for flag in ("averaged", "shuffle", "stop_when_separated"):
        with pytest.raises(TypeError, match=f"{flag} must be a bool"):
            structured_perceptron(ok, mrf_map("exact"), num_features=3, **{flag: "no"})
    assert structured_perceptron(ok, mrf_map("exact"), num_features=3, shuffle=np.bool_(True), seed=0).converged


def test_non_finite_features_or_weights_are_refused():
    """A features() giving NaN or inf, or an update overflowing the weights, left NaN/inf weights in the result
    (and every later prediction read them) without a word."""
    model = triangle_model((4.0, 3.0, 3.0))
    ok = [(model, np.array([1, 0, 0]))]
    wrong = lambda x, w: np.array([0, 0, 0])                        # noqa: E731
    with pytest.raises(ValueError, match="features returned non-finite values"):
        structured_perceptron(ok, wrong, features=lambda x, z: np.array([np.nan, 0.0, 0.0]), num_features=3)
    with pytest.raises(ValueError, match="features returned non-finite values"):
        structured_perceptron(ok, wrong, features=lambda x, z: np.array([np.inf, 0.0, 0.0]), num_features=3)
    huge = lambda x, z: np.array([1e308 if z[0] == 1 else -1e308, 0.0, 0.0])  # noqa: E731
    with pytest.raises(ValueError, match="the weights overflow float64"):
        structured_perceptron(ok, wrong, features=huge, num_features=3)


def test_initial_that_is_no_vector_of_numbers_is_named():
    model = triangle_model((4.0, 3.0, 3.0))
    ok = [(model, np.array([1, 0, 0]))]
    for bad in ("abc", [1.0, None, 2.0], {"w": 1}):
        with pytest.raises((TypeError, ValueError), match="initial must be"):
            structured_perceptron(ok, mrf_map("exact"), initial=bad)


def test_mistake_bound_scales_with_the_features():
    """R^2 / gamma^2 was formed from the squares: R, gamma of 1e160 raised OverflowError, of 1e-170
    ZeroDivisionError (the squares underflow to 0); the bound depends on their ratio only."""
    from betheproj.learning.perceptron import MistakeBound

    for scale in (1e160, 1e-170, 1e300):
        bound = MistakeBound(0.5 * scale, 1.0 * scale, 2.0 * scale, 3.0 * scale)
        assert bound.bound_lower == pytest.approx(4.0) and bound.bound_upper == pytest.approx(36.0)
