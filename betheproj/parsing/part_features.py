"""Hashed features of second-order parts (Martins et al., EMNLP 2010; McDonald & Pereira 2006): sibling parts
``(h, m, s)`` and grandparent parts ``(g, h, m)``, each a conjunction of UPOS tags, a few word forms, directions and
distance buckets, hashed into ``2^bits`` weights."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .._checks import check_bool, check_int
from ..data.conllu import Sentence
from .features import _hash_string, _Hasher, _literal, _mix, _sentences

__all__ = ["SecondOrderFeatures"]


def _bucket(d: np.ndarray) -> np.ndarray:
    """Distance buckets 1, 2, 3, 4-5, 6-10, > 10 (as 0..5)."""
    d = np.abs(d)
    return np.select([d <= 1, d == 2, d == 3, d <= 5, d <= 10], [0, 1, 2, 3, 4], 5).astype(np.uint64)


# sibling part (h, m, s), m < s both modifiers of h; attributes hp/hw, mp/mw, sp/sw and the configuration
# "side" (both left of h, straddling, both right) x distance bucket of s - m; grandparent part (g, h, m) with the
# directions of g -> h and h -> m ("dirs") and the distance bucket of h -> m
_SIB_TEMPLATES: tuple[tuple[str, ...], ...] = (
    ("side",), ("hp", "mp", "sp"), ("hp", "mp", "sp", "side"), ("mp", "sp"), ("mp", "sp", "side"),
    ("hw", "mp", "sp", "side"), ("hp", "mw", "sp", "side"), ("hp", "mp", "sw", "side"), ("mw", "sw", "side"),
    ("hp", "mp", "sp", "sdist"),
)
_GRAND_TEMPLATES: tuple[tuple[str, ...], ...] = (
    ("dirs",), ("gp", "hp", "mp"), ("gp", "hp", "mp", "dirs"), ("gp", "mp"), ("gp", "mp", "dirs"),
    ("gw", "hp", "mp", "dirs"), ("gp", "hw", "mp", "dirs"), ("gp", "hp", "mw", "dirs"), ("gw", "mw", "dirs"),
    ("gp", "hp", "mp", "dirs", "hdist"),
)
# context templates (``context=True``): the bilexical back-offs of McDonald & Pereira (2006) / Carreras (2007)
# (one word, the other part's tag) and the tags next to the parts' words (``q`` previous, ``n`` next token): the
# token before the later sibling or after the earlier one is where a coordinating conjunction or comma sits
_SIB_CONTEXT: tuple[tuple[str, ...], ...] = (
    ("mw", "sp", "side"), ("mp", "sw", "side"), ("hp", "mp", "sp", "sq", "side"), ("hp", "mp", "sp", "mn", "side"),
)
_GRAND_CONTEXT: tuple[tuple[str, ...], ...] = (
    ("gw", "mp", "dirs"), ("gp", "mw", "dirs"), ("gp", "hp", "mp", "mq", "dirs"), ("gp", "hp", "mp", "mn", "dirs"),
)


class SecondOrderFeatures:
    """Hashed second-order part features into ``2^bits`` weights (templates ``_SIB_TEMPLATES``,
    ``_GRAND_TEMPLATES``: UPOS triples with direction / adjacency configurations, a few with word forms; with
    ``context`` also ``_SIB_CONTEXT``, ``_GRAND_CONTEXT``: word-tag back-offs and neighbouring tags).

    :meth:`tokens` hashes the per-token attributes of a list of sentences once (root token in front of each);
    :meth:`sibling` / :meth:`grandparent` map part index arrays to feature ids ``[P, K]`` (int64), all in NumPy."""

    def __init__(self, bits: int = 20, lowercase: bool = True, context: bool = True):
        self.bits = check_int("bits", bits, 8, 28)
        self.lowercase = check_bool("lowercase", lowercase)
        self.context = check_bool("context", context)
        self._hash = _Hasher()
        self._sib = _SIB_TEMPLATES + (_SIB_CONTEXT if self.context else ())
        self._grand = _GRAND_TEMPLATES + (_GRAND_CONTEXT if self.context else ())
        self._sib_seeds = [_hash_string("sib:" + "+".join(t)) for t in self._sib]
        self._grand_seeds = [_hash_string("grand:" + "+".join(t)) for t in self._grand]

    @property
    def num_features(self) -> int:
        return 1 << self.bits

    def config(self) -> dict[str, int | bool]:
        return {"bits": self.bits, "lowercase": self.lowercase, "context": self.context}

    def tokens(self, sentences: Sequence[Sentence]) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """Hashed forms ``w`` and UPOS ``p`` of all tokens (a root token before each sentence), the UPOS of the
        previous and next token ``q``, ``n`` (the root's ``q`` a constant; a sentence's root before its first word
        and the next sentence's root after its last one: both read as the sentence boundary) and the offset of each
        sentence's root in those arrays."""
        sentences = _sentences(sentences)
        forms, tags = [], []
        for s in sentences:
            forms.append("<root>")
            tags.append("<root>")
            forms.extend(_literal(w[1].lower() if self.lowercase else w[1]) for w in s.words)
            tags.extend(_literal(w[3]) for w in s.words)
        sizes = np.array([len(s) + 1 for s in sentences], dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        p = self._hash(["p:" + t for t in tags])
        q = np.roll(p, 1)
        q[starts] = self._hash(["p:<none>"])[0]
        return {"w": self._hash(["w:" + f for f in forms]), "p": p, "q": q, "n": np.roll(p, -1)}, starts

    def _ids(self, seeds: list[int], templates: tuple[tuple[str, ...], ...], attrs: dict[str, np.ndarray]
             ) -> np.ndarray:
        mask = np.uint64(self.num_features - 1)
        out = np.empty((len(next(iter(attrs.values()))), len(templates)), dtype=np.int64)
        for k, (seed, tpl) in enumerate(zip(seeds, templates, strict=True)):
            out[:, k] = (_mix(seed, [attrs[a] for a in tpl]) & mask).astype(np.int64)
        return out

    def sibling(self, tok: dict[str, np.ndarray], root: np.ndarray, h: np.ndarray, m: np.ndarray, s: np.ndarray
                ) -> np.ndarray:
        """Ids [P, K] of sibling parts ``h -> m``, ``h -> s`` (``m < s``; positions local, ``root`` the global
        index of each part's sentence root)."""
        gh, gm, gs = root + h, root + m, root + s
        side = np.where(s < h, 0, np.where(m > h, 2, 1)).astype(np.uint64)
        attrs = {"hp": tok["p"][gh], "hw": tok["w"][gh], "mp": tok["p"][gm], "mw": tok["w"][gm],
                 "sp": tok["p"][gs], "sw": tok["w"][gs], "side": side * np.uint64(8) + _bucket(s - m),
                 "sdist": _bucket(s - m), "sq": tok["q"][gs], "mn": tok["n"][gm]}
        return self._ids(self._sib_seeds, self._sib, attrs)

    def grandparent(self, tok: dict[str, np.ndarray], root: np.ndarray, g: np.ndarray, h: np.ndarray,
                    m: np.ndarray) -> np.ndarray:
        """Ids [P, K] of grandparent parts ``g -> h -> m``."""
        gg, gh, gm = root + g, root + h, root + m
        dirs = ((g < h).astype(np.uint64) << np.uint64(1)) | (h < m).astype(np.uint64)
        dirs = np.where(g == 0, np.uint64(4) + (h < m).astype(np.uint64), dirs)      # root as grandparent
        attrs = {"gp": tok["p"][gg], "gw": tok["w"][gg], "hp": tok["p"][gh], "hw": tok["w"][gh],
                 "mp": tok["p"][gm], "mw": tok["w"][gm], "dirs": dirs, "hdist": _bucket(h - m),
                 "mq": tok["q"][gm], "mn": tok["n"][gm]}
        return self._ids(self._grand_seeds, self._grand, attrs)
