"""The nested-tag citation reader: hand-made lines with every repair, BIO spans, and the real files' counts."""

import gzip
import warnings
from pathlib import Path

import pytest

from betheproj.data.citations import (
    bio_segments,
    citation_lines,
    is_tag_name,
    load_citations,
    parse_citation,
    read_citations,
    tokenize_citation,
)

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "umass_citation" / "original"
needs_data = pytest.mark.skipif(not (DATA / "training.docs.gz").is_file(), reason="../shared/data not present")


def test_well_formed_line():
    c = parse_citation("<ref-marker> [3] </ref-marker> <authors> <person> <person-first> A. </person-first> "
                       "<person-last> Smith , </person-last> </person> and <person> <person-last> Jones </person-last>"
                       " </person> </authors> <venue> <thesis> PhD thesis </thesis><institution> MIT </institution>"
                       " </venue>")
    assert c.tokens == ["[3]", "A.", "Smith", ",", "and", "Jones", "PhD", "thesis", "MIT"]
    assert c.labels == ["B-ref-marker", "B-authors/person/person-first", "B-authors/person/person-last",
                        "I-authors/person/person-last", "B-authors", "B-authors/person/person-last",
                        "B-venue/thesis", "I-venue/thesis", "B-venue/institution"]
    assert c.paths[4] == ("authors",) and c.repairs == 0
    assert c.segments()[:3] == [("ref-marker", 0, 1), ("authors/person/person-first", 1, 2),
                                ("authors/person/person-last", 2, 4)]


def test_adjacent_instances_of_one_field_are_separate_segments():
    c = parse_citation("<authors> <person> <person-last> Ng </person-last> </person> <person> <person-last> Li "
                       "</person-last> </person> </authors>")
    assert c.labels == ["B-authors/person/person-last", "B-authors/person/person-last"]
    assert [s[1:] for s in c.segments()] == [(0, 1), (1, 2)]


def test_a_tag_nested_in_one_of_the_same_name_is_one_segment():
    """``<venue> <venue>`` counts once, in the path and in the segments (the innermost tag's instance split the
    field: B- at every change between the two instances)."""
    assert parse_citation("<venue> <venue> X </venue> Y </venue>").labels == ["B-venue", "I-venue"]
    c = parse_citation("<venue> A <venue> B </venue> C </venue> <venue> D </venue>")
    assert c.labels == ["B-venue", "I-venue", "I-venue", "B-venue"]
    assert [s[1:] for s in c.segments()] == [(0, 3), (3, 4)]


def test_repairs_of_malformed_lines():
    # a mismatched closer closes the innermost tag; the data's <person-middle> ... </person-first>
    c = parse_citation("<authors> <person> <person-middle> J. </person-first> <person-last> Doe </person-last> "
                       "</person> </authors>")
    assert c.labels == ["B-authors/person/person-middle", "B-authors/person/person-last"] and c.repairs == 1
    # a closer further down the stack closes everything above it
    c = parse_citation("<venue> <journal> Phys . Rev . </venue> <title> T </title>")
    assert c.paths[0] == ("venue", "journal") and c.labels[-1] == "B-title" and c.repairs == 1
    # a tag left open at the end of the line, and a stray closer with nothing open
    c = parse_citation("</note> x <note> see also")
    assert c.labels == ["O", "B-note", "I-note"] and c.repairs == 2
    # the data's "</<person-first>" is a closer, not a token "</" and an opener
    c = parse_citation("<person> <person-first> C. </<person-first> <person-middle> J.M </person-middle> </person>")
    assert c.tokens == ["C.", "J.M"] and c.labels == ["B-person/person-first", "B-person/person-middle"]
    assert c.repairs == 1
    assert parse_citation("<<title> x </title>").labels == ["O", "B-title"]        # a stray "<", then an opener
    # the same tag nested in itself counts once
    assert parse_citation("<venue> <venue> <pages> 1-2 </pages> </venue> </venue>").labels == ["B-venue/pages"]


