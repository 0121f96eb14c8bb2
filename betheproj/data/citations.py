"""The UMass citation field extraction data (Anzaroot & McCallum, 2013) in its nested-tag format.

One citation a line; tokens are separated by spaces and so, mostly, are the tags (``</thesis><institution>``
also occurs).  Each token gets the path of the tags open around it, e.g. ``authors/person/person-last``;
its label is that path in a BIO encoding (``B-`` where a new tag instance begins, ``O`` outside every tag).
The full path is kept because it is what the paper's "fine-grained" label set means: ``person-last`` under
``authors`` and under ``editor`` are different fields, and the person level separates one author from the
next (a new ``person`` makes a new ``B-`` even when two authors' last names touch).

A tag nested directly in a tag of the same name (``<venue> <venue>``, ``<person> <person>``, a few lines of
the data) counts once in the path.  Malformed lines are repaired as they are read, and each repair is
counted: a closing tag matching a tag further down the stack closes every tag above it; a closing tag
matching no open tag closes the innermost one (the data's mismatched pairs such as
``<person-middle> ... </person-first>``); ``</<name>`` (``C. </<person-first>``, twice in the data) is the
closer ``</name>``; tags left open at the end of a line are closed there.
"""

from __future__ import annotations

import gzip
import re
import warnings
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .._checks import is_bio_label

__all__ = ["Citation", "parse_citation", "read_citations", "load_citations", "tokenize_citation", "escape_tags",
           "is_tag_name", "citation_file", "citation_lines", "check_citations", "SPLITS"]

SPLITS = {"train": "training.docs", "dev": "dev.docs", "test": "testing.docs"}
_REPAIRED_MAX = 0.1        # more citations of a file than this needing repairs: a warning (the data's: 0.6 to 1.4%)
_TAG_NAME = re.compile(r"[A-Za-z][\w.-]*")
_TAG = re.compile(rf"(<(?:/<?)?{_TAG_NAME.pattern}>)")      # </<name>: a malformed closer (two lines of the data)
_QUOTES = "\"\u201c\u201d"
_SPLIT_OFF = ",;:" + _QUOTES
_INITIAL = re.compile(r"[^\W\d_]\.")                   # one letter and its period: "J."
_KEPT_WHOLE = frozenset({"Proc."})      # the data never splits it: 48 of 48 times over the three splits


@dataclass
class Citation:
    """A citation's ``tokens``, each token's tag ``paths`` (tuples, ``()`` outside every tag), the BIO
    ``labels`` over the joined paths, and the number of ``repairs`` its line needed."""

    tokens: list[str]
    paths: list[tuple[str, ...]]
    labels: list[str] = field(default_factory=list)
    repairs: int = 0

    def segments(self) -> list[tuple[str, int, int]]:
        """The labelled spans ``(path, start, end)`` (end exclusive) read off the BIO labels."""
        return bio_segments(self.labels)


def bio_segments(labels: list[str]) -> list[tuple[str, int, int]]:
    """Spans ``(type, start, end)`` of a BIO sequence; an ``I-`` that does not continue its type starts a span.
    Every label must be ``"O"`` or ``"B-type"`` / ``"I-type"`` (a non-empty type); anything else is a ValueError."""
    if isinstance(labels, str):
        raise TypeError(f"labels must be a sequence of labels, got the str {labels!r} (wrap one label in a list)")
    spans: list[tuple[str, int, int]] = []
    kind, start = None, 0
    for i, label in enumerate([*labels, "O"]):
        if not isinstance(label, str):
            raise TypeError(f"labels[{i}] must be a str, got {type(label).__name__} {label!r}")
        if not is_bio_label(label):
            raise ValueError(f"labels[{i}] = {label!r} is not a BIO label: expected 'O', 'B-<type>' or 'I-<type>'")
        tag, _, name = label.partition("-")
        if label == "O" or tag == "B" or name != kind:
            if kind is not None:
                spans.append((kind, start, i))
            kind, start = (None, i) if label == "O" else (name, i)
    return spans


