"""Second-order dependency parsing on UD English-EWT (gold UPOS): UAS (punctuation excluded) and speed.

Rows of the README table (issue 6, part 4): the arc-factored parser(s) given with ``--arc`` (trained by
``betheproj parse train``), and one second-order model (sibling + grandparent parts) decoded two ways:

* (a) Turbo Parser #1: sum-product loopy BP with the TREE factor and pairwise factors, then Chu-Liu-Edmonds on the
  beliefs (:func:`betheproj.parsing.second_order_decoding.loopy_bp_parse`);
* (b) the same scores as the mean-field energy ``SecondOrderArcs`` (eq. 9), problem (2) solved by Bethe-RDA with the
  matrix-tree oracle, Proposition 1's MAP (:func:`betheproj.parsing.second_order_decoding.mean_field_parse`).

The second-order model is trained by Algorithm 3 (surrogate likelihood, eq. 12, with a few Bethe-RDA iterations per
minibatch), starting from the weights of the first-order parser ``--first``, which also prunes arcs.  Speeds are
end to end (features, pruning, decoding) in tokens per second on this machine, one thread.

    python -m betheproj.parsing.cli train --train ../shared/data/ud_english_ewt/en_ewt-ud-train.conllu.gz \
        --dev ../shared/data/ud_english_ewt/en_ewt-ud-dev.conllu.gz --model /tmp/so_work/crf_upos.pt \
        --loss crf --epochs 5 --quiet                        # first-order CRF, UPOS only (10 min, dev 85.60)
    python benchmarks/parsing.py --first /tmp/so_work/crf_upos.pt --model /tmp/so_work/second.pt \
        --arc /tmp/so_work/crf_upos.pt --no-context --bits 20 --epochs 2 --dev-every 200 --max-seconds 1500 --quiet

trains the second-order model if ``--model`` does not exist (else loads it: the training options, ``--top-k`` and
``--min-prob`` are then an error, since the saved model fixes them) and prints the table rows.  The figures and the
command of the README's rows are in docs/measurements.md ("Dependency parsing"); this script's earlier runs are in
docs/remeasurements.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from _common import fraction, nonnegative_float, positive_float, positive_int, run

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "ud_english_ewt"


def _log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _timed(fn, sentences) -> tuple[object, float]:
    start = time.perf_counter()
    out = fn(sentences)
    return out, sum(len(s) for s in sentences) / (time.perf_counter() - start)


TRAINING = ("train_sentences", "epochs", "max_seconds", "lr", "lr_first", "train_iter", "bits", "no_context", "top_k",
            "min_prob", "dev_every")


def _check(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Options that would be ignored, and paths that would fail after the work, refused before it."""
    for path in [*args.arc, *([] if args.model.is_file() else [args.first])]:
        if not path.is_file():
            ap.error(f"no model file at {path}")
    if args.model.is_file():
        given = [f"--{k.replace('_', '-')}" for k in TRAINING if getattr(args, k) != ap.get_default(k)]
        if given:
            ap.error(f"{', '.join(given)} set how to train, but {args.model} exists and is loaded, not trained "
                     "(give a new --model path to train one)")
    elif not args.model.resolve().parent.is_dir():
        ap.error(f"--model: the folder of {args.model} does not exist (checked before training, not after)")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=DATA, help="folder with en_ewt-ud-{train,dev,test}.conllu.gz")
    ap.add_argument("--first", type=Path, required=True, help="trained first-order DependencyParser (pruner, init)")
    ap.add_argument("--model", type=Path, required=True, help="second-order model: loaded if present, else trained")
    ap.add_argument("--arc", type=Path, nargs="*", default=[], help="arc-factored models to report as rows too")
    ap.add_argument("--train-sentences", type=positive_int, default=None, help="use the first K training sentences")
    ap.add_argument("--epochs", type=positive_int, default=3)
    ap.add_argument("--max-seconds", type=positive_float, default=None, help="stop training after this many seconds")
    ap.add_argument("--lr", type=positive_float, default=0.05, help="AdaGrad rate of the second-order weights")
    ap.add_argument("--lr-first", type=nonnegative_float, default=0.01, help="AdaGrad rate of the first-order weights")
    ap.add_argument("--train-iter", type=positive_int, default=5, help="Bethe-RDA iterations per minibatch")
    ap.add_argument("--bits", type=positive_int, default=22, help="2^bits second-order weights")
    ap.add_argument("--no-context", action="store_true", help="second-order parts without the context templates")
    ap.add_argument("--top-k", type=positive_int, default=5)
    ap.add_argument("--min-prob", type=fraction, default=1e-4)
    ap.add_argument("--dev-every", type=positive_int, default=None,
                    help="dev evaluation every N steps (default per epoch)")
    ap.add_argument("--mf-iter", type=positive_int, default=10, help="Bethe-RDA iterations at test time")
    ap.add_argument("--bp-iter", type=positive_int, default=20, help="loopy BP iterations at test time")
    ap.add_argument("--damping", type=fraction, default=0.3, help="loopy BP damping (chosen on dev)")
    ap.add_argument("--split", choices=("dev", "test"), default="test")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    _check(ap, args)
    torch.set_num_threads(1)

    from betheproj.data.conllu import load_conllu
    from betheproj.parsing import DependencyParser
    from betheproj.parsing.pruning import prune
    from betheproj.parsing.second_order import SecondOrderParser

    train = load_conllu(args.data / "en_ewt-ud-train.conllu.gz")
    dev = load_conllu(args.data / "en_ewt-ud-dev.conllu.gz")
    evalset = dev if args.split == "dev" else load_conllu(args.data / "en_ewt-ud-test.conllu.gz")
    if args.train_sentences:
        train = train[: args.train_sentences]
    rows = []
    for path in args.arc:
        arc = DependencyParser.load(path)
        heads, speed = _timed(arc.predict, evalset)
        from betheproj.parsing.metrics import uas
        rows.append((f"arc-factored ({arc.info.get('loss')}, {path.name})", uas(evalset, heads), speed,
                     arc.info.get("train_seconds")))
    if args.model.is_file():
        parser = SecondOrderParser.load(args.model)
        _log(f"loaded {args.model}: {parser.info.get('steps')} steps, {parser.info.get('train_seconds', 0):.0f}s")
    else:
        first = DependencyParser.load(args.first)
        parser = SecondOrderParser(first, bits=args.bits, top_k=args.top_k, min_prob=args.min_prob,
                                   context=not args.no_context)
        parser.fit(train, epochs=args.epochs, lr=args.lr, lr_first=args.lr_first, train_iter=args.train_iter,
                   dev=dev, eval_every=args.dev_every, progress=not args.quiet, log=_log,
                   max_seconds=args.max_seconds)
        parser.save(args.model)
        _log(f"trained in {parser.info['train_seconds']:.0f}s ({parser.info['steps']} steps), saved {args.model}")
    cands = prune(parser.first, parser.pruner, evalset, parser.top_k, parser.min_prob)
    _log(f"pruning recall on {args.split}: {100 * cands.recall:.2f}% ({len(cands.mod) / cands.lengths.sum():.2f} "
         f"arcs per word)")
    seconds = parser.info.get("train_seconds")
    methods = [("second-order, loopy BP (Turbo Parser #1)", "loopy_bp", {"max_iter": args.bp_iter,
                                                                          "damping": args.damping}),
               ("second-order, mean field, Bethe-RDA", "mean_field", {"max_iter": args.mf_iter}),
               ("second-order model, pruned first-order part only", "first_order", {})]
    from betheproj.parsing.metrics import uas
    for name, method, opts in methods:
        heads, speed = _timed(lambda s, m=method, o=opts: parser.predict(s, m, **o), evalset)
        rows.append((name, uas(evalset, heads), speed, seconds))
    print(f"| model ({args.split}, gold UPOS) | UAS | tokens/s | training time (from the model file) |")
    print("|---|---|---|---|")
    for name, score, speed, secs in rows:
        t = "-" if not secs else f"{secs:.0f} s" if secs < 60 else f"{secs / 60:.0f} min"
        print(f"| {name} | {score:.2f} | {speed:.0f} | {t} |")
    print(f"pruning recall ({args.split}): {100 * cands.recall:.2f}%, top-{parser.top_k}, min_prob {parser.min_prob}")


if __name__ == "__main__":
    run(main)
