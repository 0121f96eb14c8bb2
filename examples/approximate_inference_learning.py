"""Reproduce Kulesza & Pereira, *Structured Learning with Approximate Inference* (NIPS 2007), sections 3, 4 and 5.1.

* Section 3: on the triangle MRF of Figure 1 exact MAP with ``w = (1, 1, 1)`` labels the three inputs correctly,
  while LP-relaxed MAP returns ``mu = 1/2`` whenever ``w`` separates them exactly, and no positive ``w`` makes the
  LP label all three correctly (algorithmic inseparability).
* Section 4: max-product LBP on the 4-node MRF of Figure 2 predicts ``sign(alpha + gamma beta)`` with
  ``gamma ≈ 1.089339`` (closed form, the message-exponent recursion, and a bisection on LBP's own decisions); at
  ``alpha = 1, beta = -0.95`` LBP returns -1 while MAP returns 1; the perceptron with LBP on the training set of
  Figure 3 moves by ``(-0.05, 0.05)`` per pass and never separates, with exact MAP it converges.
* Section 5.1: on algorithmically separable random grid MRFs (labelled by LP-relaxed MAP), the perceptron with
  LP-relaxed inference makes fewer than ``R^2 / gamma^2`` mistakes.

Writes ``weight_path.png`` (Figure 4) and ``feasible_regions.png`` (Figure 5) to ``--out``.

    python examples/approximate_inference_learning.py --out approx-inference-results
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence

import numpy as np

from betheproj.cli import _out_folder, int_type
from betheproj.learning.perceptron import lp_mistake_bound, mrf_map, structured_perceptron
from betheproj.mrf import (
    TRIANGLE_INPUTS,
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


def section3(num_w: int, seed: int) -> dict:
    print("== Section 3: the triangle MRF of Figure 1 under LP-relaxed inference ==")
    out: dict = {}
    exact_ok = []
    for x in TRIANGLE_INPUTS:
        model = triangle_model(x)
        res = exact_map(model.potentials(np.ones(3)))
        lp = lp_map(model.potentials(np.ones(3)))
        exact_ok.append(triangle_correct(x, res))
        mu = [m.round(6).tolist() for m in lp.node_marginals]
        print(f"  x = {x}: exact MAP (w = 1,1,1) {model.structure.label_names(res.labels)} "
              f"correct={exact_ok[-1]};  LP mu = {mu} (objective {lp.objective:g})")
    out["exact_correct"] = exact_ok
    rng = np.random.default_rng(seed)
    best = 0
    half = 0
    separating = 0
    for k in range(num_w):
        # even k: broad log-normal weights; odd k: the neighbourhood of (1, 1, 1) where exact MAP separates
        w = np.exp(rng.normal(scale=1.0, size=3)) if k % 2 == 0 else np.exp(rng.uniform(-0.14, 0.14, size=3))
        correct = 0
        all_half = True
        for x in TRIANGLE_INPUTS:
            lp = lp_map(triangle_model(x).potentials(w))
            correct += triangle_correct(x, lp)
            all_half &= all(np.allclose(m, 0.5, atol=1e-7) for m in lp.node_marginals)
        best = max(best, correct)
        sep = all(4 * w[i] > 3 * w[j] for i in range(3) for j in range(3) if i != j)
        separating += sep
        half += sep and all_half
    out.update(max_lp_correct=best, exact_separating=separating, lp_half_when_separating=half)
    print(f"  {num_w} random positive w: LP labels at most {best} of 3 inputs correctly; {separating} of them "
          f"separate exactly (4 w_ij > 3 w_kl), and for {half} of those LP returns mu = 1/2 on every input")
    return out


def section4(passes: int) -> dict:
    print("== Section 4: loopy BP on the MRF of Figure 2 ==")
    gamma = lbp_gamma()
    p, q = lbp_exponents(60)[-1][0]
    measured = lbp_decision_boundary()
    print(f"  gamma: closed form {gamma:.10f}, exponent ratio q/p after 60 updates {q / p:.10f}, "
          f"LBP decision boundary (bisection) {measured:.10f}; paper 1.089339")
    lbp = lbp_map(figure2_mrf(1.0, -0.95))
    ex = exact_map(figure2_mrf(1.0, -0.95))
    print(f"  alpha = 1, beta = -0.95: LBP {[int(v) for v in figure2_mrf(0, 0).label_names(lbp.labels)]} "
          f"(converged={lbp.converged} in {lbp.iterations} iterations), exact MAP "
          f"{[int(v) for v in figure2_mrf(0, 0).label_names(ex.labels)]}")
    data = figure3_dataset()
    t = time.perf_counter()
    res_lbp = structured_perceptron(data, mrf_map("lbp"), epochs=passes, step=0.5)
    t_lbp = time.perf_counter() - t
    res_exact = structured_perceptron(data, mrf_map("exact"), epochs=passes, step=0.5)
    per_pass = np.diff(res_lbp.path[2::2], axis=0)
    print(f"  perceptron + LBP: {res_lbp.epochs} passes, {res_lbp.total_mistakes} mistakes, separated="
          f"{res_lbp.converged}, final w = {np.round(res_lbp.last, 4).tolist()}, per-pass move "
          f"{np.round(per_pass.mean(0), 6).tolist()} ({t_lbp:.1f} s)")
    print(f"  perceptron + exact MAP: separated={res_exact.converged} after {res_exact.epochs} passes, "
          f"{res_exact.total_mistakes} mistakes, w = {np.round(res_exact.last, 4).tolist()}")
    return dict(gamma=gamma, gamma_recursion=q / p, gamma_measured=measured, lbp_labels=lbp.labels,
                exact_labels=ex.labels, perceptron_lbp=res_lbp, perceptron_exact=res_exact,
                per_pass=per_pass.mean(0))


def section51(num_instances: int, seed: int) -> dict:
    print("== Section 5.1: the perceptron with LP-relaxed inference on algorithmically separable data ==")
    data, w_star = random_grid_dataset(num_instances, seed=seed, min_margin=0.02)
    res = structured_perceptron(data, mrf_map("lp"), epochs=100)
    bound = lp_mistake_bound(data, w_star)
    print(f"  {num_instances} binary 3x3 grid MRFs labelled by LP MAP under a hidden w*: perceptron + LP "
          f"separated={res.converged} after {res.epochs} epochs, {res.total_mistakes} mistakes "
          f"({res.fractional_updates} updates with a fractional z_LP)")
    print(f"  gamma in [{bound.gamma_lower:.4f}, {bound.gamma_upper:.4f}], R in [{bound.radius_lower:.3f}, "
          f"{bound.radius_upper:.3f}]: R^2/gamma^2 in [{bound.bound_lower:.0f}, {bound.bound_upper:.0f}] "
          f">= {res.total_mistakes} mistakes")
    return dict(result=res, bound=bound)


def feasible_regions(resolution: int, coupling: float = 1e6) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For a grid of ``w`` in ``[-1, 1]^2``: which Figure-3 instances exact MAP and LBP label correctly
    (boolean arrays ``[2, resolution, resolution]``, rows indexed by ``w2``, columns by ``w1``)."""
    data = figure3_dataset(coupling)
    ws = np.linspace(-1.0, 1.0, resolution)
    exact_ok = np.zeros((2, resolution, resolution), dtype=bool)
    lbp_ok = np.zeros_like(exact_ok)
    for a, w2 in enumerate(ws):
        for b, w1 in enumerate(ws):
            w = np.array([w1, w2])
            for k, (x, y) in enumerate(data):
                exact_ok[k, a, b] = np.array_equal(exact_map(x.potentials(w)).labels, y)
                lbp_ok[k, a, b] = np.array_equal(lbp_map(x.potentials(w)).labels, y)
    return ws, exact_ok, lbp_ok