def check_citations(citations: object, empty: bool = True) -> list[Citation]:
    """``citations`` as a list, which must hold :class:`Citation` objects only (TypeError otherwise), each with
    one path and one label per token, and, unless ``empty``, at least one (ValueError)."""
    if isinstance(citations, Citation) or isinstance(citations, str) or not isinstance(citations, Sequence) \
            or not all(isinstance(c, Citation) for c in citations):
        raise TypeError("citations must be a list of Citation (from parse_citation or load_citations)")
    if not empty and not citations:
        raise ValueError("citations must not be empty")
    for i, c in enumerate(citations):
        if not len(c.paths) == len(c.labels) == len(c.tokens):
            raise ValueError(f"citations[{i}] has {len(c.tokens)} tokens but {len(c.paths)} paths and "
                             f"{len(c.labels)} labels: one of each per token")
        _check_strings(c.tokens, f"citations[{i}].tokens", "token")
        _check_strings(c.labels, f"citations[{i}].labels", "label")   # a list label failed as unhashable at encode
    return list(citations)


def _check_strings(values: object, name: str, one: str) -> None:
    """``TypeError`` unless ``values`` is a sequence of str (not one str), naming the first entry that is not."""
    if isinstance(values, str) or not isinstance(values, Sequence):
        raise TypeError(f"{name} must be a sequence of strings (one a {one}), got {type(values).__name__} {values!r}")
    bad = next((i for i, v in enumerate(values) if not isinstance(v, str)), None)
    if bad is not None:
        raise TypeError(f"{name}[{bad}] must be a str, got {type(values[bad]).__name__} {values[bad]!r}")


def parse_citation(line: str) -> Citation:
    """One line of the nested-tag format (see the module docstring for the repairs)."""
    if not isinstance(line, str):
        raise TypeError(f"line must be a str, got {type(line).__name__}")
    stack: list[tuple[str, int]] = []                      # (tag, instance id)
    tokens: list[str] = []
    paths: list[tuple[str, ...]] = []
    labels: list[str] = []
    repairs, instances, previous = 0, 0, None
    for piece in _TAG.split(line):
        if _TAG.fullmatch(piece):
            name = piece.strip("</>")
            repairs += piece.startswith("</<")
            if not piece.startswith("</"):
                instances += 1
                stack.append((name, instances))
                continue
            names = [n for n, _ in stack]
            if name in names:
                depth = len(names) - 1 - names[::-1].index(name)
                repairs += len(stack) - 1 - depth
                del stack[depth:]
            elif stack:
                repairs += 1
                stack.pop()
            else:
                repairs += 1                               # a closing tag with nothing open: ignored
            continue
        path = tuple(n for i, (n, _) in enumerate(stack) if i == 0 or stack[i - 1][0] != n)
        top = len(stack) - 1                               # a run of same-name tags is one segment: the outermost
        while top > 0 and stack[top - 1][0] == stack[top][0]:
            top -= 1
        segment = stack[top][1] if stack else None
        for token in piece.split():
            tokens.append(token)
            paths.append(path)
            if not path:
                labels.append("O")
            else:
                labels.append(("I-" if segment == previous else "B-") + "/".join(path))
            previous = segment
    repairs += len(stack)
    return Citation(tokens, paths, labels, repairs)


def is_tag_name(name: str) -> bool:
    """Whether ``<name>`` reads as a tag in the nested-tag format (an ASCII letter, then letters, digits, ``_.-``)."""
    return bool(_TAG_NAME.fullmatch(name))


def escape_tags(token: str) -> str:
    """``token`` as written in the nested-tag format: if it would read as a tag (``<title>``), with ``&lt;`` and
    ``&gt;`` for its brackets (the data itself has no such tokens, so nothing is unescaped on reading)."""
    return token.replace("<", "&lt;").replace(">", "&gt;") if _TAG.search(token) else token


