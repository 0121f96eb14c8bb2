"""Sparse citation features and the sparse-feature CRF on hand-made citations."""

import pytest
import torch

from betheproj.data.citation_features import FeatureIndex, token_features
from betheproj.data.citations import Citation, parse_citation
from betheproj.learning import SparseChainCRF, fit_crf
from betheproj.learning.metrics import segment_f1
from betheproj.oracles import LinearChain

LINES = [
    "<authors> <person> <person-first> A. </person-first> <person-last> Smith , </person-last> </person> </authors>"
    " <title> Deep nets . </title> <venue> <journal> Phys . Rev . </journal> <date> <year> 1999 . </year> </date>"
    " </venue>",
    "<authors> <person> <person-first> B. </person-first> <person-last> Jones , </person-last> </person> </authors>"
    " <title> Shallow nets . </title> <venue> <journal> Phys . Lett . </journal> <date> <year> (2004) </year>"
    " </date> </venue>",
]


def test_token_features():
    feats = token_features(["Smith", ",", "(2004)"], lexicon={"smith": {"person-last"}})
    assert {"w=Smith", "l=smith", "s=Xx", "S=Xxxxx", "p3=smi", "x2=th", "first", "l+1=,", "lex=person-last"} \
        <= set(feats[0])
    assert "punct" in feats[1] and "year" in feats[2] and "digit" in feats[2] and "last" in feats[2]
    assert "l-2=smith" in feats[2] and "l+2=<pad>" in feats[1]


def test_context_flags_of_what_came_before():
    tokens = "A. Smith ( ed. ) , 1999 . In Proc . (2001)".split()
    flags = [{f for f in fs if f in ("after_in", "after_year", "in_paren")} for fs in token_features(tokens)]
    assert flags[:2] == [set(), set()]
    assert flags[2] == flags[3] == flags[4] == {"in_paren"}                 # "(" ... ")" inclusive
    assert flags[5] == flags[6] == set()                                     # the year itself: not after one
    assert flags[7] == flags[8] == {"after_year"}
    assert flags[9] == flags[10] == {"after_in", "after_year"}
    assert flags[11] == {"after_in", "after_year", "in_paren"}              # "(2001)" opens and closes


def test_index_encodes_with_padding_and_drops_the_unseen():
    cits = [parse_citation(line) for line in LINES]
    index = FeatureIndex(cits)
    assert index.lexicon["phys"] == {"journal"} and "B-title" in index.labels and "O" in index.labels
    other = parse_citation("<title> Zebra </title> <note> x </note>")
    ids, labels, lengths = index.encode([*cits, other])
    assert ids.shape[0] == 3 and lengths.tolist() == [len(cits[0].tokens), len(cits[1].tokens), 2]
    assert (ids[2, 2:] == 0).all() and (labels[2, 2:] == -1).all()
    assert "w=Zebra" not in index.features and labels[2, 1] == index.label_ids["O"]       # unseen label -> O
    assert int(ids.max()) < index.num_features


def test_an_index_numbers_the_labels_it_is_given():
    cits = [*(parse_citation(line) for line in LINES), parse_citation("<title> Zebra </title> <note> x </note>")]
    full = FeatureIndex(cits)
    part = FeatureIndex(cits[:1], labels=full.labels)          # one citation's features, every citation's labels
    assert part.labels == full.labels and part.label_ids == full.label_ids
    assert "w=Jones" in full.features and "w=Jones" not in part.features
    assert torch.equal(part.encode(cits)[1], full.encode(cits)[1])
    assert "B-note" in full.labels and "B-note" not in FeatureIndex(cits[:1]).labels
    with pytest.raises(ValueError, match=r"labels must hold 'O' and every label of citations; it lacks \['O'\]"):
        FeatureIndex(cits, labels=[y for y in full.labels if y != "O"])
    with pytest.raises(ValueError, match="labels must be distinct"):
        FeatureIndex(cits, labels=[*full.labels, "O"])
    with pytest.raises(ValueError, match="labels must be 'O', 'B-<type>' or 'I-<type>', got 'title'"):
        FeatureIndex(cits, labels=[*full.labels, "title"])
    with pytest.raises(TypeError, match="labels must be a sequence of label strings"):
        FeatureIndex(cits, labels="O")


