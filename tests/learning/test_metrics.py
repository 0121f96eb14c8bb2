"""Segment F1 against hand-counted cases."""

import numpy as np
import pytest

from betheproj.learning.metrics import segment_f1


def test_hand_counted_case():
    gold = [["B-a", "I-a", "O", "B-b"], ["B-b", "I-b", "B-a"]]
    pred = [["B-a", "I-a", "O", "B-a"], ["B-b", "O", "B-a"]]
    # gold segments: a(0,2) b(3,4) | b(0,2) a(2,3) = 4; predicted: a(0,2) a(3,4) | b(0,1) a(2,3) = 4; correct: 2
    s = segment_f1(gold, pred)
    assert (s.precision, s.recall, s.f1) == (0.5, 0.5, 0.5)
    assert s.per_field["a"] == pytest.approx((2 / 3, 1.0, 0.8, 2))
    assert s.per_field["b"] == (0.0, 0.0, 0.0, 2)


def test_boundaries_and_stray_inside_tags():
    # an I- without its B- starts a segment (conlleval); a longer or shorter span is wrong
    s = segment_f1([["I-a", "I-a", "B-a"]], [["B-a", "I-a", "B-a"]])
    assert s.f1 == 1.0
    s = segment_f1([["B-a", "I-a", "I-a"]], [["B-a", "I-a", "O"]])
    assert (s.precision, s.recall) == (0.0, 0.0)


def test_perfect_and_empty():
    assert segment_f1([["B-x", "O"]], [["B-x", "O"]]).f1 == 1.0
    s = segment_f1([["O"]], [["O"]])
    assert (s.precision, s.recall, s.f1, s.per_field) == (0.0, 0.0, 0.0, {})


def test_bad_arguments():
    with pytest.raises(ValueError, match="as many sequences"):
        segment_f1([["O"]], [])
    with pytest.raises(ValueError, match="sequence 0"):
        segment_f1([["O", "O"]], [["O"]])


def test_a_flat_sequence_of_strings_is_refused():
    # one flat sequence used to be read as sequences of characters: F1 = 1.0 for different types
    with pytest.raises(TypeError, match="gold must be a sequence of label sequences"):
        segment_f1(["B-a", "O"], ["B-b", "O"])
    with pytest.raises(TypeError, match="predicted must be a sequence of label sequences"):
        segment_f1([["B-a", "O"]], ["BO"])
    with pytest.raises(TypeError, match="gold"):
        segment_f1("B-a", "B-a")
    with pytest.raises(TypeError, match="gold"):
        segment_f1((s for s in [["B-a"]]), [["B-a"]])
    with pytest.raises(TypeError, match="gold must be a sequence of label sequences"):   # was: len() of an iterator
        segment_f1([iter(["O"])], [["O"]])
    assert segment_f1((("B-a",),), (("B-a",),)).f1 == 1.0          # tuples are fine
    assert segment_f1([np.array(["B-a", "O"])], [np.array(["B-a", "O"])]).f1 == 1.0   # and NumPy arrays


def test_labels_that_are_not_bio_are_refused():
    # a bare tag used to become a segment of type ''
    with pytest.raises(ValueError, match="'author' is not a BIO label"):
        segment_f1([["author", "author"]], [["author", "O"]])
    with pytest.raises(ValueError, match=r"^predicted\[1\]: labels\[0\] = 'X-a'"):
        segment_f1([["O"], ["O"]], [["O"], ["X-a"]])
    s = segment_f1([["B-book-title", "I-book-title"]], [["B-book-title", "I-book-title"]])
    assert s.per_field == {"book-title": (1.0, 1.0, 1.0, 1)}


def test_a_2d_array_of_labels_scores_as_its_rows():
    # was refused as "not a string, a sequence of strings or an iterator" (an ndarray is not a Sequence)
    import numpy as np

    gold = np.array([["B-a", "I-a", "O"], ["B-b", "O", "B-a"]])
    pred = np.array([["B-a", "I-a", "O"], ["B-b", "B-b", "B-a"]])
    assert segment_f1(gold, pred) == segment_f1(gold.tolist(), pred.tolist())
    assert segment_f1(gold, pred).f1 == pytest.approx(2 * 0.75 * 1.0 / 1.75)
    with pytest.raises(TypeError, match="got int"):
        segment_f1(3, [["O"]])


def test_segment_counts_per_sequence_sum_to_segment_f1():
    from betheproj.learning.metrics import segment_counts

    gold = [["B-a", "I-a", "O", "B-b"], ["B-b", "I-b", "B-a"], ["O"]]
    pred = [["B-a", "I-a", "O", "B-a"], ["B-b", "O", "B-a"], ["B-c"]]
    counts = segment_counts(gold, pred)
    # hand-counted: (correct, predicted, gold) per sequence
    assert counts.tolist() == [[1, 2, 2], [1, 2, 2], [0, 1, 0]] and counts.dtype == np.int64
    tp, n_pred, n_gold = counts.sum(0)
    assert 2 * tp / (n_pred + n_gold) == pytest.approx(segment_f1(gold, pred).f1)
    with pytest.raises(ValueError, match="sequence 1: gold has 3 labels, predicted 2"):
        segment_counts(gold, [pred[0], ["O", "O"], pred[2]])
    with pytest.raises(TypeError, match="gold must be a sequence of label sequences"):
        segment_counts(["B-a"], [["B-a"]])
    with pytest.raises(ValueError, match=r"predicted\[0\]: "):
        segment_counts([["O"]], [["X-a"]])
    assert segment_counts([], []).shape == (0, 3)
