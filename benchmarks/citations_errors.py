"""What the citation errors are, before and after the learned constraints: an error breakdown.

Run by hand, after ``betheproj citations --data DIR --out citations-results`` (which writes the model):

    python benchmarks/citations_errors.py --data ../shared/data/umass_citation/original \
        --model citations-results/model.pt [--split dev] [--top 15]

For the baseline (Viterbi in theta) and the non-local row (Viterbi in theta - grad L(mu*)) it counts the gold
segments each one misses, by kind:

* ``label``: a predicted segment has the same span and another field (an editor's name read as an author's);
* ``boundary``: a predicted segment of the same field overlaps it with other ends (a title one token short);
* ``other``: neither (the tokens went to several fields, or to none),

and lists the most frequent (gold field -> predicted field or "boundary") confusions of the non-local row. A
count or order constraint moves whole fields, so it can fix ``label`` errors; a boundary error is a local
decision that the templates reach only through a field's length.
"""

from __future__ import annotations

import argparse
from collections import Counter

from _common import positive_int, run

from betheproj.data.citations import SPLITS, bio_segments, load_citations
from betheproj.experiments.citations import f1_of, load_model, nonlocal_predictor, viterbi_predictor


def breakdown(gold: list[list[str]], pred: list[list[str]]) -> tuple[Counter, Counter, int]:
    """Missed gold segments by kind, by (gold field, predicted field or "boundary"), and the citations with any."""
    kinds: Counter = Counter()
    pairs: Counter = Counter()
    wrong = 0
    for g, p in zip(gold, pred, strict=True):
        gs, ps = set(bio_segments(g)), set(bio_segments(p))
        wrong += gs != ps
        extra = ps - gs
        for field, start, end in sorted(gs - ps):
            same_span = [q for q in extra if q[1] == start and q[2] == end]
            overlap = [q for q in extra if q[0] == field and q[1] < end and start < q[2]]
            if same_span:
                kinds["label"] += 1
                pairs[(field, same_span[0][0])] += 1
            elif overlap:
                kinds["boundary"] += 1
                pairs[(field, "boundary")] += 1
            else:
                kinds["other"] += 1
                pairs[(field, "other")] += 1
    return kinds, pairs, wrong


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="folder holding training.docs(.gz), dev.docs(.gz), ...")
    parser.add_argument("--model", default="citations-results/model.pt", help="model.pt of a citations run")
    parser.add_argument("--split", default="dev", choices=sorted(SPLITS))
    parser.add_argument("--top", type=positive_int, default=15, help="how many confusions to list")
    args = parser.parse_args()
    try:
        index, model = load_model(args.model)
    except FileNotFoundError as error:
        parser.error(f"--model: {error}")
    cites = load_citations(args.data)[args.split]
    enc = index.encode(cites)
    gold = [c.labels for c in cites]
    n_gold = sum(len(bio_segments(g)) for g in gold)
    predictors = {"baseline": viterbi_predictor(model.theta), "non-local": nonlocal_predictor(model, model.max_iter)}
    print(f"{args.split}: {len(cites)} citations, {n_gold} gold segments")
    print(f"{'':<12}{'F1':>7}{'wrong cit.':>12}{'missed':>8}{'label':>7}{'boundary':>10}{'other':>7}")
    for name, predict in predictors.items():
        f1, pred = f1_of(predict, index, cites, enc)
        kinds, pairs, wrong = breakdown(gold, pred)
        print(f"{name:<12}{f1:>7.2f}{wrong:>12}{sum(kinds.values()):>8}{kinds['label']:>7}{kinds['boundary']:>10}"
              f"{kinds['other']:>7}")
    print("most frequent misses of the non-local row (gold field -> predicted):")
    for (field, got), count in pairs.most_common(args.top):                  # pairs: the last row's
        print(f"{count:>5}  {field} -> {got}")


if __name__ == "__main__":
    run(main)
