"""The OCR handwriting data of Taskar et al. (2004): 6,877 words, 16x8 binary letter images, 10 folds."""

from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

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
        """The words where ``mask`` [W] is true, re-padded to their longest length."""
        idx = torch.nonzero(mask).flatten()
        n = int(self.lengths[idx].max()) if idx.numel() else 1
        return OCRData(self.pixels[idx, :n], self.labels[idx, :n], self.lengths[idx], self.folds[idx],
                       [self.words[i] for i in idx.tolist()])


def load_ocr(path: str | Path, dtype: torch.dtype = torch.float32) -> OCRData:
    """Load ``ocr_letters.npz`` from ``path`` (the file itself or the folder holding it)."""
    path = Path(path)
    file = path / OCR_FILE if path.is_dir() else path
    if not file.is_file():
        raise FileNotFoundError(f"expected the OCR data file {OCR_FILE} at {file}")
    try:
        data = np.load(file)
    except (OSError, EOFError, ValueError, zipfile.BadZipFile) as err:
        raise ValueError(f"cannot read {file} as a NumPy .npz archive ({err}); is it {OCR_FILE}?") from None
    if not isinstance(data, np.lib.npyio.NpzFile):
        raise ValueError(f"{file} is a single NumPy array, not the .npz archive {OCR_FILE}")
    with data:
        for key in ("X", "y", "word_id", "position", "word", "word_fold", "word_len"):
            if key not in data.files:
                raise ValueError(f"{file} lacks the array {key!r}; is it {OCR_FILE}?")
        try:
            x, y = data["X"], data["y"].astype(np.int64)
            word_id, position = data["word_id"].astype(np.int64), data["position"].astype(np.int64)
            words, folds = data["word"], data["word_fold"].astype(np.int64)
            lengths = data["word_len"].astype(np.int64)
        except (OSError, EOFError, ValueError, zipfile.BadZipFile) as err:
            raise ValueError(f"cannot read the arrays of {file} ({err}); is it {OCR_FILE}?") from None
    n_words, n_max = len(words), int(lengths.max())
    pixels = torch.zeros(n_words, n_max, x.shape[1], dtype=dtype)
    labels = torch.full((n_words, n_max), -1, dtype=torch.long)
    pixels[word_id, position] = torch.from_numpy(x).to(dtype)
    labels[word_id, position] = torch.from_numpy(y)
    return OCRData(pixels, labels, torch.from_numpy(lengths), torch.from_numpy(folds), [str(w) for w in words])
