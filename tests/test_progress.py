import sys

import pytest

from betheproj.progress import close_bars, progress_bar


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


def test_an_error_or_interrupt_message_starts_its_own_line(monkeypatch, capsys):
    # "interrupted" (and errors) were written after the open bar's text, on its line
    tqdm = pytest.importorskip("tqdm")
    from betheproj import cli

    def interrupted(args):
        progress_bar(10, True, "tagging").update(3)
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_check_cgm_options", interrupted)
    assert cli.main(["cgm", "--quiet"]) == 130
    assert not getattr(tqdm.tqdm, "_instances", ())
    *_, cleared, message = capsys.readouterr().err.split("\r")          # the bar's line cleared, then the message
    assert cleared.strip() == "" and message == "betheproj cgm: interrupted\n"
    close_bars()                                                 # nothing open: nothing to do
