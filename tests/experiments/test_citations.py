"""The citation experiment (section 8.1): nested-tag output, and a small run on a subset of the real data."""

import gzip
import json
import re
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import torch

from betheproj import PairwisePotentials
from betheproj.cli import main
from betheproj.data.citations import load_citations, parse_citation, tokenize_citation
from betheproj.experiments import citations

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "umass_citation" / "original"
needs_data = pytest.mark.skipif(not (DATA / "training.docs.gz").is_file(), reason="../shared/data not present")


def _small_model(config):
    """A feature index, an untrained non-local model and its templates on three copies of one citation."""
    from betheproj.data.citation_features import FeatureIndex
    from betheproj.learning import SparseChainCRF

    line = "<authors> <person> <person-last> Smith </person-last> </person> </authors> <title> A title . </title>"
    cites = [parse_citation(line)] * 3
    index = FeatureIndex(cites)
    base = SparseChainCRF(index.num_features, len(index.labels)).double()
    constraints, order, formats = citations.templates(cites, index.labels, config)
    return index, citations.constraint_model(base, constraints, config, order, formats), constraints, order, formats


def test_nested_tags_round_trip():
    line = ("<authors> <person> <first> A. </first> <last> Smith </last> </person> </authors> <title> On "
            "things . </title> <venue> <journal> J. X </journal> , <volume> 3 </volume> </venue>")
    cite = parse_citation(line)
    text = citations.to_nested_tags(cite.tokens, cite.labels)
    assert parse_citation(text).labels == cite.labels
    assert text.startswith("<authors> <person> <first> A. </first> <last> Smith")
    # two adjacent segments of the same field are two tag instances
    assert citations.to_nested_tags(["a", "b"], ["B-title", "B-title"]) == "<title> a </title> <title> b </title>"
    assert citations.to_nested_tags(["x"], ["O"]) == "x"


@pytest.mark.parametrize("tokens, labels, message", [
    (["x"], ["B-"], r"labels\[0\] must be 'O' or 'B-'/'I-' and a tag path, got 'B-'"),
    (["x"], ["Q-a"], r"labels\[0\] must be"),
    (["x", "y"], ["O", None], r"labels\[1\] must be"),
    (["x"], ["B-a//b"], r"labels\[0\] must be"),
    (["x", "y"], ["O"], "tokens and labels must be as long, got 2 and 1"),
    (["a b"], ["O"], r"tokens\[0\] must be a non-empty string without spaces, got 'a b'"),
    ([""], ["O"], r"tokens\[0\] must be a non-empty string"),
    # <a> <a> t </a> </a> reads back as B-a: the segments a(0,1), a/a(1,2) became a(0,2)
    (["t", "u"], ["B-a", "B-a/a"], r"labels\[1\] = 'B-a/a' nests a tag directly in itself"),
    (["t"], ["I-x/a/a/b"], r"labels\[0\] = 'I-x/a/a/b' nests"),
])
def test_nested_tags_refuse_what_cannot_be_read_back(tokens, labels, message):
    with pytest.raises(ValueError, match=message):
        citations.to_nested_tags(tokens, labels)


@pytest.mark.parametrize("label", ["B-my title", "I-1st", "B-a<b", "B-a>", "B-_x", "B-\u00e9", "B-authors/per son",
                                   "B-a\tb"])
def test_nested_tags_refuse_tag_names_that_do_not_read_as_tags(label):
    # these were written as '<my title> x </my title>', read back as the tokens '<my', 'title>', 'x', ... all O
    with pytest.raises(ValueError, match=r"labels\[1\] must be 'O' or 'B-'/'I-' and a tag path, got .*tag name"):
        citations.to_nested_tags(["x", "y"], ["O", label])
    assert citations.to_nested_tags(["x"], ["B-a1.b_c-d/e\u00e9"]) == "<a1.b_c-d> <e\u00e9> x </e\u00e9> </a1.b_c-d>"


def test_tag_strings_takes_a_list_of_lines():
    with pytest.raises(TypeError, match="lines must be a list of citation strings, not one string"):
        citations.tag_strings("Jones, J. A title. 2005.", None, None)
    with pytest.raises(TypeError, match=r"lines\[1\] must be a str, got NoneType"):
        citations.tag_strings(["Jones, J. A title. 2005.", None], None, None)


def test_f1_of_refuses_no_citations_and_citations_without_tokens():
    """No citations was a bare RuntimeError from torch's max(); a citation without tokens a ValueError about the
    oracle's lengths, naming no citation."""
    from betheproj.data.citation_features import FeatureIndex
    from betheproj.data.citations import Citation
    from betheproj.learning import SparseChainCRF

    cites = [parse_citation("<a> x y </a> <b> z </b>"), parse_citation("<b> z w </b> <a> q </a>")]
    index = FeatureIndex(cites)
    predict = citations.viterbi_predictor(SparseChainCRF(index.num_features, len(index.labels)).double())
    f1, pred = citations.f1_of(predict, index, cites, index.encode(cites))
    assert 0 <= f1 <= 100 and [len(p) for p in pred] == [3, 3]
    with pytest.raises(ValueError, match="citations must not be empty"):
        citations.f1_of(predict, index, [], index.encode([]))
    bad = [cites[0], Citation([], [], [])]
    with pytest.raises(ValueError, match=r"citations\[1\] has no tokens"):
        citations.f1_of(predict, index, bad, index.encode(bad))


