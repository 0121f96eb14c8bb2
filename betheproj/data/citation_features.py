"""Sparse token features for citation field extraction, as indices into a weight table (no dense one-hot).

Per token: the word, its lower case, its shape (``Xx.``-style, runs collapsed) and the shape with runs kept
up to 4, prefixes and suffixes of 1-3 characters, punctuation, digit and year flags, the position in the
citation (10 buckets, first and last), the lower-cased words and shapes at offsets -2..2, lexicon
features read off the training split (the leaf fields the lower-cased word was labelled with at least
twice), and three flags of what came before: an ``in`` (venues follow it), a year, an open parenthesis.
:class:`FeatureIndex` numbers the features seen in training (0 is padding); others are dropped.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from .._checks import check_count, is_bio_label
from .citations import Citation, _check_strings, bio_segments, check_citations

__all__ = ["token_features", "FeatureIndex"]

_YEAR = re.compile(r"^\(?(1[89]|20)\d\d[a-z]?\)?[.,;:]?$")


def _shape(word: str, keep: int) -> str:
    out, last, run = [], "", 0
    for ch in word:
        k = "X" if ch.isupper() else "x" if ch.islower() else "d" if ch.isdigit() else ch
        run = run + 1 if k == last else 1
        last = k
        if run <= keep:
            out.append(k)
    return "".join(out)


def _context(tokens: Sequence[str], lower: Sequence[str], years: Sequence[bool]) -> list[list[str]]:
    """Per token: ``after_in`` / ``after_year`` when an earlier token is ``in`` / a year, ``in_paren`` inside
    parentheses (opened by a token starting with ``(``, closed by one ending with ``)``)."""
    out, after_in, after_year, depth = [], False, False, 0
    for tok, low, year in zip(tokens, lower, years, strict=True):
        if tok.startswith("("):
            depth += 1
        out.append([name for name, on in (("after_in", after_in), ("after_year", after_year),
                                          ("in_paren", depth > 0)) if on])
        if depth and tok.endswith(")"):
            depth -= 1
        after_in |= low in ("in", "in:")
        after_year |= year
    return out


def token_features(tokens: Sequence[str], lexicon: dict[str, set[str]] | None = None) -> list[list[str]]:
    """The feature strings of every token of a citation (``tokens``: a list of strings, not one string), read in
    Unicode NFC: a decomposed ``e`` + combining circumflex (text copied from a PDF) is featurised as the ``ê`` of
    the data (whose tokens are all NFC)."""
    _check_strings(tokens, "tokens", "token")
    tokens = [unicodedata.normalize("NFC", t) for t in tokens]
    n = len(tokens)
    lower = [t.lower() for t in tokens]
    shape = [_shape(t, 1) for t in tokens]
    years = [bool(_YEAR.match(t)) for t in tokens]
    context = _context(tokens, lower, years)
    feats = []
    for i, (tok, low) in enumerate(zip(tokens, lower, strict=True)):
        f = [f"w={tok}", f"l={low}", f"s={shape[i]}", f"S={_shape(tok, 4)}", f"pos={10 * i // max(n, 1)}"]
        f += [f"p{k}={low[:k]}" for k in (1, 2, 3) if len(low) >= k]
        f += [f"x{k}={low[-k:]}" for k in (1, 2, 3) if len(low) >= k]
        if i == 0:
            f.append("first")
        if i == n - 1:
            f.append("last")
        if not any(ch.isalnum() for ch in tok):
            f.append("punct")
        if any(ch.isdigit() for ch in tok):
            f.append("digit")
            if tok.isdigit():
                f.append(f"ndig={min(len(tok), 5)}")
        if years[i]:
            f.append("year")
        for off in (-2, -1, 1, 2):
            j = i + off
            word, sh = (lower[j], shape[j]) if 0 <= j < n else ("<pad>", "<pad>")
            f += [f"l{off:+d}={word}", f"s{off:+d}={sh}"]
        if lexicon is not None:
            f += [f"lex={leaf}" for leaf in sorted(lexicon.get(low, ()))]
        feats.append(f + context[i])
    return feats


FEATURES_VERSION = 1
"""The version of :func:`token_features` (and of the tokens' normalisation), saved with every index: bump it when a
feature's definition changes, so that an index fitted with the old one (a saved model) is refused instead of
read with features it was not trained on.  An index saved before versions were recorded is taken as version 1."""


def other_feature_version(state: dict[str, Any]) -> object | None:
    """The feature version of an index ``state`` (:meth:`FeatureIndex.state`) if it is not this one's
    (:data:`FEATURES_VERSION`; none recorded: 1), else ``None``."""
    version = state.get("version", 1)
    return None if version == FEATURES_VERSION else version


class FeatureIndex:
    """Feature and label numbering fitted on training citations; ``encode`` gives padded index tensors.

    ``labels``: the label list to number (default: the sorted labels of ``citations`` and ``O``), e.g. a larger
    index's, so that a model fitted on part of the citations scores the same labels; it must hold ``O`` and every
    label of ``citations``."""

    def __init__(self, citations: Sequence[Citation], min_count: int = 1, lexicon_count: int = 2,
                 labels: Sequence[str] | None = None):
        citations = check_citations(citations, empty=False)
        min_count, lexicon_count = check_count("min_count", min_count), check_count("lexicon_count", lexicon_count)
        seen = {label for c in citations for label in c.labels} | {"O"}
        if labels is not None:
            if isinstance(labels, str) or not all(isinstance(y, str) for y in labels):
                raise TypeError("labels must be a sequence of label strings or None")
            labels = list(labels)
            if len(set(labels)) != len(labels):
                raise ValueError("labels must be distinct (one id each)")
            bad = next((y for y in labels if not is_bio_label(y)), None)
            if bad is not None:
                raise ValueError(f"labels must be 'O', 'B-<type>' or 'I-<type>', got {bad!r}")
            missing = sorted(seen - set(labels))
            if missing:
                raise ValueError(f"labels must hold 'O' and every label of citations; it lacks {missing[:5]}")
        leaves: dict[str, Counter[str]] = defaultdict(Counter)
        for i, c in enumerate(citations):
            try:                                    # the labels a saved index must hold (from_state checks them)
                bio_segments(c.labels)
            except ValueError as err:
                raise ValueError(f"citations[{i}].{err}") from None
            for tok, path in zip(c.tokens, c.paths, strict=True):
                if path:
                    leaves[unicodedata.normalize("NFC", tok).lower()][path[-1]] += 1     # as token_features reads it
        self.lexicon = {w: {leaf for leaf, k in cnt.items() if k >= lexicon_count} for w, cnt in leaves.items()}
        counts = Counter(f for c in citations for fs in token_features(c.tokens, self.lexicon) for f in fs)
        self.features = {f: i + 1 for i, f in enumerate(sorted(f for f, k in counts.items() if k >= min_count))}
        self.labels = sorted(seen) if labels is None else labels
        self.label_ids = {label: i for i, label in enumerate(self.labels)}

    def state(self) -> dict[str, Any]:
        """A plain-data copy (for ``torch.save`` with ``weights_only`` loading)."""
        return {"features": self.features, "labels": self.labels,
                "lexicon": {w: sorted(v) for w, v in self.lexicon.items()}, "version": FEATURES_VERSION}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> FeatureIndex:
        """The index :meth:`state` describes."""
        if not isinstance(state, dict):
            raise TypeError(f"a feature index state is a dict, got {type(state).__name__}")
        version = other_feature_version(state)
        if version is not None:
            raise ValueError(f"state: a feature index of feature version {version!r}, but this betheproj computes "
                             f"version {FEATURES_VERSION}: its features would not be the ones the model was trained "
                             f"on; train again")
        obj = cls.__new__(cls)
        try:
            if not all(isinstance(v, int) and not isinstance(v, bool) for v in dict(state["features"]).values()):
                raise TypeError("features must map each feature to an int id")
            if not isinstance(state["labels"], list | tuple):     # a str would read as a list of characters
                raise TypeError(f"labels must be a list, got {type(state['labels']).__name__}")
            obj.features, obj.labels = dict(state["features"]), list(state["labels"])
            obj.lexicon = {w: set(v) for w, v in state["lexicon"].items()}
            if "O" not in obj.labels:                 # encode maps unseen labels to it
                raise ValueError(f"labels must hold 'O', got {obj.labels[:5]}")
            if len(set(obj.labels)) != len(obj.labels) or not all(isinstance(y, str) for y in obj.labels):
                raise ValueError(f"labels must be distinct strings (one id each), got {obj.labels[:5]}...")
            bad = next((y for y in obj.labels if not is_bio_label(y)), None)
            if bad is not None:                       # else tagging failed later, naming no file
                raise ValueError(f"labels must be 'O', 'B-<type>' or 'I-<type>', got {bad!r}")
            if sorted(obj.features.values()) != list(range(1, len(obj.features) + 1)):   # the weight table's rows
                raise ValueError(f"features must number the {len(obj.features)} features 1..{len(obj.features)}, "
                                 "each once")
            if not all(isinstance(v, list | tuple) and all(isinstance(x, str) for x in v)
                       for v in state["lexicon"].values()):
                raise ValueError("lexicon must map each word to a list of field names")
        except KeyError as err:
            raise ValueError(f"state: a malformed feature index state (it lacks {err})") from None
        except (TypeError, ValueError, AttributeError) as err:
            raise ValueError(f"state: a malformed feature index state ({type(err).__name__} reading 'features', "
                             f"'labels' and 'lexicon': {err})") from None
        obj.label_ids = {label: i for i, label in enumerate(obj.labels)}
        return obj

    @property
    def num_features(self) -> int:
        return len(self.features) + 1

    def encode(self, citations: Sequence[Citation]) -> tuple[Tensor, Tensor, Tensor]:
        """Feature indices [B, N, K] (0 = padding), label ids [B, N] (-1 padding; labels unseen in training
        map to ``O``) and lengths [B]."""
        citations = check_citations(citations)
        rows = [[[self.features[f] for f in fs if f in self.features] for fs in token_features(c.tokens, self.lexicon)]
                for c in citations]
        b = len(rows)
        n = max((len(r) for r in rows), default=1)
        k = max((len(f) for r in rows for f in r), default=1)
        ids = torch.zeros(b, n, k, dtype=torch.long)
        labels = torch.full((b, n), -1, dtype=torch.long)
        o = self.label_ids["O"]
        for i, (r, c) in enumerate(zip(rows, citations, strict=True)):
            for j, fs in enumerate(r):
                ids[i, j, : len(fs)] = torch.tensor(fs, dtype=torch.long)
            labels[i, : len(c.labels)] = torch.tensor([self.label_ids.get(y, o) for y in c.labels], dtype=torch.long)
        return ids, labels, torch.tensor([len(c.tokens) for c in citations], dtype=torch.long)