def test_tag_names_are_what_the_reader_reads_as_tags():
    for name in ("title", "person-last", "reference_id", "a1.b", "a\u00e9"):
        assert is_tag_name(name) and parse_citation(f"<{name}> x </{name}>").labels == [f"B-{name}"]
    for name in ("", "1st", "_x", "\u00e9", "my title", "a<b", "a>", "a/b", "title\n"):
        assert not is_tag_name(name) and parse_citation(f"<{name}> x </{name}>").labels != [f"B-{name}"]


def test_bio_segments():
    assert bio_segments(["B-a", "I-a", "O", "I-b", "I-b", "B-b", "I-a"]) == [("a", 0, 2), ("b", 3, 5), ("b", 5, 6),
                                                                                ("a", 6, 7)]
    assert bio_segments([]) == [] and bio_segments(["O", "O"]) == []


@pytest.mark.parametrize("label", ["author", "B", "B-", "I-", "X-a", "o", "b-a", ""])
def test_bio_segments_refuses_labels_that_are_not_bio(label):
    # a bare tag used to become a span of type ''
    with pytest.raises(ValueError, match=r"labels\[1\] = .* is not a BIO label"):
        bio_segments(["O", label, "O"])


def test_bio_segments_refuses_labels_that_are_not_strings():
    with pytest.raises(TypeError, match=r"labels\[0\] must be a str"):
        bio_segments([1, "O"])


def test_a_string_is_not_a_label_sequence_nor_a_line_none():
    with pytest.raises(TypeError, match="labels must be a sequence of labels, got the str 'B-x'"):
        bio_segments("B-x")
    with pytest.raises(TypeError, match="line must be a str, got NoneType"):
        tokenize_citation(None)


def test_parsed_labels_are_bio():
    line = "<author> <person> A. B </person> </author> , <title> T </title> x <venue> <pages> 1 </pages> </venue>"
    labels = parse_citation(line).labels
    assert all(y == "O" or y[:2] in ("B-", "I-") for y in labels)
    assert bio_segments(labels) == [("author/person", 0, 2), ("title", 3, 4), ("venue/pages", 5, 6)]


def test_missing_files_name_what_is_expected(tmp_path):
    with pytest.raises(FileNotFoundError, match="training.docs"):
        load_citations(tmp_path)
    with pytest.raises(FileNotFoundError, match="dev.docs"):
        read_citations(tmp_path / "dev.docs")


@needs_data
def test_counts_match_the_source():
    data = load_citations(DATA)
    assert {k: len(v) for k, v in data.items()} == {"train": 1457, "dev": 660, "test": 367}
    # SOURCE.md's 37,280 / 16,249 count the "</" of the two lines' "</<tag>" closers as tokens
    assert [sum(len(c.tokens) for c in v) for v in data.values()] == [37279, 16248, 9237]
    assert not any(t.startswith("</") for v in data.values() for c in v for t in c.tokens)
    assert [sum(c.repairs > 0 for c in v) for v in data.values()] == [9, 5, 5]          # SOURCE.md: 9, 5, 5
    assert all(len(c.tokens) == len(c.labels) == len(c.paths) for v in data.values() for c in v)


def test_tokenize_raw_strings_like_the_data():
    raw = 'J. Smith and A.B. Jones. "Learning things." In Proc. of ICML, pages 1-10; (2005): 3...'
    assert tokenize_citation(raw) == ["J.", "Smith", "and", "A.B", ".", "Jones", ".", '"', "Learning", "things", ".",
                                      '"', "In", "Proc.", "of", "ICML", ",", "pages", "1-10", ";", "(2005)",
                                      ":", "3", "..."]
    assert tokenize_citation("Proc. Amer. Math. Soc.") == ["Proc.", "Amer", ".", "Math", ".", "Soc", "."]
    assert tokenize_citation("  ") == [] and tokenize_citation(". , ...") == [".", ",", "..."]
    assert tokenize_citation("\u201cTitle,\u201d [3]") == ["\u201c", "Title", ",", "\u201d", "[3]"]


