"""The arc-factored parser: hashed features, learning a tiny synthetic treebank, the ``parse`` CLI round trip."""

import random
import re

import numpy as np
import pytest
import torch

from betheproj.data.conllu import Sentence, format_conllu, load_conllu, parse_conllu
from betheproj.parsing.cli import main
from betheproj.parsing.features import ArcFeatures
from betheproj.parsing.metrics import uas
from betheproj.parsing.parser import DependencyParser

from ._spy import arcs_per_batch

VOCAB = {"DET": ["the", "a", "every"], "ADJ": ["big", "red", "old", "tiny"], "NOUN": ["dog", "cat", "idea", "car"],
         "VERB": ["sees", "likes", "took"], "ADP": ["with", "near", "of"], "PUNCT": ["."]}


def _np(rng, words):
    """Append DET ADJ* NOUN; return the NOUN's position (1-based)."""
    start = len(words)
    n_adj = rng.randint(0, 2)
    noun = start + 2 + n_adj
    words.append(("DET", noun))
    words.extend(("ADJ", noun) for _ in range(n_adj))
    words.append(("NOUN", None))
    return noun


def _sentence(rng):
    words: list = []
    subj = _np(rng, words)
    words.append(("VERB", 0))
    verb = len(words)
    words[subj - 1] = ("NOUN", verb)
    obj = _np(rng, words)
    words[obj - 1] = ("NOUN", verb)
    if rng.random() < 0.5:                                 # a PP attached to the object noun
        words.append(("ADP", None))
        adp = len(words)
        noun = _np(rng, words)
        words[adp - 1] = ("ADP", noun)
        words[noun - 1] = ("NOUN", obj)
    words.append(("PUNCT", verb))
    lines = []
    for i, (tag, head) in enumerate(words, 1):
        form = rng.choice(VOCAB[tag])
        lines.append(f"{i}\t{form}\t{form}\t{tag}\t_\t_\t{head}\t_\t_\t_")
    return "\n".join(lines) + "\n\n"


def _treebank(n, seed=0):
    rng = random.Random(seed)
    return "".join(_sentence(rng) for _ in range(n))


def test_features_are_deterministic_and_in_range():
    sentences = parse_conllu(_treebank(20))
    f = ArcFeatures(bits=16)
    ids = f.batch(sentences)
    again = ArcFeatures(bits=16).batch(sentences, chunk_arcs=50)            # another instance, other chunks
    for s, a, b in zip(sentences, ids, again, strict=True):
        n = len(s)
        assert a.shape == (n, n + 1, f.num_slots) and a.dtype == np.int32
        assert np.array_equal(a, b)
        assert a.min() >= 0 and a.max() <= f.num_features
        assert (a[np.arange(n), np.arange(1, n + 1)] == f.num_features).all()    # self-arcs: all unused
        assert len(np.unique(a)) > n * (n + 1)                               # many distinct features
    single = f(sentences[3])
    assert np.array_equal(single, ids[3])
    flat, sent, mod, head = f.flat(sentences[:2])
    assert len(flat) == sum(len(s) * (len(s) + 1) for s in sentences[:2])
    assert np.array_equal(flat[(sent == 1) & (mod == 2) & (head == 0)][0], ids[1][1, 0])
    with pytest.raises(ValueError, match="bits must be"):
        ArcFeatures(bits=4)
    with_xpos = ArcFeatures(bits=16, xpos=True)
    assert with_xpos.num_slots == f.num_slots + 22
    assert np.array_equal(with_xpos(sentences[0])[..., :30], ids[0][..., :30])    # the UPOS templates are kept
    plain = ArcFeatures(bits=16, context=False)
    assert f.num_slots == plain.num_slots + 16 and not plain.config()["context"]
    assert np.array_equal(plain(sentences[0])[..., :22], ids[0][..., :22])       # the same ids, 8 templates fewer


@pytest.mark.parametrize("single_root", [False, True])
def test_greedy_first_decoding_equals_chu_liu_edmonds(single_root):
    from betheproj.oracles.dependency import arc_potentials
    from betheproj.oracles.nonprojective import NonProjective
    from betheproj.parsing.parser import GreedyFirst

    gen = torch.Generator().manual_seed(0)
    scores = torch.randn(64, 9, 9, generator=gen, dtype=torch.float64)
    scores[:32] += 4 * torch.eye(9, dtype=torch.float64).roll(-1, 0)      # near-chains: greedy is often a tree
    lengths = torch.randint(1, 9, (64,), generator=gen)
    pot = arc_potentials(scores, lengths)
    exact = NonProjective(single_root=single_root)
    fast, slow = GreedyFirst(exact).map(pot), exact.map(pot)

    def total(heads):
        valid = heads >= 0
        return torch.where(valid, pot.node.gather(2, heads.clamp_min(0)[..., None]).squeeze(-1), 0.0).sum(1)

    assert torch.equal(fast < 0, slow < 0)
    assert torch.allclose(total(fast), total(slow))


