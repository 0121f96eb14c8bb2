"""The command line: the demo runs and prints what it solved; errors are one line and a non-zero exit."""

import errno
import io
import json
import os
import subprocess
import sys
import threading

import pytest
import torch

from betheproj import __version__
from betheproj.cli import main
from betheproj.demo import run_demo


def test_demo_prints_what_it_solved(capsys):
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    assert "Collective graphical model" in out and "Proposition-1 MAP" in out
    for method in ("rda", "md", "accelerated"):
        assert f"   {method}" in out


def test_demo_marks_runs_stopped_by_max_iter():
    lines: list[str] = []
    results = run_demo(echo=lines.append)
    assert results["md"]["converged"] and results["md"]["residual"] <= 1e-6
    for method in ("rda", "md", "accelerated"):
        row = next(line for line in lines if line.startswith(f"   {method} "))
        iterations = row.split()[2]
        assert iterations.endswith("*") != results[method]["converged"]
        assert sum(int(part) for part in iterations.rstrip("*").split("+")) == results[method]["iterations"]
    # with its restarts the accelerated method converges by itself (it used to run out of the 300 iterations and
    # be finished by mirror descent, printed "300+k")
    assert results["accelerated"]["converged"] and results["accelerated"]["iterations"] < 300


def test_usage_error_is_one_line():
    proc = subprocess.run([sys.executable, "-m", "betheproj.cli", "frobnicate"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "error" in proc.stderr


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "betheproj.cli", *args], capture_output=True, text=True)


def test_ocr_missing_data_names_the_file(tmp_path):
    proc = _cli("ocr", "--data", str(tmp_path), "--out", str(tmp_path / "out"))
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "ocr_letters.npz" in proc.stderr


def test_ocr_bad_folds_and_rows(tmp_path):
    cases = ((["--folds", "0-12"], "--folds"), (["--folds", "x"], "--folds"), (["--rows", "2gram,3gram"], "--rows"))
    for args, word in cases:
        proc = _cli("ocr", "--data", str(tmp_path), *args)
        assert proc.returncode == 2 and word in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_a_folds_range_far_out_of_bounds_is_refused_without_listing_it(capsys):
    """--folds 0-1000000000000 listed every fold of the range before checking it: a MemoryError traceback, or
    the machine's memory filled."""
    assert main(["ocr", "--data", "no-such-folder", "--folds", f"0-{10 ** 12}"]) == 2
    err = capsys.readouterr().err
    assert err == f"betheproj ocr: error: --folds must lie in 0..9, got '0-{10 ** 12}'\n"


def test_options_that_say_nothing_or_conflict_are_refused_before_the_work(runs_stubbed, tmp_path, capsys):
    cases = [([*runs_stubbed["ocr"], "--folds", "3-1"], "--folds: the range '3-1' runs backwards (write '1-3')"),
             ([*runs_stubbed["ocr"], "--rows", ""], "--rows must be among"),
             ([*runs_stubbed["cgm"], "--out", ""], "--out must name a folder, got an empty path"),
             ([*runs_stubbed["cgm"], "--schedule", "alternate"], "--schedule applies to hard EM only: add --learn"),
             (["citations", "--predict", str(tmp_path / "x.txt"), "--data", str(tmp_path)],
              "--data is for training; --predict tags with the model already in --out")]
    for args, message in cases:
        assert main([*args, "--quiet"]) == 2, args
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, err


def test_a_fold_that_is_absent_is_named_before_any_fold_trains(tmp_path, monkeypatch):
    from betheproj.data.ocr import load_ocr
    from betheproj.experiments import ocr
    from tests.experiments.test_ocr import write_synthetic_npz

    def trains(*args, **kwargs):
        raise AssertionError("a fold was trained")

    monkeypatch.setattr(ocr, "run_fold", trains)
    write_synthetic_npz(tmp_path / "ocr_letters.npz")
    data = load_ocr(tmp_path)
    present = sorted(set(data.folds.tolist()))
    absent = next(f for f in range(10) if f not in present)
    with pytest.raises(ValueError, match=rf"folds \[{absent}\] have no words \(folds present: "):
        ocr.run(data, [present[0], absent], ["2gram"])
    out = tmp_path / "out"                                  # the command line says so before creating --out
    assert main(["ocr", "--data", str(tmp_path), "--folds", str(absent), "--rows", "2gram", "--out", str(out),
                 "--quiet"]) == 2
    assert not out.exists()


def test_a_fold_that_holds_every_word_is_named_before_out_is_created(tmp_path, capsys):
    """With one fold in the data nothing is left to train on: the base CRF's "no training examples: ... B = 0
    sequences" came after --out was created, naming neither the fold nor the data."""
    from tests.experiments.test_ocr import write_synthetic_npz

    write_synthetic_npz(tmp_path / "ocr_letters.npz", folds=1)
    out = tmp_path / "out"
    assert main(["ocr", "--data", str(tmp_path), "--folds", "0", "--rows", "2gram", "--out", str(out), "--quiet"]) == 2
    assert capsys.readouterr().err == ("betheproj ocr: error: fold 0 holds every word of the data: no word is left to "
                                       "train on (folds present: [0])\n")
    assert not out.exists()