def test_f1_of_refuses_an_encoding_of_other_citations():
    """An encoding of [a, b] scored against [a] was an IndexError "list assignment index out of range", and one of
    [b, a] against [a, b] "sequence 0: gold has 3 labels, predicted 1"."""
    index, model, *_ = _small_model(citations.CitationConfig(min_support=1))
    a = parse_citation("<title> A title . </title>")
    b = parse_citation("<authors> <person> <person-last> Smith </person-last> </person> </authors>")
    predict = citations.viterbi_predictor(model.theta)
    for cites, encoded in (([a], index.encode([a, b])), ([a, b], index.encode([b, a]))):
        with pytest.raises(ValueError, match=r"^encoded must be index.encode\(citations\): its lengths \[\d"):
            citations.f1_of(predict, index, cites, encoded)
    assert len(citations.f1_of(predict, index, [a, b], index.encode([a, b]))[1]) == 2


def test_mbr_f1_checks_its_citations_as_f1_of_does_and_agrees_with_decode_segments():
    """mbr_f1 scores every threshold from one pass of segment posteriors: the F1 of decode_segments at each."""
    from betheproj.inference import BIOFields, decode_segments
    from betheproj.learning.metrics import segment_f1

    index, model, *_ = _small_model(citations.CitationConfig(min_support=1))
    torch.manual_seed(0)
    with torch.no_grad():
        model.theta.weights.weight.normal_()
    a = parse_citation("<title> A title . </title>")
    b = parse_citation("<authors> <person> <person-last> Smith </person-last> </person> </authors> <title> T </title>")
    cites, fields = [a, b, a], BIOFields.from_labels(index.labels)
    encoded = index.encode(cites)
    got = citations.mbr_f1(model.theta, index, cites, encoded, (0.2, 0.5, 0.9), chunk_size=2)
    x, _, n = encoded
    for threshold, f1 in zip((0.2, 0.5, 0.9), got, strict=True):
        ids = decode_segments(model.theta(x, n), fields, threshold)
        pred = [[index.labels[int(v)] for v in ids[i, : int(n[i])]] for i in range(len(cites))]
        assert f1 == 100 * segment_f1([c.labels for c in cites], pred).f1
    with pytest.raises(ValueError, match=r"^thresholds must be a non-empty sequence of numbers in \[0, 1\]"):
        citations.mbr_f1(model.theta, index, cites, encoded, ())
    with pytest.raises(ValueError, match=r"^thresholds\[1\] must be a finite number in \[0, 1\], got 1.5"):
        citations.mbr_f1(model.theta, index, cites, encoded, (0.5, 1.5))
    with pytest.raises(ValueError, match=r"^encoded must be index.encode\(citations\)"):
        citations.mbr_f1(model.theta, index, cites[:2], encoded, (0.5,))


def test_nonlocal_tagger_decodes_one_solve_by_map_and_segment_mbr_as_the_single_decoders_do(monkeypatch):
    """One solve per chunk, decoded by Proposition 1's MAP and by segment MBR at each threshold: the labels of
    nonlocal_predictor and of decode_segments on the same solution; predictions checks its citations as f1_of."""
    from betheproj.inference import BIOFields, decode_segments
    from betheproj.learning import NonLocalCRF

    index, model, *_ = _small_model(citations.CitationConfig(min_support=1))
    torch.manual_seed(0)
    with torch.no_grad():
        model.theta.weights.weight.normal_()
        model.psi.value.fill_(2.0)                          # every constraint on (the learned c starts at 0)
    a = parse_citation("<title> A title . </title>")
    b = parse_citation("<authors> <person> <person-last> Smith </person-last> </person> </authors> <title> T </title>")
    cites, fields = [a, b, a], BIOFields.from_labels(index.labels)
    encoded = index.encode(cites)
    iterations = []
    calls = []
    infer = model.infer

    def counted(x, n, max_iter=None):
        calls.append(len(n))
        return infer(x, n, max_iter)

    model.infer = counted
    got = citations.predictions(citations.nonlocal_tagger(model, 5, fields, (0.3, 0.7), iterations), index, cites,
                                encoded, chunk_size=2)
    assert len(got) == 3 and sum(calls) == 3 and sum(len(i) for i in iterations) == 3      # each citation solved once
    assert got[0] == citations.f1_of(citations.nonlocal_predictor(model, 5), index, cites, encoded, chunk_size=2)[1]
    x, _, n = encoded
    sol = NonLocalCRF.infer(model, x, n, 5)
    for threshold, labels in zip((0.3, 0.7), got[1:], strict=True):
        ids = decode_segments(sol.potentials, fields, threshold)
        assert labels == [[index.labels[int(v)] for v in ids[i, : int(n[i])]] for i in range(len(cites))]
    assert len(citations.predictions(citations.nonlocal_tagger(model, 5), index, cites, encoded)) == 1
    calls.clear()
    decoded = []
    monkeypatch.setattr(citations, "decode", lambda *a: decoded.append(1))
    alone = citations.predictions(citations.nonlocal_tagger(model, 5, fields, (0.3, 0.7), map_labels=False), index,
                                  cites, encoded, chunk_size=2)
    assert alone == got[1:] and sum(calls) == 3 and not decoded          # the MBR labels alone, no Viterbi pass
    with pytest.raises(ValueError, match="map_labels=False needs thresholds"):
        citations.nonlocal_tagger(model, 5, map_labels=False)
    with pytest.raises(TypeError, match="map_labels must be a bool, got int"):
        citations.nonlocal_tagger(model, 5, fields, (0.5,), map_labels=0)
    with pytest.raises(ValueError, match="thresholds need fields"):
        citations.nonlocal_tagger(model, 5, None, (0.5,))
    with pytest.raises(ValueError, match="model has no energy"):                  # was a bare AssertionError
        citations.nonlocal_predictor(NonLocalCRF(model.theta), 5)
    with pytest.raises(TypeError, match="model must be a NonLocalCRF"):
        citations.nonlocal_tagger(model.theta, 5)
    with pytest.raises(TypeError, match="tagger must be a callable"):
        citations.predictions(None, index, cites, encoded)
    with pytest.raises(TypeError, match="tagger must return a list of .* got Tensor .*f1_of"):
        citations.predictions(citations.viterbi_predictor(model.theta), index, cites, encoded)
    with pytest.raises(ValueError, match=r"^encoded must be index.encode\(citations\)"):
        citations.predictions(citations.nonlocal_tagger(model, 5), index, cites[:2], encoded)


