"""Arc-factored features in the style of McDonald, Crammer and Pereira (ACL 2005, "Online large-margin training of
dependency parsers", Table 1), hashed into a weight vector of ``2^bits`` entries.

For an arc ``h -> m`` (``h = 0`` the root) with head / modifier word form ``hw``/``mw`` (lower-cased), lemma
``hl``/``ml`` and UPOS ``hp``/``mp``, the templates are

* unigram: ``hw hp``, ``hw``, ``hp``, ``mw mp``, ``mw``, ``mp``; lemma: ``hl``, ``ml``, ``hl ml``, ``hl mp``,
  ``hp ml``;
* bigram: ``hw hp mw mp``, ``hp mw mp``, ``hw mw mp``, ``hw hp mp``, ``hw hp mw``, ``hw mw``, ``hp mp``;
* surrounding UPOS: ``hp hp+1 mp-1 mp``, ``hp-1 hp mp-1 mp``, ``hp hp+1 mp mp+1``, ``hp-1 hp mp mp+1``;
* context (``context=True``, the default): the three-tag back-offs ``hp hp-1 mp``, ``hp hp+1 mp``, ``hp mp-1 mp``,
  ``hp mp+1 mp`` (as in McDonald's MSTParser) and the neighbouring words with both tags, ``hp hw-1 mp``,
  ``hp hw+1 mp``, ``hp mw-1 mp``, ``hp mw+1 mp`` (an auxiliary before a participle, a preposition after a verb:
  what a finer tag set such as the Penn Treebank's would tell); on EWT dev they add 1.1 UAS to the SVM;
* optionally (``xpos=True``) over the XPOS ``hx``/``mx`` (Penn Treebank tags in English, the tags McDonald et
  al. used): ``hx``, ``mx``, ``hw hx``, ``mw mx``, ``hx mx``, ``hx mw mx``, ``hw hx mx`` and the four
  surrounding-tag templates;

each once plain and once conjoined with the attachment direction and a distance bucket (1, 2, 3, 4, 5, 6-10,
> 10), plus the direction-distance feature itself and the in-between UPOS ``hp bp mp`` (with direction) for every
UPOS ``bp`` occurring strictly between ``h`` and ``m`` (one slot per tag, unused when the tag is absent).

Extraction is vectorised with NumPy over all arcs of many sentences at once.  Token attributes are hashed to
64-bit integers (a deterministic BLAKE2 hash of the string, so ids are the same in every process).  Every
template splits into a head half and a modifier half, each hashed once per *token*; the id of an arc is
``(head_half[h] + mod_half[m] (+ offset[template, direction-distance])) mod 2^bits``, so the per-arc work is two
gathers and an addition per template (sums of independent uniform hashes are uniform, and two arcs collide only
with probability ``2^-bits`` as for a direct hash).  A sentence of ``N`` words yields an int32 array
``[N, N+1, K]``: row ``m-1``, column ``h``, the ``K`` feature ids of arc ``h -> m`` (modifier-major, the layout
of the dependency oracles' node potentials), so all arc scores are ``w[ids].sum(-1)``.  Unused slots (absent
in-between tags, self-arcs) hold ``2^bits``, a padding weight pinned to zero.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

import numpy as np

from .._checks import check_bool, check_int
from ..data.conllu import Sentence

__all__ = ["UPOS_TAGS", "ArcFeatures"]

UPOS_TAGS = ("ADJ", "ADP", "ADV", "AUX", "CCONJ", "DET", "INTJ", "NOUN", "NUM", "PART", "PRON", "PROPN", "PUNCT",
             "SCONJ", "SYM", "VERB", "X")
"""The 17 universal POS tags; any other tag counts as ``X`` for the in-between features."""

_TAG_INDEX = {t: i for i, t in enumerate(UPOS_TAGS)}
_MASK64 = (1 << 64) - 1
_P1 = np.uint64(0x9E3779B97F4A7C15)
_P2 = np.uint64(0xBF58476D1CE4E5B9)
_P3 = np.uint64(0x94D049BB133111EB)

# templates over the attributes hw hp mw mp hl ml and the context tags hp-1 (hq), hp+1 (hn), mp-1 (mq), mp+1 (mn)
_TEMPLATES: tuple[tuple[str, ...], ...] = (
    ("hw", "hp"), ("hw",), ("hp",), ("mw", "mp"), ("mw",), ("mp",),
    ("hl",), ("ml",), ("hl", "ml"), ("hl", "mp"), ("hp", "ml"),
    ("hw", "hp", "mw", "mp"), ("hp", "mw", "mp"), ("hw", "mw", "mp"), ("hw", "hp", "mp"), ("hw", "hp", "mw"),
    ("hw", "mw"), ("hp", "mp"),
    ("hp", "hn", "mq", "mp"), ("hq", "hp", "mq", "mp"), ("hp", "hn", "mp", "mn"), ("hq", "hp", "mp", "mn"),
)
# with ``context=True`` (the default): three-tag back-offs of the surrounding templates and the neighbouring words
# hqw = hw-1, hnw = hw+1, mqw = mw-1, mnw = mw+1 with both UPOS
_CONTEXT_TEMPLATES: tuple[tuple[str, ...], ...] = (
    ("hp", "hq", "mp"), ("hp", "hn", "mp"), ("hp", "mq", "mp"), ("hp", "mn", "mp"),
    ("hp", "hqw", "mp"), ("hp", "hnw", "mp"), ("hp", "mqw", "mp"), ("hp", "mnw", "mp"),
)
# with ``xpos=True``: the same kind of templates over the language-specific tags (the Penn Treebank tags of
# McDonald et al. in English treebanks): hx, mx and their neighbours hxq = hx-1, hxn = hx+1, mxq, mxn
_XPOS_TEMPLATES: tuple[tuple[str, ...], ...] = (
    ("hx",), ("mx",), ("hw", "hx"), ("mw", "mx"), ("hx", "mx"), ("hx", "mw", "mx"), ("hw", "hx", "mx"),
    ("hx", "hxn", "mxq", "mx"), ("hxq", "hx", "mxq", "mx"), ("hx", "hxn", "mx", "mxn"), ("hxq", "hx", "mx", "mxn"),
)


_RESERVED = frozenset({"<root>", "<s>", "</s>", "<none>"})


def _literal(value: str) -> str:
    """A word's attribute as hashed: the strings that stand for the root token and the sentence's ends are moved
    out of the way (a tab, which no CoNLL-U field holds, in front), so a word written ``<root>`` is not the root."""
    return "\t" + value if value in _RESERVED else value


def _hash_string(s: str) -> int:
    return int.from_bytes(hashlib.blake2b(s.encode("utf-8"), digest_size=8).digest(), "little")


class _Hasher:
    """Memoised deterministic 64-bit string hashes."""

    def __init__(self) -> None:
        self.cache: dict[str, int] = {}

    def __call__(self, values: Sequence[str]) -> np.ndarray:
        cache = self.cache
        out = np.empty(len(values), dtype=np.uint64)
        for i, v in enumerate(values):
            h = cache.get(v)
            if h is None:
                h = cache[v] = _hash_string(v)
            out[i] = h
        return out


def _sentences(sentences: object, name: str = "sentences") -> list[Sentence]:
    """``sentences`` as a list, which must hold :class:`~betheproj.data.conllu.Sentence` objects only (a
    ``TypeError`` naming ``name`` otherwise: one sentence or a string given for a list, say)."""
    if isinstance(sentences, Sentence | str) or not isinstance(sentences, Iterable):
        raise TypeError(f"{name} must be a list of Sentence (from read_conllu or parse_conllu), got "
                        f"{type(sentences).__name__}")
    out = list(sentences)
    for i, s in enumerate(out):
        if not isinstance(s, Sentence):
            raise TypeError(f"{name}[{i}] must be a Sentence (from read_conllu or parse_conllu), got "
                            f"{type(s).__name__}")
    return out


def _mix(seed: int, parts: Sequence[np.ndarray]) -> np.ndarray:
    """A 64-bit hash of the tuple ``(seed, *parts)``, elementwise (uint64 arithmetic wraps around)."""
    h = np.full(np.shape(parts[0]), np.uint64(seed & _MASK64), dtype=np.uint64)
    for a in parts:
        h ^= a.astype(np.uint64, copy=False)
        h *= _P1
        h ^= h >> np.uint64(31)
    h *= _P2
    h ^= h >> np.uint64(29)
    h *= _P3
    h ^= h >> np.uint64(32)
    return h


_BUCKET = np.array([0, 1, 2, 3, 4, 5, 6, 6, 6, 6, 6, 7], dtype=np.int64)    # distance 1..5, 6-10, > 10


class ArcFeatures:
    """Hashed McDonald-style arc features; see the module docstring.  ``bits``: the weight vector has ``2^bits``
    entries (plus the padding slot); ``lowercase``: lower-case word forms; ``xpos``: add templates over XPOS;
    ``context``: add the context templates (models saved before they existed load with ``context=False``)."""

    def __init__(self, bits: int = 22, lowercase: bool = True, xpos: bool = False, context: bool = True):
        self.bits = check_int("bits", bits, 8, 30)
        self.lowercase = check_bool("lowercase", lowercase)
        self.xpos = check_bool("xpos", xpos)
        self.context = check_bool("context", context)
        self.templates = (_TEMPLATES + (_CONTEXT_TEMPLATES if self.context else ())
                          + (_XPOS_TEMPLATES if self.xpos else ()))
        self._hash = _Hasher()
        self._seeds = [_hash_string("tpl:" + "+".join(t)) for t in self.templates]
        self._seed_between = _hash_string("tpl:hp+bp+mp+dir")
        mask = np.uint64((1 << bits) - 1)
        dd = np.arange(16, dtype=np.uint64)
        # per (direction-distance, template) offsets; row dd of _dd_parts is added to a template's id
        self._dd_parts = np.stack([_mix(s, [dd + np.uint64(1)]) & mask for s in self._seeds], 1).astype(np.uint32)
        self._dd_alone = (_mix(_hash_string("tpl:dir+dist"), [dd]) & mask).astype(np.uint32)
        tags = self._hash([f"bp:{t}" for t in UPOS_TAGS])
        self._tag_parts = (_mix(self._seed_between, [tags]) & mask).astype(np.uint32)
        self._right = np.uint32(_hash_string("dir:right") & ((1 << bits) - 1))

    @property
    def num_features(self) -> int:
        """``2^bits``; also the id of the unused (padding) slot."""
        return 1 << self.bits

    @property
    def num_slots(self) -> int:
        """``K``: feature ids per arc."""
        return 2 * len(self.templates) + 1 + len(UPOS_TAGS)

    def config(self) -> dict[str, int | bool]:
        return {"bits": self.bits, "lowercase": self.lowercase, "xpos": self.xpos, "context": self.context}

    def __call__(self, sentence: Sentence) -> np.ndarray:
        """Feature ids [N, N+1, K] (int32) of one sentence."""
        if not isinstance(sentence, Sentence):
            raise TypeError(f"sentence must be a Sentence (from read_conllu or parse_conllu), got "
                            f"{type(sentence).__name__}")
        return self.batch([sentence])[0]

    def batch(self, sentences: Sequence[Sentence], chunk_arcs: int = 2_000_000) -> list[np.ndarray]:
        """Feature ids of every sentence, extracted in vectorised chunks of about ``chunk_arcs`` arcs."""
        sentences = _sentences(sentences)
        out: list[np.ndarray] = []
        start = 0
        while start < len(sentences):
            stop, arcs = start, 0
            while stop < len(sentences) and (stop == start or arcs < chunk_arcs):
                n = len(sentences[stop])
                arcs += n * (n + 1)
                stop += 1
            ids, sent, mod, head = self._flat(sentences[start:stop])
            bounds = np.concatenate([[0], np.cumsum(np.bincount(sent, minlength=stop - start))])
            for i in range(stop - start):
                n = len(sentences[start + i])
                out.append(ids[bounds[i]:bounds[i + 1]].reshape(n, n + 1, -1))
            start = stop
        return out

    def _tokens(self, sentences: Sequence[Sentence]) -> dict[str, np.ndarray]:
        """Per-token hashed attributes of the concatenated sentences, each with a root token in front."""
        forms: list[str] = []
        lemmas: list[str] = []
        tags: list[str] = []
        xtags: list[str] = []
        for s in sentences:
            if not len(s):
                raise ValueError("a sentence has no words")
            forms.append("<root>")
            lemmas.append("<root>")
            tags.append("<root>")
            xtags.append("<root>")
            for w in s.words:
                forms.append(_literal(w[1].lower() if self.lowercase else w[1]))
                lemmas.append(_literal(w[2]))
                tags.append(_literal(w[3]))
                xtags.append(_literal(w[4]))
        lengths = np.array([len(s) + 1 for s in sentences], dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        hp = self._hash(tags)
        first = np.zeros(len(tags), dtype=bool)
        first[starts] = True
        last = np.zeros(len(tags), dtype=bool)
        last[starts + lengths - 1] = True
        bos, eos = self._hash(["<s>", "</s>"])

        def neighbours(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            """The attribute of the previous and of the next token (``<s>`` / ``</s>`` at a sentence's ends)."""
            return np.where(first, bos, np.roll(a, 1)), np.where(last, eos, np.roll(a, -1))

        prev, nxt = neighbours(hp)
        tag_ix = np.array([_TAG_INDEX.get(t, _TAG_INDEX["X"]) for t in tags], dtype=np.int64)
        tag_ix[starts] = -1                                         # the root is no in-between word
        # prefix[i] = tag counts of tokens < i, in the smallest unsigned type that holds every count between two
        # words of one sentence: the wrap-around of the global cumulative sum cancels in the differences
        longest = int(lengths.max())
        count = np.uint8 if longest < 256 else np.uint16 if longest < 65536 else np.int64
        onehot = np.zeros((len(tags) + 1, len(UPOS_TAGS)), dtype=count)
        valid = tag_ix >= 0
        onehot[1:][np.nonzero(valid)[0], tag_ix[valid]] = 1
        prefix = np.cumsum(onehot, axis=0, dtype=count)
        out = {"w": self._hash(forms), "l": self._hash(lemmas), "p": hp, "q": prev, "n": nxt,
               "prefix": prefix, "lengths": lengths, "starts": starts}
        if self.context:
            out["qw"], out["nw"] = neighbours(out["w"])
        if self.xpos:
            out["x"] = self._hash(["x:" + t for t in xtags])
            out["xq"], out["xn"] = neighbours(out["x"])
        return out

    def flat(self, sentences: Sequence[Sentence]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """All arcs of the sentences at once: ids [A, K] (int32), and per arc its sentence, modifier ``m``
        (1..n) and head ``h`` (0..n) [A] (int64); arcs are ordered by sentence, then ``m``, then ``h``."""
        return self._flat(_sentences(sentences))

    def _flat(self, sentences: list[Sentence]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`flat` of sentences already checked (:meth:`batch`'s chunks)."""
        tok = self._tokens(sentences)
        n_words = tok["lengths"] - 1
        per = n_words * (n_words + 1)                               # arcs per sentence
        total = int(per.sum())
        sent = np.repeat(np.arange(len(sentences)), per)
        offset = np.concatenate([[0], np.cumsum(per)[:-1]])
        j = np.arange(total, dtype=np.int64) - offset[sent]
        width = n_words[sent] + 1
        m_loc = j // width + 1
        h_loc = j % width
        base = tok["starts"][sent]
        hg, mg = base + h_loc, base + m_loc                         # global token indices
        right = h_loc < m_loc
        dd = (right.astype(np.int64) << 3) | _BUCKET[np.minimum(np.abs(h_loc - m_loc), 11)]
        mask = np.uint64((1 << self.bits) - 1)
        # token-level halves of every template: id = (head_part[h] + mod_part[m] (+ dd_part[dd])) mod 2^bits
        head, mod = self._halves(tok, mask)                          # [T, n_tpl] uint32 each
        tpl = head[hg]
        tpl += mod[mg]                                               # uint32 arithmetic wraps: mod 2^32
        k, n_tpl = self.num_slots, len(self.templates)
        ids = np.empty((total, k), dtype=np.int32)
        m32 = np.uint32(mask)
        np.bitwise_and(tpl, m32, out=ids[:, :n_tpl], casting="unsafe")
        tpl += self._dd_parts[dd]
        np.bitwise_and(tpl, m32, out=ids[:, n_tpl:2 * n_tpl], casting="unsafe")
        col = 2 * n_tpl
        ids[:, col] = self._dd_alone[dd]
        col += 1
        lo, hi = np.minimum(hg, mg), np.maximum(hg, mg)
        between = (tok["prefix"][hi] - tok["prefix"][lo + 1]) != 0  # [A, T]: tag present strictly between
        bhead, bmod = self._between_halves(tok, mask)
        pair = bhead[hg] + bmod[mg] + np.where(right, self._right, np.uint32(0))
        pad = np.int32(self.num_features)
        tags = (pair[:, None] + self._tag_parts[None, :]) & m32
        ids[:, col:] = np.where(between, tags, pad)
        ids[h_loc == m_loc] = pad
        return ids, sent, m_loc, h_loc

    def _halves(self, tok: dict[str, np.ndarray], mask: np.uint64) -> tuple[np.ndarray, np.ndarray]:
        t = len(tok["w"])
        head = np.zeros((t, len(self.templates)), dtype=np.uint32)
        mod = np.zeros((t, len(self.templates)), dtype=np.uint32)
        for i, (seed, tpl) in enumerate(zip(self._seeds, self.templates, strict=True)):
            hs = [tok[a[1:]] for a in tpl if a[0] == "h"]
            ms = [tok[a[1:]] for a in tpl if a[0] == "m"]
            if hs:
                head[:, i] = _mix(seed, hs) & mask
            if ms:
                mod[:, i] = _mix(seed ^ 0x5BD1E995, ms) & mask
        return head, mod

    def _between_halves(self, tok: dict[str, np.ndarray], mask: np.uint64) -> tuple[np.ndarray, np.ndarray]:
        return ((_mix(self._seed_between, [tok["p"]]) & mask).astype(np.uint32),
                (_mix(self._seed_between ^ 0x5BD1E995, [tok["p"]]) & mask).astype(np.uint32))