def test_tiny_synthetic_treebank_is_learned():
    sentences = parse_conllu(_treebank(40))
    for loss in ("crf", "svm"):
        parser = DependencyParser(bits=16)
        assert parser.fit(sentences, loss=loss, epochs=8) is parser
        assert parser.result_.losses[-1] < parser.result_.losses[0]
        assert uas(sentences, parser.predict(sentences), punct=True) == 100.0
    held_out = parse_conllu(_treebank(20, seed=1))
    assert parser.evaluate(held_out) > 90.0
    projective = DependencyParser(bits=16, projective=True, single_root=True)
    projective.fit(sentences, loss="svm", epochs=5)
    heads = projective.predict(sentences, batch_size=7)
    assert all((h == 0).sum() == 1 for h in heads)
    assert uas(sentences, heads) == 100.0


def test_save_load_and_errors(tmp_path):
    sentences = parse_conllu(_treebank(10))
    parser = DependencyParser(bits=12, xpos=True)
    with pytest.raises(ValueError, match="not trained"):
        parser.predict(sentences)
    parser.fit(sentences, loss="softmax_margin", epochs=2)
    parser.save(tmp_path / "m.pt")
    loaded = DependencyParser.load(tmp_path / "m.pt")
    assert torch.equal(loaded.weights, parser.weights) and loaded.config() == parser.config()
    assert loaded.features.xpos and loaded.features.context
    state = torch.load(tmp_path / "m.pt", weights_only=True)
    del state["config"]["context"]                                      # a model saved before the context templates
    torch.save(state, tmp_path / "old.pt")
    assert not DependencyParser.load(tmp_path / "old.pt").features.context
    assert [h.tolist() for h in loaded.predict(sentences)] == [h.tolist() for h in parser.predict(sentences)]
    (tmp_path / "junk.pt").write_bytes(b"not a model")
    with pytest.raises(ValueError, match="not a parser model file"):
        DependencyParser.load(tmp_path / "junk.pt")
    with pytest.raises(FileNotFoundError, match="expected a parser model file"):
        DependencyParser.load(tmp_path / "missing.pt")
    with pytest.raises(ValueError, match="word without a gold HEAD"):
        DependencyParser(bits=12).fit(parse_conllu("1\ta\ta\tX\t_\t_\t_\t_\t_\t_\n"))
    with pytest.raises(ValueError, match="loss must be one of"):
        DependencyParser(bits=12).fit(sentences, loss="hinge")
    with pytest.raises(ValueError, match="no training sentences"):
        DependencyParser(bits=12).fit([])
    with pytest.raises(ValueError, match="batch_size must be an int >= 1"):
        loaded.predict(sentences, batch_size=0)
    assert "trained" in repr(loaded) and "untrained" in repr(DependencyParser(bits=12))
    state = torch.load(tmp_path / "m.pt", weights_only=True)
    torch.save({**state, "version": 99}, tmp_path / "future.pt")
    with pytest.raises(ValueError, match="unsupported model version 99"):
        DependencyParser.load(tmp_path / "future.pt")
    torch.save({**state, "weights": state["weights"][:-1]}, tmp_path / "cut.pt")
    with pytest.raises(ValueError, match="weights do not match bits=12"):
        DependencyParser.load(tmp_path / "cut.pt")
    written = loaded.parse(sentences[:2])
    assert [s.heads.tolist() for s in written] == [h.tolist() for h in loaded.predict(sentences[:2])]
    scores = loaded.arc_scores(sentences[:2])         # [N, N+1]: the tree with the best total is the prediction
    for sc, s, heads in zip(scores, sentences[:2], loaded.predict(sentences[:2]), strict=True):
        assert sc.shape == (len(s), len(s) + 1)
        assert sc[np.arange(len(s)), heads].sum() >= sc[np.arange(len(s)), s.heads].sum() - 1e-4


