"""Two yardsticks for the OCR handwriting experiment (Taskar et al. 2004 letters), 10-fold protocol.

For each fold k: train on the words of the other nine folds, test on fold k, report character accuracy.
1. CRFsuite: a linear-chain CRF (python-crfsuite, L-BFGS, L2 c2=1.0, c1=0, 100 iterations, fixed across folds)
   with the on-pixels of each 16x8 letter image plus a bias as features and CRFsuite's label-bigram transitions.
2. Hard snap: CRFsuite's node marginals of each test word snapped to the nearest training word of the same
   length (L1 distance to its one-hot matrix); CRFsuite's Viterbi output where no training word has that length.
   The data hold only 55 distinct words and every test word also occurs in the other nine folds, so this is an
   upper yardstick (a dictionary oracle), not a fair competitor.

Beside them, on the same folds in the same run, our rows (``--ours``, default 2-gram, L^w and L^w (MM); see
:mod:`betheproj.experiments.ocr`), with the differences that the issue's goals are about: our 2-gram minus
CRFsuite, our L^w rows minus the hard snap, and our 2-gram's training time over CRFsuite's.

Run:  python benchmarks/ocr_yardsticks.py --data ../shared/data/ocr  [--folds 0 1] [--ours 2gram,Lw] [--json out.json]
Needs python-crfsuite (the ``bench`` extra).  ``--ours none`` measures the yardsticks alone.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from _common import crfsuite, nonnegative_float, positive_int, run
from torch import Tensor

from betheproj.data.ocr import OCRData, load_ocr
from betheproj.experiments.ocr import ROWS, check_folds, run_fold

LETTERS = [chr(97 + c) for c in range(26)]


def _features(pixels: Tensor, length: int) -> list[dict[str, float]]:
    """One feature dict per letter: ``bias`` and ``p<i>`` for each pixel that is on."""
    return [{"bias": 1.0, **{f"p{i}": 1.0 for i in torch.nonzero(row).flatten().tolist()}}
            for row in pixels[:length]]


def accuracy(pred: Tensor, labels: Tensor) -> float:
    """Character accuracy over the non-padding positions (``labels >= 0``)."""
    mask = labels >= 0
    return (pred[mask] == labels[mask]).double().mean().item()


def crfsuite_fold(train: OCRData, test: OCRData, c2: float = 1.0, max_iterations: int = 100) -> dict:
    """Train CRFsuite on ``train``, decode ``test``: accuracy, train seconds, Viterbi ``pred`` [W, N] (-1 padding)
    and node ``marginals`` [W, N, 26] (zeros at padding)."""
    pycrfsuite = crfsuite()
    trainer = pycrfsuite.Trainer(algorithm="lbfgs", verbose=False)
    for w in range(len(train)):
        n = int(train.lengths[w])
        trainer.append(_features(train.pixels[w], n), [LETTERS[y] for y in train.labels[w, :n].tolist()])
    trainer.set_params({"c1": 0.0, "c2": c2, "max_iterations": max_iterations})
    pred = torch.full(test.labels.shape, -1, dtype=torch.long)
    marginals = torch.zeros(*test.labels.shape, 26)
    with tempfile.TemporaryDirectory() as tmp:
        model = str(Path(tmp) / "crf.model")
        start = time.perf_counter()
        trainer.train(model)
        seconds = time.perf_counter() - start
        tagger = pycrfsuite.Tagger()
        tagger.open(model)
        for w in range(len(test)):
            n = int(test.lengths[w])
            tagger.set(_features(test.pixels[w], n))
            pred[w, :n] = torch.tensor([ord(c) - 97 for c in tagger.tag()])
            marginals[w, :n] = torch.tensor([[tagger.marginal(c, t) for c in LETTERS] for t in range(n)])
        tagger.close()
    return {"accuracy": accuracy(pred, test.labels), "train_seconds": seconds, "pred": pred, "marginals": marginals}


def hard_snap(marginals: Tensor, lengths: Tensor, train_words: list[str], fallback: Tensor | None = None) -> Tensor:
    """Snap each word's marginals [W, N, 26] to the nearest training word of its length (L1 to the one-hot matrix).
    Words with no training word of their length keep ``fallback`` [W, N] (default: the marginals' argmax)."""
    pred = marginals.argmax(-1) if fallback is None else fallback.clone()
    pos = torch.arange(marginals.shape[1])
    pred[pos >= lengths[:, None]] = -1
    for n in lengths.unique().tolist():
        vocab = sorted({w for w in train_words if len(w) == n})
        rows = torch.nonzero(lengths == n).flatten()
        if not vocab:
            continue
        cand = torch.tensor([[ord(c) - 97 for c in w] for w in vocab])  # [V, n]
        onehot = torch.nn.functional.one_hot(cand, 26).to(marginals.dtype).flatten(1)  # [V, n*26]
        dist = torch.cdist(marginals[rows, :n].flatten(1), onehot, p=1)  # [R, V]
        pred[rows, :n] = cand[dist.argmin(1)]
    return pred


def _row(fold: int | str, r: dict, ours: list[str]) -> str:
    line = f"{fold:>4}  {100 * r['crfsuite']:>8.2f}%  {r['train_seconds']:>8.1f}  {100 * r['hard_snap']:>8.2f}%"
    for key in ours:
        line += f"  {r['ours'][key]:>8.2f}%"
    if "2gram" in ours:
        ratio = r["ours_seconds"]["2gram"] / r["train_seconds"]
        line += f"  {r['ours']['2gram'] - 100 * r['crfsuite']:>+8.2f}  {ratio:>8.2f}x"
    for key in ("Lw", "Lw-mm"):
        if key in ours:
            line += f"  {r['ours'][key] - 100 * r['hard_snap']:>+8.2f}"
    return line


def _header(ours: list[str]) -> str:
    line = f"{'fold':>4}  {'CRFsuite':>9}  {'train s':>8}  {'hard snap':>9}"
    for key in ours:
        line += f"  {ROWS[key]:>9}"
    if "2gram" in ours:
        line += f"  {'2g-CRFs':>8}  {'t 2g/CRFs':>9}"
    for key in ("Lw", "Lw-mm"):
        if key in ours:
            line += f"  {key + '-snap':>8}"
    return line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="../shared/data/ocr", help="ocr_letters.npz or the folder holding it")
    parser.add_argument("--folds", type=int, nargs="+", default=list(range(10)))
    parser.add_argument("--c2", type=nonnegative_float, default=1.0,
                        help="CRFsuite's L2 coefficient (0: none; default 1.0)")
    parser.add_argument("--max-iterations", type=positive_int, default=100)
    parser.add_argument("--threads", type=positive_int, default=None,
                        help="torch threads for our rows (default: torch's own; CRFsuite runs on one)")
    parser.add_argument("--ours", default="2gram,Lw,Lw-mm",
                        help=f"our rows to measure beside the yardsticks, among {','.join(ROWS)}, or 'none'")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    crfsuite()                          # the peer is there, before any work
    if args.json and not Path(args.json).resolve().parent.is_dir():       # found before the work, not after it
        parser.error(f"--json: the folder of {args.json} does not exist")
    ours = [] if args.ours == "none" else [r.strip() for r in args.ours.split(",")]
    if any(r not in ROWS for r in ours):
        parser.error(f"--ours must be among {', '.join(ROWS)} or 'none', got {args.ours!r}")

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    data = load_ocr(args.data)
    try:
        check_folds(data, args.folds)
    except ValueError as err:
        parser.error(f"--folds: {err}")
    rows = []
    print(f"torch threads for our rows: {torch.get_num_threads()} (CRFsuite: one)")
    print(_header(ours), flush=True)
    for k in args.folds:
        train, test = data.subset(data.folds != k), data.subset(data.folds == k)
        res = crfsuite_fold(train, test, c2=args.c2, max_iterations=args.max_iterations)
        snap = accuracy(hard_snap(res["marginals"], test.lengths, train.words, res["pred"]), test.labels)
        rows.append({"fold": k, "crfsuite": res["accuracy"], "train_seconds": res["train_seconds"], "hard_snap": snap,
                     "test_words": len(test), "test_letters": int(test.lengths.sum())})
        if ours:
            mine = run_fold(data, k, ours)
            rows[-1]["ours"], rows[-1]["ours_seconds"] = mine.accuracy, mine.train_seconds
        print(_row(k, rows[-1], ours), flush=True)
    mean = {key: sum(r[key] for r in rows) / len(rows) for key in ("crfsuite", "train_seconds", "hard_snap")}
    if ours:
        for key in ("ours", "ours_seconds"):
            mean[key] = {o: sum(r[key][o] for r in rows) / len(rows) for o in ours}
    print(_row("mean", mean, ours))
    if args.json:
        settings = {"c1": 0.0, "c2": args.c2, "max_iterations": args.max_iterations, "algorithm": "lbfgs"}
        out = {"settings": settings, "ours": ours, "folds": rows, "mean": mean, "threads": torch.get_num_threads()}
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    run(main)
