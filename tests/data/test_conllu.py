"""CoNLL-U reader/writer: comments, multi-word tokens, empty nodes, round trips, the real EWT counts."""

import gzip
import io
import os
import random
import re
import threading
from pathlib import Path

import numpy as np
import pytest

from betheproj.data.conllu import Sentence, format_conllu, load_conllu, parse_conllu, read_conllu, write_conllu
from betheproj.parsing.metrics import attachment_counts, uas

EWT = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "ud_english_ewt"

SAMPLE = """# newdoc id = doc1
# sent_id = s1
# text = I don't know.
1\tI\tI\tPRON\tPRP\tCase=Nom\t4\tnsubj\t4:nsubj\t_
2-3\tdon't\t_\t_\t_\t_\t_\t_\t_\t_
2\tdo\tdo\tAUX\tVBP\t_\t4\taux\t4:aux\t_
3\tn't\tnot\tPART\tRB\t_\t4\tadvmod\t4:advmod\t_
4\tknow\tknow\tVERB\tVB\t_\t0\troot\t0:root\tSpaceAfter=No
4.1\tknow\tknow\tVERB\tVB\t_\t_\t_\t0:root\t_
5\t.\t.\tPUNCT\t.\t_\t4\tpunct\t4:punct\t_

# sent_id = s2
1\tYes\tyes\tINTJ\tUH\t_\t0\troot\t0:root\t_
2\t!\t!\tPUNCT\t.\t_\t1\tpunct\t1:punct\t_

"""


def test_reader_skips_comments_multiword_tokens_and_empty_nodes():
    s1, s2 = parse_conllu(SAMPLE)
    assert len(s1) == 5 and len(s2) == 2
    assert s1.forms == ["I", "do", "n't", "know", "."]
    assert s1.lemmas == ["I", "do", "not", "know", "."]
    assert s1.upos == ["PRON", "AUX", "PART", "VERB", "PUNCT"]
    assert s1.xpos == ["PRP", "VBP", "RB", "VB", "."]
    assert s1.deprels == ["nsubj", "aux", "advmod", "root", "punct"]
    assert s1.heads.tolist() == [4, 4, 4, 0, 4] and s1.heads.dtype == np.int64
    assert s1.comments == ["# newdoc id = doc1", "# sent_id = s1", "# text = I don't know."]
    assert s1.text == "I don't know." and s2.text == "Yes !"
    assert [k for k, _ in s1.extra] == [1, 4]          # before word 2, after word 4


def test_round_trip_and_predicted_heads(tmp_path):
    sentences = parse_conllu(SAMPLE)
    assert format_conllu(sentences) == SAMPLE
    for name in ("out.conllu", "out.conllu.gz"):
        write_conllu(sentences, tmp_path / name, heads=[[2, 4, 4, 0, 1], [0, 1]])
        again = read_conllu(tmp_path / name)
        assert again[0].heads.tolist() == [2, 4, 4, 0, 1]
        assert again[0].deprels == sentences[0].deprels and again[0].extra == sentences[0].extra
        assert format_conllu(again).replace("\t2\tnsubj", "\t4\tnsubj").replace("\t1\tpunct\t4:", "\t4\tpunct\t4:") \
            == SAMPLE
    buf = io.StringIO()
    write_conllu(sentences, buf)
    assert buf.getvalue() == SAMPLE
    with pytest.raises(ValueError, match="head arrays"):
        write_conllu(sentences, buf, heads=[[0]])
    with pytest.raises(ValueError, match=r"heads must lie in \[0, 2\]"):
        sentences[1].with_heads([0, 3])
    for heads, word in (([0, 2], 2), ([2, 1], 1), ([3, 3, 1, 0, 4], 1)):       # a self-loop, two cycles
        with pytest.raises(ValueError, match=f"heads must form a tree rooted at 0, but word {word} is on a cycle"):
            sentences[0 if len(heads) == 5 else 1].with_heads(heads)
    assert sentences[0].with_heads([0, 0, 2, 2, 1]).heads.tolist() == [0, 0, 2, 2, 1]       # a forest under 0: fine