def test_a_test_word_length_no_training_word_has_is_named_before_the_55_class_row_trains(tmp_path, monkeypatch):
    """The 55-class row's classes are the training words: a test word of another length failed after the 2-gram and
    energy rows of that fold had trained."""
    from betheproj.data.ocr import load_ocr
    from betheproj.experiments import ocr
    from tests.experiments.test_ocr import write_synthetic_npz

    write_synthetic_npz(tmp_path / "ocr_letters.npz")
    data = load_ocr(tmp_path)
    data.lengths[int(torch.nonzero(data.folds == 0)[0])] = 99             # a length only fold 0 has
    ocr.check_folds(data, [0, 1], ["2gram", "Lw"])
    ocr.check_folds(data, [1], ["55class"])
    with pytest.raises(ValueError, match=r"fold 0 has words of lengths \[99\]"):   # run_fold alone too
        ocr.run_fold(data, 0, ["2gram", "55class"])
    monkeypatch.setattr(ocr, "run_fold", lambda *args, **kwargs: pytest.fail("a fold was trained"))
    with pytest.raises(ValueError, match=r"fold 0 has words of lengths \[99\] that no word of the other folds has"):
        ocr.run(data, [1, 0], ["2gram", "55class"])


def test_a_cgm_population_beyond_exact_float64_counts_is_refused_before_out_is_created(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["cgm", "--grid", "2", "--steps", "2", "--population", str(2 ** 53 + 1), "--rate", "1e-12",
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == f"betheproj cgm: error: --population must be at most 2**53 = {2 ** 53} (the float64 model holds " \
                  f"counts exactly only up to there), got {2 ** 53 + 1}\n"
    assert not out.exists()


def test_a_cgm_rate_whose_counts_would_pass_exact_float64_is_refused_before_out_is_created(tmp_path, capsys):
    # population 2**52 at rate 3: observed Poisson counts near 1.35e16 > 2**53, which the float64 model rounds
    out = tmp_path / "out"
    assert main(["cgm", "--grid", "2", "--steps", "2", "--population", str(2 ** 52), "--rate", "3",
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("betheproj cgm: error: --rate x --population must leave the observed counts")
    assert "got 3.0 x 4503599627370496" in err
    assert not out.exists()


@pytest.mark.parametrize("noise", ["1e308", "3e306"])
def test_a_cgm_noise_that_overflows_the_log_potentials_is_refused_before_out_is_created(tmp_path, capsys, noise):
    """The model's own check (noise x the N(0, 1) draws overflow float64) came after --out was created."""
    out = tmp_path / "out"
    assert main(["cgm", "--grid", "2", "--steps", "2", "--noise", noise, "--out", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == (
        f"betheproj cgm: error: --noise must be at most {sys.float_info.max / 64:.3g} (it scales N(0, 1) draws added "
        f"to float64 log-potentials), got {float(noise)!r}\n")
    assert not out.exists()
    assert main(["cgm", "--grid", "2", "--steps", "2", "--noise", "2e306", "--out", str(out), "--quiet"]) == 0
    assert (out / "results.json").is_file()                # below the bound the draws stay finite


def test_a_cgm_rate_whose_expected_counts_are_subnormal_is_refused_before_out_is_created(tmp_path, capsys):
    """The solver's own check of rate x population came after --out was created and the instance was printed."""
    out = tmp_path / "out"
    assert main(["cgm", "--grid", "2", "--steps", "2", "--rate", "1e-320", "--out", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == (
        "betheproj cgm: error: --rate x --population must be a normal float64 number (the scale of the expected "
        f"counts), got 1e-320 x 100000 = {1e-320 * 100000!r}\n")
    assert not out.exists()


def test_a_cgm_rate_and_population_at_the_exact_limit_are_accepted(monkeypatch, tmp_path):
    # 2**52 at rate 1.9: mean 8.6e15, ten standard deviations below 2**53 (the draw is checked again)
    import betheproj.experiments.cgm as cgm_experiment

    ran = []
    monkeypatch.setattr(cgm_experiment, "run", lambda *args, **kwargs: ran.append(args))
    assert main(["cgm", "--grid", "2", "--steps", "2", "--population", str(2 ** 52), "--rate", "1.9",
                 "--out", str(tmp_path / "out"), "--quiet"]) == 0
    assert len(ran) == 1


def test_each_ocr_row_is_run_once(runs_stubbed, monkeypatch, capsys):
    from betheproj.experiments import ocr

    asked = []

    def run(data, folds, rows, *args, **kwargs):
        asked.append(rows)
        raise ValueError("stop here")

    monkeypatch.setattr(ocr, "run", run)
    assert main([*runs_stubbed["ocr"], "--rows", "2gram,2gram", "--quiet"]) == 2
    assert asked == [["2gram"]]


@pytest.fixture
def tagger_stubbed(monkeypatch):
    """``citations --predict`` with no model: each input line comes back as its repr."""
    from betheproj.experiments import citations

    monkeypatch.setattr(citations, "load_run", lambda path: (None, None, None, None))
    asked = []

    def tag_strings(lines, index, model, progress=False, mbr_threshold=None):
        asked.append(progress)
        return [repr(line) for line in lines]

    monkeypatch.setattr(citations, "tag_strings", tag_strings)
    return asked


def test_citation_predict_shows_progress_unless_quiet(tagger_stubbed, tmp_path, capsys):
    # tagging a thousand citations took minutes without a sign of life
    source = tmp_path / "raw.txt"
    source.write_text("J. Smith. A title. 2005.\n")
    assert main(["citations", "--predict", str(source), "--out", str(tmp_path)]) == 0
    assert main(["citations", "--predict", str(source), "--out", str(tmp_path), "--quiet"]) == 0
    assert tagger_stubbed == [True, False]


def test_citation_predict_drops_a_byte_order_mark(tagger_stubbed, tmp_path, capsys):
    source = tmp_path / "raw.txt"
    source.write_bytes("\ufeffJ. Smith. A title. 2005.\n".encode())
    assert main(["citations", "--predict", str(source), "--out", str(tmp_path)]) == 0
    assert capsys.readouterr().out == "'J. Smith. A title. 2005.'\n"


def test_citation_predict_reads_standard_input_for_a_dash(tagger_stubbed, tmp_path, monkeypatch, capsys):
    import io

    raw = "\ufeffJ. Smith. A title. 2005.\r\nB. Jones. Another. 2006.\n".encode()
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(raw)))          # a pipe's stdin: bytes underneath
    assert main(["citations", "--predict", "-", "--out", str(tmp_path)]) == 0
    assert capsys.readouterr().out == "'J. Smith. A title. 2005.'\n'B. Jones. Another. 2006.'\n"


def test_citation_predict_splits_lines_at_a_bare_carriage_return_from_a_file_or_stdin(tagger_stubbed, tmp_path,
                                                                                   monkeypatch, capsys):
    """A file's text is read with universal newlines, standard input's was split at "\\n" only: two citations
    separated by a bare "\\r" were tagged as one from standard input."""
    import io

    raw = b"J. Smith. A title. 2005.\rB. Jones. Another. 2006.\r"
    source = tmp_path / "raw.txt"
    source.write_bytes(raw)
    expected = "'J. Smith. A title. 2005.'\n'B. Jones. Another. 2006.'\n"
    assert main(["citations", "--predict", str(source), "--out", str(tmp_path)]) == 0
    assert capsys.readouterr().out == expected
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(raw)))
    assert main(["citations", "--predict", "-", "--out", str(tmp_path)]) == 0
    assert capsys.readouterr().out == expected
    assert main(["citations", "--predict", "", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err == ("betheproj citations: error: --predict: give a file (or - for standard input), "
                                       "got an empty name\n")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes are POSIX")
def test_citation_predict_reads_a_named_pipe(tagger_stubbed, tmp_path, capsys):
    """``--predict <(...)`` hands over a pipe, not a regular file: it was refused as a missing file."""
    fifo = tmp_path / "raw.pipe"
    os.mkfifo(fifo)
    writer = threading.Thread(target=fifo.write_text, args=("J. Smith. A title. 2005.\n",))
    writer.start()
    try:
        assert main(["citations", "--predict", str(fifo), "--out", str(tmp_path)]) == 0
    finally:
        writer.join(timeout=10)
    assert capsys.readouterr().out == "'J. Smith. A title. 2005.'\n"
    assert main(["citations", "--predict", str(tmp_path), "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (f"betheproj citations: error: --predict: expected a file of raw citations, "
                                       f"one a line, at {tmp_path}, found a folder\n")
    assert main(["citations", "--predict", str(tmp_path / "missing.txt"), "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (f"betheproj citations: error: --predict: expected a file of raw citations, "
                                       f"one a line, at {tmp_path / 'missing.txt'}, found none\n")


def test_citation_predict_refuses_an_empty_out(tagger_stubbed, tmp_path, monkeypatch, capsys):
    """--out '' read the model.pt of the working folder, where training refuses an empty --out."""
    source = tmp_path / "raw.txt"
    source.write_text("J. Smith. A title. 2005.\n")
    monkeypatch.chdir(tmp_path)
    assert main(["citations", "--predict", str(source), "--out", ""]) == 2
    assert capsys.readouterr().err == "betheproj citations: error: --out must name a folder, got an empty path\n"


def test_citation_predict_refuses_a_seed(tagger_stubbed, tmp_path, capsys):
    source = tmp_path / "raw.txt"
    source.write_text("J. Smith. A title. 2005.\n")
    assert main(["citations", "--predict", str(source), "--out", str(tmp_path), "--seed", "3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--seed is for training" in err


def test_ocr_on_a_tiny_synthetic_data_set(tmp_path, capsys):
    from tests.experiments.test_ocr import write_synthetic_npz

    write_synthetic_npz(tmp_path / "ocr_letters.npz")
    out = tmp_path / "results"
    assert main(["ocr", "--data", str(tmp_path), "--folds", "0", "--out", str(out), "--quiet", "--seed", "3"]) == 0
    printed = capsys.readouterr().out
    assert "L^w (MM)" in printed and "98.26" in printed and "99.45" in printed
    results = json.loads((out / "results.json").read_text())
    assert [f["fold"] for f in results["folds"]] == [0] and set(results["mean"]) == set(ocr_rows())
    assert all(95 <= v <= 100 for v in results["mean"].values()), results["mean"]    # measured: 100.0 each
    assert printed.count("100.00") >= len(ocr_rows())                               # and printed
    assert results["config"]["seed"] == 3
    for png in ("accuracy_vs_iterations.png", "iterations_histogram.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"


def ocr_rows():
    from betheproj.experiments.ocr import ROWS

    return ROWS


def test_cgm_runs_compares_learns_and_writes(tmp_path, capsys):
    pytest.importorskip("cvxpy")
    out = tmp_path / "cgm"
    assert main(["cgm", "--grid", "3", "--steps", "4", "--population", "20000", "--compare", "--learn",
                 "--out", str(out), "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "Bethe mirror descent: objective" in printed and "CVXPY + Clarabel" in printed and "hard EM" in printed
    results = json.loads((out / "results.json").read_text())
    assert results["interior_point"]["relative_gap"] < 1e-6
    assert results["learning"]["count_error_learned"] < results["learning"]["count_error_initial"]
    assert (out / "flows.png").read_bytes()[:4] == b"\x89PNG"


def test_cgm_bad_arguments_are_one_line():
    # ("--rate -inf" and "--rate -1e-3" were "expected one argument": argparse read them as options)
    for args, word in ((["--rate", "-1"], "rate"), (["--grid", "0"], "grid"), (["--population", "0"], "population"),
                       (["--steps", "1"], "steps"), (["--grid", "-2"], "grid"), (["--rate", "-inf"], "rate"),
                       (["--rate", "-1e-3"], "rate"), (["--rate", "-NaN"], "rate")):
        proc = _cli("cgm", *args, "--out", "/tmp/never-written")
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, args
        assert proc.stderr.startswith(f"betheproj cgm: error: --{word} must be"), proc.stderr


@pytest.mark.parametrize("option", ["--grid", "--steps", "--seasons"])
def test_cgm_sizes_beyond_int64_are_one_line_errors(option, tmp_path, capsys):
    """--grid 10**80 passed the option checks, and the memory estimate's message raised OverflowError (a traceback)
    turning its byte count into a float."""
    out = tmp_path / "out"
    assert main(["cgm", option, str(10 ** 80), "--out", str(out)]) == 2
    low = 2 if option == "--steps" else 1
    assert capsys.readouterr().err == (f"betheproj cgm: error: {option} must be an int in [{low}, 2**63 - 1], got "
                                       f"{10 ** 80}\n")
    assert not out.exists()


def test_cgm_rate_times_population_beyond_the_sampler_names_both_options(capsys):
    assert main(["cgm", "--population", str(10 ** 18), "--rate", "100", "--out", "/tmp/never-written"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("betheproj cgm: error: --rate x --population must be at most")


def test_a_cgm_grid_too_large_for_memory_is_refused_before_the_work(tmp_path, monkeypatch, capsys):
    import betheproj.cli
    from betheproj.experiments import cgm

    monkeypatch.setattr(cgm, "run", _no_work)
    monkeypatch.setattr(betheproj.cli, "_CGROUP_FILES", ())               # the machine's memory alone, whatever
    monkeypatch.setattr(betheproj.cli, "_address_space_left", lambda: None)   # limits the test runs under
    assert main(["cgm", "--grid", "1000", "--steps", "2", "--out", str(tmp_path / "out")]) == 2   # s = 10^12
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("betheproj cgm: error: --grid 1000 --steps ") and "64.0 TB" in err
    assert not (tmp_path / "out").exists()
    monkeypatch.setattr(betheproj.cli, "_physical_memory", lambda: 2 ** 30)
    betheproj.cli._check_cgm_size(5, 10, 3)          # the README's command
    betheproj.cli._check_cgm_size(32, 10, 1)         # the README's largest benchmark (s = 1,048,576): ~0.6 GB
    with pytest.raises(ValueError, match="--grid 40 --steps .* this machine's 1.1 GB; use a smaller --grid, --steps"):
        betheproj.cli._check_cgm_size(40, 10, 1)
    # --compare: the interior-point solver's problem too (at G = 20 it grew past 5.8 GB, then failed in the solver)
    betheproj.cli._check_cgm_size(10, 10, 1, compare=True)
    betheproj.cli._check_cgm_size(15, 10, 1)
    with pytest.raises(ValueError, match=r"--compare: CVXPY \+ Clarabel need about 2.3 GB of memory at --grid 15 "):
        betheproj.cli._check_cgm_size(15, 10, 1, compare=True)
    # on a CUDA device the run must also fit in the device's memory (here a 0.5 GB one, faked)
    monkeypatch.setattr(betheproj.cli, "_physical_memory", lambda: 2 ** 40)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: type("P", (), {"total_memory": 2 ** 29}))
    betheproj.cli._check_cgm_size(32, 10, 1, torch.device("cpu"))
    with pytest.raises(ValueError, match="of memory on cuda, more than its 536.9 MB; .* or --device cpu"):
        betheproj.cli._check_cgm_size(32, 10, 1, torch.device("cuda"))


def test_a_cgm_grid_beyond_ulimit_or_the_container_is_refused_before_the_work(tmp_path, monkeypatch, capsys):
    """The check compared with the machine's memory alone: under `ulimit -v 1000000`, `betheproj cgm --grid 40`
    created --out, simulated, and failed in torch's allocator (a traceback, later "out of memory: could not
    allocate 20.5 MB"); in a container the kernel's OOM killer would end it without a word."""
    import resource

    import betheproj.cli
    from betheproj.experiments import cgm

    monkeypatch.setattr(cgm, "run", _no_work)
    monkeypatch.setattr(betheproj.cli, "_physical_memory", lambda: 2 ** 40)
    monkeypatch.setattr(betheproj.cli, "_CGROUP_FILES", ())
    used = 0                                                  # what this process maps already (Linux)
    if os.path.exists("/proc/self/statm"):
        with open("/proc/self/statm") as handle:
            used = int(handle.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    limit = used + 2 ** 30                                    # and 1 GB: G = 32 needs 0.6 GB, G = 40 1.5 GB
    monkeypatch.setattr(resource, "getrlimit", lambda which: (limit, resource.RLIM_INFINITY))
    betheproj.cli._check_cgm_size(32, 10, 1)
    assert main(["cgm", "--grid", "40", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs about 1.5 GB of memory" in err and not (tmp_path / "out").exists()
    assert "GB of address space left under this process's limit (ulimit -v); use a smaller --grid" in err
    # a container's limit (cgroup v2's memory.max, v1's memory.limit_in_bytes; "max" is none)
    monkeypatch.setattr(resource, "getrlimit", lambda which: (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    v2, v1 = tmp_path / "memory.max", tmp_path / "memory.limit_in_bytes"
    v2.write_text("max\n")
    v1.write_text(f"{2 ** 30}\n")
    monkeypatch.setattr(betheproj.cli, "_CGROUP_FILES", (str(v2), str(v1)))
    betheproj.cli._check_cgm_size(40, 10, 1)                   # v2 says no limit
    monkeypatch.setattr(betheproj.cli, "_CGROUP_FILES", (str(tmp_path / "absent"), str(v1)))
    with pytest.raises(ValueError, match=r"more than the 1.1 GB memory limit of this container \(cgroup\); use"):
        betheproj.cli._check_cgm_size(40, 10, 1)


@pytest.mark.parametrize("command", [["cgm"], ["ocr", "--data", "x"], ["citations"],
                                     ["parse", "train", "--train", "x", "--model", "y"]])
@pytest.mark.parametrize("seed", ["-1", str(2 ** 63), "1.5", "x"])
def test_every_seed_is_an_integer_in_0_to_2_63_minus_1(command, seed, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([*command, "--seed", seed])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1
    assert f"error: argument --seed: must be an integer in [0, 2**63 - 1], got '{seed}'" in err


def test_the_largest_seed_is_accepted():
    from betheproj.cli import _parser

    assert _parser().parse_args(["cgm", "--seed", str(2 ** 63 - 1)]).seed == 2 ** 63 - 1
    assert _parser().parse_args(["parse", "train", "--train", "x", "--model", "y", "--seed", "0"]).seed == 0


def test_every_out_option_states_its_default():
    from betheproj.cli import _parser

    commands = _parser()._subparsers._group_actions[0].choices
    for name in ("ocr", "citations", "cgm"):
        out = next(a for a in commands[name]._actions if a.dest == "out")
        assert f"(default {out.default})" in out.help, name


@pytest.mark.parametrize("command", ["cgm", "ocr", "citations"])
def test_an_out_path_that_is_a_file_fails_before_the_work(runs_stubbed, tmp_path, capsys, command):
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert main([*runs_stubbed[command], "--out", str(afile), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--out: {afile} exists and is not a folder" in err, err
    assert afile.read_text() == "x"


def _no_work(*args, **kwargs):
    raise AssertionError("the work started although --out was bad")


@pytest.fixture
def runs_stubbed(tmp_path, monkeypatch):
    """Each command's arguments (ocr and citations with loadable data) with the work itself stubbed out."""
    import betheproj.data.citations
    from betheproj.experiments import cgm, citations, ocr
    from tests.experiments.test_ocr import write_synthetic_npz

    for module in (cgm, citations, ocr):
        monkeypatch.setattr(module, "run", _no_work)
    splits = {"train": ["c"], "dev": ["c"], "test": ["c"]}
    monkeypatch.setattr(betheproj.data.citations, "load_citations", lambda folder: splits)
    write_synthetic_npz(tmp_path / "ocr_letters.npz")
    return {"cgm": ["cgm", "--grid", "2", "--steps", "2"], "ocr": ["ocr", "--data", str(tmp_path), "--folds", "0-2"],
            "citations": ["citations", "--data", str(tmp_path)]}


@pytest.mark.parametrize("command, name", [("cgm", "results.json"), ("cgm", "flows.png"), ("ocr", "results.json"),
                                           ("citations", "model.pt"), ("citations", "results.json")])
def test_an_output_file_that_is_a_folder_fails_before_the_work(runs_stubbed, tmp_path, capsys, command, name):
    (tmp_path / "out" / name).mkdir(parents=True)
    assert main([*runs_stubbed[command], "--out", str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--out: {tmp_path / 'out' / name} is a folder" in err


@pytest.mark.parametrize("command", ["cgm", "ocr", "citations"])
def test_an_out_folder_that_takes_no_file_fails_before_the_work(runs_stubbed, tmp_path, monkeypatch, capsys,
                                                                command):
    import errno
    import os

    from betheproj import _files

    def read_only(*args, **kwargs):                  # root ignores chmod: fake a read-only mount
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(_files.tempfile, "mkstemp", read_only)
    assert main([*runs_stubbed[command], "--out", str(tmp_path), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err == f"betheproj {command}: error: --out: cannot write in the folder {tmp_path} (Read-only file system)\n"


@pytest.mark.parametrize("empty", ["dev.docs", "testing.docs.gz"])
def test_an_empty_citation_split_is_named_before_out_is_created(tmp_path, capsys, empty):
    import gzip

    for name in ("training.docs", "dev.docs", "testing.docs"):
        (tmp_path / name).write_text("<title> A title </title>\n")
    (tmp_path / empty.removesuffix(".gz")).unlink()
    (tmp_path / empty).write_bytes(gzip.compress(b"") if empty.endswith(".gz") else b"")
    assert main(["citations", "--data", str(tmp_path), "--out", str(tmp_path / "out"), "--quiet"]) == 2
    assert capsys.readouterr().err == f"betheproj citations: error: --data: {tmp_path / empty} holds no citations\n"
    assert not (tmp_path / "out").exists()


def test_corrupt_ocr_files_are_one_line_errors_naming_the_file(tmp_path):
    import numpy as np

    empty, truncated, single = tmp_path / "empty.npz", tmp_path / "trunc.npz", tmp_path / "single.npz"
    empty.write_bytes(b"")
    np.savez(truncated, X=np.zeros(3))
    truncated.write_bytes(truncated.read_bytes()[:40])
    with open(single, "wb") as handle:
        np.save(handle, np.zeros(3))
    for path in (empty, truncated, single):
        proc = _cli("ocr", "--data", str(path), "--out", str(tmp_path / "out"))
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert path.name in proc.stderr and "Traceback" not in proc.stderr


def test_interrupt_and_closed_pipe_end_quietly(monkeypatch, capsys):
    import betheproj.demo

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(betheproj.demo, "run_demo", interrupted)
    assert main(["demo"]) == 130
    assert capsys.readouterr().err == "betheproj demo: interrupted\n"

    def closed(*args, **kwargs):
        raise BrokenPipeError

    monkeypatch.setattr(betheproj.demo, "run_demo", closed)
    stdout = sys.stdout
    try:
        assert main(["demo"]) == 1
    finally:
        sys.stdout.close()
        sys.stdout = stdout
    assert capsys.readouterr().err == ""


class _FullDisk(io.StringIO):
    """Standard output on a full disk: buffered writes succeed, the flush fails."""

    def flush(self):
        raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize("fails", [False, True], ids=["after output", "after an error"])
def test_output_that_cannot_be_written_is_a_one_line_error(monkeypatch, capsys, fails):
    """Buffered output was only written by the interpreter's flush at exit, after main had returned: a full disk
    printed "Exception ignored ... OSError" and the status was 120."""
    import betheproj.demo

    def demo(*args, **kwargs):
        print("a table")
        if fails:
            raise ValueError("bad input")

    monkeypatch.setattr(betheproj.demo, "run_demo", demo)
    stdout = sys.stdout
    sys.stdout = _FullDisk()
    try:
        status = main(["demo"])
        sys.stdout.flush()                              # what the interpreter does at exit: now quiet
        dropped = not isinstance(sys.stdout, _FullDisk)
    finally:
        if sys.stdout is not stdout and not isinstance(sys.stdout, _FullDisk):
            sys.stdout.close()                          # the null device main put there
        sys.stdout = stdout
    assert status == 2 and dropped
    want = "bad input" if fails else "No space left on device: standard output"     # it said which file no more
    assert capsys.readouterr().err == f"betheproj demo: error: {want}\n"


class _FailingWrites(io.StringIO):
    def __init__(self, err: int):
        super().__init__()
        self.err = err

    def write(self, text):
        raise OSError(self.err, os.strerror(self.err))


@pytest.mark.parametrize("err,status,message", [
    (errno.ENOSPC, 2, "betheproj demo: error: No space left on device: standard output\n"),
    (errno.EIO, 2, "betheproj demo: error: Input/output error: standard output\n"),
    (errno.EPIPE, 1, "")])
def test_a_failed_write_to_standard_output_names_it(monkeypatch, capsys, err, status, message):
    """`betheproj demo > file` on a full disk said "No space left on device" alone, as if a file it writes were
    full; a closed pipe stays quiet (status 1), and standard output is the caller's again after main."""
    import betheproj.demo

    monkeypatch.setattr(betheproj.demo, "run_demo", lambda *args, **kwargs: print("a table"))
    stdout = sys.stdout
    sys.stdout = failing = _FailingWrites(err)
    try:
        assert main(["demo"]) == status
        after = sys.stdout
    finally:
        if sys.stdout is not failing:
            sys.stdout.close()                          # the null device main put there
        sys.stdout = stdout
    assert capsys.readouterr().err == message
    assert (after is not failing) == (err == errno.EPIPE)      # a closed pipe: the rest goes nowhere
    monkeypatch.setattr(betheproj.demo, "run_demo", lambda *args, **kwargs: None)
    sys.stdout = kept = io.StringIO()
    try:
        assert main(["demo"]) == 0
        assert sys.stdout is kept
    finally:
        sys.stdout = stdout


def test_output_the_locale_cannot_encode_says_how_to_write_it(monkeypatch, capsys):
    """In a non-UTF-8 locale (PYTHONUTF8=0, LC_ALL=C) `citations --predict` of "Müller" failed with "'ascii' codec
    can't encode character '\\xfc' in position 68: ordinal not in range(128)"."""
    import betheproj.demo

    monkeypatch.setattr(betheproj.demo, "run_demo", lambda *args, **kwargs: print("<person-last> Müller"))
    stdout = sys.stdout
    sys.stdout = io.TextIOWrapper(io.BytesIO(), encoding="ascii")
    try:
        status = main(["demo"])
    finally:
        sys.stdout = stdout
    assert status == 2
    assert capsys.readouterr().err == ("betheproj demo: error: cannot write 'ü' in the ascii encoding of the output: "
                                       "run with PYTHONIOENCODING=utf-8 or in a UTF-8 locale\n")


def test_interrupt_while_the_parser_loads_torch_is_one_line(monkeypatch, capsys):
    import betheproj.cli

    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setattr(betheproj.cli, "_parser", interrupted)
    assert main(["demo"]) == 130
    assert capsys.readouterr().err == "betheproj: interrupted\n"


def test_ctrl_c_during_start_up_is_one_line():
    import signal
    import time

    proc = subprocess.Popen([sys.executable, "-m", "betheproj.cli", "cgm", "--grid", "2", "--steps", "2", "--out",
                             "/tmp/never-written", "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    time.sleep(0.5)                                  # Python is up; torch (~2.5 s) is loading
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate()
    assert proc.returncode == 130 and err.count("\n") == 1 and err.endswith(": interrupted\n"), err


@pytest.mark.filterwarnings("default::UserWarning")      # as a shell runs it, whatever pytest's -W says
def test_library_warnings_are_one_line(monkeypatch, capsys):
    import warnings

    import betheproj.demo

    def warn(*args, **kwargs):
        warnings.warn("first line\n   second line", UserWarning, stacklevel=1)

    monkeypatch.setattr(betheproj.demo, "run_demo", warn)
    assert main(["demo"]) == 0
    assert capsys.readouterr().err == "betheproj: warning: first line second line\n"
    with warnings.catch_warnings():
        warnings.simplefilter("error")                  # `python -W error -m betheproj.cli demo`: an error, one line
        assert main(["demo"]) == 2
    assert capsys.readouterr().err == "betheproj demo: error: first line second line\n"


def test_citation_predict_on_a_file_that_is_not_utf8(tagger_stubbed, tmp_path, capsys):
    source = tmp_path / "raw.txt"
    source.write_bytes(b"\xff\xfe citation")                                # a stub model: the text fails
    assert main(["citations", "--predict", str(source), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not UTF-8 text" in err


@pytest.mark.parametrize("command", [["cgm"], ["ocr", "--data", "no-such-folder"]])
def test_device_is_checked_before_the_work(command, tmp_path, monkeypatch, capsys):
    from betheproj.experiments import cgm, ocr

    monkeypatch.setattr(cgm, "run", _no_work)
    monkeypatch.setattr(ocr, "run", _no_work)
    for device in ["tpu", "mps", "cuda:99"] + ([] if torch.cuda.is_available() else ["cuda"]):
        assert main([*command, "--device", device, "--out", str(tmp_path / "out")]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"betheproj {command[0]}: error: --device "), err
        assert repr(device) in err
    assert not (tmp_path / "out").exists()


def test_a_closed_standard_output_is_a_one_line_error(tagger_stubbed, tmp_path, monkeypatch, capsys):
    # started with `>&-`, Python's sys.stdout is None and print() dropped the tags silently, with exit 0
    source = tmp_path / "raw.txt"
    source.write_text("J. Smith. A title. 2005.\n")
    monkeypatch.setattr(sys, "stdout", None)
    assert main(["citations", "--predict", str(source), "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err == "betheproj citations: error: standard output is closed\n"


def _allocate_numpy():
    import numpy as np

    np.empty(2 ** 58)                                   # 2 EiB: NumPy's MemoryError


def _allocate_torch():
    torch.empty(2 ** 58, dtype=torch.uint8)             # torch's CPU allocator: a RuntimeError


def _allocate_python():
    raise MemoryError


def _allocate_cuda():
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.\nGPU 0 has a total capacity of 1 GiB")


@pytest.mark.parametrize("allocate, want", [
    (_allocate_numpy, "out of memory: Unable to allocate 2.00 EiB for an array with shape (288230376151711744,) "
                      "and data type float64"),
    (_allocate_torch, "out of memory: could not allocate 288,230.4 TB"),
    (_allocate_python, "out of memory"),
    (_allocate_cuda, "out of memory: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
                     "1 GiB"),
], ids=["numpy", "torch", "python", "cuda"])
def test_running_out_of_memory_is_a_one_line_error(monkeypatch, capsys, allocate, want):
    """Under ``ulimit -v`` a large --grid failed with a traceback (exit 1) ending in torch's "[enforce fail at
    alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory" or NumPy's MemoryError."""
    import betheproj.demo

    monkeypatch.setattr(betheproj.demo, "run_demo", lambda *args, **kwargs: allocate())
    assert main(["demo"]) == 2
    assert capsys.readouterr().err == f"betheproj demo: error: {want}\n"


def test_other_runtime_errors_keep_their_traceback(monkeypatch):
    import betheproj.demo

    def bug(*args, **kwargs):
        raise RuntimeError("shape mismatch")

    monkeypatch.setattr(betheproj.demo, "run_demo", bug)
    with pytest.raises(RuntimeError, match="shape mismatch"):
        main(["demo"])


def test_python_dash_m_betheproj_runs_the_command_line(tmp_path):
    # before: "No module named betheproj.__main__; 'betheproj' is a package and cannot be directly executed", exit 1
    proc = subprocess.run([sys.executable, "-m", "betheproj", "cgm", "--grid", "0", "--out", str(tmp_path / "o")],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.startswith("betheproj cgm: error: --grid "), proc.stderr


@pytest.mark.parametrize("missing", ["clarabel", "cvxpy"])
def test_cgm_compare_without_its_solver_fails_before_the_work(monkeypatch, tmp_path, capsys, missing):
    """Without cvxpy, the error came after the simulation and the Bethe solve, with --out created; without
    clarabel, the run ended with exit 0 and "relative objective difference nan"."""
    monkeypatch.setitem(sys.modules, missing, None)          # as if not installed
    out = tmp_path / "out"
    assert main(["cgm", "--grid", "2", "--steps", "2", "--compare", "--out", str(out), "--quiet"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and not out.exists()
    assert captured.err == ('betheproj cgm: error: the interior-point baseline needs cvxpy and clarabel: '
                            'pip install "betheproj[cgm]"\n')


@pytest.mark.parametrize("args", [["ocr", "--data", ""], ["citations", "--data", ""],
                                  ["parse", "train", "--train", "", "--model", "m.pt"],
                                  ["parse", "train", "--train", "t", "--dev", "", "--model", "m.pt"],
                                  ["parse", "eval", "--model", "", "--data", "d"],
                                  ["parse", "eval", "--model", "m", "--data", ""],
                                  ["parse", "predict", "--model", "m", "--input", ""]])
def test_an_empty_input_path_is_named(args, capsys):
    # Path("") is the current folder: the errors named files there ("... at ., found a folder", "... at
    # training.docs")
    with pytest.raises(SystemExit) as stop:
        main([*args, "--quiet"])
    assert stop.value.code == 2
    flag = args[args.index("") - 1]
    assert capsys.readouterr().err.startswith(f"betheproj {' '.join(args[:2]) if args[0] == 'parse' else args[0]}: "
                                              f"error: argument {flag}: must name a file or folder, got an empty path")


def test_version_is_printed():
    proc = _cli("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"betheproj {__version__}"
