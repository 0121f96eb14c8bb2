import sys

import pytest

from betheproj.progress import progress_bar


def test_disabled_bar_is_silent(capsys):
    bar = progress_bar(3, False, "work")
    bar.update(1)
    bar.set_postfix(loss="0.1")
    bar.close()
    out = capsys.readouterr()
    assert out.out == "" and out.err == ""


def test_enabled_bar_is_tqdm_and_falls_back_without_it(monkeypatch):
    tqdm = pytest.importorskip("tqdm")
    bar = progress_bar(3, True, "work")
    assert isinstance(bar, tqdm.tqdm) and bar.total == 3 and bar.desc == "work"
    bar.close()
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)          # import fails: a silent bar, no error
    quiet = progress_bar(3, True, "work")
    assert not hasattr(quiet, "total")
    quiet.update(1)
    quiet.close()
