"""CoNLL-U reader and writer (Universal Dependencies format, https://universaldependencies.org/format.html).

A sentence is a block of lines ended by a blank line: ``#`` comments, then one line per word with 10 tab-separated
columns ``ID FORM LEMMA UPOS XPOS FEATS HEAD DEPREL DEPS MISC``.  Multi-word token lines (ID ``1-2``) and empty
nodes of the enhanced graph (ID ``8.1``) are not words of the basic tree: they are skipped for parsing but kept,
in place, so that writing a sentence back reproduces the input (with the predicted ``HEAD`` when one is given).
Files may be gzip-compressed (``.gz``) and may start with a UTF-8 byte-order mark.
"""

from __future__ import annotations

import gzip
import io
import re
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import numpy as np

from .._files import write_atomically

__all__ = ["Sentence", "parse_conllu", "read_conllu", "load_conllu", "format_conllu", "write_conllu", "head_cycle"]

_COLUMNS = 10
_HEAD = re.compile(r"[0-9]+")            # ASCII digits only: str.isdigit() also accepts '²' and '١'
ID, FORM, LEMMA, UPOS, XPOS, FEATS, HEAD, DEPREL, DEPS, MISC = range(_COLUMNS)


def _number(digits: str) -> int:
    """A string of ASCII digits (an ID or a HEAD) as an int; past 18 digits, leading zeros aside, as 10**18, larger
    than any sentence (``int`` refuses strings of over 4300 digits, in words that name no file and line)."""
    digits = digits.lstrip("0") or "0"
    return int(digits) if len(digits) <= 18 else 10 ** 18


@dataclass
class Sentence:
    """One sentence: its comment lines (without the newline), the 10 columns of each word (``words[i]`` is word
    ``i + 1``) and the multi-word token / empty node lines as ``(k, columns)``: written just before word ``k + 1``
    (``k = len(words)``: after the last word)."""

    comments: list[str] = field(default_factory=list)
    words: list[list[str]] = field(default_factory=list)
    extra: list[tuple[int, list[str]]] = field(default_factory=list)
    line: int = field(default=0, compare=False)
    """Line of the sentence's first line in the file it was read from (0: unknown)."""

    def __len__(self) -> int:
        return len(self.words)

    def _column(self, j: int) -> list[str]:
        return [w[j] for w in self.words]

    @property
    def forms(self) -> list[str]:
        return self._column(FORM)

    @property
    def lemmas(self) -> list[str]:
        return self._column(LEMMA)

    @property
    def upos(self) -> list[str]:
        return self._column(UPOS)

    @property
    def xpos(self) -> list[str]:
        return self._column(XPOS)

    @property
    def deprels(self) -> list[str]:
        return self._column(DEPREL)

    @property
    def heads(self) -> np.ndarray:
        """HEAD of every word [N] (int64; 0 = root, -1 where the column is ``_``)."""
        return np.array([-1 if w[HEAD] == "_" else _number(w[HEAD]) for w in self.words], dtype=np.int64)

    @property
    def text(self) -> str:
        """The ``# text = ...`` comment, or the forms joined by spaces."""
        for c in self.comments:
            if c.startswith("# text = "):
                return c[len("# text = "):]
        return " ".join(self.forms)

    def with_heads(self, heads: Sequence[int] | np.ndarray) -> Sentence:
        """A copy with the HEAD column replaced (every other column kept)."""
        heads = np.asarray(heads)
        if heads.size and heads.dtype.kind not in "iu":
            raise TypeError(f"heads must be integers, got {heads.dtype}")
        if heads.shape != (len(self.words),):
            raise ValueError(f"heads must have shape ({len(self.words)},), got {heads.shape}")
        if len(heads) and (heads.min() < 0 or heads.max() > len(self.words)):
            raise ValueError(f"heads must lie in [0, {len(self.words)}]")
        cycle = head_cycle(heads)
        if cycle is not None:
            raise ValueError(f"heads must form a tree rooted at 0, but word {cycle[0]} is on a cycle (a word that is "
                             f"its own head or an ancestor of its head)")
        words = [list(w) for w in self.words]
        for w, h in zip(words, heads.tolist(), strict=True):
            w[HEAD] = str(int(h))
        return Sentence(list(self.comments), words, [(k, list(c)) for k, c in self.extra], self.line)