def test_cli_train_eval_predict_round_trip(tmp_path, capsys):
    train, dev = tmp_path / "train.conllu", tmp_path / "dev.conllu"
    train.write_text(_treebank(40))
    dev.write_text(_treebank(10, seed=2))
    model = tmp_path / "model.pt"
    assert main(["train", "--train", str(train), "--dev", str(dev), "--model", str(model), "--epochs", "6",
                 "--bits", "16", "--loss", "svm", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "trained on 40 sentences" in out and "svm, 6 epochs)" in out and "dev UAS" in out and model.is_file()
    assert main(["train", "--train", str(dev), "--model", str(tmp_path / "one.pt"), "--epochs", "1", "--bits", "12",
                 "--quiet"]) == 0
    assert "(crf, 1 epoch)" in capsys.readouterr().out
    assert main(["eval", "--model", str(model), "--data", str(dev), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("UAS ") and "punctuation excluded" in out
    pred = tmp_path / "pred.conllu"
    assert main(["predict", "--model", str(model), "--input", str(dev), "--output", str(pred), "--quiet"]) == 0
    gold, parsed = load_conllu(dev), load_conllu(pred)
    assert [s.forms for s in parsed] == [s.forms for s in gold]
    assert uas(gold, parsed) > 80.0
    assert format_conllu([Sentence(s.comments, s.words, s.extra).with_heads(g.heads) for s, g in
                          zip(parsed, gold, strict=True)]) == dev.read_text()
    capsys.readouterr()
    assert main(["predict", "--model", str(model), "--input", str(dev), "--quiet"]) == 0
    assert capsys.readouterr().out == pred.read_text()


def test_cli_second_order_train_eval_predict(tmp_path, capsys):
    train, dev = tmp_path / "train.conllu", tmp_path / "dev.conllu"
    train.write_text(_treebank(30))
    dev.write_text(_treebank(8, seed=2))
    first, second = tmp_path / "first.pt", tmp_path / "second.pt"
    assert main(["train", "--train", str(train), "--model", str(first), "--epochs", "3", "--bits", "16",
                 "--quiet"]) == 0
    assert main(["train", "--train", str(train), "--dev", str(dev), "--model", str(second), "--second-order",
                 str(first), "--epochs", "1", "--quiet"]) == 0
    assert "second order, 1 epoch)" in capsys.readouterr().out and second.is_file()
    from betheproj.parsing.cli import _DECODING
    from betheproj.parsing.second_order import SecondOrderParser

    model, dev_sents = SecondOrderParser.load(second), load_conllu(dev)
    for decoder in ("mean_field", "loopy_bp"):
        assert main(["eval", "--model", str(second), "--data", str(dev), "--decoder", decoder, "--quiet"]) == 0
        printed = re.match(r"UAS (\d+\.\d\d) \((\d+)/(\d+), ", capsys.readouterr().out)
        want = model.evaluate(dev_sents, method=decoder, **_DECODING[decoder])
        assert printed and printed[1] == f"{want:.2f}", (printed, want)
        assert 100 * int(printed[2]) / int(printed[3]) == pytest.approx(want)
    pred = tmp_path / "pred.conllu"
    assert main(["predict", "--model", str(second), "--input", str(dev), "--output", str(pred), "--quiet"]) == 0
    assert [s.forms for s in load_conllu(pred)] == [s.forms for s in load_conllu(dev)]
    # an option for the other kind of model was silently ignored
    for command, data in (("eval", "--data"), ("predict", "--input")):
        capsys.readouterr()
        assert main([command, "--model", str(second), data, str(dev), "--batch-size", "8", "--quiet"]) == 2
        assert "--batch-size applies to arc-factored models; " in capsys.readouterr().err
        assert main([command, "--model", str(first), data, str(dev), "--decoder", "loopy_bp", "--quiet"]) == 2
        assert "--decoder applies to second-order models; " in capsys.readouterr().err
    assert main(["eval", "--model", str(first), "--data", str(dev), "--batch-size", "8", "--quiet"]) == 0
    junk = tmp_path / "junk.pt"
    torch.save({"format": "something else"}, junk)
    capsys.readouterr()
    assert main(["eval", "--model", str(junk), "--data", str(dev)]) == 2
    err = capsys.readouterr().err
    assert "junk.pt is not a parser model file (no 'betheproj-dependency-parser' or" in err
    assert "second-order" in err


def test_cli_errors_are_one_line(tmp_path, capsys):
    assert main(["eval", "--model", str(tmp_path / "none.pt"), "--data", str(tmp_path / "x.conllu")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("betheproj parse: error: expected a parser model file")
    (tmp_path / "t.conllu").write_text(_treebank(3))
    assert main(["train", "--train", str(tmp_path / "missing.conllu"), "--model", str(tmp_path / "m.pt")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "expected a CoNLL-U file" in err and "missing.conllu" in err
    assert main(["train", "--train", str(tmp_path / "t.conllu"), "--model", str(tmp_path / "m.pt"),
                 "--epochs", "0"]) == 2
    assert "--epochs must be >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--model", "m.pt"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the following arguments are required: --train" in err


def test_greedy_first_decoding_stays_on_the_input_device(monkeypatch):
    """No GPU in CI: the meta device, which like CUDA refuses to mix with CPU tensors, stands in for it."""
    from types import SimpleNamespace

    from betheproj.oracles.nonprojective import NonProjective
    from betheproj.parsing import parser as parser_module
    from betheproj.parsing.parser import GreedyFirst

    # what map reads of arc potentials (PairwisePotentials validates values, which meta tensors do not have)
    pot = SimpleNamespace(node=torch.zeros(4, 6, 7, device="meta"), lengths=torch.full((4,), 6, device="meta"))
    real_nonzero = torch.nonzero

    def nonzero(x, *args, **kwargs):                 # meta tensors hold no data: say every greedy guess is a tree
        if x.device.type == "meta":
            return torch.empty(0, x.dim(), dtype=torch.long, device="meta")
        return real_nonzero(x, *args, **kwargs)

    monkeypatch.setattr(torch, "nonzero", nonzero)
    monkeypatch.setattr(parser_module, "check_arc_potentials", lambda p: None)   # its checks read values meta lacks
    heads = GreedyFirst(NonProjective()).map(pot)
    assert heads.device.type == "meta" and heads.shape == (4, 6)


def test_switches_must_be_bools():
    """A string such as "no" was read as True (``lowercase`` was not even converted)."""
    from betheproj.parsing.part_features import SecondOrderFeatures

    for make, name in ((lambda v: ArcFeatures(bits=8, lowercase=v), "lowercase"),
                       (lambda v: ArcFeatures(bits=8, xpos=v), "xpos"),
                       (lambda v: ArcFeatures(bits=8, context=v), "context"),
                       (lambda v: DependencyParser(bits=8, projective=v), "projective"),
                       (lambda v: DependencyParser(bits=8, single_root=v), "single_root"),
                       (lambda v: SecondOrderFeatures(bits=8, lowercase=v), "lowercase"),
                       (lambda v: SecondOrderFeatures(bits=8, context=v), "context")):
        with pytest.raises(TypeError, match=f"{name} must be a bool, got str 'no'"):
            make("no")
    assert DependencyParser(bits=8, projective=np.bool_(True)).projective is True


def test_greedy_first_checks_like_its_oracle_names_the_batch_example_and_copies():
    """GreedyFirst ignored a non-zero edge table unless a cycle sent the sentence to the oracle, accepted a
    projective oracle (its greedy trees need not be projective), named the failing example by its place among
    the forwarded ones, and copy/pickle recursed forever through __getattr__."""
    import copy
    import pickle

    from betheproj.oracles import NonProjective, Projective, arc_potentials
    from betheproj.oracles.base import PairwisePotentials
    from betheproj.parsing.parser import GreedyFirst

    greedy = GreedyFirst(NonProjective())
    node = torch.zeros(1, 2, 3)
    node[0, :, 0] = 1.0                                       # both words' best head: the root, a tree
    with pytest.raises(ValueError, match="potentials.edge must be all zeros"):
        greedy.map(PairwisePotentials(node, torch.full((3, 3), 5.0)))
    with pytest.raises(TypeError, match="oracle must be NonProjective"):
        GreedyFirst(Projective())
    scores = torch.zeros(3, 3, 3, dtype=torch.float64)
    scores[2] = -torch.inf                                    # example 2 has no tree; 0 and 1 are greedy trees
    with pytest.raises(ValueError, match="^example 2: no valid dependency tree"):
        greedy.map(arc_potentials(scores))
    for clone in (copy.copy(greedy), copy.deepcopy(greedy), pickle.loads(pickle.dumps(greedy))):
        assert clone.map(arc_potentials(scores[:2])).tolist() == greedy.map(arc_potentials(scores[:2])).tolist()


def test_parse_takes_a_generator():
    """parse() handed a generator to predict, which used it up, then zipped the empty generator with the heads."""
    sentences = parse_conllu(_treebank(5))
    parser = DependencyParser(bits=8)
    parser.fit(sentences, epochs=1)
    parsed = parser.parse(s for s in sentences)
    assert [p.heads.tolist() for p in parsed] == [h.tolist() for h in parser.predict(sentences)]


def test_a_word_written_like_the_root_or_a_sentence_end_is_not_hashed_as_one():
    from betheproj.parsing.part_features import SecondOrderFeatures

    text = ("1\t<root>\t<root>\t<root>\t<root>\t_\t0\t_\t_\t_\n"
            "2\t<s>\t</s>\tNOUN\t<none>\t_\t1\t_\t_\t_\n"
            "3\t</s>\t<s>\t<none>\tVB\t_\t1\t_\t_\t_\n\n")
    sentence = parse_conllu(text)
    tok = ArcFeatures(bits=16, xpos=True)._tokens(sentence)
    for key in ("w", "l", "p", "x"):                          # token 0 is the root, 1 the word "<root>"
        assert tok[key][0] != tok[key][1], key
    root_prev, root_next = tok["qw"][0], tok["nw"][3]         # the sentence's ends as neighbours
    assert tok["w"][2] != root_prev and tok["w"][3] != root_prev
    assert tok["w"][2] != root_next and tok["w"][3] != root_next
    part, _ = SecondOrderFeatures(bits=16).tokens(sentence)
    assert part["w"][0] != part["w"][1] and part["p"][0] != part["p"][1]
    assert part["p"][3] != part["q"][0]                       # the tag "<none>" is not the boundary's


def test_evaluate_takes_a_generator_as_parse_and_predict_do():
    """evaluate() refused a generator with a TypeError naming 'gold', an argument it does not have."""
    sentences = parse_conllu(_treebank(5))
    parser = DependencyParser(bits=8).fit(sentences, epochs=1)
    assert parser.evaluate(s for s in sentences) == parser.evaluate(sentences)
    with pytest.raises(TypeError, match=r"^sentences must be a list of Sentence .*got str$"):
        parser.evaluate("w1 w2")


def test_predict_extracts_features_for_a_bounded_number_of_arcs_at_once(monkeypatch):
    """predict extracted the features of a whole batch (256 sentences) at once, ~700 bytes an arc at the peak: the
    256 longest EWT training sentences (1.0M arcs) took 0.73 GB, 256 sentences of 300 words would take 17 GB."""
    import betheproj.parsing.parser as parser_module

    sentences = parse_conllu(_treebank(30))
    parser = DependencyParser(bits=10).fit(sentences, epochs=1)
    want = parser.predict(sentences)
    arcs = arcs_per_batch(monkeypatch)
    monkeypatch.setattr(parser_module, "MAX_ARCS", 1000, raising=False)
    got = parser.predict(sentences)
    assert [h.tolist() for h in got] == [h.tolist() for h in want]
    assert len(arcs) > 1 and max(arcs) <= 1000 and sum(arcs) == sum(len(s) * (len(s) + 1) for s in sentences)


def test_arc_scores_of_a_word_as_its_own_head_are_minus_infinity():
    """arc_scores gave the self-arcs m -> m (no arc of any tree) the score 0, the padding weight's: a per-word argmax
    over a row picked a word as its own head wherever the real heads all scored below 0."""
    sentences = parse_conllu(_treebank(5))
    parser = DependencyParser(bits=8).fit(sentences, epochs=1)
    for sc, s in zip(parser.arc_scores(sentences), sentences, strict=True):
        n = len(s)
        self_arcs = sc[torch.arange(n), torch.arange(1, n + 1)]
        assert torch.isneginf(self_arcs).all()
        assert torch.isfinite(sc.masked_fill(torch.eye(n + 1, dtype=torch.bool)[1:], 0.0)).all()


def test_a_dev_sentence_without_words_is_named_before_training(monkeypatch):
    """fit(dev=[..., Sentence()]) trained a whole epoch and then failed in the dev evaluation, naming
    'sentences[5]'."""
    import betheproj.parsing.parser as parser_module

    def no_training(*args, **kwargs):
        raise AssertionError("training started although dev was bad")

    sentences = parse_conllu(_treebank(5))
    monkeypatch.setattr(parser_module, "fit_online", no_training)
    with pytest.raises(ValueError, match=r"^dev\[5\] has no words$"):
        DependencyParser(bits=8).fit(sentences, epochs=1, dev=[*sentences, Sentence()])


def test_feature_extraction_shows_progress_in_slices(monkeypatch):
    # parse train on EWT spent 47 s extracting features before its first output
    import betheproj.parsing.parser as parser_module

    seen = []

    class Bar:
        def __init__(self, total, enabled, desc):
            seen.append((desc, total, enabled))

        def update(self, n=1):
            seen.append(n)

        def close(self):
            seen.append("closed")

    monkeypatch.setattr(parser_module, "progress_bar", Bar)
    sentences = parse_conllu(_treebank(600))
    parser = DependencyParser(bits=12)
    parser.fit(sentences, epochs=1, progress=True)
    assert seen[:4] == [("features", 600, True), 512, 88, "closed"]
