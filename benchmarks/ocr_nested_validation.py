"""Nested validation of the OCR word rows: the last iterate of Algorithm 3 against the mean of its iterates.

For each outer test fold t (default 0-4) the fold t is left out entirely; the rows are trained on the eight other
folds but t + 1 and scored on fold t + 1 (the validation fold), so no test fold takes part in the choice.  Printed:
character errors on the validation fold of L^w and L^w (MM), trained by Algorithm 3 with the experiment's settings
(:class:`betheproj.experiments.ocr.OCRConfig`), keeping the last iterate or the mean of the iterates
(``word_average``), for each seed; then the totals.

Run:  python benchmarks/ocr_nested_validation.py --data ../shared/data/ocr  [--outer 0 1 2 3 4] [--seeds 0 1]
"""

from __future__ import annotations

import argparse
from dataclasses import replace

from _common import distinct, run, seed_int

from betheproj.data.ocr import OCRData, load_ocr
from betheproj.experiments.ocr import (
    NUM_LABELS,
    OCRConfig,
    check_folds,
    energy_model,
    median_bandwidth,
    unigram_prototypes,
    word_prototypes,
)
from betheproj.learning import LinearChainCRF, character_accuracy, fit_crf

ROWS = ("Lw", "Lw-mm")


def errors(model, data: OCRData) -> int:
    """Wrong characters of ``model`` on ``data``."""
    accuracy = character_accuracy(model.predict(data.pixels, data.lengths), data.labels, data.lengths)
    return round((1 - accuracy) * int(data.lengths.sum()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="folder holding ocr_letters.npz")
    parser.add_argument("--outer", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--seeds", type=seed_int, nargs="+", default=[0, 1])
    args = parser.parse_args()
    distinct(parser, "--outer", args.outer)
    distinct(parser, "--seeds", args.seeds)
    data = load_ocr(args.data)
    try:                                # each outer fold and the validation fold after it
        check_folds(data, sorted({f for t in args.outer for f in (t, (t + 1) % 10)}))
    except ValueError as err:
        parser.error(f"--outer: {err}")
    totals = {(row, avg): 0 for row in ROWS for avg in (False, True)}
    print("wrong characters on the validation fold (fewer is better)")
    print(f"{'outer':>5}{'valid':>6}{'seed':>5}" + "".join(f"{r + (' mean' if a else ' last'):>14}"
                                                          for r in ROWS for a in (False, True)))
    for t in args.outer:
        v = (t + 1) % 10
        train, valid = data.subset((data.folds != t) & (data.folds != v)), data.subset(data.folds == v)
        x, y, n = train.pixels, train.labels, train.lengths
        base = LinearChainCRF(x.shape[-1], NUM_LABELS)
        fit_crf(base, x, y, n, l2=OCRConfig.crf_l2, max_iter=OCRConfig.crf_iter)
        protos, proto_lengths = word_prototypes(y, n)
        unigrams = unigram_prototypes(y, n)
        for seed in args.seeds:
            bandwidth = median_bandwidth(x, n, seed=seed) * OCRConfig.bandwidth_scale
            cells = []
            for row in ROWS:
                for average in (False, True):
                    config = replace(OCRConfig(seed=seed), word_average=average)
                    model, options = energy_model(row, base, protos, proto_lengths, unigrams, config, bandwidth)
                    model.fit(x, y, n, epochs=config.epochs, seed=seed, **options)
                    e = errors(model, valid)
                    totals[row, average] += e
                    cells.append(e)
            print(f"{t:>5}{v:>6}{seed:>5}" + "".join(f"{e:>14}" for e in cells), flush=True)
    print(f"{'total':>16}" + "".join(f"{totals[r, a]:>14}" for r in ROWS for a in (False, True)))


if __name__ == "__main__":
    run(main)
