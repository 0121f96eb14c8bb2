"""The package type-checks: ``mypy`` (its settings in pyproject.toml) finds no error in ``betheproj/``.

Run where the mypy of the ``dev`` extras is installed (``pip install -e ".[dev]"``); another mypy version may read
the stubs differently, so the test is skipped there, as it is outside a source checkout.
"""

import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _pinned_mypy() -> str | None:
    pyproject = ROOT / "pyproject.toml"
    if not pyproject.is_file():
        return None
    found = re.search(r'"mypy==([^"]+)"', pyproject.read_text())
    return found.group(1) if found else None


def test_the_package_type_checks(tmp_path):
    mypy = pytest.importorskip("mypy.version", reason="mypy is not installed (pip install -e '.[dev]')")
    pinned = _pinned_mypy()
    if pinned is None:
        pytest.skip("not a source checkout with pyproject.toml's mypy pin")
    if mypy.__version__ != pinned:
        pytest.skip(f"mypy {mypy.__version__} is installed; the package is checked with mypy=={pinned}")
    proc = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("Success: no issues found"), proc.stdout