def tokenize_citation(line: str) -> list[str]:
    """Split a raw citation string the way the data's tokens are split: on spaces, with commas, semicolons,
    colons and quotes split off a word's end (quotes also off its start), and a final period split off
    unless the word is a single letter's initial or ``Proc.``, which the data never splits (``"Jones."`` ->
    ``Jones .``, ``"Amer."`` -> ``Amer .``; ``"J."`` and ``"Proc."`` stay; a final ellipsis is one token).
    Brackets stay attached (``(1991)``, ``[3]``), as in the data.  Of the dev citations, detokenised, 96%
    (632 of 660) come back as their exact tokens; the rest are the data's own inconsistencies (``104:`` and
    ``(1):`` whole in dev, never in training; ``wavelets,"`` beside ``wavelets , "``; ``Sci.`` whole once and
    split 20 times)."""
    if not isinstance(line, str):
        raise TypeError(f"line must be a str, got {type(line).__name__}")
    tokens: list[str] = []
    for word in line.split():
        head: list[str] = []
        while len(word) > 1 and word[0] in _QUOTES:
            head.append(word[0])
            word = word[1:]
        tail: list[str] = []
        while len(word) > 1 and (word[-1] in _SPLIT_OFF or (word[-1] == "." and not _INITIAL.fullmatch(word)
                                                             and word not in _KEPT_WHOLE and word.strip("."))):
            cut = 3 if word.endswith("...") else 1                   # an ellipsis is one token
            tail.append(word[-cut:])
            word = word[:-cut]
        tokens += [*head, word, *reversed(tail)]
    return tokens


def citation_file(path: str | Path) -> Path:
    """``path``, or ``path.gz`` where only the compressed file exists."""
    path = Path(path)
    gz = Path(f"{path}.gz")
    return gz if not path.is_file() and gz.is_file() else path


def citation_lines(path: str | Path) -> list[str]:
    """The non-blank lines of a ``.docs`` file (or its ``.docs.gz``), unparsed.

    ``FileNotFoundError`` if neither exists; ``ValueError`` (naming the file) if it cannot be read as UTF-8
    (gzip) text."""
    path = citation_file(path)
    if not path.is_file():
        raise FileNotFoundError(f"expected the citation file {path.name} (or {path.name}.gz) at {path}")
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8-sig") as handle:        # -sig: a byte-order mark is no token
            lines = [line for line in handle if line.strip()]
    except (OSError, EOFError, UnicodeDecodeError, zlib.error) as err:       # zlib: a corrupt gzip stream
        kind = "gzip-compressed UTF-8 text" if path.suffix == ".gz" else "UTF-8 text"
        raise ValueError(f"cannot read {path} as {kind} ({err})") from None
    return lines


def read_citations(path: str | Path) -> list[Citation]:
    """Every line of a ``.docs`` file (or its ``.docs.gz``) that holds a token; lines of tags alone are skipped.

    ``ValueError`` (naming the file) if it cannot be read as UTF-8 (gzip) text or holds no tag at all, as
    files in another format (e.g. one ``token label`` pair a line) would otherwise read as unlabelled; a
    ``UserWarning`` (naming it) when more than a tenth of its citations needed repairs (tags that do not pair up,
    e.g. openers with attributes, ``<title lang="en">``, which are no tags, beside closers that are)."""
    path = citation_file(path)
    lines = citation_lines(path)
    if lines and not any(_TAG.search(line) for line in lines):
        raise ValueError(f"{path} holds no tags: expected one citation a line in the nested-tag format "
                         "(<authors> <person> ... </person> </authors> <title> ... </title> ...)")
    citations = [c for c in (parse_citation(line) for line in lines) if c.tokens]
    repaired = sum(c.repairs > 0 for c in citations)
    if repaired > _REPAIRED_MAX * len(citations):
        warnings.warn(f"{path}: {repaired} of {len(citations)} citations have tags that do not pair up (unclosed, "
                      f"mismatched or stray closing tags; in the UMass files under 2% do) and were read with the "
                      f"repairs of betheproj.data.citations: is the file in the nested-tag format?", UserWarning,
                      stacklevel=2)
    return citations


def load_citations(folder: str | Path) -> dict[str, list[Citation]]:
    """The three splits from ``folder`` (``training.docs``, ``dev.docs``, ``testing.docs``, optionally
    gzipped): ``{"train": [...], "dev": [...], "test": [...]}``."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"expected a folder holding {', '.join(SPLITS.values())} at {folder}")
    return {split: read_citations(folder / name) for split, name in SPLITS.items()}
