"""Constraint templates: instances, measurement vectors and violations against hand-counted citations."""

import pytest
import torch

from betheproj.data.citation_constraints import (
    OrderConstraints,
    bigram_exclusions,
    citation_constraints,
    encode_labels,
    label_counts,
    order_constraints,
)
from betheproj.data.citations import parse_citation

LINES = [
    "<authors> <person> <first> A. </first> <last> Smith </last> </person> , <person> <first> B. </first> "
    "<last> Jones </last> </person> </authors> <title> On things . </title> <venue> <journal> J. X </journal> "
    "</venue>",
    "<authors> <person> <first> C. </first> <last> Lee </last> </person> </authors> <title> Stuff </title> "
    "<venue> <booktitle> Proc. Y </booktitle> </venue>",
    "<authors> <person> <first> D. </first> <last> Wu </last> </person> </authors> <title> More </title> "
    "<venue> <journal> J. Z </journal> </venue>",
]


@pytest.fixture
def cites():
    return [parse_citation(line) for line in LINES]


def labels_of(cites):
    return sorted({y for c in cites for y in c.labels} | {"O"})


def test_hand_counted_instances(cites):
    labels = labels_of(cites)
    con = citation_constraints(cites, labels, min_support=1, min_agreement=1.0, presence=1.0)
    names = set(con.names)
    # one title and one journal per citation; two authors in the first citation
    assert "at_most_one(title)" in names and "at_most_one(venue/journal)" in names
    assert "at_most_one(authors/person/first)" not in names
    # every citation has a title, first and last names
    assert "at_least_one(title)" in names and "at_least_one(authors/person/last)" in names
    assert "at_least_one(venue/journal)" not in names                      # the second has a booktitle
    # first and last names come in pairs: both directions hold, for segments and tokens
    assert {"seg(authors/person/last) <= seg(authors/person/first)",
            "seg(authors/person/first) <= seg(authors/person/last)",
            "tok(authors/person/last) <= tok(authors/person/first)"} <= names
    # 2 first names vs 1 title in the first citation: fails there
    assert "seg(authors/person/first) <= seg(title)" not in names
    assert "seg(title) <= seg(authors/person/first)" in names
    assert "exclusive(venue/booktitle, venue/journal)" in names
    assert "exclusive(title, venue/journal)" not in names                   # they occur together


def test_measurement_vectors_and_violations(cites):
    labels = labels_of(cites)
    ids = {y: i for i, y in enumerate(labels)}
    con = citation_constraints(cites, labels, min_support=1, min_agreement=1.0, presence=1.0)
    j = con.names.index("tok(authors/person/last) <= tok(authors/person/first)")
    a = con.a[j]
    assert a[ids["B-authors/person/last"]] == 1 and a[ids["B-authors/person/first"]] == -1
    assert a[ids["B-title"]] == 0 and con.b[j] == 0
    k = con.names.index("at_least_one(title)")
    assert con.a[k][ids["B-title"]] == -1 and con.a[k][ids["I-title"]] == 0 and con.b[k] == -1
    # the training citations satisfy every kept constraint
    y = torch.nn.utils.rnn.pad_sequence([torch.tensor([ids[v] for v in c.labels]) for c in cites],
                                        batch_first=True, padding_value=-1)
    counts = label_counts(y, len(labels))
    assert counts[0, ids["B-authors/person/first"]] == 2 and counts[0, ids["I-title"]] == 2
    assert (con.violations(counts) <= 0).all()
    # a labelling with two titles and a missing journal/booktitle violates exactly at_most_one(title) there
    bad = counts[1:2].clone()
    bad[0, ids["B-title"]] += 1
    v = con.violations(bad)[0]
    assert v[con.names.index("at_most_one(title)")] == 1
    assert v[con.names.index("seg(title) <= seg(authors/person/first)")] == 1


def test_length_templates_hand_counted(cites):
    labels = labels_of(cites)
    ids = {y: i for i, y in enumerate(labels)}
    assert not any("len(" in name for name in citation_constraints(cites, labels, min_support=1).names)
    con = citation_constraints(cites, labels, min_support=1, min_agreement=1.0, presence=1.0, length_agreement=1.0)
    names = [name for name in con.names if "len(" in name]
    # titles of 3, 1 and 1 tokens; journals of 2 and 2; one-token fields (no I- label) get none
    assert "max_len(title) <= 3" in names and not any(n.startswith("min_len(title)") for n in names)
    assert {"max_len(venue/journal) <= 2", "min_len(venue/journal) >= 2"} <= set(names)
    assert not any("person/first" in n or "person/last" in n for n in names)
    j = con.names.index("max_len(title) <= 3")
    assert con.a[j, ids["B-title"]] == -2 and con.a[j, ids["I-title"]] == 1 and con.b[j] == 0
    k = con.names.index("min_len(venue/journal) >= 2")
    assert con.a[k, ids["B-venue/journal"]] == 1 and con.a[k, ids["I-venue/journal"]] == -1
    y = torch.nn.utils.rnn.pad_sequence([torch.tensor([ids[v] for v in c.labels]) for c in cites],
                                        batch_first=True, padding_value=-1)
    counts = label_counts(y, len(labels))
    assert (con.violations(counts) <= 0).all()
    # a 4-token title is one token too long; a one-token journal one token too short
    bad = counts[:1].clone()
    bad[0, ids["I-title"]] += 1
    bad[0, ids["I-venue/journal"]] -= 1
    v = con.violations(bad)[0]
    assert v[j] == 1 and v[k] == 1
    # two of the three titles are one token long: at 60% agreement the bound tightens to 1
    loose = citation_constraints(cites, labels, min_support=1, length_agreement=0.6)
    assert "max_len(title) <= 1" in loose.names


