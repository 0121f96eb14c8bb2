"""Bad input to the parsers and the ``parse`` CLI: output paths checked before training or parsing, gold heads
that are not trees, dev / eval data with nothing to score, empty input to second-order models."""

from __future__ import annotations

import contextlib
import io
import math
import os
import warnings

import numpy as np
import pytest
import torch

from betheproj.data.conllu import parse_conllu
from betheproj.parsing import DependencyParser
from betheproj.parsing.cli import main
from betheproj.parsing.metrics import scorable_words
from betheproj.parsing.parser import is_projective, tree_error
from betheproj.parsing.pruning import prune
from betheproj.parsing.second_order import SecondOrderParser
from tests.trees import reaches_root

from .test_parser import _treebank


def _conllu(*sentences: list[int | str], upos: str = "NOUN") -> str:
    """CoNLL-U text of sentences given as their HEAD columns."""
    return "".join("".join(f"{i}\tw{i}\tw{i}\t{upos}\t_\t_\t{h}\t_\t_\t_\n" for i, h in enumerate(heads, 1)) + "\n"
                   for heads in sentences)


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict:
    """A (barely) trained first-order model and a second-order model on top of it, with their data."""
    d = tmp_path_factory.mktemp("models")
    train = d / "train.conllu"
    train.write_text(_treebank(6))
    first, second = d / "first.pt", d / "second.pt"
    parser = DependencyParser(bits=10)
    parser.fit(parse_conllu(train.read_text()), epochs=1)
    parser.save(first)
    SecondOrderParser(parser, bits=10).save(second)
    return {"dir": d, "train": train, "first": first, "second": second}


def _no_training(*args, **kwargs):
    raise AssertionError("training started although an argument was bad")


# ------------------------------------------------------------------------------------------- output paths

