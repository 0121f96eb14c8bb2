"""Attachment scores for dependency trees."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..data.conllu import Sentence
from ..factor_graphs._util import as_numpy

__all__ = ["PUNCT", "uas", "attachment_counts", "scorable_words"]

PUNCT = "PUNCT"
"""Punctuation convention: a word is punctuation iff its *gold* UPOS is ``PUNCT`` (UD's universal tag; ``SYM`` and
everything else are scored).  This is the usual "UAS without punctuation" on UD treebanks (e.g. Dozat & Manning
2017); the CoNLL-X ``eval.pl`` instead excludes tokens made only of Unicode punctuation characters."""


def _heads(x: Sentence | Sequence[int] | np.ndarray) -> np.ndarray:
    if isinstance(x, Sentence):
        return x.heads
    heads = np.asarray(as_numpy(x))                                              # CUDA heads too
    if heads.size and heads.dtype.kind not in "iu":
        raise TypeError(f"predicted heads must be integers, got {heads.dtype}")
    return heads.astype(np.int64)


def _scored(s: Sentence, punct: bool) -> np.ndarray:
    """The words of ``s`` that are scored: those with a gold HEAD (not punctuation unless ``punct``)."""
    keep = np.ones(len(s.heads), dtype=bool) if punct else np.array([u != PUNCT for u in s.upos], dtype=bool)
    return keep & (s.heads >= 0)


def scorable_words(gold: Sequence[Sentence], punct: bool = False) -> int:
    """How many words :func:`attachment_counts` would score."""
    return sum(int(_scored(s, punct).sum()) for s in gold)


def attachment_counts(gold: Sequence[Sentence], predicted: Sequence[Sentence | Sequence[int] | np.ndarray],
                      punct: bool = False) -> tuple[int, int]:
    """``(correct, total)`` heads over all words (punctuation included only when ``punct``)."""
    if len(gold) != len(predicted):
        raise ValueError(f"got {len(predicted)} predicted sentences for {len(gold)} gold ones")
    correct = total = 0
    for i, (g, p) in enumerate(zip(gold, predicted, strict=True)):
        gh, ph = g.heads, _heads(p)
        if gh.shape != ph.shape:
            raise ValueError(f"sentence {i}: {len(ph)} predicted heads for {len(gh)} words")
        if ph.size and (ph.min() < 0 or ph.max() > len(ph)):
            raise ValueError(f"sentence {i}: predicted heads must lie in [0, {len(ph)}] (0 the root), got "
                             f"{int(ph.min()) if ph.min() < 0 else int(ph.max())}")
        keep = _scored(g, punct)
        correct += int((gh[keep] == ph[keep]).sum())
        total += int(keep.sum())
    return correct, total


def uas(gold: Sequence[Sentence], predicted: Sequence[Sentence | Sequence[int] | np.ndarray],
        punct: bool = False) -> float:
    """Unlabeled attachment score in percent: the share of scored words whose predicted head is the gold one.
    By default words whose gold UPOS is ``PUNCT`` are excluded (see :data:`PUNCT`); ``punct=True`` scores all."""
    correct, total = attachment_counts(gold, predicted, punct)
    return 100.0 * correct / total if total else float("nan")