def test_sparse_crf_scores_and_learns():
    cits = [parse_citation(line) for line in LINES]
    index = FeatureIndex(cits)
    ids, labels, lengths = index.encode(cits)
    model = SparseChainCRF(index.num_features, len(index.labels)).double()
    with torch.no_grad():
        model.weights.weight.normal_()
        model.weights.weight[0] = 0.0
    node = model(ids, lengths).node
    assert torch.allclose(node[0, 0], model.weights.weight[ids[0, 0]].sum(0) + model.bias)
    fit_crf(model, ids, labels, lengths, l2=1e-4, max_iter=60)
    with torch.no_grad():
        pred = LinearChain().map(model(ids, lengths))
    guessed = [[index.labels[j] for j in pred[i, : lengths[i]].tolist()] for i in range(2)]
    assert segment_f1([c.labels for c in cits], guessed).f1 == 1.0


def test_inputs_of_the_wrong_kind_are_type_errors():
    cite = parse_citation("<title> A title </title>")
    for bad in ("abc", [1, 2], cite):
        with pytest.raises(TypeError, match="citations must be a list of Citation"):
            FeatureIndex(bad)
    index = FeatureIndex([cite])
    with pytest.raises(TypeError, match="citations must be a list of Citation"):
        index.encode(cite)
    assert index.encode([])[2].dtype == torch.long
    with pytest.raises(TypeError, match="line must be a str, got NoneType"):
        parse_citation(None)


def test_token_features_of_one_string_or_tokens_that_are_no_strings_are_type_errors():
    """token_features("Smith") gave the features of five one-letter tokens ("w=S", ...); a citation with an int token
    failed FeatureIndex as "'int' object has no attribute 'lower'"."""
    with pytest.raises(TypeError, match=r"tokens must be a sequence of strings \(one a token\), got str 'Smith'"):
        token_features("Smith")
    with pytest.raises(TypeError, match=r"tokens\[1\] must be a str, got int 3"):
        token_features(["a", 3])
    with pytest.raises(TypeError, match=r"citations\[1\]\.tokens\[0\] must be a str, got int 1"):
        FeatureIndex([parse_citation("<title> A </title>"), Citation([1], [("title",)], ["B-title"])])
    assert token_features(("a", "b")) == token_features(["a", "b"])


def test_decomposed_unicode_is_featurised_as_the_composed_form():
    """"Duche\u0302ne" (e + combining circumflex, as text copied from a PDF often is) got features of its own,
    "w=Duche\u0302ne", "x3=\u0302ne", which the index of the data's "Duch\u00eane" does not know: the test split's
    "Sanz-Sol\u00e9" decomposed kept 12 of the 16 features the index knows for it."""
    composed, decomposed = ["Duch\u00eane", "(2004)"], ["Duche\u0302ne", "(2004)"]
    assert token_features(decomposed) == token_features(composed)
    index = FeatureIndex([parse_citation("<authors> <person> <person-last> Duch\u00eane </person-last> </person> "
                                         "</authors> <date> <year> (2004) </year> </date>")])
    cite = parse_citation("<authors> <person> <person-last> Duche\u0302ne </person-last> </person> </authors>")
    assert cite.tokens == ["Duche\u0302ne"]                       # the token itself is kept as written
    same = parse_citation("<authors> <person> <person-last> Duch\u00eane </person-last> </person> </authors>")
    assert index.encode([cite])[0].tolist() == index.encode([same])[0].tolist()
    # the lexicon of decomposed training words is looked up by the composed form too
    index = FeatureIndex([cite, cite])
    assert index.lexicon == {"duch\u00eane": {"person-last"}}
    assert index.encode([same])[0].tolist() == index.encode([cite])[0].tolist()


def test_counts_of_the_feature_index_are_checked():
    cite = parse_citation("<title> A title </title>")
    for name, value, error in (("min_count", 0, ValueError), ("min_count", 1.5, TypeError),
                               ("lexicon_count", 0, ValueError), ("lexicon_count", "2", TypeError)):
        with pytest.raises(error, match=name):                # 0 and 1.5 were accepted silently
            FeatureIndex([cite], **{name: value})


