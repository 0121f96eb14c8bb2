"""The OCR handwriting data of Taskar et al. (2004): 6,877 words, 16x8 binary letter images, 10 folds."""

from __future__ import annotations

import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from .._checks import check_float_dtype

__all__ = ["OCRData", "load_ocr", "OCR_FILE"]

OCR_FILE = "ocr_letters.npz"


@dataclass
class OCRData:
    """Padded word batches: ``pixels`` [W, N, 128] (0/1 floats), ``labels`` [W, N] (0..25, ``-1`` padding),
    ``lengths`` [W], ``folds`` [W] (0..9) and the ``words`` as strings."""

    pixels: Tensor
    labels: Tensor
    lengths: Tensor
    folds: Tensor
    words: list[str]

    def __len__(self) -> int:
        return len(self.words)

    def subset(self, mask: Tensor) -> OCRData:
        """The words where ``mask`` [W] (a bool tensor, one entry per word) is true, re-padded to their longest
        length."""
        w = len(self.lengths)
        if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
            got = mask.dtype if isinstance(mask, Tensor) else type(mask).__name__
            raise TypeError(f"mask must be a bool tensor [W]=({w},), one entry per word, got {got}")
        if mask.shape != (w,):
            raise ValueError(f"mask must have shape [W]=({w},), one entry per word, got {tuple(mask.shape)}")
        idx = torch.nonzero(mask).flatten()
        n = int(self.lengths[idx].max()) if idx.numel() else 1
        return OCRData(self.pixels[idx, :n], self.labels[idx, :n], self.lengths[idx], self.folds[idx],
                       [self.words[i] for i in idx.tolist()])


def load_ocr(path: str | Path, dtype: torch.dtype = torch.float32) -> OCRData:
    """Load ``ocr_letters.npz`` from ``path`` (the file itself or the folder holding it).

    The arrays are checked to describe padded words consistently (shapes, integer types, ``y`` in 0..25, every
    letter's ``word_id`` and ``position`` inside its word, each position of each word given once, each ``word``
    string the letters its labels spell, ``a`` = 0); a file that is not such an archive is a ``ValueError`` naming
    it (and the array at fault)."""
    check_float_dtype("dtype", dtype)                     # the pixels are 0/1 floats
    path = Path(path)
    file = path / OCR_FILE if path.is_dir() else path
    if not file.is_file():
        raise FileNotFoundError(f"expected the OCR data file {OCR_FILE} at {file}")
    with open(file, "rb") as handle:
        magic = handle.read(6)
    if magic.startswith(b"\x93NUMPY"):
        raise ValueError(f"{file} is a single NumPy array, not the .npz archive {OCR_FILE}")
    if not magic.startswith((b"PK\x03\x04", b"PK\x05\x06")):          # an .npz is a zip archive
        kind = " (it is gzip-compressed)" if magic.startswith(b"\x1f\x8b") else ""
        raise ValueError(f"cannot read {file} as a NumPy .npz archive: not a zip file{kind}; is it {OCR_FILE}?")
    try:
        data = np.load(file)
    except (OSError, EOFError, ValueError, zipfile.BadZipFile) as err:
        raise ValueError(f"cannot read {file} as a NumPy .npz archive ({err}); is it {OCR_FILE}?") from None
    if not isinstance(data, np.lib.npyio.NpzFile):       # pragma: no cover - the magic check above
        raise ValueError(f"{file} is a single NumPy array, not the .npz archive {OCR_FILE}")
    with data:
        for key in ("X", "y", "word_id", "position", "word", "word_fold", "word_len"):
            if key not in data.files:
                raise ValueError(f"{file} lacks the array {key!r}; is it {OCR_FILE}?")
        try:
            arrays = {key: data[key] for key in ("X", "y", "word_id", "position", "word", "word_fold", "word_len")}
        # zlib.error: a damaged deflate stream; NotImplementedError: a compression method zipfile lacks;
        # RuntimeError: an encrypted member
        except (OSError, EOFError, ValueError, zipfile.BadZipFile, zlib.error, NotImplementedError,
                RuntimeError) as err:
            raise ValueError(f"cannot read the arrays of {file} ({err}); is it {OCR_FILE}?") from None
    x, y, word_id, position, words, folds, lengths = _checked(file, arrays)
    n_words, n_max = len(words), int(lengths.max())
    pixels = torch.zeros(n_words, n_max, x.shape[1], dtype=dtype)
    labels = torch.full((n_words, n_max), -1, dtype=torch.long)
    pixels[word_id, position] = torch.from_numpy(x).to(dtype)
    labels[word_id, position] = torch.from_numpy(y)
    _check_words(file, words, labels, lengths)
    return OCRData(pixels, labels, torch.from_numpy(lengths), torch.from_numpy(folds), [str(w) for w in words])