def _head_array(heads: Sequence[int] | np.ndarray, bounded: bool = False) -> np.ndarray:
    """``heads`` (the HEAD of words ``1..n``) as a 1-D int64 array: ``TypeError`` unless integers (a float 1.5
    would be read as 1), ``ValueError`` for another shape and, with ``bounded``, for a head outside ``0..n``."""
    array = np.asarray(heads)
    if array.size and array.dtype.kind not in "iu":
        raise TypeError(f"heads must be integers, got {array.dtype}")
    if array.ndim != 1:
        raise ValueError(f"heads must be one head per word (1-D), got shape {array.shape}")
    n = len(array)
    if bounded and n and (array.min() < 0 or array.max() > n):
        raise ValueError(f"heads must lie in [0, {n}], got {int(array.min() if array.min() < 0 else array.max())}")
    return array.astype(np.int64)


def head_cycle(heads: Sequence[int] | np.ndarray) -> list[int] | None:
    """The words (1-based) of a cycle of ``heads`` (the HEAD of words ``1..n``, each in ``0..n``), in the order a
    walk up the heads meets them, or ``None`` when every word's head chain reaches the root 0 (``TypeError`` /
    ``ValueError`` for heads that are not integers in ``0..n``)."""
    parent = _head_array(heads, bounded=True).tolist()
    n = len(parent)
    state = [0] * (n + 1)                                # 0 unseen, 1 on the current walk, 2 reaches the root
    state[0] = 2
    for start in range(1, n + 1):
        walk, w = [], start
        while state[w] == 0:
            state[w] = 1
            walk.append(w)
            w = parent[w - 1]
        if state[w] == 1:
            return walk[walk.index(w):]
        for v in walk:
            state[v] = 2
    return None


def _lines(source: str | Path | TextIO) -> Iterator[str]:
    if isinstance(source, str | Path):
        path = Path(source)
        opener = gzip.open if path.suffix == ".gz" else open
        try:
            with opener(path, "rt", encoding="utf-8-sig") as f:        # -sig: a byte-order mark is not text
                yield from f
        except (gzip.BadGzipFile, EOFError, zlib.error) as err:
            raise ValueError(f"{path}: not a valid gzip file (expected gzip-compressed CoNLL-U for a .gz name): "
                             f"{err}") from None
    elif hasattr(source, "read"):
        for line in source:
            if not isinstance(line, str):
                raise TypeError(f"source must be a path or a text stream, got a stream of {type(line).__name__} "
                                "(open the file in text mode)")
            yield line
    else:
        raise TypeError(f"source must be a path (str or Path) or a text stream, got {type(source).__name__}")


def _utf8_error(path: Path) -> str:
    """Where the first byte that is not UTF-8 lies in the file (re-read in binary; the error path only).  Of a
    damaged gzip stream, the part that decompresses is searched (the text layer met the bad byte there)."""
    opener = gzip.open if path.suffix == ".gz" else open
    chunks: list[bytes] = []
    damaged = False
    try:
        with opener(path, "rb") as f:
            while chunk := f.read(1 << 16):
                chunks.append(chunk)
    except (gzip.BadGzipFile, EOFError, zlib.error):
        damaged = True
    raw = b"".join(chunks)
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as err:
        if damaged and err.end == len(raw) and err.reason == "unexpected end of data":
            return f"{path}: not UTF-8 text; expected a UTF-8 CoNLL-U file"    # a character cut where reading stopped
        hint = " (it looks gzip-compressed: name it .gz)" if raw[:2] == b"\x1f\x8b" else ""
        line = raw.count(b"\n", 0, err.start) + 1
        return (f"{path}:{line}: not UTF-8 text (byte 0x{raw[err.start]:02x}); expected a UTF-8 CoNLL-U "
                f"file{hint}")
    return f"{path}: not UTF-8 text; expected a UTF-8 CoNLL-U file"


