"""How far the citation constraint templates can lift the base model on test at all: a diagnostic ceiling.

Run by hand, after ``betheproj citations --data DIR --out citations-results`` (which writes the model):

    python benchmarks/citations_ceiling.py --data ../shared/data/umass_citation/original \
        --model citations-results/model.pt [--epochs 5 30] [--dev-halves 2]

It keeps the saved base CRF and templates, resets the weights ``c`` and learns them by Algorithm 3 (the
settings of the saved run) on the *test* split itself, then scores test. No reported figure may come from
this: it reads the test labels to fit ``c``. It answers one question, whether the energy (20) over these
templates can reach a target on test with this base when ``c`` is as favourable to test as Algorithm 3
makes it. Prints the baseline, the saved (dev-learned) row and the test-fitted rows.

``--dev-halves K`` also learns ``c`` (the saved run's settings) on K random halves of the development split
and scores test: whether more data for ``c`` than the dev split holds would help.
"""

from __future__ import annotations

import argparse
import time

import torch
from _common import positive_int, run

from betheproj.data.citations import load_citations
from betheproj.experiments.citations import f1_of, learn_weights, load_run, nonlocal_predictor, viterbi_predictor


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="folder holding training.docs(.gz), dev.docs(.gz), ...")
    parser.add_argument("--model", default="citations-results/model.pt", help="model.pt of a citations run")
    parser.add_argument("--epochs", type=positive_int, nargs="+", default=[5, 30],
                        help="Algorithm 3 epochs over the test split (one fit each)")
    parser.add_argument("--dev-halves", type=int, default=0, help="also fit c on this many random halves of dev")
    args = parser.parse_args()
    if args.dev_halves < 0:
        parser.error(f"--dev-halves must be >= 0, got {args.dev_halves}")
    try:
        index, model, config, _ = load_run(args.model)
    except FileNotFoundError as error:
        parser.error(f"--model: {error}")
    data = load_citations(args.data)
    test = data["test"]
    enc = index.encode(test)
    iters = config.test_iters[-1]
    baseline = f1_of(viterbi_predictor(model.theta), index, test, enc)[0]
    saved = f1_of(nonlocal_predictor(model, iters), index, test, enc)[0]
    print(f"test F1: baseline {baseline:.2f}; c learned on dev (the saved run) {saved:.2f} ({saved - baseline:+.2f})")

    def fit_and_score(encoded: tuple[torch.Tensor, torch.Tensor, torch.Tensor], epochs: int, seed: int) -> str:
        start = time.perf_counter()
        learn_weights(model, encoded, config, epochs=epochs, seed=seed)
        f1 = f1_of(nonlocal_predictor(model, iters), index, test, enc)[0]
        return (f"{f1:.2f} ({f1 - baseline:+.2f}; {int((model.psi.value > 0).sum())} active, "
                f"{time.perf_counter() - start:.0f} s)")

    for epochs in args.epochs:
        print(f"c learned on test, {epochs} epochs: {fit_and_score(enc, epochs, config.seed)}")
    dev = index.encode(data["dev"])
    for half in range(args.dev_halves):
        rows = torch.randperm(len(dev[2]), generator=torch.Generator().manual_seed(half))[: len(dev[2]) // 2]
        print(f"c learned on dev half {half} ({len(rows)} citations), {config.epochs} epochs: test "
              f"{fit_and_score(tuple(t[rows] for t in dev), config.epochs, half)}")


if __name__ == "__main__":
    run(main)
