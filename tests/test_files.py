"""betheproj._files: the writability probe and torch.save failures as an OSError naming the file."""

import errno
import os

import pytest
import torch

from betheproj import _files
from betheproj._files import check_writable, torch_save


def test_check_writable_probes_by_creating_a_file(tmp_path, monkeypatch):
    check_writable(tmp_path, "--out")
    assert list(tmp_path.iterdir()) == []                        # the probe is removed

    def read_only(*args, **kwargs):                              # root ignores chmod: fake a read-only mount
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(_files.tempfile, "mkstemp", read_only)
    with pytest.raises(ValueError, match=f"--out: cannot write in the folder {tmp_path} \\(Read-only file system\\)"):
        check_writable(tmp_path, "--out")


def test_torch_save_failures_are_os_errors_naming_the_path(tmp_path, monkeypatch):
    path = tmp_path / "missing" / "m.pt"
    with pytest.raises(OSError, match=f"cannot write {path}"):          # torch raises RuntimeError here
        torch_save({"a": 1}, path)

    def read_only(obj, f, *args, **kwargs):                              # what torch.save says on a read-only mount
        raise RuntimeError("[enforce fail at inline_container.cc:747] . open file failed with strerror: "
                           "Read-only file system")

    monkeypatch.setattr(torch, "save", read_only)
    with pytest.raises(OSError, match=f"cannot write {tmp_path / 'm.pt'} \\(Read-only file system\\)$"):
        torch_save({"a": 1}, tmp_path / "m.pt")


def test_write_json_writes_non_finite_floats_as_null(tmp_path):
    import json

    from betheproj._files import write_json

    path = tmp_path / "results.json"
    write_json(path, {"gap": float("nan"), "rows": [1.5, float("inf"), (2, -float("inf"))], "name": "x"})
    assert "NaN" not in path.read_text() and "Infinity" not in path.read_text()
    assert json.loads(path.read_text()) == {"gap": None, "rows": [1.5, None, [2, None]], "name": "x"}