def _read(lines: Iterable[str], name: str) -> list[Sentence]:
    sentences: list[Sentence] = []
    cur = Sentence(line=1)
    start = 1
    word_lines: list[int] = []                                 # the line of each word of the sentence
    extra_lines: list[int] = []                                # ... and of each multi-word token or empty node

    def finish(lineno: int) -> None:
        nonlocal cur
        if cur.words:
            n = len(cur.words)
            for i, (w, at) in enumerate(zip(cur.words, word_lines, strict=True)):
                if w[ID] != str(i + 1):
                    raise ValueError(f"{name}:{at}: word IDs must be 1..{n} in order, got {w[ID]!r} at word {i + 1}")
                if w[HEAD] != "_" and not (_HEAD.fullmatch(w[HEAD]) and _number(w[HEAD]) <= n):
                    raise ValueError(f"{name}:{at}: HEAD of word {i + 1} must be an integer in 0..{n} or '_', "
                                     f"got {w[HEAD]!r}")
            _check_ranges(cur.extra, extra_lines, n, name)
            sentences.append(cur)
        elif cur.comments or cur.extra:
            raise ValueError(f"{name}:{start}: sentence without word lines (line {lineno})")
        cur = Sentence(line=lineno + 1)
        word_lines.clear()
        extra_lines.clear()

    lineno = 0
    for lineno, raw in enumerate(lines, 1):
        line = raw.rstrip("\r\n")
        if lineno == 1:
            line = line.removeprefix("\ufeff")                 # a byte-order mark in a stream or string
        if not line.strip():
            finish(lineno)
            start = lineno + 1
            continue
        if line.startswith("#"):
            if cur.words or cur.extra:
                raise ValueError(f"{name}:{lineno}: comment line inside a sentence")
            cur.comments.append(line)
            continue
        cols = line.split("\t")
        if len(cols) != _COLUMNS:
            raise ValueError(f"{name}:{lineno}: expected {_COLUMNS} tab-separated columns, got {len(cols)}")
        if "-" in cols[ID] or "." in cols[ID]:              # multi-word token or empty node
            _check_extra_id(cols[ID], len(cur.words), f"{name}:{lineno}")
            cur.extra.append((len(cur.words), cols))
            extra_lines.append(lineno)
        else:
            cur.words.append(cols)
            word_lines.append(lineno)
    finish(lineno + 1)
    return sentences


_RANGE = re.compile(r"([0-9]+)-([0-9]+)")                # ASCII digits, as word IDs
_EMPTY = re.compile(r"([0-9]+)\.([0-9]+)")


def _check_ranges(extra: list[tuple[int, list[str]]], lines: list[int], n: int, name: str) -> None:
    """The multi-word tokens of a finished sentence of ``n`` words: each range ends at a word of the sentence and
    starts after the previous range's end (their starts are checked as they are read, by :func:`_check_extra_id`)."""
    end = 0
    for (_, cols), at in zip(extra, lines, strict=True):
        rng = _RANGE.fullmatch(cols[ID])
        if rng is None:
            continue
        a, b = _number(rng[1]), _number(rng[2])
        if b > n:
            raise ValueError(f"{name}:{at}: multi-word token {cols[ID]!r} ends past the sentence's last word ({n})")
        if a <= end:
            raise ValueError(f"{name}:{at}: multi-word token {cols[ID]!r} overlaps the one before it (ending at "
                             f"word {end})")
        end = b


def _check_extra_id(token_id: str, words_before: int, where: str) -> None:
    """A multi-word token ``a-b`` must start at the next word (``a = words_before + 1``) with ``b > a``; an empty
    node ``i.k`` must follow word ``i = words_before`` (``k >= 1``)."""
    rng, empty = _RANGE.fullmatch(token_id), _EMPTY.fullmatch(token_id)
    if rng is not None:
        a, b = _number(rng[1]), _number(rng[2])
        if a != words_before + 1 or b <= a:
            raise ValueError(f"{where}: multi-word token ID {token_id!r} must be a range a-b with b > a starting "
                             f"at the next word ({words_before + 1})")
    elif empty is not None:
        if _number(empty[1]) != words_before or _number(empty[2]) < 1:
            raise ValueError(f"{where}: empty node ID {token_id!r} must be {words_before}.k with k >= 1 (it "
                             f"follows word {words_before})")
    else:
        raise ValueError(f"{where}: ID {token_id!r} is neither a word (an integer), a multi-word token (a-b) nor "
                         f"an empty node (i.k)")


