"""The OCR loader on ../shared/data/ocr (the counts its SOURCE.md states) and on files that are not it."""

import re
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


def _tiny(**changes) -> dict:
    """Two words, 'ab' (fold 0) and 'c' (fold 1), in the layout of ocr_letters.npz, with ``changes`` applied."""
    arrays = {"X": np.eye(3, 4, dtype=np.uint8), "y": np.array([0, 1, 2]), "word_id": np.array([0, 0, 1]),
              "position": np.array([0, 1, 0]), "word": np.array(["ab", "c"]), "word_fold": np.array([0, 1]),
              "word_len": np.array([2, 1])}
    return {**arrays, **changes}


def test_a_consistent_tiny_archive_loads(tmp_path):
    np.savez(tmp_path / "ocr_letters.npz", **_tiny())
    data = load_ocr(tmp_path)
    assert data.words == ["ab", "c"] and data.labels.tolist() == [[0, 1], [2, -1]]
    assert data.pixels.shape == (2, 2, 4) and data.pixels[1, 0].tolist() == [0, 0, 1, 0]
    assert load_ocr(tmp_path, torch.float64).pixels.dtype == torch.float64
    for dtype in (torch.int64, torch.bool, torch.float16, "float32"):           # were loaded: pixels are 0/1 floats
        with pytest.raises(TypeError, match="dtype must be torch.float32 or torch.float64"):
            load_ocr(tmp_path, dtype)


def test_byte_string_words_load_as_text(tmp_path):
    # the loader takes 'word' as bytes (dtype S) as well as str (U); str() of a NumPy bytes is "b'ab'"
    np.savez(tmp_path / "ocr_letters.npz", **_tiny(word=np.array([b"ab", b"c"])))
    assert load_ocr(tmp_path).words == ["ab", "c"]
    np.savez(tmp_path / "bad.npz", **_tiny(word=np.array([b"ab", b"\xff"])))
    with pytest.raises(ValueError, match=r"bad.npz: array 'word' .*UTF-8"):
        load_ocr(tmp_path / "bad.npz")


@pytest.mark.parametrize("changes, match", [
    ({"word_id": np.array([0, 0, 7])}, r"'word_id' must index the 2 words \(0..1\), got values in 0..7"),
    ({"word_len": np.array([1, 1])}, r"'position' must lie inside its word .* letter 1 has position 1 in word 0"),
    ({"position": np.array([0, 0, 0])}, "'position' must give each position of each word exactly once"),
    ({"word_len": np.array([3, 1])}, "'position' must give each position of each word exactly once"),
    ({"X": np.zeros(12, dtype=np.uint8)}, "'X' must be a 2-D numeric array"),
    ({"y": np.array([0, 1, 200])}, r"'y' must hold letters 0..25, got values in 0..200"),
    ({"X": np.full((3, 4), 255, dtype=np.uint8)}, r"'X' must hold binary pixels \(0 or 1\), got 255"),
    ({"X": np.full((3, 4), np.nan)}, r"'X' must hold binary pixels \(0 or 1\), got nan"),
    ({"y": np.array([0.0, 1.0, 2.0])}, "'y' must be a 1-D integer array, got 1-D float64"),
    ({"y": np.array([0, 1])}, r"'y' has 2 entries, expected one per letter \(the 3 rows of 'X'\)"),
    ({"word_fold": np.array([0])}, "'word_fold' has 1 entries, expected one per word"),
    ({"word_fold": np.array([0, 10])}, "'word_fold' must hold folds 0..9"),
    ({k: np.zeros((0,) * (2 if k == "X" else 1), dtype=np.uint8 if k == "X" else np.int64)
      for k in ("X", "y", "word_id", "position", "word_fold", "word_len")} | {"word": np.array([], dtype="<U1")},
     r"'X' is empty"),
])
def test_inconsistent_arrays_are_named(tmp_path, changes, match):
    file = tmp_path / "bad.npz"
    np.savez(file, **_tiny(**changes))
    with pytest.raises(ValueError, match=f"bad.npz: array {match}"):
        load_ocr(file)


@pytest.mark.parametrize("changes, match", [
    ({"word_len": np.array([2**63, 1], dtype=np.uint64)}, r"'word_len' .*got 9223372036854775808 \(word 0\)"),
    ({"word_len": np.array([2, 2**64 - 1], dtype=np.uint64)}, r"'word_len' .*got 18446744073709551615 \(word 1\)"),
    ({"y": np.array([0, 1, 2**63], dtype=np.uint64)}, r"'y' .*got 9223372036854775808 \(letter 2\)"),
    ({"word_len": np.array([2**63 - 1, 1])},
     r"'word_len' must be at most the 3 letters \(rows of 'X'\), got 9223372036854775807 \(word 0\)"),
])
def test_huge_lengths_and_labels_are_named_with_their_value(tmp_path, changes, match):
    """A uint64 'word_len' of 2**63 was reported as 'must be >= 1, got -9223372036854775808' (the cast to int64
    wrapped), and an int64 'word_len' of 2**63 - 1 as '3 letters for -9223372036854775808 positions' (the sum
    wrapped): the value in the file is named, never a wrapped negative one."""
    file = tmp_path / "bad.npz"
    np.savez(file, **_tiny(**changes))
    with pytest.raises(ValueError, match=f"bad.npz: array {match}") as err:
        load_ocr(file)
    assert not re.search(r"-\d", str(err.value).split("bad.npz: ", 1)[1])