def _detokenize(tokens):
    text = ""
    for t in tokens:
        text += t if t in {",", ";", ":", "."} and text else (" " + t if text else t)
    return text


@needs_data
def test_tokenizer_recovers_the_dev_tokens():
    dev = read_citations(DATA / "dev.docs")
    same = sum(tokenize_citation(_detokenize(c.tokens)) == c.tokens for c in dev)
    assert same >= 0.95 * len(dev)            # measured: 632 of 660; the rest are the data's inconsistencies


def test_unreadable_or_untagged_files_are_errors_naming_the_file(tmp_path):
    (tmp_path / "bad.docs.gz").write_bytes(b"not gzip")
    with pytest.raises(ValueError, match="bad.docs.gz as gzip"):
        read_citations(tmp_path / "bad.docs")
    packed = bytearray(gzip.compress(" ".join(f"<title> w{i} </title>" for i in range(400)).encode()))
    packed[60:120] = bytes(255 - b for b in packed[60:120])           # a corrupt deflate stream: zlib.error
    (tmp_path / "corrupt.docs.gz").write_bytes(bytes(packed))
    with pytest.raises(ValueError, match="corrupt.docs.gz as gzip-compressed UTF-8 text"):
        read_citations(tmp_path / "corrupt.docs")
    (tmp_path / "latin.docs").write_bytes("<title> caf\xe9 </title>".encode("latin-1"))
    with pytest.raises(ValueError, match="latin.docs as UTF-8"):
        read_citations(tmp_path / "latin.docs")
    (tmp_path / "conll.docs").write_text("Smith B-author\nTitle B-title\n")
    with pytest.raises(ValueError, match="conll.docs holds no tags"):
        read_citations(tmp_path / "conll.docs")


def test_lines_of_tags_alone_are_skipped(tmp_path):
    (tmp_path / "t.docs").write_text("<title> A title . </title>\n<title> </title>\n\n<year> 2001 </year>\n")
    assert [c.tokens for c in read_citations(tmp_path / "t.docs")] == [["A", "title", "."], ["2001"]]


def test_a_byte_order_mark_is_not_a_token(tmp_path):
    # a file saved with a BOM (Windows editors) used to give its first citation a token '\ufeff', labelled O
    text = "<title> A B </title>\n<year> 2001 </year>\n"
    (tmp_path / "t.docs").write_bytes(b"\xef\xbb\xbf" + text.encode())
    (tmp_path / "g.docs.gz").write_bytes(gzip.compress(b"\xef\xbb\xbf" + text.encode()))
    for path in (tmp_path / "t.docs", tmp_path / "g.docs"):
        assert [c.tokens for c in read_citations(path)] == [["A", "B"], ["2001"]]
        assert citation_lines(path)[0] == "<title> A B </title>\n"


def test_a_file_whose_tags_mostly_do_not_pair_up_is_read_with_a_warning(tmp_path):
    """Openers with attributes are no tags, their closers are: every author was read as O tokens '<author',
    'lang="en">', 'J.', 'Smith' and a stray closer, silently (as were files whose closers were all missing)."""
    line = '<author lang="en"> J. Smith </author> <title> A title </title>\n'
    (tmp_path / "attrs.docs").write_text(line * 5)
    with pytest.warns(UserWarning, match=r"attrs.docs: 5 of 5 citations have tags that do not pair up .* is the "
                                         r"file in the nested-tag format\?"):
        citations = read_citations(tmp_path / "attrs.docs")
    assert citations[0].labels[:2] == ["O", "O"]                        # read as before, repairs and all
    # a few repaired lines, as in the data itself (under 2% of each file): no warning
    good = "<author> J. Smith </author> <title> A title </title>\n"
    (tmp_path / "few.docs").write_text(good * 9 + "<title> open at the end\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(read_citations(tmp_path / "few.docs")) == 10
