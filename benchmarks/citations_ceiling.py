"""How far the citation constraint templates can lift the base model on test at all: a diagnostic ceiling.

Run by hand, after ``betheproj citations --data DIR --out citations-results`` (which writes the model):

    python benchmarks/citations_ceiling.py --data ../shared/data/umass_citation/original \
        --model citations-results/model.pt [--epochs 5 30]

It keeps the saved base CRF and templates, resets the weights ``c`` and learns them by Algorithm 3 (the
settings of the saved run) on the *test* split itself, then scores test. No reported figure may come from
this: it reads the test labels to fit ``c``. It answers one question, whether the energy (20) over these
templates can reach a target on test with this base when ``c`` is as favourable to test as Algorithm 3
makes it. Prints the baseline, the saved (dev-learned) row and the test-fitted rows.
"""

from __future__ import annotations

import argparse
import time

import torch

from betheproj.data.citations import load_citations
from betheproj.experiments.citations import _nonlocal_predictor, f1_of, load_model
from betheproj.learning.train import fit_doubly_stochastic
from betheproj.oracles import LinearChain


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="folder holding training.docs(.gz), dev.docs(.gz), ...")
    parser.add_argument("--model", default="citations-results/model.pt", help="model.pt of a citations run")
    parser.add_argument("--epochs", type=int, nargs="+", default=[5, 30],
                        help="Algorithm 3 epochs over the test split (one fit each)")
    args = parser.parse_args()
    data = load_citations(args.data)
    test = data["test"]
    index, model = load_model(args.model)
    config = torch.load(args.model, weights_only=True)["config"]
    enc = index.encode(test)
    base = model.theta
    iters = config["test_iters"][-1]

    def viterbi(x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        return LinearChain().map(base(x, n))

    baseline = f1_of(viterbi, index, test, enc)[0]
    saved = f1_of(_nonlocal_predictor(model, iters), index, test, enc)[0]
    print(f"test F1: baseline {baseline:.2f}; c learned on dev (the saved run) {saved:.2f} ({saved - baseline:+.2f})")
    x, y, n = enc
    for epochs in args.epochs:
        with torch.no_grad():
            model.psi.value.fill_(config["psi_init"])
        start = time.perf_counter()
        fit_doubly_stochastic(model, x, y, n, epochs=epochs, batch_size=config["batch_size"], lr=config["psi_lr"],
                              psi_lr=config["psi_lr"], learn_theta=False, train_iter=config["train_iter"],
                              seed=config["seed"])
        f1 = f1_of(_nonlocal_predictor(model, iters), index, test, enc)[0]
        print(f"c learned on test, {epochs} epochs: {f1:.2f} ({f1 - baseline:+.2f}; "
              f"{int((model.psi.value > 0).sum())} active, {time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