def parse_conllu(text: str, name: str = "<string>") -> list[Sentence]:
    """Sentences of a CoNLL-U string, its lines ended by ``\n``, ``\r\n`` or ``\r`` as in a file read by
    :func:`read_conllu`."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str (CoNLL-U text), got {type(text).__name__}")
    return _read(io.StringIO(text, newline=None), name)          # universal newlines, as open() reads a file


def read_conllu(source: str | Path | TextIO) -> list[Sentence]:
    """Sentences of a ``.conllu`` / ``.conllu.gz`` file (path) or an open text stream."""
    name = str(source) if isinstance(source, str | Path) else getattr(source, "name", "<stream>")
    try:
        return _read(_lines(source), name)
    except UnicodeDecodeError as err:
        if isinstance(source, str | Path):
            raise ValueError(_utf8_error(Path(source))) from None
        raise ValueError(f"{name}: not UTF-8 text ({err}); expected a UTF-8 CoNLL-U stream") from None


def load_conllu(path: str | Path) -> list[Sentence]:
    """:func:`read_conllu`, with a clear error naming the expected file when it is missing."""
    p = Path(path)
    if not p.exists() or p.is_dir():                 # a pipe (bash's <(...)) is read like a file
        found = "a folder" if p.is_dir() else "none"
        raise FileNotFoundError(f"expected a CoNLL-U file (.conllu or .conllu.gz) at {p}, found {found}")
    return read_conllu(p)


def _placed(s: Sentence, number: int) -> list[tuple[int, list[str]]]:
    """The multi-word token / empty node lines of ``s`` (sentence ``number``) in order of position (stable: lines
    of one position keep their order); ``ValueError`` for a position outside ``0..len(s)``."""
    for k, cols in s.extra:
        if isinstance(k, bool) or not isinstance(k, int | np.integer) or not 0 <= k <= len(s.words):
            raise ValueError(f"sentence {number}: the line {cols[ID] if cols else ''!r} has position {k!r}, not in "
                             f"0..{len(s.words)} (it is written before word position + 1)")
    return sorted(s.extra, key=lambda e: int(e[0]))


def _lines_of(s: Sentence, number: int) -> list[str]:
    """The lines of sentence ``number``, checked to read back as they are: ``ValueError`` for a comment that does
    not start with ``#``, a line of other than 10 tab-separated columns or of white space alone (read as a
    sentence break), or either with a line break (``\n`` or ``\r``: the reader's universal newlines)."""
    if not isinstance(s, Sentence):
        raise TypeError(f"sentence {number} must be a Sentence, got {type(s).__name__}")
    for cols in [*s.words, *(cols for _, cols in s.extra)]:
        bad = next((c for c in cols if not isinstance(c, str)), None)
        if bad is not None:
            raise TypeError(f"sentence {number}: the columns of a line must be str, got {type(bad).__name__} "
                            f"{bad!r} in {list(cols)!r}")
    lines = list(s.comments)
    done = 0
    for k, cols in _placed(s, number):
        lines.extend("\t".join(w) for w in s.words[done:k])
        lines.append("\t".join(cols))
        done = k
    lines.extend("\t".join(w) for w in s.words[done:])
    for j, line in enumerate(lines):
        if j < len(s.comments):
            if not line.startswith("#"):
                raise ValueError(f"sentence {number}: the comment {line!r} does not start with '#'")
            if "\n" in line or "\r" in line:
                raise ValueError(f"sentence {number}: the comment {line!r} holds a line break")
        elif line.count("\t") != _COLUMNS - 1 or "\n" in line or "\r" in line or not line.strip():
            raise ValueError(f"sentence {number}: the line {line!r} is not {_COLUMNS} tab-separated columns on one "
                             "line")
    return lines


def format_conllu(sentences: Iterable[Sentence]) -> str:
    """CoNLL-U text: every sentence followed by a blank line, its multi-word token / empty node lines ``(k,
    columns)`` before word ``k + 1``; ``ValueError`` for a ``k`` outside ``0..len(words)`` and for a line that would
    not read back (:func:`_lines_of`)."""
    out: list[str] = []
    for number, s in enumerate(sentences, 1):
        out.extend(_lines_of(s, number))
        out.append("")
    return "\n".join(out) + ("\n" if out else "")


def write_conllu(sentences: Iterable[Sentence], target: str | Path | TextIO,
                 heads: Iterable[Sequence[int] | np.ndarray] | None = None) -> None:
    """Write sentences (with ``heads[i]`` as the HEAD column of sentence ``i`` when given) to a path (gzip when it
    ends in ``.gz``) or a text stream."""
    sentences = list(sentences)
    if heads is not None:
        heads = list(heads)
        if len(heads) != len(sentences):
            raise ValueError(f"got {len(heads)} head arrays for {len(sentences)} sentences")
        sentences = [s.with_heads(h) for s, h in zip(sentences, heads, strict=True)]
    text = format_conllu(sentences)
    if isinstance(target, str | Path):
        path = Path(target)

        def write(name: str) -> None:
            if path.suffix == ".gz":                # no file name in the header (gzip.open would store the part's)
                Path(name).write_bytes(gzip.compress(text.encode("utf-8")))
            else:
                Path(name).write_text(text, encoding="utf-8")

        try:
            write_atomically(path, write)       # a failed write leaves an earlier file at path as it was
        except OSError as err:
            if err.filename is not None:
                raise
            # a failed write or close (a full disk) names no file: name it
            raise OSError(err.errno, err.strerror or str(err), str(path)) from None
    elif isinstance(target, io.BufferedIOBase | io.RawIOBase):      # gzip.open(..., "wb"), sys.stdout.buffer
        raise TypeError(f"target must be a path or a text stream, got a binary stream {type(target).__name__} (open "
                        "the file in text mode)")
    elif callable(getattr(target, "write", None)):
        target.write(text)
    else:
        raise TypeError(f"target must be a path (str or Path) or a text stream, got {type(target).__name__}")