def test_citations_need_one_path_and_one_label_per_token():
    """Citation(tokens, paths) leaves labels empty: encoded, they became -1 inside the length (training stopped
    with "labels must lie in [0, C)", naming no citation); an extra label was a bare RuntimeError and a short
    paths list zip()'s error."""
    from betheproj.data.citation_constraints import citation_constraints
    from betheproj.data.citations import Citation

    good = parse_citation("<title> a b </title> <year> 2001 </year>")
    index = FeatureIndex([good])
    for bad in (Citation(["a", "b"], [("title",)] * 2),
                Citation(["a"], [("title",)], ["B-title", "O"]),
                Citation(["a", "b"], [("title",)], ["B-title", "I-title"])):
        for f, args in ((FeatureIndex, ()), (index.encode, ()), (citation_constraints, (["O", "B-title"],))):
            with pytest.raises(ValueError, match=r"citations\[1\] has \d tokens but \d paths and \d labels"):
                f([good, bad], *args)
    for bad in (Citation(["a"], [("title",)], [["B-title"]]), Citation([1], [("title",)], ["B-title"])):
        for f, args in ((FeatureIndex, ()), (index.encode, ()), (citation_constraints, (["O", "B-title"],))):
            with pytest.raises(TypeError, match=r"citations\[1\]\.(labels|tokens)\[0\] must be a str, got (list|int)"):
                f([good, bad], *args)


def test_a_malformed_state_is_a_value_error_naming_the_state():
    """from_state({}) was a bare KeyError 'features', and a label list without 'O' loaded and failed at encode
    with a bare KeyError 'O'."""
    good = parse_citation("<title> a b </title> <year> 2001 </year>")
    state = FeatureIndex([good]).state()
    assert FeatureIndex.from_state(state).encode([good])[1].tolist() == FeatureIndex([good]).encode([good])[1].tolist()
    for bad, match in (({}, "lacks 'features'"), ({**state, "lexicon": None}, "'lexicon'"),
                       ({**state, "labels": ["B-title"]}, "labels must hold 'O'")):
        with pytest.raises(ValueError, match=f"state: a malformed feature index state .*{match}"):
            FeatureIndex.from_state(bad)


def test_a_state_whose_features_labels_or_lexicon_do_not_number_or_name_one_thing_each_is_refused():
    """A feature id out of 1..F loaded and failed at tagging as "features must be indices in [0, 70)"; two features
    of one id, a label list naming 'O' twice, and a lexicon entry "title" (read as the fields t, i, l, e) loaded
    and tagged silently."""
    good = parse_citation("<title> a b </title> <year> 2001 </year> <title> a </title>")
    state = FeatureIndex([good], lexicon_count=1).state()
    first, second = list(state["features"])[:2]
    for bad, match in (({**state, "features": {**state["features"], first: 10 ** 6}}, r"features must number the"),
                       ({**state, "features": {**state["features"], second: state["features"][first]}},
                        r"features must number the \d+ features 1\.\.\d+, each once"),
                       ({**state, "labels": ["O", *state["labels"]]}, r"labels must be distinct strings"),
                       # loaded, then tagging failed with "labels[0] = 'title' is not a BIO label", naming no file
                       ({**state, "labels": [y if y == "O" else f"{y[2:]}{i}" for i, y in enumerate(state["labels"])]},
                        r"labels must be 'O', 'B-<type>' or 'I-<type>', got 'title0'"),
                       ({**state, "labels": ["B-", *state["labels"][1:]]}, r"got 'B-'"),
                       ({**state, "labels": "O"}, r"labels must be a list, got str"),        # read as ['O']
                       ({**state, "features": {**state["features"], first: True}}, r"features must map each feature "
                                                                                     r"to an int id"),
                       ({**state, "lexicon": {**state["lexicon"], "a": "title"}}, r"lexicon must map each word")):
        with pytest.raises(ValueError, match=f"state: a malformed feature index state .*{match}"):
            FeatureIndex.from_state(bad)


def test_labels_that_a_saved_index_could_not_hold_are_refused_when_it_is_built():
    # 'PER' built an index whose state from_state refused (a model saved and never loaded); an int label failed in
    # sorted() naming nothing
    words, paths = ["John", "Smith"], [("person",), ("person",)]
    with pytest.raises(ValueError, match=r"citations\[0\]\.labels\[0\] = 'PER' is not a BIO label"):
        FeatureIndex([Citation(words, paths, ["PER", "PER"])])
    with pytest.raises(TypeError, match=r"citations\[1\]\.labels\[1\] must be a str, got int 5"):
        FeatureIndex([Citation(words, paths, ["B-person", "I-person"]), Citation(words, paths, ["O", 5])])
