"""betheproj/__init__.py: the public names load on first use, so the command line starts without torch."""

import subprocess
import sys


def _fresh(code: str) -> str:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_importing_the_command_line_does_not_import_torch():
    assert _fresh("import sys, betheproj, betheproj.cli; print('torch' in sys.modules)") == "False"


def test_every_public_name_is_listed_reachable_and_importable():
    code = """
import betheproj as bp
assert set(bp.__all__) <= set(dir(bp)), set(bp.__all__) - set(dir(bp))
names = {name: getattr(bp, name) for name in bp.__all__}
from betheproj import *  # noqa: F403
from betheproj import Solution, energies, solve
from betheproj.inference import solve as home
assert solve is home and names['solve'] is home and energies.Poisson is bp.energies.Poisson
try:
    bp.no_such_name
except AttributeError as err:
    print(err)
"""
    assert _fresh(code) == "module 'betheproj' has no attribute 'no_such_name'"


def test_the_package_marks_its_type_hints_for_users():
    """PEP 561: ``py.typed`` beside ``__init__.py`` (and in the wheel, by pyproject's package-data), so that a
    user's type checker reads the public functions' hints instead of treating the package as untyped."""
    import pathlib

    import betheproj

    root = pathlib.Path(betheproj.__file__).parent
    assert (root / "py.typed").is_file()
    pyproject = root.parent / "pyproject.toml"
    if pyproject.is_file():                          # a source checkout
        assert 'betheproj = ["py.typed"]' in pyproject.read_text()