def test_exclusive_must_hold_from_both_sides():
    # ref-markers in four citations, a publisher in one of them: "never together" fails for the publisher
    lines = [f"<ref-marker> [{i}] </ref-marker> <title> T{i} </title>" for i in range(3)]
    lines += ["<ref-marker> [3] </ref-marker> <title> T </title> <venue> <publisher> P </publisher> </venue>",
              "<title> U </title> <venue> <journal> J </journal> </venue>"]
    cites = [parse_citation(line) for line in lines]
    con = citation_constraints(cites, labels_of(cites), min_support=1, min_agreement=0.7, presence=1.0)
    assert "exclusive(ref-marker, venue/publisher)" not in con.names    # held in 3 of the 4 with either field
    assert "exclusive(ref-marker, venue/journal)" in con.names          # never together


def test_order_templates_hand_counted(cites):
    labels = labels_of(cites)
    ids = {y: i for i, y in enumerate(labels)}
    con = order_constraints(cites, labels, min_support=1, min_agreement=1.0)
    names = set(con.names)
    assert {"order(authors < title)", "order(title < venue)", "order(authors/person < venue/journal)",
            "order(authors/person/last < title)"} <= names
    assert "order(title < authors)" not in names
    assert not any("authors < authors/" in name or "authors/person < authors" in name for name in names)
    # A. Smith , B. Jones: a last name before the second first name, so "first < last" holds in 2 of 3
    assert "order(authors/person/first < authors/person/last)" not in names
    loose = order_constraints(cites, labels, min_support=1, min_agreement=0.6)
    assert "order(authors/person/first < authors/person/last)" in loose.names
    assert len(order_constraints(cites, labels, min_support=3, min_agreement=1.0)) < len(con)
    # vectors: every label under the group; violations: pairs with a ``then`` token before a ``first`` one
    j = con.names.index("order(authors < title)")
    assert con.first[j, ids["B-authors/person/first"]] == 1 and con.first[j, ids["B-authors"]] == 1
    assert con.first[j, ids["B-title"]] == 0 and con.then[j, ids["I-title"]] == 1
    y = torch.nn.utils.rnn.pad_sequence([torch.tensor([ids[v] for v in c.labels]) for c in cites],
                                        batch_first=True, padding_value=-1)
    assert (con.violations(y) == 0).all()
    swapped = OrderConstraints(con.then[j:j + 1], con.first[j:j + 1], ["order(title < authors)"])
    assert swapped.violations(y)[:, 0].tolist() == [5 * 3, 2 * 1, 2 * 1]         # authors x title tokens


def test_name_format_templates():
    first_last = "<authors> <person> <first> A. </first> <last> Smith </last> </person> </authors> <title> T </title>"
    last_first = ("<authors> <person> <last> Wu , </last> <first> B. </first> </person> </authors> "
                  "<title> U </title>")
    cites = [parse_citation(line) for line in [first_last, first_last, last_first, last_first]]
    labels = labels_of(cites)
    ids = {y: i for i, y in enumerate(labels)}
    con = bigram_exclusions(cites, labels, min_support=2, max_together=0.0)

    def named(a, b, c, d):
        return f"not_both({a} {b} ; {c} {d})" in con.names or f"not_both({c} {d} ; {a} {b})" in con.names

    first, last = "B-authors/person/first", "B-authors/person/last"
    assert named(first, last, last, "I-authors/person/last")            # "A. Smith" never with "Wu ,"
    assert named(first, last, "I-authors/person/last", first)
    assert not named(first, last, last, "B-title")                        # "Smith T" comes with "A. Smith"
    assert len(bigram_exclusions(cites, labels, min_support=3)) == 0      # every bigram is in two citations
    y = torch.nn.utils.rnn.pad_sequence([torch.tensor([ids[v] for v in c.labels]) for c in cites],
                                        batch_first=True, padding_value=-1)
    assert (con.violations(y) == 0).all()
    assert con.counts(y)[0].sum() == 2 and con.counts(y)[2].sum() == 3   # bigrams touching a name
    # a mixed labelling "A. Smith , B. Wu ," with both formats breaks a template
    mixed = torch.tensor([[ids[first], ids[last], ids["I-authors/person/last"], ids[first], ids[last]]])
    assert con.violations(mixed).max() >= 1
    with pytest.raises(ValueError, match="max_together"):
        bigram_exclusions(cites, labels, max_together=1.0)
    # a top-level group names the same bigrams as the group below it (the BIO prefix is no part of the path)
    assert bigram_exclusions(cites, labels, min_support=2, max_together=0.0, within="authors").names == con.names