def test_run_refuses_a_config_or_data_of_another_type():
    """A dict of settings was an AttributeError on 'seed' (and an empty one silently the defaults), a list of
    splits an AttributeError on 'get'."""
    cites = [parse_citation("<a> x y </a> <b> z </b>")]
    splits = {"train": cites, "dev": cites, "test": cites}
    for config in ({"crf_iter": 1}, {}):
        with pytest.raises(TypeError, match="config must be a CitationConfig or None, got dict"):
            citations.run(splits, config)
    with pytest.raises(TypeError, match="data must be a dict of splits"):
        citations.run([cites, cites, cites])


def test_nested_tags_rebuild_groups():
    line = ("<authors> <person> <first> A. </first> <last> Smith </last> </person> and <person> <last> Jones , "
            "</last> <first> B. </first> </person> <person> <last> Wu </last> </person> </authors> <venue> "
            "<language> x </language> </venue> <venue> <language> y </language> </venue>")
    cite = parse_citation(line)
    text = citations.to_nested_tags(cite.tokens, cite.labels)
    assert text == line                     # "and" stays in <authors>; a repeated field opens a new group
    assert parse_citation(text).labels == cite.labels


@needs_data
def test_nested_tags_rebuild_the_data_structure():
    tags = re.compile(r"</?[A-Za-z][\w.-]*>")
    with gzip.open(DATA / "dev.docs.gz", "rt", encoding="utf-8") as handle:
        lines = [line for line in handle if line.strip() and parse_citation(line).repairs == 0]
    same = 0
    for line in lines:
        cite = parse_citation(line)
        text = citations.to_nested_tags(cite.tokens, cite.labels)
        assert parse_citation(text).labels == cite.labels
        same += tags.findall(text) == tags.findall(line)
    assert same >= 0.95 * len(lines)        # measured: 639 of 655 (241 before groups were rebuilt)


