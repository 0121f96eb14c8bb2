"""Segment-level precision, recall and F1 (exact span match, per field and micro-averaged; CoNLL convention)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..data.citations import bio_segments

__all__ = ["SegmentScores", "segment_f1", "segment_counts"]


def _prf(tp: int, n_pred: int, n_gold: int) -> tuple[float, float, float]:
    p = tp / n_pred if n_pred else 0.0
    r = tp / n_gold if n_gold else 0.0
    return p, r, (2 * p * r / (p + r) if p + r else 0.0)


@dataclass
class SegmentScores:
    """Micro-averaged ``precision``, ``recall``, ``f1`` (in [0, 1]) and, per field, ``(p, r, f1, gold count)``."""

    precision: float
    recall: float
    f1: float
    per_field: dict[str, tuple[float, float, float, int]] = field(default_factory=dict)


def _check_sequences(gold: object, predicted: object) -> tuple[Sequence[Sequence[str]], Sequence[Sequence[str]]]:
    """``gold`` and ``predicted`` as sequences of label sequences, as many of each."""
    if isinstance(gold, np.ndarray):                    # rows of a 2-D array of labels are its sequences
        gold = list(gold)
    if isinstance(predicted, np.ndarray):
        predicted = list(predicted)
    gold, predicted = _check_label_sequences("gold", gold), _check_label_sequences("predicted", predicted)
    if len(gold) != len(predicted):
        raise ValueError(f"gold and predicted must hold as many sequences, got {len(gold)} and {len(predicted)}")
    return gold, predicted


def _check_label_sequences(name: str, seqs: object) -> Sequence[Sequence[str]]:
    """``seqs`` if it is a sequence of label sequences (not a string, a sequence of strings or an iterator)."""
    if not isinstance(seqs, Sequence) or isinstance(seqs, str) \
            or any(isinstance(s, str) or not (hasattr(s, "__len__") and hasattr(s, "__getitem__")) for s in seqs):
        raise TypeError(f"{name} must be a sequence of label sequences (e.g. [['B-a', 'O']]), "
                        f"not a string, a sequence of strings or an iterator; got {type(seqs).__name__}")
    return seqs


def _segments(name: str, i: int, labels: Sequence[str]) -> set[tuple[str, int, int]]:
    """The segments of ``labels``, with errors naming the sequence (``predicted[3]: labels[0] = ...``)."""
    try:
        return set(bio_segments(list(labels)))
    except (TypeError, ValueError) as err:
        raise type(err)(f"{name}[{i}]: {err}") from None


def _segment_sets(gold: object, predicted: object
                  ) -> Iterator[tuple[set[tuple[str, int, int]], set[tuple[str, int, int]]]]:
    """Each sequence's gold and predicted segment sets, the arguments checked (a length mismatch names the
    sequence)."""
    gold, predicted = _check_sequences(gold, predicted)
    for i, (g, p) in enumerate(zip(gold, predicted, strict=True)):
        if len(g) != len(p):
            raise ValueError(f"sequence {i}: gold has {len(g)} labels, predicted {len(p)}")
        yield _segments("gold", i, g), _segments("predicted", i, p)


def segment_f1(gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]]) -> SegmentScores:
    """Score predicted BIO label sequences against gold ones: a segment counts only when its type, start and
    end all match; an ``I-`` that does not continue its type starts a new segment (the conlleval reading).
    ``gold`` and ``predicted`` hold one sequence of labels per example (not one flat sequence of strings)."""
    tp: Counter[str] = Counter()
    n_gold: Counter[str] = Counter()
    n_pred: Counter[str] = Counter()
    for gs, ps in _segment_sets(gold, predicted):
        for kind, _, _ in gs:
            n_gold[kind] += 1
        for kind, _, _ in ps:
            n_pred[kind] += 1
        for kind, _, _ in gs & ps:
            tp[kind] += 1
    per_field = {k: (*_prf(tp[k], n_pred[k], n_gold[k]), n_gold[k]) for k in sorted(set(n_gold) | set(n_pred))}
    p, r, f = _prf(sum(tp.values()), sum(n_pred.values()), sum(n_gold.values()))
    return SegmentScores(p, r, f, per_field)


def segment_counts(gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]]) -> np.ndarray:
    """Each sequence's ``(true positives, predicted, gold)`` segment counts, [n, 3] int64, read as
    :func:`segment_f1` reads them (its micro F1 is ``2 tp / (predicted + gold)`` of the column sums): per-example
    counts to resample, for a bootstrap interval of F1 or of the difference between two taggers."""
    counts = [(len(gs & ps), len(ps), len(gs)) for gs, ps in _segment_sets(gold, predicted)]
    return np.array(counts, dtype=np.int64).reshape(len(counts), 3)
