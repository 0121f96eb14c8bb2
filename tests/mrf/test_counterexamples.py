"""The findings of Kulesza & Pereira, *Structured Learning with Approximate Inference* (NIPS 2007): section 3 (LP
relaxation makes the triangle of Figure 1 algorithmically inseparable), section 4 (LBP on Figure 2, gamma, the
perceptron that never separates) and section 5.1 (the perceptron mistake bound under LP-relaxed inference), plus a
smoke test of the example script."""

import importlib.util
import pathlib

import numpy as np
import pytest

from betheproj.learning.perceptron import lp_mistake_bound, mrf_map, structured_perceptron
from betheproj.mrf import (
    TRIANGLE_INPUTS,
    LocalMarginals,
    PairwiseMRF,
    exact_map,
    figure2_mrf,
    figure3_dataset,
    lbp_decision_boundary,
    lbp_exponents,
    lbp_gamma,
    lbp_map,
    lp_map,
    random_grid_dataset,
    triangle_correct,
    triangle_model,
)
from betheproj.mrf.paper import FIGURE2_LABELS

PAPER_GAMMA = 1.089339


# --- section 3 ---------------------------------------------------------------------------------------------------
def test_triangle_exact_map_with_unit_weights_labels_all_inputs_correctly():
    for x in TRIANGLE_INPUTS:
        model = triangle_model(x)
        res = exact_map(model.potentials(np.ones(3)))
        assert triangle_correct(x, res)
        assert res.objective == pytest.approx(4.0)                  # lambda_{i*j*} = 4
        # margin: every labelling with the wrong pair matched scores at most 3 < 4
        for w in np.exp(np.random.default_rng(0).uniform(-0.14, 0.14, size=(20, 3))):
            assert triangle_correct(x, exact_map(model.potentials(w)))


def test_triangle_lp_returns_one_half_whenever_w_separates_exactly():
    rng = np.random.default_rng(1)
    for w in [np.ones(3)] + list(np.exp(rng.uniform(-0.14, 0.14, size=(15, 3)))):
        assert all(4 * a > 3 * b for a in w for b in w)            # the separating region of section 3.2
        for x in TRIANGLE_INPUTS:
            res = lp_map(triangle_model(x).potentials(w))
            assert not res.integral and not triangle_correct(x, res)
            for mu in res.node_marginals:
                assert np.allclose(mu, 0.5, atol=1e-9)
            for mu in res.edge_marginals:                          # mu_ij(agree) = 1/2 on every edge
                assert np.allclose(np.sort(mu.reshape(-1)), [0, 0, 0.5, 0.5], atol=1e-9)
            lam = w * np.asarray(x)
            assert res.objective == pytest.approx(lam.sum() / 2)


def test_triangle_correct_refuses_points_of_other_models():
    x = TRIANGLE_INPUTS[0]
    other = exact_map(PairwiseMRF([2, 2], [(0, 1)]))                # a 2-node model's labelling: was False
    nodes_only = LocalMarginals([np.array([0.0, 1.0])] * 2, [])      # was False
    three_labels = LocalMarginals([np.array([0.0, 0.0, 1.0])] * 3, [np.zeros((3, 3))] * 3)   # was an IndexError
    nan = triangle_model(x).structure.one_hot([1, 0, 0])
    nan.node[2] = np.array([np.nan, 1.0])                          # was False
    for bad in (other, nodes_only, three_labels, nan):
        with pytest.raises(ValueError, match="prediction"):
            triangle_correct(x, bad)
    assert triangle_correct(x, triangle_model(x).structure.one_hot([1, 0, 0]))     # B = B on edge 12


def test_no_positive_w_lets_the_lp_label_all_three_inputs():
    """LP correct on x needs lambda_{i*j*} >= sum(lambda)/2, i.e. 4 w_{i*j*} >= 3 (w_kl + w_mn); summing the three
    conditions gives 4 S >= 6 S, impossible for S = sum(w) > 0.  Checked on broad random w."""
    rng = np.random.default_rng(2)
    best = 0
    for w in np.exp(rng.normal(scale=1.5, size=(30, 3))):
        correct = 0
        for x in TRIANGLE_INPUTS:
            res = lp_map(triangle_model(x).potentials(w))
            lam = w * np.asarray(x)
            assert res.objective == pytest.approx(max(lam.max(), lam.sum() / 2), rel=1e-9)
            ok = triangle_correct(x, res)
            assert not ok or lam[int(np.argmax(x))] >= lam.sum() / 2
            correct += ok
        best = max(best, correct)
        assert correct <= 2
    assert best == 2                                                # two of three is reachable, three never


