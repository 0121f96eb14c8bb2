"""How sure is the energy's gain on test? A paired bootstrap over the citations of a split.

Run by hand, after ``betheproj citations --data DIR --out citations-results`` (which writes the model):

    python benchmarks/citations_bootstrap.py --data ../shared/data/umass_citation/original \
        --model citations-results/model.pt [--split test] [--samples 10000] [--mbr T_BASE T_NONLOCAL] \
        [--plot gain.png]

It tags the split with both rows of Table 1 (Viterbi in the base's theta, and Viterbi in Proposition 1's
``theta - grad L(mu*)``), counts each citation's correct, predicted and gold segments
(:func:`betheproj.learning.metrics.segment_counts`), and resamples the citations with replacement, the same
resample for both rows (Efron and Tibshirani's paired bootstrap; Koehn 2004 for tagging and translation scores).
It prints each row's micro F1 with its 95% percentile interval, the gain's interval, and how often a resample
meets the issue's goals (a gain of at least one point; the non-local row at or above 96.0).  ``--mbr`` adds the
rows decoded for segment F1 at the two thresholds given (the run's results.json names the ones dev chose);
``--plot`` draws the gains' bootstrap distributions against the one-point goal.

This measures how much the split's sampling moves the figures, not how a new split would score: the model, and the
thresholds, stay fixed.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from _common import positive_int, run, seed_int

from betheproj.cli import _unit_float
from betheproj.data.citations import SPLITS, load_citations
from betheproj.experiments._plot import figure
from betheproj.experiments.citations import load_run, nonlocal_tagger, predictions
from betheproj.inference import BIOFields, decode_segments_at
from betheproj.learning.metrics import segment_counts
from betheproj.oracles import LinearChain

GAIN_GOAL, F1_GOAL = 1.0, 96.0          # issue 5: one point over the baseline, and 96.0 on test


def f1(counts: np.ndarray) -> np.ndarray:
    """Micro F1 (%) of counts summed over the last-but-one axis: ``2 tp / (predicted + gold)``."""
    tp, pred, gold = np.moveaxis(counts, -1, 0)
    return 100 * 2 * tp / np.maximum(pred + gold, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="folder holding training.docs(.gz), dev.docs(.gz), ...")
    parser.add_argument("--model", default="citations-results/model.pt", help="model.pt of a citations run")
    parser.add_argument("--split", choices=sorted(SPLITS), default="test")
    parser.add_argument("--samples", type=positive_int, default=10000, help="bootstrap resamples (default 10000)")
    parser.add_argument("--seed", type=seed_int, default=0)
    parser.add_argument("--mbr", type=_unit_float, nargs=2, metavar=("T_BASE", "T_NONLOCAL"),
                        help="also the rows decoded for segment F1 at these thresholds")
    parser.add_argument("--plot", metavar="PNG", help="draw the gains' bootstrap distributions into this PNG")
    args = parser.parse_args()
    try:
        saved = load_run(args.model)
    except FileNotFoundError as error:
        parser.error(f"--model: {error}")
    index, model, iters = saved.index, saved.model, saved.config.test_iters[-1]
    cites = load_citations(args.data)[args.split]
    enc = index.encode(cites)
    fields = BIOFields.from_labels(index.labels) if args.mbr is not None else None
    t_base, t_nonlocal = ([], []) if args.mbr is None else ([args.mbr[0]], [args.mbr[1]])

    def baseline(x: torch.Tensor, n: torch.Tensor) -> list[torch.Tensor]:        # Viterbi, and MBR if asked
        theta = model.theta(x, n)
        return [LinearChain().map(theta), *(decode_segments_at(theta, fields, t_base) if t_base else [])]

    # each row's decodings of one solve: the names of a tagger's outputs, in order
    taggers = {("baseline", "baseline, MBR")[: 1 + len(t_base)]: baseline,
               ("non-local", "non-local, MBR")[: 1 + len(t_nonlocal)]: nonlocal_tagger(model, iters, fields,
                                                                                      t_nonlocal)}
    gold = [c.labels for c in cites]
    names = [name for group in taggers for name in group]
    counts = np.stack([segment_counts(gold, labels) for tagger in taggers.values()
                       for labels in predictions(tagger, index, cites, enc)])                        # [R, n, 3]
    rng = np.random.default_rng(args.seed)
    weights = rng.multinomial(len(cites), np.full(len(cites), 1 / len(cites)), size=args.samples)      # [S, n]
    resampled = f1(np.einsum("sn,rnk->srk", weights, counts))                                           # [S, R]
    point = f1(counts.sum(1))
    print(f"{args.split}: {len(cites)} citations, {int(counts[0, :, 2].sum())} gold segments; {args.samples} paired "
          f"resamples of the citations (seed {args.seed})")
    for r, name in enumerate(names):
        low, high = np.percentile(resampled[:, r], [2.5, 97.5])
        print(f"  {name:<16} F1 {point[r]:6.2f}  95% interval [{low:.2f}, {high:.2f}]  "
              f"(standard error {resampled[:, r].std(ddof=1):.2f})")
    gains = {}
    for base, other in (("baseline", "non-local"), ("baseline, MBR", "non-local, MBR")):
        if other not in names:
            continue
        b, o = names.index(base), names.index(other)
        gains[other] = gain = resampled[:, o] - resampled[:, b]
        low, high = np.percentile(gain, [2.5, 97.5])
        print(f"  gain, {other} over {base}: {point[o] - point[b]:+.2f}  95% interval [{low:+.2f}, {high:+.2f}]; "
              f"a resample has it >= {GAIN_GOAL:.2f} in {100 * np.mean(gain >= GAIN_GOAL):.1f}%, "
              f"{other} >= {F1_GOAL:.1f} in {100 * np.mean(resampled[:, o] >= F1_GOAL):.1f}%, both in "
              f"{100 * np.mean((gain >= GAIN_GOAL) & (resampled[:, o] >= F1_GOAL)):.1f}%")
    if args.plot:
        with figure(args.plot, (6, 3.5)) as ax:
            bins = np.linspace(min(g.min() for g in gains.values()), max(g.max() for g in gains.values()), 60)
            for (name, gain), color in zip(gains.items(), ("tab:blue", "tab:orange"), strict=False):
                decoder = "segment MBR" if "MBR" in name else "MAP"
                ax.hist(gain, bins=bins, alpha=0.6, color=color, weights=np.full(len(gain), 100 / len(gain)),
                        label=f"both rows by {decoder}: median {np.median(gain):+.2f}")
            ax.axvline(GAIN_GOAL, color="black", linestyle="--", label=f"goal {GAIN_GOAL:+.2f}")
            ax.axvline(0, color="grey", linewidth=0.8)
            ax.set_xlabel(f"gain over the baseline on {args.split} (F1 points), {args.samples} paired resamples")
            ax.set_ylabel("% of resamples")
            ax.legend(fontsize=8)
        print(f"wrote {args.plot}")


if __name__ == "__main__":
    run(main)