@needs_data
def test_small_run_and_cli(tmp_path, capsys):
    data = load_citations(DATA)
    small = {"train": data["train"][:200], "dev": data["dev"][:60], "test": data["test"][:60]}
    config = citations.CitationConfig(crf_iter=40, epochs=1, test_iters=(1, 5), min_support=5)
    results = citations.run(small, config, save=tmp_path / "model.pt")
    base, nonlocal_ = results["rows"]["baseline"], results["rows"]["non-local"]
    # measured on this subset: base ~80 / ~82 F1; a chain of 200 citations is far from the full model's 94
    assert 70 < base["test"] < 95 and 70 < base["dev"] < 95
    assert nonlocal_["test"] > base["test"] - 3
    assert results["constraints"] > 50 and len(results["test_iterations_to_converge"]) == 60
    assert 0 < results["order_constraints"] < results["constraints"] and results["format_constraints"] >= 0
    assert all(0 <= i <= 5 for i in results["test_iterations_to_converge"])
    assert "Non-local energies" in citations.format_table(results)
    # segment MBR rows: each row's threshold is the first best on dev, its test F1 the one at that threshold
    for key in ("baseline, MBR", "non-local, MBR"):
        row = results["rows"][key]
        k = config.mbr_thresholds.index(row["extra"]["threshold"])
        assert row["dev"] == max(row["extra"]["dev_by_threshold"]) == row["extra"]["dev_by_threshold"][k]
        assert row["test"] == row["extra"]["test_by_threshold"][k] and 70 < row["test"] <= 100
    assert "Non-local, segment MBR" in citations.format_table(results)
    json.dumps(results)
    citations.plot_iterations(results, str(tmp_path / "f1.png"))
    citations.plot_histogram(results, str(tmp_path / "hist.png"))
    assert (tmp_path / "f1.png").stat().st_size > 1000
    # the CLI tags raw strings with the saved model
    raw = tmp_path / "raw.txt"
    untokenised = "A. Smith and B. Jones, Learning things. In Proc. of ICML, pages 1-10, 2005."
    tagged = "<title> Tags </title> in text ."
    raw.write_text(" ".join(data["test"][1].tokens) + "\n\n" + untokenised + "\u2028more .\n" + tagged + "\n")
    assert main(["citations", "--out", str(tmp_path), "--predict", str(raw)]) == 0
    lines = capsys.readouterr().out.split("\n")[:-1]
    assert len(lines) == 4 and lines[1] == "" and "<" in lines[0]           # one line out per line in (U+2028 too)
    assert parse_citation(lines[0]).tokens == data["test"][1].tokens
    assert parse_citation(lines[2]).tokens == tokenize_citation(untokenised + " more .")   # split as the data is
    assert parse_citation(lines[3]).tokens == ["&lt;title&gt;", "Tags", "&lt;/title&gt;", "in", "text", "."]
    # decoded for segment F1 instead: the same tokens; at threshold 1 no segment is more probable, so no tags
    assert main(["citations", "--out", str(tmp_path), "--predict", str(raw), "--mbr", "0.5", "--quiet"]) == 0
    mbr = capsys.readouterr().out.split("\n")[:-1]
    assert len(mbr) == 4 and parse_citation(mbr[0]).tokens == data["test"][1].tokens and "<" in mbr[0]
    assert citations.tag_strings([untokenised], *citations.load_model(tmp_path / "model.pt"),
                                 mbr_threshold=1.0) == [" ".join(tokenize_citation(untokenised))]
    # --mbr alone: the threshold dev chose, saved in the model file
    saved = citations.load_run(tmp_path / "model.pt")
    assert saved.mbr_threshold == results["rows"]["non-local, MBR"]["extra"]["threshold"]
    assert main(["citations", "--out", str(tmp_path), "--predict", str(raw), "--mbr", "--quiet"]) == 0
    chosen = citations.tag_strings(raw.read_text().split("\n")[:-1], saved.index, saved.model,
                                   mbr_threshold=saved.mbr_threshold)
    assert capsys.readouterr().out.split("\n")[:-1] == chosen
    with pytest.raises(SystemExit) as exit_:
        main(["citations", "--out", str(tmp_path), "--predict", str(raw), "--mbr", "1.5"])
    assert exit_.value.code == 2 and "argument --mbr: must be a number in [0, 1], got '1.5'" in capsys.readouterr().err
    assert main(["citations", "--data", str(DATA), "--mbr", "0.5"]) == 2
    assert "--mbr is for --predict" in capsys.readouterr().err
    # a damaged model file is a one-line error naming it
    (tmp_path / "model.pt").write_bytes(b"not a model")
    assert main(["citations", "--out", str(tmp_path), "--predict", str(raw)]) == 2
    err = capsys.readouterr().err
    assert "model.pt is not a citation model" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("content", [torch.zeros(3), [1, 2], {"index": torch.zeros(2)}],
                         ids=["tensor", "list", "dict of tensors"])
def test_a_model_file_of_other_content_is_named(tmp_path, content):
    """A tensor in model.pt raised IndexError, which the one-line "not a citation model" error did not cover."""
    torch.save(content, tmp_path / "model.pt")
    with pytest.raises(ValueError, match="model.pt is not a citation model written by 'betheproj citations'"):
        citations.load_model(tmp_path / "model.pt")


@pytest.mark.parametrize("weight", ["theta.weights.weight", "theta.transitions", "psi.value"])
def test_a_model_file_with_weights_that_are_not_finite_is_named(tmp_path, capsys, weight):
    """A NaN in a saved weight failed at tagging as "node contains NaN" or "psi must be finite", naming no file."""
    from betheproj.data.citation_features import FeatureIndex
    from betheproj.learning import SparseChainCRF

    line = ("<authors> <person> <person-last> Smith </person-last> </person> </authors> <title> A title . </title> "
            "<date> <year> 2005 </year> </date>")
    cites, config = [parse_citation(line)] * 3, citations.CitationConfig(min_support=1)
    index = FeatureIndex(cites)
    base = SparseChainCRF(index.num_features, len(index.labels)).double()
    constraints, order, formats = citations.templates(cites, index.labels, config)
    model = citations.constraint_model(base, constraints, config, order, formats)
    citations.save_model(tmp_path / "model.pt", index, model, constraints, config, order, formats)
    state = torch.load(tmp_path / "model.pt", weights_only=True)
    state["model"][weight].fill_(float("nan"))
    torch.save(state, tmp_path / "model.pt")
    raw = tmp_path / "raw.txt"
    raw.write_text("Smith . A title . 2005\n")
    assert main(["citations", "--out", str(tmp_path), "--predict", str(raw)]) == 2
    assert capsys.readouterr().err == (
        f"betheproj citations: error: {tmp_path / 'model.pt'} is not a citation model written by 'betheproj "
        f"citations' (ValueError: its weights {weight} hold NaN or infinite values)\n")