def test_missing_head_and_errors(tmp_path):
    (s,) = parse_conllu("1\ta\ta\tX\t_\t_\t_\t_\t_\t_\n")
    assert s.heads.tolist() == [-1]
    with pytest.raises(ValueError, match=r"<string>:1: expected 10 tab-separated columns, got 3"):
        parse_conllu("1\ta\tb\n")
    with pytest.raises(ValueError, match="word IDs must be 1..2 in order"):
        parse_conllu("1\ta\ta\tX\t_\t_\t0\t_\t_\t_\n3\tb\tb\tX\t_\t_\t1\t_\t_\t_\n")
    with pytest.raises(ValueError, match="HEAD of word 1 must be an integer in 0..1"):
        parse_conllu("1\ta\ta\tX\t_\t_\t5\t_\t_\t_\n")
    # the line of the bad word, not of the sentence's first (comment) line
    with pytest.raises(ValueError, match=r"^<string>:4: HEAD of word 2 must be an integer in 0..2"):
        parse_conllu("# sent_id = 1\n1\ta\ta\tX\t_\t_\t0\t_\t_\t_\n2-3\tab\t_\t_\t_\t_\t_\t_\t_\t_\n"
                     "2\tb\tb\tX\t_\t_\t7\t_\t_\t_\n")
    with pytest.raises(ValueError, match=r"^<string>:3: word IDs must be 1..2 in order, got '3' at word 2"):
        parse_conllu("# c\n1\ta\ta\tX\t_\t_\t0\t_\t_\t_\n3\tb\tb\tX\t_\t_\t1\t_\t_\t_\n")
    with pytest.raises(FileNotFoundError, match=r"expected a CoNLL-U file \(.conllu or .conllu.gz\) at .*nope.conllu"):
        load_conllu(tmp_path / "nope.conllu")
    (tmp_path / "folder").mkdir()
    with pytest.raises(FileNotFoundError, match="at .*folder, found a folder"):
        load_conllu(tmp_path / "folder")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes are POSIX")
def test_a_named_pipe_is_read_like_a_file(tmp_path):
    """bash's ``<(...)`` hands over a pipe, which is not a regular file: it was refused as "found none"."""
    fifo = tmp_path / "pipe.conllu"
    os.mkfifo(fifo)
    text = "1\ta\ta\tX\t_\t_\t0\t_\t_\t_\n\n"
    writer = threading.Thread(target=fifo.write_text, args=(text,))
    writer.start()
    try:
        (s,) = load_conllu(fifo)
    finally:
        writer.join(timeout=10)
    assert s.forms == ["a"]


def test_sources_and_heads_of_the_wrong_kind_are_type_errors():
    (s,) = parse_conllu("1\ta\ta\tX\t_\t_\t0\t_\t_\t_\n")
    for call, message in [(lambda: read_conllu(b"1\ta"), "source must be a path .* got bytes"),
                          (lambda: read_conllu(io.BytesIO(b"1\ta")), "got a stream of bytes"),
                          (lambda: parse_conllu(None), "text must be a str"),
                          (lambda: write_conllu([s], None), "target must be a path .* got NoneType"),
                          # was "a bytes-like object is required, not 'str'", naming neither target nor the mode
                          (lambda: write_conllu([s], io.BytesIO()), "target must be a path or a text stream, got "
                                                                    "a binary stream BytesIO"),
                          (lambda: s.with_heads([0.7]), "heads must be integers, got float64"),
                          (lambda: s.with_heads(["0"]), "heads must be integers")]:
        with pytest.raises(TypeError, match=message):
            call()


def test_uas_excludes_gold_punctuation():
    gold = parse_conllu(SAMPLE)
    pred = [[4, 4, 1, 0, 1], [0, 1]]       # word 3 wrong; the punctuation of sentence 1 wrong
    assert attachment_counts(gold, pred) == (4, 5)
    assert uas(gold, pred) == pytest.approx(80.0)
    assert attachment_counts(gold, pred, punct=True) == (5, 7)
    assert uas(gold, gold) == 100.0
    with pytest.raises(ValueError, match="2 predicted heads for 5 words"):
        uas(gold, [[0, 1], [0, 1]])
    with pytest.raises(TypeError, match="predicted heads must be integers, got float64"):
        uas(gold, [np.array([4.7, 4, 1, 0, 1]), [0, 1]])
    for bad, value in (([4, 4, 1, 0, 6], 6), ([4, -1, 1, 0, 1], -1)):   # scored as wrong once, silently
        with pytest.raises(ValueError, match=rf"predicted\[0\]: heads must lie in \[0, 5\].*got {value}"):
            attachment_counts(gold, [bad, [0, 1]])