def test_train_checks_model_path_before_training(models, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(DependencyParser, "fit", _no_training)
    monkeypatch.setattr(SecondOrderParser, "fit", _no_training)
    afile = tmp_path / "afile"
    afile.write_text("x")
    folder = tmp_path / "folder"
    folder.mkdir()
    base = ["train", "--train", str(models["train"]), "--quiet", "--model"]
    assert main([*base, str(afile / "x.pt")]) == 2
    assert f"the folder of --model {afile / 'x.pt'} ({afile}) is not a directory" in _one_error_line(capsys)
    assert main([*base, str(folder)]) == 2
    assert f"--model {folder} is a directory; expected a file name" in _one_error_line(capsys)
    assert main([*base, str(folder), "--second-order", str(models["first"])]) == 2
    assert "is a directory" in _one_error_line(capsys)
    assert main([*base, str(tmp_path / "missing" / "x.pt")]) == 2
    assert "the folder of --model" in _one_error_line(capsys)
    assert not any(folder.iterdir())


def test_predict_checks_output_path_before_parsing(models, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(DependencyParser, "predict", _no_training)
    afile = tmp_path / "afile"
    afile.write_text("x")
    base = ["predict", "--model", str(models["first"]), "--input", str(models["train"]), "--quiet", "--output"]
    assert main([*base, str(tmp_path)]) == 2
    assert f"--output {tmp_path} is a directory; expected a file name" in _one_error_line(capsys)
    assert main([*base, str(afile / "out.conllu")]) == 2
    assert "is not a directory" in _one_error_line(capsys)
    assert afile.read_text() == "x"


def test_a_model_is_not_written_over_the_data_or_the_output_over_the_model(models, tmp_path, monkeypatch, capsys):
    """'parse train --model' naming the --train or --dev file replaced the treebank with the model, 'parse predict
    --output' naming the --model file replaced the model with CoNLL-U, and naming the --input file replaced its gold
    heads with the predicted ones, all with exit 0."""
    monkeypatch.setattr(DependencyParser, "fit", _no_training)
    monkeypatch.setattr(DependencyParser, "predict", _no_training)
    data, model = tmp_path / "data.conllu", tmp_path / "model.pt"
    data.write_bytes(models["train"].read_bytes())
    model.write_bytes(models["first"].read_bytes())
    (tmp_path / "link.conllu").symlink_to(data)
    cases = [(["train", "--train", str(data), "--model", str(data)], f"--model {data} is the --train file"),
             (["train", "--train", str(models["train"]), "--dev", str(data), "--model", str(tmp_path / "link.conllu")],
              f"--model {tmp_path / 'link.conllu'} is the --dev file"),
             (["predict", "--model", str(model), "--input", str(data), "--output", str(model)],
              f"--output {model} is the --model file"),
             (["predict", "--model", str(model), "--input", str(data), "--output", str(tmp_path / "link.conllu")],
              f"--output {tmp_path / 'link.conllu'} is the --input file")]
    for args, message in cases:
        assert main([*args, "--quiet"]) == 2, args
        assert f"betheproj parse: error: {message}" in _one_error_line(capsys)
    assert data.read_bytes() == models["train"].read_bytes() and model.read_bytes() == models["first"].read_bytes()


def test_a_second_order_model_is_not_written_over_its_first_order_model(models, tmp_path, monkeypatch, capsys):
    """'parse train --second-order M.pt --model M.pt' trained and then replaced the first-order model M.pt with the
    second-order model, with exit 0; it is refused before loading or training, also through a symbolic link."""
    monkeypatch.setattr(DependencyParser, "fit", _no_training)
    monkeypatch.setattr(SecondOrderParser, "fit", _no_training)
    model = tmp_path / "first.pt"
    model.write_bytes(models["first"].read_bytes())
    (tmp_path / "link.pt").symlink_to(model)
    for out in (model, tmp_path / "link.pt"):
        args = ["train", "--train", str(models["train"]), "--second-order", str(model), "--model", str(out), "--quiet"]
        assert main(args) == 2, out
        assert (f"betheproj parse: error: --model {out} is the --second-order file {model}; writing there would "
                "overwrite it") in _one_error_line(capsys)
    assert model.read_bytes() == models["first"].read_bytes()


def test_predict_writes_to_a_pipe_or_device_given_as_output(models, capsys):
    """'--output /dev/fd/N' (bash's >(...)) or '--output /dev/stdout' was refused: the check probed the folder
    (/dev/fd takes no new file) although a pipe or a device is written in place."""
    read, write = os.pipe()
    try:
        assert main(["predict", "--model", str(models["first"]), "--input", str(models["train"]), "--quiet",
                     "--output", f"/dev/fd/{write}"]) == 0
        os.close(write)
        with os.fdopen(read) as pipe:
            written = pipe.read()
    finally:
        for fd in (read, write):
            with contextlib.suppress(OSError):
                os.close(fd)
    assert written.count("\n") == models["train"].read_text().count("\n")
    assert main(["predict", "--model", str(models["first"]), "--input", str(models["train"]), "--quiet",
                 "--output", os.devnull]) == 0
    capsys.readouterr()


def test_predict_writes_standard_output_for_a_dash(models, tmp_path, monkeypatch, capsys):
    """'--input -' reads standard input, but '--output -' wrote a file named '-' in the working folder."""
    monkeypatch.chdir(tmp_path)
    base = ["predict", "--model", str(models["first"]), "--input", str(models["train"]), "--quiet"]
    assert main(base) == 0
    to_stdout = capsys.readouterr().out
    assert main([*base, "--output", "-"]) == 0
    assert capsys.readouterr().out == to_stdout and not (tmp_path / "-").exists()


def test_train_checks_the_model_folder_is_writable_before_training(models, tmp_path, monkeypatch, capsys):
    import errno
    import os

    from betheproj import _files

    def read_only(*args, **kwargs):                  # root ignores chmod: fake a read-only mount
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(DependencyParser, "fit", _no_training)
    monkeypatch.setattr(_files.tempfile, "mkstemp", read_only)
    assert main(["train", "--train", str(models["train"]), "--quiet", "--model", str(tmp_path / "m.pt")]) == 2
    assert f"--model {tmp_path / 'm.pt'}: cannot write in the folder {tmp_path} (Read-only file system)" in \
        _one_error_line(capsys)


def test_a_model_that_cannot_be_written_is_an_os_error_naming_it(models, tmp_path, monkeypatch, capsys):
    missing = tmp_path / "missing" / "m.pt"
    with pytest.raises(OSError, match=f"cannot write {missing}"):
        DependencyParser.load(models["first"]).save(missing)
    with pytest.raises(OSError, match=f"cannot write {missing}"):
        SecondOrderParser.load(models["second"]).save(missing)

    def full(*args, **kwargs):                       # the folder passed the probe, the write fails anyway
        raise RuntimeError("[enforce fail at inline_container.cc:600] . PytorchStreamWriter failed writing file "
                           "data/0: file write failed")

    monkeypatch.setattr(torch, "save", full)
    out = tmp_path / "m.pt"
    assert main(["train", "--train", str(models["train"]), "--bits", "10", "--epochs", "1", "--quiet",
                 "--model", str(out)]) == 2
    assert f"error: cannot write {out} (" in _one_error_line(capsys)



@pytest.mark.parametrize("option", [["--loss", "svm"], ["--loss", "crf"], ["--lam", "0.01"], ["--projective"],
                                    ["--single-root"], ["--xpos"]])
def test_first_order_options_are_refused_with_second_order(models, tmp_path, monkeypatch, capsys, option):
    monkeypatch.setattr(SecondOrderParser, "fit", _no_training)
    assert main(["train", "--train", str(models["train"]), "--second-order", str(models["first"]), "--quiet",
                 "--model", str(tmp_path / "m.pt"), *option]) == 2
    assert f"error: {option[0]} cannot be given with --second-order" in _one_error_line(capsys)


def test_bits_with_second_order_name_the_option_and_its_range(models, tmp_path, monkeypatch, capsys):
    # the second-order part features take at most 2^28 weights: --bits 29 or 30 used to pass the option's check and
    # fail later as "bits must be an int in [8, 28]"
    monkeypatch.setattr(SecondOrderParser, "fit", _no_training)
    assert main(["train", "--train", str(models["train"]), "--second-order", str(models["first"]), "--quiet",
                 "--model", str(tmp_path / "m.pt"), "--bits", "29"]) == 2
    assert "error: --bits must lie in 8..28 with --second-order, got 29" in _one_error_line(capsys)


@pytest.mark.parametrize("lam", ["inf", "nan", "0", "-0.5"])
def test_lam_must_be_finite_and_positive(models, tmp_path, monkeypatch, capsys, lam):
    monkeypatch.setattr(DependencyParser, "fit", _no_training)
    assert main(["train", "--train", str(models["train"]), "--quiet", "--model", str(tmp_path / "m.pt"),
                 "--lam", lam]) == 2
    assert f"betheproj parse: error: --lam must be a finite number > 0, got {float(lam)}" in _one_error_line(capsys)


def test_the_perceptron_loss_which_never_leaves_the_zero_start_is_refused(models, tmp_path, capsys):
    """At w = 0 every tree ties, so the perceptron loss and Algorithm 1's step are 0: 'parse train --loss perceptron'
    wrote an all-zero model (dev UAS that of a fixed tree) and exited 0."""
    with pytest.raises(SystemExit) as exit_:
        main(["train", "--train", str(models["train"]), "--quiet", "--model", str(tmp_path / "m.pt"),
              "--loss", "perceptron"])
    assert exit_.value.code == 2 and "argument --loss: invalid choice: 'perceptron'" in _one_error_line(capsys)
    assert not (tmp_path / "m.pt").exists()
    sentences = parse_conllu(models["train"].read_text())
    for options in ({"loss": "perceptron"}, {"loss": None, "beta": math.inf, "gamma": 0.0}):
        with pytest.raises(ValueError, match=r"the perceptron loss \(beta = inf, gamma = 0\) makes no step"):
            DependencyParser(bits=10).fit(sentences, epochs=1, **options)


@pytest.mark.parametrize("text", ["", "\n\n"])
def test_a_training_file_without_sentences_is_named(models, tmp_path, monkeypatch, capsys, text):
    monkeypatch.setattr(DependencyParser, "fit", _no_training)
    empty = tmp_path / "empty.conllu"
    empty.write_text(text)
    assert main(["train", "--train", str(empty), "--quiet", "--model", str(tmp_path / "m.pt")]) == 2
    assert f"betheproj parse: error: --train {empty} holds no sentences" in _one_error_line(capsys)


def test_a_second_order_model_given_as_first_is_named(models, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(SecondOrderParser, "fit", _no_training)
    assert main(["train", "--train", str(models["train"]), "--second-order", str(models["second"]), "--quiet",
                 "--model", str(tmp_path / "m.pt")]) == 2
    assert (f"error: --second-order {models['second']} is a second-order model; --second-order needs an "
            "arc-factored one") in _one_error_line(capsys)
    (tmp_path / "junk.pt").write_bytes(b"junk")
    assert main(["train", "--train", str(models["train"]), "--second-order", str(tmp_path / "junk.pt"), "--quiet",
                 "--model", str(tmp_path / "m.pt")]) == 2
    err = _one_error_line(capsys)
    assert "junk.pt is not a parser model file (torch.load cannot read it: not a file torch.save wrote" in err
    assert "weights_only" not in err                          # torch's advice on unsafe loading is not ours


def test_a_projective_model_given_as_first_is_named(models, tmp_path, monkeypatch, capsys):
    """The second-order model's own check said "give a non-projective first-order parser", naming no option or file,
    after the training treebank was read."""
    monkeypatch.setattr(SecondOrderParser, "fit", _no_training)
    projective = tmp_path / "projective.pt"
    parser = DependencyParser(bits=10, projective=True)
    parser.fit(parse_conllu(models["train"].read_text()), epochs=1)
    parser.save(projective)
    assert main(["train", "--train", str(models["train"]), "--second-order", str(projective), "--quiet",
                 "--model", str(tmp_path / "m.pt")]) == 2
    assert _one_error_line(capsys) == (
        f"betheproj parse: error: --second-order {projective} is a projective model; second-order parsing is "
        "non-projective: give an arc-factored model trained without --projective\n")


def _broken(state: dict, drop: str | None = None, **changes) -> dict:
    state = {**state, **changes}
    if drop is not None:
        del state[drop]
    return state


def test_malformed_models_are_one_line_errors_naming_the_file(models, tmp_path, capsys):
    data = models["train"]
    first = torch.load(models["first"], weights_only=True)
    second = torch.load(models["second"], weights_only=True)
    cases = [(_broken(first, "config"), "a malformed parser model (no field 'config')"),
             (_broken(first, config={}), "a malformed parser model (no field 'bits')"),
             (_broken(second, "first_config"), "a malformed second-order parser model (no field 'first_config')"),
             (_broken(second, w2=second["w2"][:-5]), f"w2 has shape ({len(second['w2']) - 5},), not "
                                                     f"({len(second['w2'])},)"),
             (_broken(second, pruner=second["pruner"][:7]), "pruner has shape (7,)"),
             (_broken(first, version=2), "unsupported model version 2 (expected 1)")]
    for k, (state, message) in enumerate(cases):
        path = tmp_path / f"broken{k}.pt"
        torch.save(state, path)
        assert main(["eval", "--model", str(path), "--data", str(data), "--quiet"]) == 2
        assert f"{path}" in (err := _one_error_line(capsys)) and message in err, err


def test_models_with_weights_or_settings_out_of_range_are_named(models, tmp_path, capsys):
    # integer weights used to be a traceback; NaN weights and out-of-range settings failed in the decoders or the
    # pruner without naming the file
    data = models["train"]
    first = torch.load(models["first"], weights_only=True)
    second = torch.load(models["second"], weights_only=True)
    cases = [(_broken(first, weights=first["weights"].long()), "weights must be float32 or float64, got torch.int64"),
             (_broken(first, weights=torch.full_like(first["weights"], math.nan)), "weights hold NaN or infinite"),
             (_broken(first, config={**first["config"], "bits": 100}),
              "a malformed parser model (a field out of range: bits must be an int in [8, 30], got 100)"),
             (_broken(second, w1=second["w1"].long()), "w1 must be float32 or float64, got torch.int64"),
             (_broken(second, w2=second["w2"].int()), "w2 must be float32 or float64, got torch.int32"),
             (_broken(second, pruner=torch.full_like(second["pruner"], math.inf)), "pruner hold NaN or infinite"),
             (_broken(second, top_k=0), "top_k must be an int >= 1, got 0"),
             (_broken(second, min_prob=math.nan), "min_prob must be a finite number in [0, 1), got nan"),
             # sparse or meta weights were a traceback from the finiteness check
             (_broken(first, weights=first["weights"].to_sparse()), "weights must be a dense tensor with values"),
             (_broken(first, weights=first["weights"].to("meta")), "weights must be a dense tensor with values"),
             (_broken(second, w2=second["w2"].to_sparse()), "w2 must be a dense tensor with values")]
    for k, (state, message) in enumerate(cases):
        path = tmp_path / f"bad{k}.pt"
        torch.save(state, path)
        assert main(["eval", "--model", str(path), "--data", str(data), "--quiet"]) == 2
        assert f"{path}" in (err := _one_error_line(capsys)) and message in err, err


def test_first_order_training_applies_the_stated_defaults(models, tmp_path, monkeypatch):
    seen = {}

    def fit(self, train, **options):
        seen.update(options, **self.config())
        raise KeyboardInterrupt                      # stop here: main reports it as an interrupt

    monkeypatch.setattr(DependencyParser, "fit", fit)
    assert main(["train", "--train", str(models["train"]), "--quiet", "--model", str(tmp_path / "m.pt")]) == 130
    assert seen["loss"] == "crf" and seen["lam"] == 1e-4
    assert seen["projective"] is False and seen["single_root"] is False and seen["xpos"] is False


# ------------------------------------------------------------------------------------------- gold trees

def _reference_is_tree(heads: list[int], single_root: bool) -> bool:
    """Every word reaches 0 within n steps and (single_root) one word hangs from 0."""
    return reaches_root(heads) and (not single_root or heads.count(0) == 1)


def test_tree_error_matches_a_reference_on_random_head_arrays():
    rng = np.random.default_rng(0)
    for _ in range(2000):
        n = int(rng.integers(1, 7))
        heads = rng.integers(0, n + 1, size=n)
        for single_root in (False, True):
            assert (tree_error(heads, single_root) is None) == _reference_is_tree(heads.tolist(), single_root)
    assert tree_error(np.array([2, 1, 0])) == "gold heads are not a tree: words 1, 2 form a cycle"
    assert tree_error(np.array([0, 2])) == "gold heads are not a tree: word 2 is its own HEAD"
    assert tree_error(np.array([2, 3, 1])).endswith("no word is attached to the root 0")
    assert tree_error(np.array([0, 0])) is None
    assert tree_error(np.array([], dtype=np.int64)) == "no words"
    assert tree_error(np.array([0, 5])) == "HEAD 5 of word 2 is not in 0..2"
    assert "2 words are attached to the root 0" in tree_error(np.array([0, 0]), single_root=True)


@pytest.mark.parametrize(("heads", "error", "message"), [
    ([0.5], TypeError, "heads must be integers, got float64"),            # tree_error was None: a tree
    (["0"], TypeError, "heads must be integers, got <U1"),                # tree_error was None: a tree
    ([True], TypeError, "heads must be integers, got bool"),
    ([[0]], ValueError, r"heads must be one head per word \(1-D\), got shape \(1, 1\)"),   # is_projective: True
])
def test_tree_error_and_is_projective_refuse_heads_that_are_not_integers(heads, error, message):
    for check in (tree_error, is_projective):
        with pytest.raises(error, match=f"^{message}$"):
            check(heads)


@pytest.mark.parametrize("heads", [[5], [-1, 0]])
def test_is_projective_refuses_heads_that_are_not_words_or_the_root(heads):
    # is_projective([5]) was True, is_projective([-1, 0]) False: answers about arcs that are not in any tree
    with pytest.raises(ValueError, match=rf"^heads must lie in \[0, {len(heads)}\], got {heads[0]}$"):
        is_projective(heads)


@pytest.mark.parametrize(("heads", "single_root", "reason"), [
    ([2, 1, 0], False, "words 1, 2 form a cycle"),
    ([1, 0], False, "word 1 is its own HEAD"),
    ([2, 3, 1], False, "no word is attached to the root 0"),
    ([0, 0, 2], True, "2 words are attached to the root 0"),
])
def test_train_rejects_gold_heads_that_are_not_trees(tmp_path, monkeypatch, capsys, heads, single_root, reason):
    monkeypatch.setattr(DependencyParser, "fit", _no_training)
    train = tmp_path / "bad.conllu"
    train.write_text(_conllu([0, 1], heads))                      # the bad sentence (the 2nd) starts on line 4
    args = ["train", "--train", str(train), "--model", str(tmp_path / "m.pt"), "--quiet", "--epochs", "1"]
    assert main(args + (["--single-root"] if single_root else [])) == 2
    err = _one_error_line(capsys)
    assert f"{train}:4: training sentence 2: " in err and reason in err
    monkeypatch.undo()
    with pytest.raises(ValueError, match=f"^training sentence 2: .*{reason}"):
        DependencyParser(bits=10, single_root=single_root).fit(parse_conllu(train.read_text()), epochs=1)


def test_second_order_training_rejects_gold_heads_that_are_not_trees(models, tmp_path, capsys):
    bad = parse_conllu(_conllu([0, 1], [2, 1, 0]))
    parser = SecondOrderParser(DependencyParser.load(models["first"]), bits=10)
    with pytest.raises(ValueError, match="training sentence 2: gold heads are not a tree: words 1, 2 form a cycle"):
        parser.fit(bad, epochs=1)
    train = tmp_path / "cyc.conllu"
    train.write_text(_conllu([0, 1], [2, 1, 0]))
    assert main(["train", "--train", str(train), "--model", str(tmp_path / "so.pt"), "--second-order",
                 str(models["first"]), "--quiet"]) == 2
    assert f"{train}:4: training sentence 2: gold heads are not a tree" in _one_error_line(capsys)


def test_training_still_accepts_proper_trees_with_several_roots():
    parser = DependencyParser(bits=10)
    data = parse_conllu(_conllu([0, 0, 2], [0, 1]))
    parser.fit(data, epochs=1)
    assert parser.weights.abs().sum() > 0                    # it trained (the weights start at 0)
    assert [h.tolist() for h in parser.predict(data)] == [[0, 0, 2], [0, 1]]      # two roots kept (measured)


def _reference_is_projective(heads: list[int]) -> bool:
    """Projective iff every word strictly between the ends of an arc ``h -> m`` descends from ``h``."""
    def descends(v: int, h: int) -> bool:
        while v != 0 and v != h:
            v = heads[v - 1]
        return v == h

    return all(descends(v, h) for m, h in enumerate(heads, 1) for v in range(min(h, m) + 1, max(h, m)))


def test_is_projective_matches_a_reference_on_random_trees():
    rng = np.random.default_rng(1)
    seen = {True: 0, False: 0}
    for _ in range(3000):
        n = int(rng.integers(1, 8))
        heads = rng.integers(0, n + 1, size=n)
        if tree_error(heads) is not None:
            continue
        expected = _reference_is_projective(heads.tolist())
        assert is_projective(heads) == expected, heads
        seen[expected] += 1
    assert min(seen.values()) > 50
    assert not is_projective(np.array([3, 4, 0, 3]))           # 1 <- 3 and 2 <- 4 cross
    assert not is_projective(np.array([0, 4, 1, 1]))           # 3's span [1,3] holds word 2, a child of 4
    assert is_projective(np.array([2, 0, 2]))


@pytest.mark.filterwarnings("default::UserWarning")      # the CLI's one-line warning, whatever pytest's -W says
def test_projective_training_on_non_projective_gold_warns(tmp_path, capsys):
    text = _conllu([3, 4, 0, 3], [2, 0, 2])                   # the first tree has crossing arcs
    with pytest.warns(UserWarning, match="^1 of 2 training sentences have a non-projective gold tree"):
        DependencyParser(bits=10, projective=True).fit(parse_conllu(text), epochs=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")                          # non-projective parsers and projective gold: silent
        DependencyParser(bits=10).fit(parse_conllu(text), epochs=1)
        DependencyParser(bits=10, projective=True).fit(parse_conllu(_conllu([2, 0, 2])), epochs=1)
    train = tmp_path / "crossing.conllu"
    train.write_text(text)
    assert main(["train", "--train", str(train), "--model", str(tmp_path / "p.pt"), "--projective", "--quiet",
                 "--epochs", "1"]) == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("betheproj: warning: 1 of 2 training sentences"), err


# ------------------------------------------------------------------------------------------- nothing to score

@pytest.mark.parametrize("text", ["", _conllu(["_", "_"]), _conllu([0, 1], upos="PUNCT")])
def test_dev_without_gold_heads_is_rejected(models, tmp_path, monkeypatch, capsys, text):
    monkeypatch.setattr(DependencyParser, "fit", _no_training)
    monkeypatch.setattr(SecondOrderParser, "fit", _no_training)
    dev = tmp_path / "dev.conllu"
    dev.write_text(text)
    base = ["train", "--train", str(models["train"]), "--dev", str(dev), "--model", str(tmp_path / "m.pt"),
            "--quiet"]
    for extra in ([], ["--second-order", str(models["first"])]):
        assert main(base + extra) == 2
        assert f"--dev {dev} has no words with a gold HEAD (punctuation excluded)" in _one_error_line(capsys)
    monkeypatch.undo()
    train, dev_sents = parse_conllu(models["train"].read_text()), parse_conllu(text)
    with pytest.raises(ValueError, match="dev has no words with a gold HEAD"):
        DependencyParser(bits=10).fit(train, epochs=1, dev=dev_sents)
    with pytest.raises(ValueError, match="dev has no words with a gold HEAD"):
        SecondOrderParser(DependencyParser.load(models["first"]), bits=10).fit(train, dev=dev_sents)


def test_second_order_best_dev_score_ignores_nan(models, monkeypatch):
    train = parse_conllu(models["train"].read_text())
    parser = SecondOrderParser(DependencyParser.load(models["first"]), bits=10)
    scores = iter([math.nan, 50.0, 40.0])
    weights = []

    def evaluate(*args, **kwargs) -> float:
        weights.append(parser.w2.detach().clone())
        return next(scores)

    monkeypatch.setattr(parser, "evaluate", evaluate)
    parser.fit(train, epochs=3, max_batch=len(train), dev=train[:2], eval_every=1, lr_first=0.0)
    assert parser.info["best_dev"] == 50.0
    assert [s for _, s in parser.info["dev_history"]][1:] == [50.0, 40.0]
    assert torch.equal(parser.w2, weights[1]) and not torch.equal(weights[1], weights[0])


@pytest.mark.parametrize("text", ["", _conllu(["_", "_"]), _conllu([0, 1], upos="PUNCT")])
def test_eval_without_gold_heads_is_an_error(models, tmp_path, capsys, text):
    data = tmp_path / "data.conllu"
    data.write_text(text)
    for model in ("first", "second"):
        assert main(["eval", "--model", str(models[model]), "--data", str(data), "--quiet"]) == 2
        assert f"--data {data} has no words with a gold HEAD" in _one_error_line(capsys)


def test_eval_scores_punctuation_only_data_with_punct(models, tmp_path, capsys):
    data = tmp_path / "data.conllu"
    data.write_text(_conllu([0, 1], upos="PUNCT"))
    assert scorable_words(parse_conllu(data.read_text())) == 0
    assert scorable_words(parse_conllu(data.read_text()), punct=True) == 2
    assert main(["eval", "--model", str(models["first"]), "--data", str(data), "--punct", "--quiet"]) == 0
    assert "/2, all words)" in capsys.readouterr().out


def test_eval_does_not_claim_to_exclude_punctuation_from_data_without_upos_punct(models, tmp_path, capsys):
    """CoNLL-X data (TurboParser's sample tags punctuation PUNC) had every word scored under "punctuation
    excluded"."""
    data = tmp_path / "data.conllu"
    data.write_text(_conllu([0, 1, 1], upos="PUNC"))
    assert main(["eval", "--model", str(models["first"]), "--data", str(data), "--quiet"]) == 0
    assert "/3, no word has UPOS PUNCT: none excluded) on 1 sentences" in capsys.readouterr().out


# ------------------------------------------------------------------------------------------- empty input

def test_second_order_model_on_empty_input(models, tmp_path, capsys):
    empty = tmp_path / "empty.conllu"
    empty.write_text("")
    out = tmp_path / "out.conllu"
    assert main(["predict", "--model", str(models["second"]), "--input", str(empty), "--output", str(out),
                 "--quiet"]) == 0
    assert out.read_text() == ""
    capsys.readouterr()
    assert main(["predict", "--model", str(models["second"]), "--input", str(empty), "--quiet"]) == 0
    assert capsys.readouterr().out == ""
    parser = SecondOrderParser.load(models["second"])
    cands = prune(parser.first, parser.pruner, [])
    assert cands.offsets.tolist() == [0] and len(cands.mod) == 0 and math.isnan(cands.recall)
    assert cands.ids.shape == (0, parser.first.features.num_slots)
    for method in ("mean_field", "loopy_bp", "first_order"):
        assert parser.predict([], method=method) == []


def test_parsers_refuse_what_is_not_a_list_of_sentences(models):
    # a string, one Sentence or a list of strings used to be an AttributeError ('str' object has no attribute 'words')
    first = DependencyParser.load(models["first"])
    second = SecondOrderParser.load(models["second"])
    sentences = parse_conllu(models["train"].read_text())
    calls = [first.predict, first.arc_scores, first.parse, second.predict, DependencyParser(bits=8).fit,
             SecondOrderParser(first, bits=8).fit]
    for call in calls:
        with pytest.raises(TypeError, match=r"^sentences\[1\] must be a Sentence .*got str$"):
            call([sentences[0], "w1 w2"])
        with pytest.raises(TypeError, match=r"^sentences must be a list of Sentence .*got Sentence$"):
            call(sentences[0])
        with pytest.raises(TypeError, match=r"^sentences must be a list of Sentence .*got str$"):
            call("w1 w2")
    for fit in (DependencyParser(bits=8).fit, SecondOrderParser(first, bits=8).fit):
        with pytest.raises(TypeError, match=r"^dev\[0\] must be a Sentence .*got str$"):
            fit(sentences, epochs=1, dev=["w1 w2"])


# ------------------------------------------------------------------------------------------- standard input

def test_predict_reads_standard_input_for_a_dash(models, monkeypatch, capsys):
    text = models["train"].read_text()
    assert main(["predict", "--model", str(models["first"]), "--input", str(models["train"]), "--quiet"]) == 0
    from_file = capsys.readouterr().out
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(("\ufeff" + text).encode())))
    assert main(["predict", "--model", str(models["first"]), "--input", "-", "--quiet"]) == 0
    assert capsys.readouterr().out == from_file and from_file.count("\n") == text.count("\n")
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"1\tw\xff\tw\tNOUN\t_\t_\t0\t_\t_\t_\n")))
    assert main(["predict", "--model", str(models["first"]), "--input", "-", "--quiet"]) == 2
    assert "--input: standard input is not UTF-8 text" in _one_error_line(capsys)