def test_a_label_list_without_o_is_refused(cites):
    labels = [y for y in labels_of(cites) if y != "O"]
    for make in (citation_constraints, order_constraints, bigram_exclusions,
                 lambda c, y: label_counts(encode_labels(c, y), len(y))):
        with pytest.raises(ValueError, match="labels must be a list of labels holding 'O'"):
            make(cites, labels)


def test_label_lists_with_repeated_or_non_bio_labels_are_refused(cites):
    """A repeated label kept only its last id (the first one's column never counted), and a label that is not BIO
    was read as a field ('X-title' as title in the order groups, 'title' as the field 'tle'), both silently; a path
    with an empty part ('B-authors//person-last') made an order-template group named ''."""
    labels = labels_of(cites)
    title = labels.index("B-title")
    cases = [([*labels, "B-title"], rf"labels\[{len(labels)}\] = 'B-title' repeats labels\[{title}\]"),
             (["O", *labels], rf"labels\[{labels.index('O') + 1}\] = 'O' repeats labels\[0\]"),
             ([*labels, "X-title"], r"labels\[\d+\] = 'X-title' is not a BIO label"),
             ([*labels, "title"], r"labels\[\d+\] = 'title' is not a BIO label"),
             ([*labels, "B-"], r"labels\[\d+\] = 'B-' is not a BIO label"),
             ([*labels, "B-authors//person-last"], r"labels\[\d+\] = 'B-authors//person-last' has an empty part"),
             ([*labels, "I-title/"], r"labels\[\d+\] = 'I-title/' has an empty part")]
    for make in (citation_constraints, order_constraints, bigram_exclusions, encode_labels):
        for bad, message in cases:
            with pytest.raises(ValueError, match=message):
                make(cites, bad)
        with pytest.raises(TypeError, match=r"labels\[\d+\] must be a str, got int 3"):
            make(cites, [*labels, 3])


def test_errors(cites):
    for make in (citation_constraints, order_constraints, bigram_exclusions):
        with pytest.raises(ValueError, match="min_support must be an int >= 1"):
            make(cites, labels_of(cites), min_support=0)
    with pytest.raises(ValueError, match="citations"):
        citation_constraints([], ["O"])
    with pytest.raises(ValueError, match="min_agreement"):
        citation_constraints(cites, labels_of(cites), min_agreement=0.0)
    with pytest.raises(ValueError, match="length_agreement"):
        citation_constraints(cites, labels_of(cites), length_agreement=1.5)
    with pytest.raises(ValueError, match="citations"):
        order_constraints([], ["O"])
    with pytest.raises(ValueError, match="min_agreement"):
        order_constraints(cites, labels_of(cites), min_agreement=1.5)
    for make in (citation_constraints, order_constraints):      # a bool was read as 1
        with pytest.raises(TypeError, match="min_agreement"):
            make(cites, labels_of(cites), min_agreement=True)
    with pytest.raises(ValueError, match="presence"):
        citation_constraints(cites, labels_of(cites), presence=0.0)
    for make in (citation_constraints, order_constraints, bigram_exclusions):     # AttributeErrors before
        for bad in (["a", "b"], cites[0]):
            with pytest.raises(TypeError, match="citations must be a list of Citation"):
                make(bad, labels_of(cites))
        with pytest.raises(ValueError, match="labels must be a list of labels holding 'O'"):
            make(cites, None)
    for bad in (None, "", ["person"]):          # None and [..] gave no template, silently; "" none either
        with pytest.raises(TypeError, match=r"within must be a group's tag name \(a non-empty str"):
            bigram_exclusions(cites, labels_of(cites), min_support=1, within=bad)
    con = citation_constraints(cites, labels_of(cites))
    with pytest.raises(ValueError, match=r"counts must be label counts \[B, C="):
        con.violations(torch.zeros(len(labels_of(cites))))                         # 1-D: was [J], silently


def test_label_ids_out_of_range_or_of_the_wrong_shape_are_refused(cites):
    """An id past the labels was a bare RuntimeError/IndexError, -2 was read as padding, and one citation's ids
    [N] (no batch dimension) gave order violations of shape [N], summed over the wrong axis."""
    labels = labels_of(cites)
    c = len(labels)
    order = order_constraints(cites, labels, min_support=1, min_agreement=0.5)
    formats = bigram_exclusions(cites, labels, min_support=1)
    assert len(order) and len(formats.left)
    for f in (lambda y: label_counts(y, c), order.violations, formats.counts, formats.violations):
        for ids in (torch.tensor([[0, c]]), torch.tensor([[-2, 0]])):
            with pytest.raises(ValueError, match=rf"label_ids must lie in 0..{c - 1} .* or be -1"):
                f(ids)
        for ids in (torch.tensor([0, 1]), torch.tensor([[0.0, 1.0]]), [[0, 1]]):
            with pytest.raises(TypeError, match=r"label_ids must be an integer tensor \[B, N\]"):
                f(ids)
    ids = encode_labels(cites, labels)
    assert label_counts(ids, c).sum().item() == sum(len(x.labels) for x in cites)
