"""Arc-factored parsing speed and UAS on UD English-EWT test (issue 6): tokens per second end to end (features,
scoring, Chu-Liu-Edmonds), the median of three passes, for each model written by ``betheproj parse train``.

    python benchmarks/parsing_speed.py MODEL.pt [MODEL.pt ...] [--data TEST.conllu.gz] [--threads 2]

Measured 2026-11-23 (2 cores, 2 threads; goal: at least 10,000 tokens/s): with the default context templates,
CRF (5 epochs, 2^24) 86.76 at 12,668 tokens/s and SVM (8 epochs, 2^24) 87.21 at 17,315; without them (models from
before the templates existed), UPOS CRF 85.45 at 16,098, UPOS SVM 85.71 at 22,270, XPOS CRF 86.47 at 13,922,
XPOS SVM 87.17 at 17,014.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from _common import positive_int, run

from betheproj.data.conllu import load_conllu
from betheproj.parsing.metrics import uas
from betheproj.parsing.parser import DependencyParser

TEST = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "ud_english_ewt" / "en_ewt-ud-test.conllu.gz"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+", help="arc-factored models written by 'betheproj parse train'")
    ap.add_argument("--data", default=str(TEST), help="treebank with gold heads (default: EWT test)")
    ap.add_argument("--threads", type=positive_int, default=2, help="torch threads (default 2)")
    ap.add_argument("--repeats", type=positive_int, default=3, help="passes over the data per model (default 3)")
    args = ap.parse_args(argv)
    missing = [m for m in args.models if not Path(m).is_file()]
    if missing:
        ap.error(f"no model file at {', '.join(missing)}")
    torch.set_num_threads(args.threads)
    sentences = load_conllu(args.data)
    tokens = sum(len(s) for s in sentences)
    print(f"{len(sentences)} sentences, {tokens} tokens, {args.threads} threads")
    for path in args.models:
        parser = DependencyParser.load(path)
        rates = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            heads = parser.predict(sentences)
            rates.append(tokens / (time.perf_counter() - start))
        runs = ", ".join(f"{r:,.0f}" for r in rates)
        print(f"{path}: UAS {uas(sentences, heads):.2f}, {statistics.median(rates):,.0f} tokens/s "
              f"(median of {runs}); >= 10,000: {statistics.median(rates) >= 10_000}")


if __name__ == "__main__":
    run(main)