@pytest.mark.parametrize("newline", ["\r", "\r\n"], ids=["CR", "CRLF"])
def test_predict_reads_the_same_lines_from_standard_input_as_from_a_file(models, tmp_path, monkeypatch, capsys,
                                                                          newline):
    """A file is read with universal newlines, standard input was split at \\n alone: lines ended by a bare \\r
    parsed from a file and were one line of too many columns from standard input."""
    source = tmp_path / "in.conllu"
    source.write_bytes(models["train"].read_text().replace("\n", newline).encode())
    assert main(["predict", "--model", str(models["first"]), "--input", str(source), "--quiet"]) == 0
    from_file = capsys.readouterr().out
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(source.read_bytes())))
    assert main(["predict", "--model", str(models["first"]), "--input", "-", "--quiet"]) == 0
    assert capsys.readouterr().out == from_file


def test_train_refuses_bits_beyond_this_machines_memory_before_training(models, tmp_path, monkeypatch, capsys):
    """--bits 30 asked for ~43 GB of dense weights and ran into the machine's memory instead of an error."""
    import betheproj.cli

    monkeypatch.setattr(DependencyParser, "fit", _no_training)
    monkeypatch.setattr(SecondOrderParser, "fit", _no_training)
    monkeypatch.setattr(betheproj.cli, "_physical_memory", lambda: 2 ** 30)          # a 1 GB machine
    for extra, need in (([], "1.9 GB"), (["--second-order", str(models["first"])], "2.0 GB")):
        assert main(["train", "--train", str(models["train"]), "--model", str(tmp_path / "m.pt"), "--bits", "26",
                     *extra]) == 2
        err = _one_error_line(capsys)
        assert f"--bits 26: training keeps dense vectors of 2^26 weights, about {need}" in err
        assert "more than this machine's 1.1 GB; use a smaller --bits" in err
    assert not (tmp_path / "m.pt").exists()
    # unknown: taken as 64 GB (as the cgm check does), here with no container or ulimit -v limit
    monkeypatch.setattr(betheproj.cli, "_physical_memory", lambda: None)
    monkeypatch.setattr(betheproj.cli, "_CGROUP_FILES", ())
    monkeypatch.setattr(betheproj.cli, "_address_space_left", lambda: None)
    from betheproj.parsing.cli import _check_bits_memory

    _check_bits_memory(30)                                                          # ~30 GB
    with pytest.raises(ValueError, match="about 120.3 GB of memory, more than this machine's 68.7 GB"):
        _check_bits_memory(32)


