"""The command line: the demo runs and prints what it solved; errors are one line and a non-zero exit."""

import subprocess
import sys

from betheproj.cli import main


def test_demo_prints_what_it_solved(capsys):
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    assert "Collective graphical model" in out and "Proposition-1 MAP" in out
    for method in ("rda", "md", "accelerated"):
        assert f"   {method}" in out


def test_usage_error_is_one_line():
    proc = subprocess.run([sys.executable, "-m", "betheproj.cli", "frobnicate"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "error" in proc.stderr
