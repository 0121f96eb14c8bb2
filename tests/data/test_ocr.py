"""The OCR loader on ../shared/data/ocr (the counts its SOURCE.md states) and on files that are not it."""

from pathlib import Path

import numpy as np
import pytest
import torch

from betheproj.data import load_ocr

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "ocr"
needs_data = pytest.mark.skipif(not (DATA / "ocr_letters.npz").is_file(), reason="../shared/data/ocr not present")


@needs_data
def test_counts_match_the_source():
    data = load_ocr(DATA)
    assert len(data) == 6877 and int(data.lengths.sum()) == 52152
    assert data.pixels.shape == (6877, 14, 128) and set(data.pixels.unique().tolist()) == {0.0, 1.0}
    assert len(set(data.words)) == 55
    assert torch.bincount(data.folds).tolist() == [626, 704, 684, 698, 693, 651, 739, 717, 690, 675]
    letters = "abcdefghijklmnopqrstuvwxyz"
    for i in (0, 100, 6876):
        assert "".join(letters[j] for j in data.labels[i, : data.lengths[i]].tolist()) == data.words[i]
    assert (data.labels[data.lengths[:, None] <= torch.arange(14)] == -1).all()
    train = data.subset(data.folds != 0)
    assert len(train) == 6877 - 626 and (train.folds != 0).all()


def test_missing_file_names_the_expected_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="ocr_letters.npz"):
        load_ocr(tmp_path)


def test_files_that_are_not_the_archive_are_named(tmp_path):
    text = tmp_path / "text.npz"
    text.write_text("letters, not an archive")
    with pytest.raises(ValueError, match=r"cannot read .*text.npz as a NumPy .npz archive.*ocr_letters.npz"):
        load_ocr(text)
    single = tmp_path / "single.npz"
    with single.open("wb") as f:
        np.save(f, np.zeros(3))
    with pytest.raises(ValueError, match="is a single NumPy array, not the .npz archive ocr_letters.npz"):
        load_ocr(single)
    partial = tmp_path / "partial.npz"
    np.savez(partial, X=np.zeros((2, 128)), y=np.zeros(2))
    with pytest.raises(ValueError, match="lacks the array 'word_id'"):
        load_ocr(partial)
