"""The shared entry point of the hand-run scripts in ``benchmarks/``: errors as one line, quiet closed pipes."""

import io
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from _common import run  # noqa: E402


def test_a_value_error_is_one_line_and_exit_2(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["bench.py"])

    def main():
        raise ValueError("--data must name a folder")

    with pytest.raises(SystemExit) as stop:
        run(main)
    assert stop.value.code == 2
    assert capsys.readouterr().err == "bench.py: error: --data must name a folder\n"


def test_a_closed_pipe_exits_1_without_a_message(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["bench.py"])
    monkeypatch.setattr(sys, "stdout", io.StringIO())

    def main():
        raise BrokenPipeError(32, "Broken pipe")

    with pytest.raises(SystemExit) as stop:
        run(main)
    assert stop.value.code == 1
    assert capsys.readouterr().err == ""
    quiet = sys.stdout                          # the interpreter's last flush goes nowhere
    assert quiet.name == os.devnull
    quiet.close()