def test_the_parsers_memory_checks_see_a_containers_limit(monkeypatch):
    """They compared with the machine's memory alone (the cgm check also reads the container's cgroup limit and
    ulimit -v): in a 1 GB container --bits 26 trained into the kernel's out-of-memory killer."""
    import betheproj.cli
    from betheproj.parsing.cli import _check_bits_memory, _check_memory

    monkeypatch.setattr(betheproj.cli, "_physical_memory", lambda: 2 ** 40)
    monkeypatch.setattr(betheproj.cli, "_address_space_left", lambda: None)
    monkeypatch.setattr(betheproj.cli, "_cgroup_limit", lambda: 2 ** 30)
    _check_bits_memory(24)
    with pytest.raises(ValueError, match=r"--bits 26: .* more than the 1.1 GB memory limit of this container"):
        _check_bits_memory(26)
    long = [type("S", (list,), {"line": 4})([0] * 400)]
    with pytest.raises(ValueError, match=r"--data x.conllu:4: a sentence of 400 words .* more than the 1.1 GB memory "
                                         r"limit of this container \(cgroup\); split it, or parse"):
        _check_memory(long, "--data", "x.conllu", second_order=True)


def test_a_sentence_too_long_for_second_order_decoding_in_this_memory_is_named(models, tmp_path, monkeypatch,
                                                                                capsys):
    """Second-order decoding holds dense (n + 1)^3 part tables: a sentence of 1,000 words (~32 GB) failed in torch's
    allocator with a RuntimeError traceback (or ran the machine out of memory)."""
    import betheproj.cli

    monkeypatch.setattr(SecondOrderParser, "predict", _no_training)
    monkeypatch.setattr(SecondOrderParser, "fit", _no_training)
    monkeypatch.setattr(betheproj.cli, "_physical_memory", lambda: 2 ** 30)          # a 1 GB machine
    long = tmp_path / "long.conllu"
    long.write_text(_conllu([0, 1], [0] + [1] * 399))                               # 400 words: ~2.1 GB
    for args, option in ((["eval", "--model", str(models["second"]), "--data", str(long)], "--data"),
                         (["predict", "--model", str(models["second"]), "--input", str(long)], "--input"),
                         (["train", "--train", str(models["train"]), "--dev", str(long), "--second-order",
                           str(models["first"]), "--model", str(tmp_path / "m.pt")], "--dev")):
        assert main([*args, "--quiet"]) == 2, args
        assert _one_error_line(capsys) == (
            f"betheproj parse: error: {option} {long}:4: a sentence of 400 words needs about 2.1 GB of memory in "
            "second-order decoding (its (n + 1)^3 sibling and grandparent tables), more than this machine's 1.1 GB; "
            "split it, or parse with an arc-factored model\n")
    assert not (tmp_path / "m.pt").exists()
    assert main(["eval", "--model", str(models["first"]), "--data", str(long), "--quiet"]) == 0     # arc-factored
    capsys.readouterr()