def test_a_model_of_another_feature_version_is_refused_and_one_without_a_version_loads(tmp_path, capsys):
    """Saved models carried no version of the feature functions: a model saved before a feature's definition
    changed would tag with features it was not trained on."""
    from betheproj.data.citation_features import FEATURES_VERSION

    config = citations.CitationConfig(min_support=1)
    index, model, constraints, order, formats = _small_model(config)
    path = tmp_path / "model.pt"
    citations.save_model(path, index, model, constraints, config, order, formats)
    state = torch.load(path, weights_only=True)
    assert state["index"]["version"] == FEATURES_VERSION
    del state["index"]["version"]                       # saved before versions were recorded: version 1
    torch.save(state, path)
    assert citations.load_model(path)[0].labels == index.labels
    state["index"]["version"] = FEATURES_VERSION + 1
    torch.save(state, path)
    raw = tmp_path / "raw.txt"
    raw.write_text("Smith . A title . 2005\n")
    assert main(["citations", "--out", str(tmp_path), "--predict", str(raw)]) == 2
    assert capsys.readouterr().err == (
        f"betheproj citations: error: {path} is a citation model of feature version {FEATURES_VERSION + 1}, but this "
        f"betheproj computes version {FEATURES_VERSION}: its features would not be the ones it was trained on; train "
        "it again ('betheproj citations --data DIR')\n")
    with pytest.raises(ValueError, match="state: a feature index of feature version 2, but this betheproj computes "
                                         "version 1"):
        citations.FeatureIndex.from_state(state["index"])


def test_save_model_to_a_path_that_cannot_be_written_is_an_os_error_naming_it(tmp_path):
    config = citations.CitationConfig(min_support=1)
    index, model, constraints, order, formats = _small_model(config)
    missing = tmp_path / "missing" / "model.pt"                  # torch.save raises RuntimeError here
    with pytest.raises(OSError, match=f"cannot write {missing}"):
        citations.save_model(missing, index, model, constraints, config, order, formats)


def test_save_model_refuses_templates_or_an_index_other_than_the_model_was_built_with(tmp_path):
    """save_model(path, index, model, constraints, config) of a model with order and name-format templates wrote a
    file that load_model then refused ("Error(s) in loading state_dict"); so did an index of other labels."""
    config = citations.CitationConfig(min_support=1)
    index, model, constraints, order, formats = _small_model(config)
    assert len(order) > 0
    with pytest.raises(ValueError, match=r"model has \d+ template weights over 4 labels; constraints, order and "
                                         r"formats give \d+ over 4: pass the templates the model was built with"):
        citations.save_model(tmp_path / "model.pt", index, model, constraints, config)
    other = citations.FeatureIndex([parse_citation("<title> A title . </title>")])
    with pytest.raises(ValueError, match=r"model has \d+ features and 4 labels, index \d+ and 3: save the index"):
        citations.save_model(tmp_path / "model.pt", other, model, constraints, config, order, formats)
    assert not (tmp_path / "model.pt").exists()
    citations.save_model(tmp_path / "model.pt", index, model, constraints, config, order, formats)
    assert citations.load_model(tmp_path / "model.pt")[0].labels == index.labels


def test_tag_strings_refuses_an_index_other_than_the_models():
    """An index of 27 features and 3 labels with a model of 70 and 4 tagged silently, reading the model's label ids
    in the other list ("<person-first> T </person-first>")."""
    index, model, *_ = _small_model(citations.CitationConfig(min_support=1))
    other = citations.FeatureIndex([parse_citation("<authors> <person> <person-first> A </person-first> </person> "
                                                   "</authors> <title> T </title>")])
    with pytest.raises(ValueError, match=r"^model has 70 features and 4 labels, index 27 and 3: tag with the index "
                                         r"the model was trained with$"):
        citations.tag_strings(["A T"], other, model)
    assert citations.tag_strings(["A T"], index, model)[0].startswith("<")


def test_run_refuses_a_save_path_it_cannot_write_before_training(tmp_path, monkeypatch):
    """run(data, save=...) with a missing folder or a folder for the file trained the whole experiment (about 4 min
    on the full data) and only then failed, "cannot write ... (No such file or directory)" / "(Is a directory)"."""
    def trains(*args, **kwargs):
        raise AssertionError("the base CRF was trained")

    monkeypatch.setattr(citations, "fit_crf", trains)
    cite = parse_citation("<title> A title . </title>")
    data = {"train": [cite], "dev": [cite], "test": [cite]}
    with pytest.raises(ValueError, match=r"^save: cannot write in the folder .*missing \(No such file or directory\)"):
        citations.run(data, save=tmp_path / "missing" / "model.pt")
    with pytest.raises(ValueError, match=r"^save: .* is a folder: give the model file's path \(e\.g\. .*model\.pt\)"):
        citations.run(data, save=tmp_path)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("split", ["train", "dev", "test"])
