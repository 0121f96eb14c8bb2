"""What the citation errors are, before and after the learned constraints: an error breakdown.

Run by hand, after ``betheproj citations --data DIR --out citations-results`` (which writes the model):

    python benchmarks/citations_errors.py --data ../shared/data/umass_citation/original \
        --model citations-results/model.pt [--split dev] [--top 15]

For the baseline (Viterbi in theta) and the non-local row (Viterbi in theta - grad L(mu*)) it counts the gold
segments each one misses, by kind:

* ``label``: a predicted segment has the same span and another field (a title read as a booktitle);
* ``level``: the same span and leaf field under another group (an editor's last name read as an author's,
  ``venue/editor/person/person-last`` as ``authors/person/person-last``; a year inside or outside ``venue``);
* ``boundary``: a predicted segment of the same field overlaps it with other ends (a title one token short);
* ``other``: none of these (the tokens went to several fields, or to none),

and lists the most frequent (gold field -> predicted field or "boundary") confusions of the non-local row. A
count or order constraint moves whole fields, so it can fix ``label`` and ``level`` errors; a boundary error is
a local decision that the templates reach only through a field's length.  ``repeated``: the wrong citations
whose prediction has two or more segments of a field that gold has at most once (a second title), the kind of
error an ``at_most_one`` template names directly.

Then it asks whether the non-local row's remaining errors are the search's or the model's: for each citation it
gets wrong, is the gold labelling's score under the learned model, ``<theta, S(y)> - L_c(S(y))``
(``NonLocalCRF.score``, the log-probability of eq. 8 up to its normaliser), above that of the prediction?
Where it is not, the model itself prefers its wrong answer, and no better decoder of this model would fix it.
"""

from __future__ import annotations

import argparse
from collections import Counter

import torch
from _common import positive_int, run
from torch import Tensor

from betheproj.data.citation_features import FeatureIndex
from betheproj.data.citations import SPLITS, Citation, bio_segments, load_citations
from betheproj.experiments.citations import f1_of, load_model, nonlocal_predictor, viterbi_predictor
from betheproj.learning import NonLocalCRF


def breakdown(gold: list[list[str]], pred: list[list[str]]) -> tuple[Counter, Counter, int, int]:
    """Missed gold segments by kind, by (gold field, predicted field or "boundary"), the citations with any, and
    those of them with a field repeated that gold has at most once."""
    kinds: Counter = Counter()
    pairs: Counter = Counter()
    wrong = repeated = 0
    for g, p in zip(gold, pred, strict=True):
        gs, ps = set(bio_segments(g)), set(bio_segments(p))
        wrong += gs != ps
        gold_counts, pred_counts = Counter(q[0] for q in gs), Counter(q[0] for q in ps)
        repeated += any(k > 1 and gold_counts[field] <= 1 for field, k in pred_counts.items())
        extra = ps - gs
        for field, start, end in sorted(gs - ps):
            same_span = [q for q in extra if q[1] == start and q[2] == end]
            overlap = [q for q in extra if q[0] == field and q[1] < end and start < q[2]]
            if same_span:
                got = same_span[0][0]
                kinds["level" if got.split("/")[-1] == field.split("/")[-1] else "label"] += 1
                pairs[(field, got)] += 1
            elif overlap:
                kinds["boundary"] += 1
                pairs[(field, "boundary")] += 1
            else:
                kinds["other"] += 1
                pairs[(field, "other")] += 1
    return kinds, pairs, wrong, repeated


def search_or_model(model: NonLocalCRF, index: FeatureIndex, cites: list[Citation],
                    encoded: tuple[Tensor, Tensor, Tensor], pred: list[list[str]]) -> tuple[int, int, int]:
    """Of the citations ``pred`` gets wrong whose gold paths all occur in training (an unseen path has no label
    id): how many there are, how many the model scores the gold labelling above ``pred`` in, and how many not."""
    x, _, n = encoded
    rows = [i for i, (c, p) in enumerate(zip(cites, pred, strict=True))
            if c.labels != p and all(label in index.label_ids for label in c.labels)]
    if not rows:
        return 0, 0, 0
    idx = torch.tensor(rows)
    width = int(n[idx].max())

    def ids(seqs: list[list[str]]) -> Tensor:
        out = torch.full((len(rows), width), -1, dtype=torch.long)
        for r, i in enumerate(rows):
            out[r, : len(seqs[i])] = torch.tensor([index.label_ids[label] for label in seqs[i]])
        return out

    with torch.no_grad():
        gold = model.score(x[idx, :width], ids([c.labels for c in cites]), n[idx])
        got = model.score(x[idx, :width], ids(pred), n[idx])
    higher = int((gold > got).sum())
    return len(rows), higher, len(rows) - higher


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
    print(f"{'':<12}{'F1':>7}{'wrong cit.':>12}{'repeated':>10}{'missed':>8}{'label':>7}{'level':>7}"
          f"{'boundary':>10}{'other':>7}")
    for name, predict in predictors.items():
        f1, pred = f1_of(predict, index, cites, enc)
        kinds, pairs, wrong, repeated = breakdown(gold, pred)
        print(f"{name:<12}{f1:>7.2f}{wrong:>12}{repeated:>10}{sum(kinds.values()):>8}{kinds['label']:>7}{kinds['level']:>7}"
              f"{kinds['boundary']:>10}{kinds['other']:>7}")
    print("most frequent misses of the non-local row (gold field -> predicted):")
    for (field, got), count in pairs.most_common(args.top):                  # pairs: the last row's
        print(f"{count:>5}  {field} -> {got}")
    total, higher, lower = search_or_model(model, index, cites, enc, pred)   # pred: the non-local row's
    print(f"search or model: of the {total} citations the non-local row gets wrong (gold paths all seen in "
          f"training), the learned model scores the gold labels higher in {higher} (a better decoder could fix "
          f"these) and its own wrong answer at least as high in {lower} (only another model could)")


if __name__ == "__main__":
    run(main)
