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
from pathlib import Path

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
    parser.add_argument("--dev-halves", type=int, default=0, help="also fit c on this many random halves of dev")
    args = parser.parse_args()
    if not Path(args.model).is_file():
        parser.error(f"--model: no trained model at {args.model}; run 'betheproj citations --data DIR --out DIR' first")
    data = load_citations(args.data)
    test, dev = data["test"], data["dev"]
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

    def fit_and_score(x: torch.Tensor, y: torch.Tensor, n: torch.Tensor, epochs: int, seed: int) -> str:
        with torch.no_grad():
            model.psi.value.fill_(config["psi_init"])
        start = time.perf_counter()
        fit_doubly_stochastic(model, x, y, n, epochs=epochs, batch_size=config["batch_size"], lr=config["psi_lr"],
                              psi_lr=config["psi_lr"], learn_theta=False, train_iter=config["train_iter"], seed=seed)
        f1 = f1_of(_nonlocal_predictor(model, iters), index, test, enc)[0]
        return (f"{f1:.2f} ({f1 - baseline:+.2f}; {int((model.psi.value > 0).sum())} active, "
                f"{time.perf_counter() - start:.0f} s)")

    for epochs in args.epochs:
        print(f"c learned on test, {epochs} epochs: {fit_and_score(*enc, epochs, config['seed'])}")
    x, y, n = index.encode(dev)
    for half in range(args.dev_halves):
        rows = torch.randperm(len(n), generator=torch.Generator().manual_seed(half))[: len(n) // 2]
        print(f"c learned on dev half {half} ({len(rows)} citations), {config['epochs']} epochs: test "
              f"{fit_and_score(x[rows], y[rows], n[rows], config['epochs'], half)}")


if __name__ == "__main__":
    main()