@pytest.mark.parametrize("word, match", [
    (["ab", "d"], r"word 1 is 'd' but its letters' labels \('y'\) spell 'c'"),
    (["ba", "c"], r"word 0 is 'ba' but its letters' labels \('y'\) spell 'ab'"),
    (["abc", "c"], r"word 0 is 'abc' but its letters' labels \('y'\) spell 'ab'"),
    (["AB", "c"], r"word 0 is 'AB' but its letters' labels \('y'\) spell 'ab'"),
])
def test_words_that_disagree_with_their_labels_are_named(tmp_path, word, match):
    """A 'word' string that is not the letters its labels spell (SOURCE.md: every word equals its decoded labels;
    a mismatch means a misaligned or damaged file) loaded silently, with words that did not describe the examples."""
    file = tmp_path / "bad.npz"
    np.savez(file, **_tiny(word=np.array(word)))
    with pytest.raises(ValueError, match=f"bad.npz: array 'word' must give each word's letters as its labels spell "
                                         f"them: {match}"):
        load_ocr(file)


def test_a_file_that_is_not_a_zip_archive_says_so(tmp_path):
    import gzip

    file = tmp_path / "letter.data.gz"                       # like ../shared/data/ocr/letter.data.reconstructed.gz
    file.write_bytes(gzip.compress(b"1\ta\t1\t2\t0\t0\n"))
    with pytest.raises(ValueError, match=r"letter.data.gz as a NumPy .npz archive: not a zip file \(it is gzip"):
        load_ocr(file)
    pickled = tmp_path / "pickled.npz"                       # np.load would talk about allow_pickle here
    pickled.write_bytes(b"\x80\x04K\x01.")
    with pytest.raises(ValueError, match=r"pickled.npz as a NumPy .npz archive: not a zip file; is it ocr_letters"):
        load_ocr(pickled)


def test_subset_takes_a_bool_mask_with_one_entry_per_word():
    from betheproj.data.ocr import OCRData
    lengths = torch.tensor([2, 3, 1])
    labels = torch.full((3, 3), -1)
    for i, n in enumerate(lengths.tolist()):
        labels[i, :n] = i
    data = OCRData(torch.zeros(3, 3, 4), labels, lengths, torch.tensor([0, 1, 0]), ["aa", "bbb", "c"])
    sub = data.subset(torch.tensor([False, True, True]))
    assert sub.words == ["bbb", "c"] and sub.pixels.shape == (2, 3, 4)
    with pytest.raises(TypeError, match=r"mask must be a bool tensor \[W\]=\(3,\).*got torch.int64"):
        data.subset(torch.tensor([0, 2]))                 # indices were read as a mask: word 1 only
    with pytest.raises(ValueError, match=r"mask must have shape \[W\]=\(3,\).*got \(2,\)"):
        data.subset(torch.tensor([True, True]))           # a short mask was accepted


def _patched_members(file: Path, flags: int = 0, method: int | None = None, flip_data: bool = False) -> None:
    """Rewrite every zip header of ``file``: OR ``flags`` into its flags, set its compression ``method``; with
    ``flip_data``, invert the first bytes of the first member's compressed data."""
    raw = bytearray(file.read_bytes())
    for sig, flag_at, method_at in ((b"PK\x03\x04", 6, 8), (b"PK\x01\x02", 8, 10)):
        at = raw.find(sig)
        while at >= 0:
            raw[at + flag_at] |= flags
            if method is not None:
                raw[at + method_at:at + method_at + 2] = method.to_bytes(2, "little")
            at = raw.find(sig, at + 4)
    if flip_data:
        import zipfile

        with zipfile.ZipFile(file) as archive:
            first = archive.infolist()[0]
        start = first.header_offset + 30 + int.from_bytes(raw[first.header_offset + 26:first.header_offset + 28],
                                                          "little") \
            + int.from_bytes(raw[first.header_offset + 28:first.header_offset + 30], "little")
        raw[start:start + 4] = bytes(b ^ 0xFF for b in raw[start:start + 4])     # its first block's header
    file.write_bytes(bytes(raw))


@pytest.mark.parametrize("damage", [dict(flags=1), dict(method=99), dict(flip_data=True)],
                         ids=["encrypted", "unknown-method", "damaged-stream"])
def test_archive_members_that_cannot_be_read_are_named(tmp_path, damage):
    # an encrypted member (RuntimeError), a compression method zipfile lacks (NotImplementedError) and a damaged
    # deflate stream (zlib.error) came out of load_ocr as they were, and as a traceback from the CLI
    file = tmp_path / "ocr_letters.npz"
    rng = np.random.default_rng(0)
    np.savez_compressed(file, **_tiny(X=rng.integers(0, 2, (3, 4000), dtype=np.uint8)))
    _patched_members(file, **damage)
    with pytest.raises(ValueError, match=r"cannot read the arrays of .*ocr_letters.npz \(.*\); is it ocr_letters.npz"):
        load_ocr(file)