# --- section 4 ---------------------------------------------------------------------------------------------------
def test_gamma_closed_form_recursion_and_lbp_measurement():
    gamma = lbp_gamma()
    assert abs(gamma - PAPER_GAMMA) < 5e-7                          # the paper's 7 significant digits
    exps = lbp_exponents(80)[-1]
    for p, q in exps:                                               # all three label-1 messages: q/p -> gamma
        assert abs(q / p - gamma) < 1e-9
    measured = lbp_decision_boundary(beta=-1.0, tol=1e-9)
    assert abs(measured - gamma) < 1e-8                             # LBP's own decision boundary: 8 digits
    assert abs(measured - PAPER_GAMMA) < 5e-7
    assert lbp_decision_boundary(beta=-2.5, tol=1e-7) == pytest.approx(gamma, abs=1e-6)


def test_lbp_predicts_sign_alpha_plus_gamma_beta_and_exact_map_sign_alpha_plus_beta():
    gamma = lbp_gamma()
    rng = np.random.default_rng(3)
    pts = rng.uniform(-3, 3, size=(40, 2))
    pts = pts[np.abs(pts[:, 0] + gamma * pts[:, 1]) > 1e-3]
    for alpha, beta in pts:
        mrf = figure2_mrf(alpha, beta)
        lbp, ex = lbp_map(mrf), exact_map(mrf)
        assert lbp.converged
        assert set(lbp.labels.tolist()) == {FIGURE2_LABELS.index(int(np.sign(alpha + gamma * beta)))}
        assert set(ex.labels.tolist()) == {FIGURE2_LABELS.index(int(np.sign(alpha + beta)))}


def test_lbp_and_exact_map_disagree_at_alpha_1_beta_minus_095():
    mrf = figure2_mrf(1.0, -0.95)
    lbp = lbp_map(mrf)
    assert lbp.converged and lbp.ties == []
    assert mrf.label_names(lbp.labels) == [-1, -1, -1, -1]
    assert mrf.label_names(exact_map(mrf).labels) == [1, 1, 1, 1]
    fg = lbp_map(mrf, backend="factor_graphs")                     # the factor-graph BP agrees
    assert fg.converged and mrf.label_names(fg.labels) == [-1, -1, -1, -1]
    # the paper's normalised messages: every label-1 message ends at ~0 (alpha + gamma beta < 0)
    assert all(b[1] < 1e-12 for b in lbp.beliefs)


def test_perceptron_with_lbp_never_separates_and_with_exact_map_converges():
    data = figure3_dataset()
    res = structured_perceptron(data, mrf_map("lbp"), epochs=1000, step=0.5)
    assert not res.converged and res.epochs == 1000
    assert res.mistakes[0] == 1 and all(m == 2 for m in res.mistakes[1:])
    ends = res.path[2::2]                                           # w after each full pass
    assert np.allclose(ends[0], [0.95, 1.0])
    assert np.allclose(np.diff(ends, axis=0), [-0.05, 0.05], atol=1e-9)
    assert np.allclose(res.last, [0.95, 1.0] + 999 * np.array([-0.05, 0.05]))
    w_star = np.array([1.0, -1.0])                                  # moving away from w* = (1, -1)
    assert res.last @ w_star < -99
    assert np.allclose(res.update_vectors[1::2][:3], [[-2.0, -1.9]] * 3)     # Phi(a, -1) - Phi(a, 1)

    exact = structured_perceptron(data, mrf_map("exact"), epochs=1000, step=0.5)
    assert exact.converged and exact.epochs == 3 and exact.total_mistakes == 2
    assert np.allclose(exact.last, [-0.05, 0.05])
    # w* = (1, -1) algorithmically separates the data under LBP, and (-1, 1) separates it under exact MAP
    for x, y in data:
        assert np.array_equal(lbp_map(x.potentials(w_star)).labels, y)
        assert np.array_equal(exact_map(x.potentials(-w_star)).labels, y)
        assert not np.array_equal(exact_map(x.potentials(w_star)).labels, y)