def test_run_refuses_a_citation_without_tokens_before_training(monkeypatch, split):
    """A tokenless citation (parse_citation of a line of tags alone) in train failed in the CRF as "lengths must lie
    in [1, N]", naming no citation; in dev or test only after the base CRF had trained, as "citations[20] has no
    tokens"."""
    def trains(*args, **kwargs):
        raise AssertionError("the base CRF was trained")

    monkeypatch.setattr(citations, "fit_crf", trains)
    cite = parse_citation("<title> A title . </title>")
    data = {"train": [cite, cite], "dev": [cite, cite], "test": [cite, cite]}
    data[split] = [cite, parse_citation("<title> </title>")]
    with pytest.raises(ValueError, match=rf"^data\['{split}'\]\[1\] has no tokens: every citation must hold one"):
        citations.run(data)


def test_run_refuses_a_log_that_is_not_callable():
    """run(data, log="log.txt") failed as "'str' object is not callable", naming no argument."""
    cite = parse_citation("<title> A title . </title>")
    with pytest.raises(TypeError, match=r"^log must be None or a callable taking one str \(e\.g\. print\), got str"):
        citations.run({"train": [cite], "dev": [cite], "test": [cite]}, log="log.txt")


def test_cli_errors(tmp_path, capsys):
    assert main(["citations", "--out", str(tmp_path), "--predict", str(tmp_path / "missing.txt")]) == 2
    assert "expected a file of raw citations, one a line, at " in capsys.readouterr().err
    raw = tmp_path / "raw.txt"
    raw.write_text("A. Smith . Title .\n")
    assert main(["citations", "--out", str(tmp_path), "--predict", str(raw)]) == 2
    err = capsys.readouterr().err
    assert "no trained citation model" in err and len(err.strip().splitlines()) == 1
    assert main(["citations"]) == 2
    assert "--data is required" in capsys.readouterr().err
    assert main(["citations", "--data", str(tmp_path / "nowhere")]) == 2
    with pytest.raises(SystemExit) as exit_:
        main(["citations", "--seed", "one"])
    assert exit_.value.code == 2 and "argument --seed: must be an integer" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main(["citations", "--cross-fit", "1"])
    assert exit_.value.code == 2 and "argument --cross-fit: must be an integer >= 2, got '1'" in capsys.readouterr().err
    assert main(["citations", "--out", str(tmp_path), "--predict", str(raw), "--cross-fit", "5"]) == 2
    assert "--cross-fit is for training" in capsys.readouterr().err


@pytest.mark.parametrize("field, value, error", [
    ("crf_iter", 0, ValueError), ("chunk_size", 1.5, TypeError), ("min_support", 0, ValueError),
    ("batch_size", 0, ValueError), ("epochs", True, TypeError), ("train_iter", -1, ValueError),
    ("crf_l2", -1e-3, ValueError), ("crf_gamma", float("nan"), ValueError), ("hinge_width", 0.0, ValueError),
    ("psi_lr", -1.0, ValueError), ("margin", float("inf"), ValueError), ("psi_init", "0", TypeError),
    # c enters as max(c, 0): from psi_init=-0.5 no weight moved (0 of 317 active), non-local F1 = baseline's
    ("psi_init", -0.5, ValueError),
    ("min_agreement", 0.0, ValueError), ("min_agreement", 1.5, ValueError), ("length_agreement", 2.0, ValueError),
    ("order_agreement", 0.0, ValueError), ("format_together", -0.1, ValueError), ("format_together", 1.0, ValueError),
    ("crf_loss", "svm", ValueError),
    ("method", "newton", ValueError), ("test_iters", (40, 20), ValueError), ("test_iters", (), ValueError),
    ("seed", -1, ValueError), ("cross_fit", 1, ValueError), ("cross_fit", -2, ValueError),
    ("cross_fit_epochs", 0, ValueError), ("mbr_thresholds", (0.5, 1.5), ValueError),
    ("mbr_thresholds", "0.5", TypeError), ("mbr_thresholds", 0.5, TypeError),
])
def test_every_config_field_is_checked_at_construction(field, value, error):
    """A bad setting is named at construction (psi_lr=-1 was reported as 'lr' by Algorithm 3, minutes in)."""
    with pytest.raises(error, match=field):
        citations.CitationConfig(**{field: value})
    citations.CitationConfig(length_agreement=None, order_agreement=None, format_together=None)