def analytic_regions(w1: np.ndarray, w2: np.ndarray, g: float) -> np.ndarray:
    """Section 4.3: instance (a) is labelled correctly iff ``w1 + 0.95 g w2 < 0``, (b) iff ``0.95 g w1 + w2 > 0``
    (``g = 1`` for exact inference, ``g = gamma`` for LBP)."""
    return np.stack([w1 + 0.95 * g * w2 < 0, 0.95 * g * w1 + w2 > 0])


def plot_weight_path(path_lbp: np.ndarray, path_exact: np.ndarray, per_pass: np.ndarray, filename: str,
                     steps: int = 40) -> None:
    """The first ``steps`` perceptron updates with LBP and exact MAP, and the measured net move per pass."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.4, 5.4))
    p = path_lbp[: steps + 1]
    ax.plot(p[:, 0], p[:, 1], "-o", ms=3, lw=0.8, color="black", label=f"perceptron + LBP (first {steps // 2} passes)")
    e = path_exact
    ax.plot(e[:, 0], e[:, 1], "--s", ms=5, lw=1.2, color="tab:blue", label="perceptron + exact MAP")
    ax.annotate("", xy=(0.6, -0.6), xytext=(0, 0), arrowprops=dict(arrowstyle="->", color="tab:red", lw=1.5))
    ax.text(0.35, -0.75, "w* = (1, -1) direction", color="tab:red")
    norm = float(np.linalg.norm(per_pass))
    if norm > 0:                                  # the measured direction, drawn at a fixed length
        tip = 0.42 * per_pass / norm
        ax.annotate("", xy=(float(tip[0]), float(tip[1])), xytext=(0, 0),
                    arrowprops=dict(arrowstyle="->", color="tab:green", lw=1.5))
    ax.text(-0.95, 0.2, f"net move per pass\n({per_pass[0]:.4g}, {per_pass[1]:.4g})", color="tab:green", fontsize=8)
    ax.axhline(0, color="0.8", lw=0.5)
    ax.axvline(0, color="0.8", lw=0.5)
    ax.set_xlim(-1.1, 1.1)
    ax.set_ylim(-0.9, 2.1)
    ax.set_xlabel("w1")
    ax.set_ylabel("w2")
    ax.set_title("Perceptron learning path (Kulesza & Pereira 2007, Fig. 4)", fontsize=10)
    ax.set_aspect("equal")
    ax.legend(loc="lower left", fontsize=8)
    fig.tight_layout()
    fig.savefig(filename, dpi=120)
    plt.close(fig)


def plot_feasible_regions(ws: np.ndarray, exact_ok: np.ndarray, lbp_ok: np.ndarray, gamma: float,
                          filename: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap

    fig, axes = plt.subplots(1, 2, figsize=(10, 5))
    fine = np.linspace(-1, 1, 801)
    g1, g2 = np.meshgrid(fine, fine)
    m1, m2 = np.meshgrid(ws, ws)
    cmap = ListedColormap(["white", "0.75", "black"])
    for ax, ok, g, title in ((axes[0], exact_ok, 1.0, "(a) exact inference"), (axes[1], lbp_ok, gamma, "(b) LBP")):
        count = analytic_regions(g1, g2, g).sum(0)
        ax.imshow(count, origin="lower", extent=(-1, 1, -1, 1), cmap=cmap, vmin=0, vmax=2, interpolation="nearest")
        both = ok.all(0)
        ax.plot(m1[both], m2[both], "o", ms=3, color="tab:red", label="measured: both instances correct")
        ax.plot(m1[ok.sum(0) == 1], m2[ok.sum(0) == 1], ".", ms=2, color="tab:blue", label="measured: one correct")
        ax.set_xlabel("w1")
        ax.set_ylabel("w2")
        ax.set_title(f"{title} (scaling g = {g:.6f})", fontsize=10)
        ax.text(-0.9, -0.55, "1", fontsize=14, color="0.3")
        ax.text(0.75, 0.55, "2", fontsize=14, color="0.3")
        ax.legend(loc="lower left", fontsize=7)
    fig.suptitle("Feasible regions (Fig. 5): gray = one instance correct, black = both (analytic); dots measured")
    fig.tight_layout()
    fig.savefig(filename, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="approx-inference-results", help="output folder for the PNGs")
    parser.add_argument("--passes", type=int_type(2), default=1000, help="perceptron passes in section 4")
    parser.add_argument("--instances", type=int_type(1), default=20, help="grid MRFs in section 5.1")
    parser.add_argument("--random-w", type=int_type(1), default=200, help="random weight vectors in section 3")
    parser.add_argument("--resolution", type=int_type(2), default=41,
                        help="grid resolution of the feasible-region plot")
    parser.add_argument("--seed", type=int_type(0), default=0)
    parser.add_argument("--fast", action="store_true", help="small settings (smoke test)")
    args = parser.parse_args(argv)
    if args.fast:
        args.passes, args.instances, args.random_w, args.resolution = 25, 4, 6, 7
    try:                                 # a folder that takes the PNGs, before the work
        _out_folder(args.out, ("weight_path.png", "feasible_regions.png"))
    except ValueError as err:
        parser.error(str(err))
    findings = {"section3": section3(args.random_w, args.seed), "section4": section4(args.passes),
                "section5.1": section51(args.instances, args.seed)}
    s4 = findings["section4"]
    path_png = os.path.join(args.out, "weight_path.png")
    plot_weight_path(s4["perceptron_lbp"].path, s4["perceptron_exact"].path, s4["per_pass"], path_png)
    ws, exact_ok, lbp_ok = feasible_regions(args.resolution)
    regions_png = os.path.join(args.out, "feasible_regions.png")
    plot_feasible_regions(ws, exact_ok, lbp_ok, s4["gamma"], regions_png)
    m1, m2 = np.meshgrid(ws, ws)
    agree_exact = float(np.mean(analytic_regions(m1, m2, 1.0) == exact_ok))
    agree_lbp = float(np.mean(analytic_regions(m1, m2, s4["gamma"]) == lbp_ok))
    overlap = int(np.sum(exact_ok.all(0) & lbp_ok.all(0)))
    print(f"== Figures: {path_png}, {regions_png}: measured grid cells feasible for exact MAP "
          f"{int(exact_ok.all(0).sum())}, for LBP {int(lbp_ok.all(0).sum())}, for both {overlap}; measured "
          f"labels agree with the half-planes of section 4.3 on {100 * agree_exact:.1f}% (exact) and "
          f"{100 * agree_lbp:.1f}% (LBP) of the cells x instances")
    findings["figures"] = {"weight_path": path_png, "feasible_regions": regions_png, "overlap": overlap,
                           "agree_exact": agree_exact, "agree_lbp": agree_lbp}
    return findings


if __name__ == "__main__":
    main()