def test_a_sentence_too_long_for_arc_factored_parsing_in_this_memory_is_named(models, tmp_path, monkeypatch, capsys):
    """Arc-factored parsing extracts the features of all n (n + 1) arcs of a sentence at once (~750 bytes an arc):
    a sentence too long for the machine (8,000 words: ~48 GB) ran into its memory, a numpy MemoryError traceback or
    the out-of-memory killer, where second-order models gave this one-line error."""
    import betheproj.cli

    monkeypatch.setattr(DependencyParser, "predict", _no_training)
    monkeypatch.setattr(DependencyParser, "fit", _no_training)
    monkeypatch.setattr(betheproj.cli, "_physical_memory", lambda: 2 ** 30)          # a 1 GB machine
    long = tmp_path / "long.conllu"
    long.write_text(_conllu([0, 1], [0] + [1] * 1199))                              # 1,200 words: ~1.3 GB
    for args, option in ((["eval", "--model", str(models["first"]), "--data", str(long)], "--data"),
                         (["predict", "--model", str(models["first"]), "--input", str(long)], "--input"),
                         (["train", "--train", str(long), "--model", str(tmp_path / "m.pt")], "--train"),
                         (["train", "--train", str(models["train"]), "--dev", str(long), "--model",
                           str(tmp_path / "m.pt")], "--dev")):
        assert main([*args, "--quiet"]) == 2, args
        assert _one_error_line(capsys) == (
            f"betheproj parse: error: {option} {long}:4: a sentence of 1200 words needs about 1.3 GB of memory in "
            "arc-factored parsing (the features of its n (n + 1) arcs), more than this machine's 1.1 GB; split it\n")
    assert not (tmp_path / "m.pt").exists()


def test_feature_extraction_and_model_states_name_what_is_not_a_sentence_or_a_dict():
    parser = DependencyParser(bits=8)
    sentence = parse_conllu(_conllu([2, 0]))[0]
    assert parser.features(sentence).shape[:2] == (2, 3)
    with pytest.raises(TypeError, match="^sentence must be a Sentence .*, got str"):
        parser.features("w1 w2")
    with pytest.raises(TypeError, match=r"^sentences\[1\] must be a Sentence .*, got list"):
        parser.features.batch([sentence, ["w1"]])
    with pytest.raises(TypeError, match="^cfg must be the dict that config\\(\\) returned, got Tensor"):
        DependencyParser.from_config(torch.zeros(2))
    with pytest.raises(ValueError, match="^m.pt: a malformed parser model \\(a Tensor, not a dict of fields\\)"):
        DependencyParser.from_state(torch.zeros(2), "m.pt")
    with pytest.raises(ValueError, match="^m.pt: a malformed parser model \\(a field of the wrong kind"):
        DependencyParser.from_state({"config": [8], "weights": torch.zeros(3)}, "m.pt")
