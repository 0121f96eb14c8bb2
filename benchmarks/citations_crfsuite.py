"""The CRFsuite peer for citation field extraction, on our label set, beside our baseline CRF.

CRFsuite (python-crfsuite, L-BFGS, L2 ``c2``, no L1) with the standard token features the issue names: the word,
its lower case, its shape, 3-character prefix and suffix, the position in the citation, and the neighbouring
(offsets -2..2) lower-cased words and shapes.  Labels are ours: the BIO encoding of each token's full tag path
(:mod:`betheproj.data.citations`).  Segment-level F1 (exact spans, micro-averaged) on dev and test, and the
training time.  Our baseline (``SparseChainCRF`` with :mod:`betheproj.data.citation_features`, L-BFGS) is
trained and scored in the same run unless ``--ours none``.

Run:  python benchmarks/citations_crfsuite.py --data ../shared/data/umass_citation/original [--c2 1.0]
Needs python-crfsuite (the ``bench`` extra).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from _common import crfsuite, nonnegative_float, positive_int, run

from betheproj.data.citation_features import _shape
from betheproj.data.citations import Citation, load_citations
from betheproj.learning.metrics import segment_f1


def standard_features(tokens: list[str]) -> list[list[str]]:
    """The peer's features: word, lower case, shape, 3-prefix/suffix, position, neighbouring words and shapes."""
    n = len(tokens)
    lower = [t.lower() for t in tokens]
    shape = [_shape(t, 1) for t in tokens]
    out = []
    for i, tok in enumerate(tokens):
        f = ["bias", f"w={tok}", f"l={lower[i]}", f"s={shape[i]}", f"p3={lower[i][:3]}", f"x3={lower[i][-3:]}",
             f"pos={10 * i // n}"]
        for off in (-2, -1, 1, 2):
            j = i + off
            f += [f"l{off:+d}={lower[j]}", f"s{off:+d}={shape[j]}"] if 0 <= j < n else [f"edge{off:+d}"]
        out.append(f)
    return out


def crfsuite_run(train: list[Citation], tests: dict[str, list[Citation]], c2: float, max_iterations: int) -> dict:
    pycrfsuite = crfsuite()
    result: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "crf.model")
        t = time.perf_counter()             # features included, as ours include building and encoding theirs
        trainer = pycrfsuite.Trainer(algorithm="lbfgs", verbose=False)
        for c in train:
            trainer.append(standard_features(c.tokens), c.labels)
        trainer.set_params({"c1": 0.0, "c2": c2, "max_iterations": max_iterations})
        trainer.train(path)
        result["train_s"] = time.perf_counter() - t
        tagger = pycrfsuite.Tagger()
        tagger.open(path)
        for split, cites in tests.items():
            pred = [tagger.tag(standard_features(c.tokens)) for c in cites]
            result[split] = 100 * segment_f1([c.labels for c in cites], pred).f1
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True, help="folder with training.docs, dev.docs, testing.docs")
    ap.add_argument("--c2", type=nonnegative_float, default=1.0,
                    help="CRFsuite's L2 coefficient (0: none; default 1.0)")
    ap.add_argument("--max-iterations", type=positive_int, default=200)
    ap.add_argument("--ours", choices=("base", "none"), default="base")
    ap.add_argument("--threads", type=positive_int, default=None,
                    help="torch threads for our CRF (default: torch's own; CRFsuite runs on one)")
    args = ap.parse_args()
    crfsuite()                          # the peer is there, before any work
    import torch

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    data = load_citations(args.data)
    labels = sorted({y for c in data["train"] for y in c.labels})
    print(f"label set: {len(labels)} BIO labels over full tag paths")
    peer = crfsuite_run(data["train"], {"dev": data["dev"], "test": data["test"]}, args.c2, args.max_iterations)
    print(f"CRFsuite (c2={args.c2}): dev {peer['dev']:.2f}  test {peer['test']:.2f}  train {peer['train_s']:.1f} s")
    if args.ours == "base":
        from betheproj.data.citation_features import FeatureIndex
        from betheproj.experiments.citations import CitationConfig, f1_of, train_baseline
        from betheproj.oracles import LinearChain

        t = time.perf_counter()
        index = FeatureIndex(data["train"])
        base = train_baseline(index, index.encode(data["train"]), CitationConfig())
        took = time.perf_counter() - t
        ours = {s: f1_of(lambda x, n: LinearChain().map(base(x, n)), index, data[s], index.encode(data[s]))[0]
                for s in ("dev", "test")}
        print(f"ours (base CRF):   dev {ours['dev']:.2f}  test {ours['test']:.2f}  train {took:.1f} s "
              f"({torch.get_num_threads()} torch threads; CRFsuite: one; both times include building the features)")
        print(f"ours - CRFsuite:   dev {ours['dev'] - peer['dev']:+.2f}  test {ours['test'] - peer['test']:+.2f}")


if __name__ == "__main__":
    run(main)
