"""Attachment scores: hand-counted cases, the punctuation convention, and inputs that are refused by name."""

import numpy as np
import pytest

from betheproj.data.conllu import parse_conllu
from betheproj.parsing.metrics import attachment_counts, scorable_words, uas


def _gold():
    text = ("1\tthe\t_\tDET\t_\t_\t2\tdet\t_\t_\n2\tcat\t_\tNOUN\t_\t_\t3\tnsubj\t_\t_\n"
            "3\tsat\t_\tVERB\t_\t_\t0\troot\t_\t_\n4\t.\t_\tPUNCT\t_\t_\t3\tpunct\t_\t_\n\n")
    return parse_conllu(text)


def test_hand_counted_scores():
    gold = _gold()
    predicted = [np.array([2, 3, 0, 2])]                 # every word right but the full stop
    assert attachment_counts(gold, predicted) == (3, 3) and uas(gold, predicted) == 100.0
    assert attachment_counts(gold, predicted, punct=True) == (3, 4) and uas(gold, predicted, punct=True) == 75.0
    assert attachment_counts(gold, [[3, 3, 0, 3]]) == (2, 3) and scorable_words(gold) == 3


def test_bad_inputs_are_named():
    gold = _gold()
    with pytest.raises(TypeError, match="punct must be a bool, got str 'no'"):
        uas(gold, [[2, 3, 0, 3]], punct="no")                   # a non-empty string read as True scored all
    with pytest.raises(TypeError, match="punct must be a bool"):
        scorable_words(gold, punct="no")
    with pytest.raises(ValueError, match=r"predicted heads must be one list of heads per sentence \(1-D\), got "
                                         r"shape \(4, 1\)"):
        uas(gold, [np.array([[2], [3], [0], [3]])])
    with pytest.raises(TypeError, match=r"gold\[0\] must be a Sentence"):
        uas([[2, 3, 0, 3]], [[2, 3, 0, 3]])
    with pytest.raises(TypeError, match="gold must be a list of Sentence, got Sentence"):
        uas(gold[0], [[2, 3, 0, 3]])
    with pytest.raises(TypeError, match="predicted must be a list with one Sentence or list of heads"):
        uas(gold, gold[0])


def test_a_score_over_no_words_is_refused_not_nan():
    only_punct = parse_conllu("1\t.\t_\tPUNCT\t_\t_\t0\troot\t_\t_\n\n")
    with pytest.raises(ValueError, match=r"no words with a gold HEAD to score \(punctuation excluded: punct=True"):
        uas(only_punct, [[0]])
    assert uas(only_punct, [[0]], punct=True) == 100.0


def test_evaluate_refuses_sentences_with_nothing_to_score_before_parsing(monkeypatch):
    from betheproj.parsing import DependencyParser

    parser = DependencyParser(bits=8)

    def no_parsing(*args, **kwargs):
        raise AssertionError("parsed before checking that anything can be scored")

    monkeypatch.setattr(parser, "predict", no_parsing)
    unheaded = parse_conllu("1\tthe\t_\tDET\t_\t_\t_\t_\t_\t_\n2\tcat\t_\tNOUN\t_\t_\t_\t_\t_\t_\n\n")
    with pytest.raises(ValueError, match="gold has no words with a gold HEAD to score"):
        parser.evaluate(unheaded)