def _check_words(file: Path, words: np.ndarray, labels: Tensor, lengths: np.ndarray) -> None:
    """``ValueError`` naming ``file`` and the first word whose string is not the letters its labels spell (the
    source's words equal their decoded labels; one that does not is a misaligned or damaged file)."""
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    for i, (word, row, n) in enumerate(zip(words.tolist(), labels.numpy(), lengths.tolist(), strict=True)):
        spelled = "".join(letters[row[:n]])
        if word != spelled:
            raise ValueError(f"{file}: array 'word' must give each word's letters as its labels spell them: word {i} "
                             f"is {word!r} but its letters' labels ('y') spell {spelled!r}")


_MEANING = {"y": "letter", "word_id": "word index", "position": "position", "word_fold": "fold",
            "word_len": "word length"}


def _checked(file: Path, arrays: dict[str, np.ndarray]) -> tuple[np.ndarray, ...]:
    """The arrays of ``file`` (integers as int64), or a ``ValueError`` naming the file and the array at fault."""

    def bad(key: str, problem: str) -> ValueError:
        return ValueError(f"{file}: array {key!r} {problem}")

    x = arrays["X"]
    if x.ndim != 2 or x.dtype.kind not in "biuf":
        raise bad("X", f"must be a 2-D numeric array of letter images (letters x pixels), got {x.ndim}-D {x.dtype}")
    if x.shape[0] == 0 or x.shape[1] == 0:
        raise bad("X", f"is empty (shape {x.shape})")
    if not np.isin(x, (0, 1)).all():
        odd = x[~np.isin(x, (0, 1))].flat[0].item()
        raise bad("X", f"must hold binary pixels (0 or 1), got {odd!r}")
    ints = {}
    for key, size in (("y", x.shape[0]), ("word_id", x.shape[0]), ("position", x.shape[0]),
                      ("word_fold", None), ("word_len", None)):
        a = arrays[key]
        if a.ndim != 1 or a.dtype.kind not in "iu":
            raise bad(key, f"must be a 1-D integer array, got {a.ndim}-D {a.dtype}")
        if size is not None and len(a) != size:
            raise bad(key, f"has {len(a)} entries, expected one per letter (the {size} rows of 'X')")
        if a.dtype.kind == "u" and a.size and a.max() > np.iinfo(np.int64).max:    # would wrap to a negative int64
            i = int(np.argmax(a))
            raise bad(key, f"must hold values below 2**63 (no {_MEANING[key]} is that large), got {a[i]} "
                           f"({'letter' if size is not None else 'word'} {i})")
        ints[key] = a.astype(np.int64)
    words = arrays["word"]
    if words.ndim != 1 or words.dtype.kind not in "US":
        raise bad("word", f"must be a 1-D array of strings, got {words.ndim}-D {words.dtype}")
    if len(words) == 0:
        raise bad("word", "is empty")
    if words.dtype.kind == "S":                 # bytes: as text (str() would give "b'word'")
        try:
            words = np.char.decode(words, "utf-8")
        except UnicodeDecodeError as err:
            raise bad("word", f"holds bytes that are not UTF-8 text ({err})") from None
    for key in ("word_fold", "word_len"):
        if len(ints[key]) != len(words):
            raise bad(key, f"has {len(ints[key])} entries, expected one per word (the {len(words)} of 'word')")
    y, word_id, position, folds, lengths = (ints[k] for k in ("y", "word_id", "position", "word_fold", "word_len"))
    if y.min() < 0 or y.max() > 25:
        raise bad("y", f"must hold letters 0..25, got values in {y.min()}..{y.max()}")
    if lengths.min() < 1:
        raise bad("word_len", f"must be >= 1, got {lengths.min()}")
    if lengths.max() > len(y):                  # every letter of a word is a row of X; also keeps the sums in int64
        i = int(np.argmax(lengths))
        raise bad("word_len", f"must be at most the {len(y)} letters (rows of 'X'), got {lengths[i]} (word {i})")
    if folds.min() < 0 or folds.max() > 9:
        raise bad("word_fold", f"must hold folds 0..9, got values in {folds.min()}..{folds.max()}")
    if word_id.min() < 0 or word_id.max() >= len(words):
        raise bad("word_id", f"must index the {len(words)} words (0..{len(words) - 1}), got values in "
                             f"{word_id.min()}..{word_id.max()}")
    outside = (position < 0) | (position >= lengths[word_id])
    if outside.any():
        i = int(np.flatnonzero(outside)[0])
        raise bad("position", f"must lie inside its word (0..word_len - 1): letter {i} has position {position[i]} "
                              f"in word {word_id[i]} of length {lengths[word_id[i]]}")
    if int(lengths.sum()) != len(y) or len(np.unique(word_id * int(lengths.max()) + position)) != len(y):
        raise bad("position", "must give each position of each word exactly once (the 'word_len' letters of every "
                              f"word; {len(y)} letters for {int(lengths.sum())} positions)")
    return x, y, word_id, position, words, folds, lengths