@pytest.mark.skipif(not EWT.is_dir(), reason="../shared/data/ud_english_ewt is absent")
@pytest.mark.parametrize("split,sentences,words,extra", [("dev", 2001, 25147, 363), ("test", 2077, 25094, 356)])
def test_real_ewt_counts_and_byte_identical_round_trip(split, sentences, words, extra):
    path = EWT / f"en_ewt-ud-{split}.conllu.gz"
    data = load_conllu(path)
    assert len(data) == sentences
    assert sum(len(s) for s in data) == words
    assert sum(len(s.extra) for s in data) == extra          # multiword tokens + empty nodes (SOURCE.md)
    with gzip.open(path, "rt", encoding="utf-8") as f:
        assert format_conllu(data) == f.read()


@pytest.mark.parametrize("head", ["\u00b2", "\u0661", "+1", " 1", "1.0"])
def test_head_must_be_ascii_digits(head):
    with pytest.raises(ValueError, match=r"^<string>:3: HEAD of word 1 must be an integer in 0..1 or '_', got "):
        parse_conllu(f"1\ta\ta\tX\t_\t_\t0\t_\t_\t_\n\n1\ta\ta\tX\t_\t_\t{head}\t_\t_\t_\n")
    assert parse_conllu("1\ta\ta\tX\t_\t_\t00\t_\t_\t_\n")[0].heads.tolist() == [0]


def test_sentences_know_their_first_line(tmp_path):
    path = tmp_path / "s.conllu"
    path.write_text(SAMPLE)
    assert [s.line for s in load_conllu(path)] == [1, 12]
    s1 = load_conllu(path)[0]
    assert s1.with_heads(s1.heads).line == 1 and s1 == parse_conllu(SAMPLE)[0]


def _fails(path: Path, message: str) -> None:
    """``load_conllu(path)`` raises a ValueError reading ``{path}{message}`` (``message`` a regex)."""
    with pytest.raises(ValueError, match=f"^{re.escape(str(path))}{message}"):
        load_conllu(path)


def test_corrupt_gzip_and_non_utf8_files_name_the_file(tmp_path):
    text = "1\ta\ta\tX\t_\t_\t0\t_\t_\t_\n\n"
    packed = gzip.compress(text.encode())
    cases = {"plain.conllu.gz": text.encode(), "truncated.conllu.gz": packed[:-6],
             "crc.conllu.gz": packed[:-8] + bytes(4) + packed[-4:]}
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
        _fails(tmp_path / name, r": not a valid gzip file \(expected gzip-compressed CoNLL-U")
    (tmp_path / "latin1.conllu").write_bytes(text.encode() + "1\tcaf\u00e9\tX\t_\t_\t0\t_\t_\t_\n".encode("latin-1"))
    _fails(tmp_path / "latin1.conllu", r":3: not UTF-8 text \(byte 0xe9\); expected a UTF-8 CoNLL-U file$")
    (tmp_path / "latin1.conllu.gz").write_bytes(gzip.compress(b"\xff" + text.encode()))
    _fails(tmp_path / "latin1.conllu.gz", r":1: not UTF-8 text \(byte 0xff\)")
    (tmp_path / "packed.conllu").write_bytes(packed)
    _fails(tmp_path / "packed.conllu", r":1: not UTF-8 text .*it looks gzip-compressed: name it .gz")
    with pytest.raises(ValueError, match=r"^<stream>: not UTF-8 text .*expected a UTF-8 CoNLL-U stream$"):
        read_conllu(io.TextIOWrapper(io.BytesIO(b"\xff\n"), encoding="utf-8"))