def test_config_numpy_and_tensor_scalars_are_kept_as_python_numbers(tmp_path):
    """CitationConfig(seed=np.int64(0)) kept np.int64: the results failed json.dumps and the saved model could not be
    loaded ("not a file torch.save wrote, or a damaged one": weights_only loading refuses NumPy scalars)."""
    config = citations.CitationConfig(seed=np.int64(0), crf_iter=np.int32(5), margin=np.float32(0.5),
                                      psi_init=torch.tensor(0.0), min_support=np.int64(1), test_iters=[1, 2],
                                      mbr_thresholds=[np.float32(0.5), torch.tensor(0.25)])
    settings = asdict(config)
    assert json.loads(json.dumps(settings)) == {**settings, "test_iters": [1, 2], "mbr_thresholds": [0.5, 0.25]}
    assert type(config.seed) is int and type(config.margin) is float and config.test_iters == (1, 2)
    assert config.mbr_thresholds == (0.5, 0.25) and all(type(v) is float for v in config.mbr_thresholds)
    index, model, constraints, order, formats = _small_model(config)
    citations.save_model(tmp_path / "model.pt", index, model, constraints, config, order, formats)
    assert citations.load_run(tmp_path / "model.pt")[2] == config


def test_the_model_file_keeps_the_segment_mbr_threshold_dev_chose(tmp_path, capsys):
    """``--predict --mbr`` alone decodes with the threshold the training run chose on dev, saved in model.pt (it was
    read off results.json beside it, so the model alone could not do it)."""
    config = citations.CitationConfig(min_support=1)
    index, model, constraints, order, formats = _small_model(config)
    path = tmp_path / "model.pt"
    citations.save_model(path, index, model, constraints, config, order, formats, mbr_threshold=np.float32(0.25))
    saved = citations.load_run(path)
    assert saved.mbr_threshold == 0.25 and type(saved.mbr_threshold) is float and saved.config == config
    with pytest.raises(ValueError, match=r"mbr_threshold must be a finite number in \[0, 1\], got 1.5"):
        citations.save_model(path, index, model, constraints, config, order, formats, mbr_threshold=1.5)
    citations.save_model(path, index, model, constraints, config, order, formats)
    assert citations.load_run(path).mbr_threshold is None
    raw = tmp_path / "raw.txt"
    raw.write_text("Smith . A title .\n")
    assert main(["citations", "--out", str(tmp_path), "--predict", str(raw), "--mbr", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "model.pt holds no segment-MBR threshold" in err and "--mbr 0.5" in err and len(err.splitlines()) == 1
    assert main(["citations", "--out", str(tmp_path), "--predict", str(raw), "--mbr", "0.5", "--quiet"]) == 0
    assert capsys.readouterr().out.count("\n") == 1


def test_tag_strings_solves_with_the_iterations_the_model_was_scored_with(tmp_path, monkeypatch):
    """tag_strings (and so --predict) ran 40 solver iterations whatever test_iters the model was trained and scored
    with: a model of test_iters=(1, 80) tagged differently than its test row was measured."""
    from betheproj.learning import NonLocalCRF

    config = citations.CitationConfig(min_support=1, test_iters=(1, 80))
    index, model, constraints, order, formats = _small_model(config)
    citations.save_model(tmp_path / "model.pt", index, model, constraints, config, order, formats)
    index, model = citations.load_model(tmp_path / "model.pt")
    seen, infer = [], NonLocalCRF.infer

    def spy(self, features, lengths, max_iter=None):
        seen.append(max_iter)
        return infer(self, features, lengths, max_iter)

    monkeypatch.setattr(NonLocalCRF, "infer", spy)
    assert citations.tag_strings(["Smith . A title ."], index, model)[0].startswith("<")
    citations.tag_strings(["Smith . A title ."], index, model, max_iter=3)
    assert seen == [80, 3]


def test_histogram_of_no_iterations_is_refused(tmp_path):
    # ZeroDivisionError (the percentages of an empty list); run() never gives one, a caller of the plot might
    pytest.importorskip("matplotlib")
    with pytest.raises(ValueError, match=r"results\['test_iterations_to_converge'\] is empty"):
        citations.plot_histogram({"test_iterations_to_converge": [], "max_iter": 40}, str(tmp_path / "h.png"))
    assert not list(tmp_path.iterdir())


def test_f1_of_counts_the_citations_on_its_bar(monkeypatch):
    from betheproj.data.citation_features import FeatureIndex
    from betheproj.learning import SparseChainCRF

    updates = []

    class Bar:
        def update(self, n=1):
            updates.append(n)

        def close(self):
            updates.append("closed")

    monkeypatch.setattr(citations, "progress_bar", lambda total, enabled, desc: Bar() if enabled else None)
    cites = [parse_citation("<a> x y </a> <b> z </b>"), parse_citation("<b> z w </b>")]
    index = FeatureIndex(cites)
    predict = citations.viterbi_predictor(SparseChainCRF(index.num_features, len(index.labels)).double())
    citations.f1_of(predict, index, cites, index.encode(cites), chunk_size=1, progress=True)
    assert updates == [1, 1, "closed"]


def _named_citations(count):
    return [parse_citation(f"<authors> <person> <person-last> Name{i} </person-last> </person> </authors> <title> "
                           f"Title{i} of things . </title>") for i in range(count)]


def test_cross_fitted_potentials_come_from_a_model_that_never_saw_the_citation(monkeypatch):
    from betheproj.data.citation_features import FeatureIndex

    cites = _named_citations(7)
    index = FeatureIndex(cites)
    fitted = []
    train = citations.train_baseline

    def spy(fold_index, encoded, config, progress=False):
        fitted.append((fold_index, train(fold_index, encoded, config, progress)))
        return fitted[-1][1]

    monkeypatch.setattr(citations, "train_baseline", spy)
    node, edge = citations.cross_fit_potentials(cites, index, citations.CitationConfig(cross_fit=3, crf_iter=5))
    c = len(index.labels)
    assert len(fitted) == 3 and node.shape == (7, 5, c) and edge.shape == (7, c, c)
    for i, cite in enumerate(cites):
        blind = [k for k, (fold_index, _) in enumerate(fitted) if f"w=Name{i}" not in fold_index.features]
        assert len(blind) == 1                          # one fold model scored it, the others trained on it
        fold_index, model = fitted[blind[0]]
        assert fold_index.labels == index.labels
        x, _, n = fold_index.encode([cite])
        with torch.no_grad():
            pot = model(x, n)
        assert torch.equal(node[i], pot.node[0]) and torch.equal(edge[i], pot.edge)
    with pytest.raises(ValueError, match="config.cross_fit must be between 2 and the 7 training citations, got 8"):
        citations.cross_fit_potentials(cites, index, citations.CitationConfig(cross_fit=8))
    with pytest.raises(ValueError, match="config.cross_fit must be at most the 7 training citations"):
        citations.run({"train": cites, "dev": cites, "test": cites}, citations.CitationConfig(cross_fit=8))


def test_pooled_weights_without_held_out_citations_are_those_learned_on_dev():
    """The pool's stored potentials and its labels padded to the pool's width change nothing: with no training
    citations in it, Algorithm 3 takes the very steps it takes on dev."""
    from betheproj.data.citation_features import FeatureIndex
    from betheproj.learning import SparseChainCRF

    cites = _named_citations(5)
    config = citations.CitationConfig(epochs=2, cross_fit_epochs=2, batch_size=2, min_support=1, train_iter=5)
    index = FeatureIndex(cites)
    base = SparseChainCRF(index.num_features, len(index.labels)).double()
    with torch.no_grad():
        torch.manual_seed(0)
        base.weights.weight.normal_()
        base.transitions.normal_()
    constraints, order, formats = citations.templates(cites, index.labels, config)
    model = citations.constraint_model(base, constraints, config, order, formats)
    dev = index.encode(cites)
    citations.learn_weights(model, dev, config)
    alone = model.psi.value.detach().clone()
    c = len(index.labels)
    none = (torch.zeros(0, 9, c, dtype=torch.float64), torch.zeros(0, c, c, dtype=torch.float64))
    train = (dev[0][:0], torch.zeros(0, 9, dtype=torch.long), dev[2][:0])
    citations.learn_pooled_weights(model, none, train, dev, config)
    assert (alone > 0).any() and torch.allclose(model.psi.value, alone, rtol=1e-12, atol=1e-14)


@needs_data
def test_a_small_cross_fitted_run(tmp_path, capsys):
    data = load_citations(DATA)
    small = {"train": data["train"][:60], "dev": data["dev"][:30], "test": data["test"][:30]}
    config = citations.CitationConfig(crf_iter=20, cross_fit=2, cross_fit_epochs=1, test_iters=(5,), min_support=5,
                                      mbr_thresholds=())
    results = citations.run(small, config, save=tmp_path / "model.pt")
    assert results["seconds"]["cross_fit"] > 0 and results["config"]["cross_fit"] == 2
    assert 50 < results["rows"]["non-local"]["test"] <= 100 and results["f1_vs_iterations"]["test"] == [
        results["rows"]["non-local"]["test"]] and len(results["test_iterations_to_converge"]) == 30
    # no thresholds to choose from: no segment-MBR rows, and none saved
    assert set(results["rows"]) == {"baseline", "non-local"}
    assert citations.load_run(tmp_path / "model.pt").mbr_threshold is None
    assert "learned on dev and the 2-fold cross-fitted training split" in citations.format_table(results)


def test_stored_potentials_hand_the_chain_one_transition_table_per_example():
    """Examples of different folds keep their own transitions as a stride-0 view over the positions (the chain's
    per-example path, which gives the same marginals as the materialised tables); one fold's share one table."""
    from betheproj import LinearChain

    torch.manual_seed(0)
    node, edge = torch.randn(3, 4, 2, dtype=torch.float64), torch.randn(3, 2, 2, dtype=torch.float64)
    edge[1] = edge[0]
    stored = citations._Stored(node, edge)
    lengths = torch.tensor([4, 3])
    mixed = stored(citations._Stored.features(3, 4)[[0, 2]], lengths)
    assert mixed.edge.shape == (2, 3, 2, 2) and mixed.edge.stride(1) == 0
    assert torch.equal(mixed.edge[1, 2], edge[2]) and torch.equal(mixed.node[1], node[2])
    dense = PairwisePotentials(mixed.node, mixed.edge.contiguous(), lengths)
    assert torch.allclose(LinearChain().marginals(mixed).node, LinearChain().marginals(dense).node, atol=1e-14)
    assert stored(citations._Stored.features(3, 4)[[0, 1]], lengths).edge.shape == (2, 2)
