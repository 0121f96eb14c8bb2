"""Second-order parsing: part features, pruning, learning on a treebank that needs grandparents, storage."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from betheproj.data.conllu import Sentence
from betheproj.parsing import DependencyParser
from betheproj.parsing.part_features import SecondOrderFeatures
from betheproj.parsing.pruning import prune
from betheproj.parsing.second_order import SecondOrderParser

from ._spy import arcs_per_batch

# ----------------------------------------------------------------------------------------------- helpers

def _sentence(forms: list[str], tags: list[str], heads: list[int]) -> Sentence:
    words = [[str(i + 1), f, f, t, t, "_", str(h), "dep", "_", "_"]
             for i, (f, t, h) in enumerate(zip(forms, tags, heads, strict=True))]
    return Sentence(words=words)


# ----------------------------------------------------------------------------------------------- features, pruning

def _grandparent_treebank(copies: int = 12) -> list[Sentence]:
    """``G F H F M F H``: M attaches to the left H under grandparent form ``g1`` and to the right H under ``g2``.
    The two arcs into M look the same to the arc-factored features except for their direction (G's form is
    neither head, modifier, neighbour nor an in-between tag), so only grandparent parts can tell them apart."""
    tags = ["G", "F", "H", "F", "M", "F", "H"]
    out = []
    for g, m_head in (("g1", 3), ("g2", 7)):
        forms = [g, "f", "h", "f", "m", "f", "h"]
        out += [_sentence(forms, tags, [0, 1, 1, 1, m_head, 1, 1]) for _ in range(copies)]
    return out


def test_features_and_pruning():
    sents = _grandparent_treebank(1)
    feats = SecondOrderFeatures(bits=12, context=False)
    tok, starts = feats.tokens(sents)
    assert len(tok["w"]) == 2 * 8 and starts.tolist() == [0, 8]
    a = feats.sibling(tok, starts[[0, 1]], np.array([1, 1]), np.array([3, 3]), np.array([7, 7]))
    b = feats.grandparent(tok, starts[[0, 1]], np.array([1, 1]), np.array([3, 3]), np.array([5, 5]))
    assert a.shape[0] == 2 and a.min() >= 0 and a.max() < 4096
    assert (a[0] != a[1]).sum() == 1                 # the head is G (g1 / g2): only the template with its form
    assert (b[0] != b[1]).sum() == 2                 # the two templates with the grandparent's form
    # the context templates come after the same base ids; the grandparent's form also in ("gw", "mp", "dirs")
    ctx = SecondOrderFeatures(bits=12)
    assert ctx.context and ctx.config()["context"]
    tok_c, _ = ctx.tokens(sents)
    ac = ctx.sibling(tok_c, starts[[0, 1]], np.array([1, 1]), np.array([3, 3]), np.array([7, 7]))
    bc = ctx.grandparent(tok_c, starts[[0, 1]], np.array([1, 1]), np.array([3, 3]), np.array([5, 5]))
    assert (ac[:, : a.shape[1]] == a).all() and (bc[:, : b.shape[1]] == b).all()
    assert ac.shape[1] > a.shape[1] and bc.shape[1] > b.shape[1]
    assert (ac[0] != ac[1]).sum() == 1 and (bc[0] != bc[1]).sum() == 3
    # neighbouring tags: the tag before the first word and after the last is the sentence boundary (a root)
    assert tok_c["q"][1] == tok_c["p"][0] and tok_c["n"][7] == tok_c["p"][8] and tok_c["n"][15] == tok_c["p"][0]
    assert tok_c["q"][2] == tok_c["p"][1] and tok_c["n"][2] == tok_c["p"][3] and tok_c["q"][8] != tok_c["p"][7]
    # a different tag after the earlier sibling m changes exactly the ("hp", "mp", "sp", "mn", "side") id
    other = [_sentence(["g1", "f", "h", "f", "m", "f", "h"], ["G", "F", "H", "X", "M", "F", "H"],
                       [0, 1, 1, 1, 5, 1, 1])]
    tok_o, _ = ctx.tokens(other)
    ao = ctx.sibling(tok_o, np.array([0]), np.array([1]), np.array([3]), np.array([7]))
    assert (ao[0] != ac[0]).sum() == 1
    first = DependencyParser(bits=10)
    first.weights = torch.randn(1025, generator=torch.Generator().manual_seed(0))
    cands = prune(first, first.weights.double(), sents, top_k=2, gold=True)
    assert cands.recall == 1.0
    for i, s in enumerate(sents):
        r = cands.rows(i)
        per_word = np.bincount(cands.mod[r], minlength=len(s))
        assert (per_word >= 1).all() and (per_word <= 2 + 2).all()       # top-2 plus MAP plus gold
    with pytest.raises(ValueError, match="top_k"):
        prune(first, first.weights.double(), sents, top_k=0)


# ----------------------------------------------------------------------------------------------- learning

def test_learning_needs_grandparents_and_fits(tmp_path):
    train = _grandparent_treebank()
    arc = DependencyParser(bits=12)
    arc.fit(train, loss="crf", epochs=5)
    arc_uas = arc.evaluate(train)
    assert arc_uas <= 100 * 13 / 14 + 1e-9            # the arc into M is a coin toss for an arc-factored model
    first = DependencyParser(bits=12)
    first.weights = torch.zeros(first.features.num_features + 1)   # prune nothing: uniform first-order marginals
    parser = SecondOrderParser(first, bits=12, top_k=7, min_prob=0.0)
    parser.fit(train, epochs=12, lr=0.3, lr_first=0.3, train_iter=5, max_batch=8, dev=train[:4], eval_every=10 ** 6)
    assert [s for s, _ in parser.info["dev_history"]] == [parser.info["steps"]]     # the last step is evaluated
    for method in ("mean_field", "loopy_bp"):
        assert parser.evaluate(train, method=method) == 100.0
    assert parser.info["steps"] > 0 and parser.info["train_recall"] == 1.0
    path = tmp_path / "so.pt"
    parser.save(path)
    again = SecondOrderParser.load(path)
    for a, b in zip(again.predict(train[:3], method="loopy_bp"), parser.predict(train[:3], method="loopy_bp"),
                    strict=True):
        assert (a == b).all()
    torch.testing.assert_close(again.w2, parser.w2)
    # a model saved before the context templates (no "context" key) loads without them
    state = torch.load(path, weights_only=False)
    del state["features"]["context"]
    assert not SecondOrderParser.from_state(state).features.context


def test_parser_bad_inputs(tmp_path):
    first = DependencyParser(bits=10)
    with pytest.raises(ValueError, match="not trained"):
        SecondOrderParser(first)
    first.weights = torch.zeros(1025)
    parser = SecondOrderParser(first, bits=10)
    with pytest.raises(ValueError, match="method"):
        parser.predict(_grandparent_treebank(1), method="exact")
    sents = _grandparent_treebank(1)
    other = [_sentence(["a", "b"], ["F", "F"], [0, 1]), sents[1]]          # same number, other lengths
    cands = prune(first, parser.pruner, other, parser.top_k, parser.min_prob)
    with pytest.raises(ValueError, match="candidates do not belong to these sentences"):
        parser.predict(sents, candidates=cands)                  # a bare IndexError before
    with pytest.raises(ValueError, match="no training"):
        parser.fit([])
    for bad, match in (({"lr": -1.0}, "lr must be"), ({"lr": 0.0}, "lr must be"), ({"lr_first": -0.1}, "lr_first"),
                       ({"l2": float("nan")}, "l2"), ({"max_seconds": -1.0}, "max_seconds")):
        with pytest.raises(ValueError, match=match):                # lr -1 trained, ascending the loss
            parser.fit(_grandparent_treebank(1), **bad)
    train = _grandparent_treebank(1)
    for bad, match in (({"dev_method": "bad"}, "dev_method must be one of"),    # raised after a whole epoch
                       ({"dev_iter": -1}, "dev_iter must be"), ({"eval_every": 0}, "eval_every must be"),
                       ({"eval_every": -2}, "eval_every must be"), ({"budget": 0}, "budget must be"),
                       ({"seed": "a"}, "seed must be an int")):
        before = parser.w2.clone()
        with pytest.raises((ValueError, TypeError), match=match):
            parser.fit(train, dev=train, **bad)
        assert torch.equal(parser.w2, before)
    for bad, match in (({"candidates": "x"}, "candidates must be Candidates"), ({"max_batch": 0}, "max_batch"),
                       ({"budget": -1}, "budget"), ({"method": "loopy_bp", "max_iter": 0}, "max_iter must be")):
        with pytest.raises((ValueError, TypeError), match=match):     # loopy BP ran its default 20 for 0
            parser.predict(sents, **bad)
    wider = DependencyParser(bits=12)
    wider.weights = torch.zeros(4097)
    with pytest.raises(ValueError, match=r"candidates were pruned with other first-order features \(bits"):
        parser.predict(sents, candidates=prune(wider, wider.weights, sents))    # ids of other weights: wrong parses
    with pytest.raises(FileNotFoundError, match="expected a second-order parser model .* at .*missing.pt"):
        SecondOrderParser.load(tmp_path / "missing.pt")
    with pytest.raises(ValueError, match="bits"):
        SecondOrderFeatures(bits=3)


def test_zero_decoding_iterations_mean_zero():
    """``max_iter=0`` fell back to the default (``max_iter or 30``): mean field decoded after 30 iterations."""
    first = DependencyParser(bits=10)
    first.weights = torch.randn(1025, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    parser = SecondOrderParser(first, bits=10)
    parser.w2 = torch.randn_like(parser.w2, generator=torch.Generator().manual_seed(1)) * 3.0
    sents = _grandparent_treebank(1)
    zero, thirty = parser.predict(sents, max_iter=0), parser.predict(sents, max_iter=30)
    assert all((z == f).all() for z, f in zip(zero, parser.predict(sents, method="first_order"), strict=True))
    assert [h.tolist() for h in parser.predict(sents)] == [h.tolist() for h in thirty]


def test_prune_bad_inputs():
    """Weights of a model with other feature bits were used silently (a longer vector) or failed with an
    IndexError; a gold HEAD past its sentence read the padding of a longer sentence in the batch."""
    sents = _grandparent_treebank(1)
    first = DependencyParser(bits=8)
    w = torch.randn(257, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    for other in (torch.randn(1025, dtype=torch.float64), w[:100], w[None]):
        with pytest.raises(ValueError, match="w1 must hold the 257 weights"):
            prune(first, other, sents)
    with pytest.raises(TypeError, match="w1"):
        prune(first, w.numpy(), sents)
    with pytest.raises(ValueError, match="w1 must be finite"):
        prune(first, torch.full_like(w, float("nan")), sents)
    with pytest.raises(ValueError, match="batch_size"):
        prune(first, w, sents, batch_size=0)
    with pytest.raises(TypeError, match="gold must be a bool"):       # "yes" was read as True
        prune(first, w, sents, gold="yes")
    with pytest.raises(TypeError, match="sentences must be a list"):
        prune(first, w, sents[0])
    short = _sentence(["g1", "f"], ["G", "F"], [0, 3])          # HEAD 3 of a 2-word sentence
    for gold in (False, True):
        with pytest.raises(ValueError, match=r"sentences\[0\]: gold HEAD 3 is not in 0\.\.2"):
            prune(first, w, [short, *sents], gold=gold)


def test_prune_refuses_a_gold_head_that_is_its_own_word():
    """With ``gold``, a word that is its own gold HEAD was kept as a candidate arc m -> m."""
    sents = _grandparent_treebank(1)
    first = DependencyParser(bits=8)
    w = torch.randn(257, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    loop = _sentence(["g1", "f"], ["G", "F"], [0, 2])               # word 2 heads itself
    with pytest.raises(ValueError, match=r"sentences\[2\]: word 2 is its own gold HEAD"):
        prune(first, w, [*sents, loop], gold=True)
    assert prune(first, w, [*sents, loop]).recall <= 1.0            # scoring it without gold arcs is fine


def test_predict_refuses_options_its_method_does_not_use():
    """damping=5.0 with mean field, max_iter=-5 or decode_on='x' with first_order were ignored silently."""
    first = DependencyParser(bits=10)
    first.weights = torch.zeros(1025)
    parser = SecondOrderParser(first, bits=10)
    sents = _grandparent_treebank(1)
    for method, options, match in (("mean_field", {"damping": 5.0}, "damping applies to method='loopy_bp' only"),
                                   ("mean_field", {"damping_space": "log"},
                                    "damping_space applies to method='loopy_bp' only"),
                                   ("loopy_bp", {"damping_space": "geometric"}, "damping_space must be one of"),
                                   ("first_order", {"max_iter": -5}, "max_iter applies to"),
                                   ("first_order", {"decode_on": "x"}, "decode_on applies to"),
                                   ("mean_field", {"decode_on": "beliefs"}, r"decode_on must be one of \('map', "),
                                   ("loopy_bp", {"max_iter": -1}, "max_iter")):
        with pytest.raises(ValueError, match=match):
            parser.predict(sents, method=method, **options)
    assert len(parser.predict(sents, method="loopy_bp", damping=0.5, decode_on="log_odds", max_iter=3)) == len(sents)
    assert len(parser.predict(sents, method="loopy_bp", damping=0.5, damping_space="log", max_iter=3)) == len(sents)
    # first_order as the dev method: fit passes it no iteration count
    parser.fit(sents, epochs=1, max_batch=8, dev=sents[:2], dev_method="first_order")
    assert parser.info["dev_history"]


def test_evaluate_takes_a_generator_as_predict_does():
    """evaluate() refused a generator with a TypeError naming 'gold', an argument it does not have."""
    train = _grandparent_treebank(1)
    parser = SecondOrderParser(DependencyParser(bits=8).fit(train, epochs=1), bits=8)
    assert parser.evaluate((s for s in train), method="loopy_bp") == parser.evaluate(train, method="loopy_bp")
    with pytest.raises(TypeError, match=r"^sentences must be a list of Sentence .*got str$"):
        parser.evaluate("w1 w2")


def test_prune_extracts_features_for_a_bounded_number_of_arcs_at_once(monkeypatch):
    """prune extracted the features of a whole batch (256 sentences) at once: the 256 longest EWT training
    sentences (1.0M arcs) took 1.6 GB."""
    import betheproj.parsing.pruning as pruning_module

    sents = _grandparent_treebank(4)                  # 8 sentences of 7 words: 56 arcs each
    first = DependencyParser(bits=10)
    first.weights = torch.randn(1025, generator=torch.Generator().manual_seed(0))
    want = prune(first, first.weights.double(), sents, top_k=2)
    arcs = arcs_per_batch(monkeypatch)
    monkeypatch.setattr(pruning_module, "MAX_ARCS", 150, raising=False)
    got = prune(first, first.weights.double(), sents, top_k=2)
    assert arcs == [112] * 4                          # two sentences a batch
    for field in ("offsets", "mod", "head", "ids", "lengths"):
        assert np.array_equal(getattr(got, field), getattr(want, field)), field


def test_zero_dev_iterations_of_loopy_bp_are_refused_before_training(monkeypatch):
    """fit(dev_method="loopy_bp", dev_iter=0) accepted the 0 (mean field's "no iterations"), trained until the first
    dev evaluation and then failed in loopy_bp: "max_iter must be an int >= 1, got 0"."""
    import betheproj.parsing.second_order as second_order_module

    train = _grandparent_treebank(1)
    parser = SecondOrderParser(DependencyParser(bits=8).fit(train, epochs=1), bits=8)
    monkeypatch.setattr(second_order_module, "solve", _no_training)
    with pytest.raises(ValueError, match=r"^dev_iter must be an int >= 1 with dev_method='loopy_bp', got 0$"):
        parser.fit(train, dev=train, dev_method="loopy_bp", dev_iter=0)


def _no_training(*args, **kwargs):
    raise AssertionError("training started although an argument was bad")


@pytest.mark.parametrize(("damping", "error"), [(1.0, ValueError), (-0.5, ValueError), ("0.3", TypeError)])
def test_loopy_bp_damping_is_checked_before_pruning(monkeypatch, damping, error):
    """predict(method="loopy_bp", damping=1.0) pruned every sentence and built the first batch before loopy_bp
    refused the damping."""
    import betheproj.parsing.second_order as second_order_module

    train = _grandparent_treebank(1)
    parser = SecondOrderParser(DependencyParser(bits=8).fit(train, epochs=1), bits=8)
    monkeypatch.setattr(second_order_module, "prune", _no_training)
    with pytest.raises(error, match="^damping must be"):
        parser.predict(train, method="loopy_bp", damping=damping)


def test_zero_loopy_bp_iterations_are_refused_before_pruning(monkeypatch):
    """predict(method="loopy_bp", max_iter=0) accepted the 0 (mean field's "no iterations"), pruned every sentence,
    then loopy_bp refused it: "max_iter must be an int >= 1, got 0"."""
    import betheproj.parsing.second_order as second_order_module

    train = _grandparent_treebank(1)
    parser = SecondOrderParser(DependencyParser(bits=8).fit(train, epochs=1), bits=8)
    monkeypatch.setattr(second_order_module, "prune", _no_training)
    with pytest.raises(ValueError, match=r"^max_iter must be an int >= 1 with method='loopy_bp', got 0$"):
        parser.predict(train, method="loopy_bp", max_iter=0)