# --- section 5.1 -------------------------------------------------------------------------------------------------
def test_perceptron_with_lp_inference_respects_the_mistake_bound():
    data, w_star = random_grid_dataset(12, rows=3, cols=3, seed=0, min_margin=0.02)
    for x, y in data:                                               # algorithmically separable by w*
        res = lp_map(x.potentials(w_star))
        assert res.integral and np.array_equal(res.labels, y)
    res = structured_perceptron(data, mrf_map("lp"), epochs=100)
    assert res.converged
    bound = lp_mistake_bound(data, w_star)
    assert 0 < bound.gamma_lower <= bound.gamma_upper
    assert 0 < bound.radius_lower <= bound.radius_upper
    # mistakes <= R_lower^2 / gamma_upper^2 <= R^2 / gamma^2 (the bound itself, bracketed)
    assert res.total_mistakes <= bound.bound_lower
    # the proof's ingredients on every update: ||Phi(z_i) - Phi(z_LP)|| <= R and w* . (...) >= gamma
    norms = np.linalg.norm(res.update_vectors, axis=1)
    assert norms.max() <= bound.radius_upper + 1e-9
    assert (res.update_vectors @ w_star).min() >= bound.gamma_lower - 1e-9
    k = np.arange(1, len(norms) + 1)
    upd = np.cumsum(res.update_vectors, axis=0)                    # w_{k+1} (step 1, w_1 = 0)
    assert np.all(upd @ w_star >= k * bound.gamma_lower - 1e-9)
    assert np.all((upd ** 2).sum(1) <= k * bound.radius_upper ** 2 + 1e-9)
    # the returned weights separate the data under LP-relaxed inference
    assert all(lp_map(x.potentials(res.last)).integral and np.array_equal(lp_map(x.potentials(res.last)).labels, y)
               for x, y in data)


# --- the example script ------------------------------------------------------------------------------------------
def test_example_script_smoke(tmp_path):
    path = pathlib.Path(__file__).resolve().parents[2] / "examples" / "approximate_inference_learning.py"
    spec = importlib.util.spec_from_file_location("approximate_inference_learning", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    findings = module.main(["--out", str(tmp_path), "--fast"])
    for name in ("weight_path.png", "feasible_regions.png"):
        f = tmp_path / name
        assert f.exists() and f.stat().st_size > 1000 and f.read_bytes()[:4] == b"\x89PNG"
    assert findings["section3"]["exact_correct"] == [True, True, True]
    assert findings["section3"]["max_lp_correct"] <= 2
    assert abs(findings["section4"]["gamma_measured"] - PAPER_GAMMA) < 5e-7
    assert not findings["section4"]["perceptron_lbp"].converged and findings["section4"]["perceptron_exact"].converged
    # measured labels follow the half-planes of section 4.3 (only cells on a boundary, e.g. w = 0, may differ)
    assert findings["figures"]["agree_exact"] > 0.95 and findings["figures"]["agree_lbp"] > 0.95
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    with pytest.raises(SystemExit) as info:             # one argparse line before the work, not a traceback after
        module.main(["--out", str(blocker / "sub"), "--fast"])
    assert info.value.code == 2


def test_a_zero_true_weight_vector_is_named():
    with pytest.raises(ValueError, match="w_true must be a non-zero"):
        random_grid_dataset(1, rows=2, cols=2, w_true=np.zeros(5))


@pytest.mark.parametrize("kwargs, message", [
    ({"tol": 0.0}, "tol must be a finite number > 0"),      # the bisection never stopped
    ({"tol": -1e-9}, "tol must be"),
    ({"tol": float("nan")}, "tol must be"),                # returned (lo + hi) / 2 without measuring
    ({"lo": float("nan")}, "lo must be"),
    ({"lo": 2.0, "hi": 0.5}, "lo must be below hi"),
])
def test_lbp_decision_boundary_checks_its_bracket_and_tolerance(kwargs, message):
    with pytest.raises(ValueError, match=message):
        lbp_decision_boundary(**kwargs)


def test_lbp_decision_boundary_stops_at_adjacent_floats():
    """A tolerance below the float spacing near gamma leaves a bracket of two adjacent floats: stop there."""
    assert abs(lbp_decision_boundary(tol=1e-300) - lbp_gamma()) < 1e-8


@pytest.mark.parametrize("kwargs, message", [
    ({"min_margin": float("nan")}, "min_margin must be"),  # turned the margin filter off
    ({"node_dim": 0}, "node_dim must be"),                 # ran max_tries and named none of these
    ({"edge_dim": 1.5}, "edge_dim must be"),
    ({"max_tries": 0}, "max_tries must be"),
    ({"labeller": "lp"}, "labeller must be a MAP routine"),         # "'str' object is not callable"
    ({"labeller": lambda m: lp_map(m).labels}, "labeller must return a MAPResult"),   # an AttributeError
])
def test_random_grid_dataset_checks_its_settings(kwargs, message):
    with pytest.raises((ValueError, TypeError), match=message):
        random_grid_dataset(1, rows=2, cols=2, **kwargs)
