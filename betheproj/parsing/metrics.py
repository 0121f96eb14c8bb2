"""Attachment scores for dependency trees."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .._checks import check_bool
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
    if heads.ndim != 1:
        raise ValueError(f"predicted heads must be one list of heads per sentence (1-D), got shape {heads.shape}")
    return heads.astype(np.int64)


def _scored(s: Sentence, punct: bool) -> np.ndarray:
    """The words of ``s`` that are scored: those with a gold HEAD (not punctuation unless ``punct``)."""
    keep = np.ones(len(s.heads), dtype=bool) if punct else np.array([u != PUNCT for u in s.upos], dtype=bool)
    return keep & (s.heads >= 0)


def _check_gold(gold: object) -> None:
    if isinstance(gold, Sentence | str) or not isinstance(gold, Sequence):
        raise TypeError(f"gold must be a list of Sentence, got {type(gold).__name__}")
    for i, s in enumerate(gold):
        if not isinstance(s, Sentence):
            raise TypeError(f"gold[{i}] must be a Sentence (read_conllu gives them), got {type(s).__name__}")


def scorable_words(gold: Sequence[Sentence], punct: bool = False) -> int:
    """How many words :func:`attachment_counts` would score."""
    _check_gold(gold)
    punct = check_bool("punct", punct)
    return sum(int(_scored(s, punct).sum()) for s in gold)


def attachment_counts(gold: Sequence[Sentence], predicted: Sequence[Sentence | Sequence[int] | np.ndarray],
                      punct: bool = False) -> tuple[int, int]:
    """``(correct, total)`` heads over all words (punctuation included only when ``punct``)."""
    _check_gold(gold)
    punct = check_bool("punct", punct)
    if isinstance(predicted, Sentence | str) or not isinstance(predicted, Sequence | np.ndarray):
        raise TypeError(f"predicted must be a list with one Sentence or list of heads per gold sentence, got "
                        f"{type(predicted).__name__}")
    if len(gold) != len(predicted):
        raise ValueError(f"got {len(predicted)} predicted sentences for {len(gold)} gold ones")
    correct = total = 0
    for i, (g, p) in enumerate(zip(gold, predicted, strict=True)):
        gh, ph = g.heads, _heads(p)
        if gh.shape != ph.shape:
            raise ValueError(f"predicted[{i}]: {len(ph)} predicted heads for {len(gh)} words")
        if ph.size and (ph.min() < 0 or ph.max() > len(ph)):
            raise ValueError(f"predicted[{i}]: heads must lie in [0, {len(ph)}] (0 the root), got "
                             f"{int(ph.min()) if ph.min() < 0 else int(ph.max())}")
        keep = _scored(g, punct)
        correct += int((gh[keep] == ph[keep]).sum())
        total += int(keep.sum())
    return correct, total


def uas(gold: Sequence[Sentence], predicted: Sequence[Sentence | Sequence[int] | np.ndarray],
        punct: bool = False) -> float:
    """Unlabeled attachment score in percent: the share of scored words whose predicted head is the gold one.
    By default words whose gold UPOS is ``PUNCT`` are excluded (see :data:`PUNCT`); ``punct=True`` scores all.
    ``ValueError`` when no word is scored (no gold HEAD, or punctuation alone): the score is not defined."""
    correct, total = attachment_counts(gold, predicted, punct)
    if total == 0:
        raise _nothing_to_score(punct)
    return 100.0 * correct / total


def _nothing_to_score(punct: bool) -> ValueError:
    scope = "" if punct else " (punctuation excluded: punct=True scores it)"
    return ValueError(f"gold has no words with a gold HEAD to score{scope}")


def _require_scorable(gold: Sequence[Sentence], punct: bool = False) -> None:
    """``ValueError`` when ``gold`` has no word :func:`uas` would score."""
    if not scorable_words(gold, punct):
        raise _nothing_to_score(punct)