def test_a_truncated_gzip_file_that_is_not_utf8_names_the_file(tmp_path):
    # the bad byte is met before the end of the damaged stream: locating it must not hit that end (an EOFError
    # naming no file)
    packed = gzip.compress(b"\xff" + random.Random(0).randbytes(200_000))
    (tmp_path / "cut.conllu.gz").write_bytes(packed[: len(packed) // 2])
    _fails(tmp_path / "cut.conllu.gz", r":1: not UTF-8 text \(byte 0xff\)")


def test_a_byte_order_mark_is_not_part_of_the_first_line(tmp_path):
    plain = parse_conllu(SAMPLE)
    bom = "\ufeff" + SAMPLE
    (tmp_path / "bom.conllu").write_text(bom, encoding="utf-8")
    (tmp_path / "bom.conllu.gz").write_bytes(gzip.compress(bom.encode("utf-8")))
    (tmp_path / "word.conllu").write_text("\ufeff" + SAMPLE.split("\n", 3)[3], encoding="utf-8")   # BOM on a word line
    assert load_conllu(tmp_path / "bom.conllu") == plain
    assert load_conllu(tmp_path / "bom.conllu.gz") == plain
    assert parse_conllu(bom) == plain and read_conllu(io.StringIO(bom)) == plain
    assert load_conllu(tmp_path / "word.conllu")[0].words == plain[0].words


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (writes fail there)")
def test_a_failed_write_names_the_file():
    sentences = parse_conllu("1\tw\tw\tNOUN\t_\t_\t0\t_\t_\t_\n\n") * 10_000
    with pytest.raises(OSError) as info:
        write_conllu(sentences, "/dev/full")
    assert info.value.filename == "/dev/full" and info.value.strerror


@pytest.mark.parametrize("token_id, message", [
    ("-1", "neither a word"), ("1-", "neither a word"), ("1.x", "neither a word"), ("2-3", "starting at the next word"),
    ("1-1", "b > a"), ("2.1", "must be 0.k"), ("0.0", "k >= 1")])
def test_malformed_multiword_and_empty_node_ids_are_named(token_id, message):
    line = token_id + "\tx" + "\t_" * 8 + "\n"
    with pytest.raises(ValueError, match=rf"^<string>:1: .*{re.escape(message)}"):
        parse_conllu(line + "1\ta\t_\tX\t_\t_\t0\t_\t_\t_\n")
    assert len(parse_conllu("0.1\tx" + "\t_" * 8 + "\n1\ta\t_\tX\t_\t_\t0\t_\t_\t_\n")[0]) == 1   # a node before word 1


def _word(i: int) -> str:
    return f"{i}\tw{i}\t_\tX\t_\t_\t0\t_\t_\t_\n"


def _token(token_id: str) -> str:
    return token_id + "\tx" + "\t_" * 8 + "\n"


@pytest.mark.parametrize("lines, message", [
    ([_word(1), _token("2-3"), _word(2)], "<string>:2: multi-word token '2-3' ends past the sentence's last word (2)"),
    ([_token("1-2"), _token("1-3"), _word(1), _word(2), _word(3)], "<string>:2: multi-word token '1-3' overlaps"),
    ([_token("1-2"), _word(1), _token("2-3"), _word(2), _word(3)], "<string>:3: multi-word token '2-3' overlaps"),
    ([_token("١-٢"), _word(1), _word(2)], "neither a word"),                   # Arabic-Indic digits
])
def test_multiword_ranges_past_the_end_overlapping_or_of_other_digits_are_named(lines, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_conllu("".join(lines))
    assert len(parse_conllu(_token("1-2") + _word(1) + _word(2) + _token("3-4") + _word(3) + _word(4))[0]) == 4


@pytest.mark.parametrize("line, message", [
    ("1\ta\ta\tX\t_\t_\t" + "9" * 5000 + "\t_\t_\t_\n", "<string>:1: HEAD of word 1 must be an integer in 0..1"),
    ("1-" + "9" * 5000 + "\tx" + "\t_" * 8 + "\n" + _word(1), "<string>:1: multi-word token '1-999"),
    ("9" * 5000 + ".1\tx" + "\t_" * 8 + "\n" + _word(1), "<string>:1: empty node ID '999"),
], ids=["head", "multi-word token", "empty node"])
def test_numbers_of_thousands_of_digits_are_named_like_any_out_of_range_number(line, message):
    """int() refuses more than 4300 digits: its error named no file and advised sys.set_int_max_str_digits()."""
    with pytest.raises(ValueError, match=f"^{re.escape(message)}"):
        parse_conllu(line)
    sentence = parse_conllu("1\ta\ta\tX\t_\t_\t" + "0" * 5000 + "\t_\t_\t_\n")[0]
    assert sentence.heads.tolist() == [0]                        # leading zeros, as in '00', are still read


def test_extra_lines_are_written_by_their_position_and_one_past_the_words_is_named():
    # format_conllu wrote a sentence's multi-word tokens / empty nodes only while they came in order of position:
    # one listed after a later one, or placed outside 0..len(words), was silently left out of the text
    s = parse_conllu(SAMPLE)[0]
    shuffled = Sentence(s.comments, s.words, list(reversed(s.extra)))
    assert format_conllu([shuffled]) == format_conllu([s])
    token = s.extra[0][1]
    for k in (-1, len(s) + 1):
        with pytest.raises(ValueError, match=rf"^sentence 1: the line '2-3' has position {k}, not in 0\.\.5 "):
            format_conllu([Sentence(s.comments, s.words, [(k, token)])])


@pytest.mark.parametrize("heads, error, message", [
    ([-1, 0], ValueError, r"heads must lie in \[0, 2\], got -1"),        # was [-1]: "word -1" on a cycle
    ([0, 3], ValueError, r"heads must lie in \[0, 2\], got 3"),          # was IndexError: list index out of range
    ([1.5, 0], TypeError, "heads must be integers, got float64"),        # was [1]: 1.5 read as 1, a self-loop
    ([[0]], ValueError, r"heads must be one head per word \(1-D\), got shape \(1, 1\)"),
])
def test_head_cycle_names_heads_that_are_not_words_or_the_root(heads, error, message):
    from betheproj.data.conllu import head_cycle

    with pytest.raises(error, match=f"^{message}$"):
        head_cycle(heads)
    assert head_cycle([0, 1, 2]) is None and head_cycle([2, 3, 2]) == [2, 3] and head_cycle([]) is None


@pytest.mark.parametrize("edit, message", [
    (lambda s: s.words[1].pop(), r"sentence 1: the line '2\\tdo\\tdo\\tAUX.*' is not 10 tab-separated columns"),
    (lambda s: s.words[1].__setitem__(1, "do\n\n1"), r"sentence 1: the line '2\\tdo\\n\\n1\\t.*' is not 10 tab-sep"),
    (lambda s: s.extra[0][1].__setitem__(1, "do\tnot"), r"sentence 1: the line '2-3\\tdo\\tnot.*' is not 10 tab"),
    (lambda s: s.comments.append("sent_id = x"), r"sentence 1: the comment 'sent_id = x' does not start with '#'"),
    (lambda s: s.comments.append("# a\n1"), r"sentence 1: the comment '# a\\n1' holds a line break"),
    # a carriage return splits a line as the reader's universal newlines read it; white space alone is a break
    (lambda s: s.comments.append("# a\rb"), r"sentence 1: the comment '# a\\rb' holds a line break"),
    (lambda s: s.words[1].__setitem__(1, "a\rb"), r"sentence 1: the line '2\\ta\\rb\\t.*' is not 10 tab-sep"),
    (lambda s: s.words.__setitem__(1, [" "] * 10), r"sentence 1: the line ' \\t \\t.*' is not 10 tab-separated"),
])
def test_the_writer_refuses_lines_it_could_not_read_back(edit, message):
    # format_conllu wrote these silently: a 9-column word or a tab in a field (a file read_conllu rejects), a
    # newline in a field or comment (a line, or a sentence, split in two), a comment without '#' (read as a word)
    s = parse_conllu(SAMPLE)[0]
    edit(s)
    with pytest.raises(ValueError, match=f"^{message}"):
        format_conllu([s])


def test_the_writer_names_what_is_not_a_sentence_or_a_column():
    # an AttributeError ('str' object has no attribute 'comments') and str.join's TypeError, naming nothing
    with pytest.raises(TypeError, match="sentence 1 must be a Sentence, got str"):
        format_conllu(["abc"])
    s = parse_conllu(SAMPLE)[0]
    s.words[0][6] = 0
    with pytest.raises(TypeError, match=r"sentence 1: the columns of a line must be str, got int 0 in \['1', "):
        format_conllu([s])
