"""betheproj._files: the writability probe, torch.save failures as an OSError naming the file, and torch_load's
checks."""

import errno
import os
from pathlib import Path

import pytest
import torch

from betheproj import _files
from betheproj._files import check_writable, torch_load, torch_save


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


def test_write_atomically_leaves_the_earlier_file_when_a_write_fails(tmp_path):
    # a full disk or an interrupt part-way left a half-written model, results file or CoNLL-U output
    path = tmp_path / "results.json"
    path.write_text("earlier")

    def half(name):
        with open(name, "w") as f:
            f.write("half")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), name)

    with pytest.raises(OSError, match=f"No space left on device: '{path}'"):      # named as asked, not the part
        _files.write_atomically(path, half)
    assert path.read_text() == "earlier" and sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]

    def interrupted(name):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _files.write_atomically(path, interrupted)
    assert path.read_text() == "earlier" and len(list(tmp_path.iterdir())) == 1


def test_write_atomically_permissions_links_and_missing_folders(tmp_path):
    umask = os.umask(0o022)
    try:
        _files.write_atomically(tmp_path / "new.txt", lambda name: Path(name).write_text("x"))
    finally:
        os.umask(umask)
    assert (tmp_path / "new.txt").stat().st_mode & 0o777 == 0o644          # as a plain open() makes it, not 0o600
    target, link = tmp_path / "target.txt", tmp_path / "link.txt"
    target.write_text("old")
    link.symlink_to(target)
    _files.write_atomically(link, lambda name: Path(name).write_text("new"))
    assert link.is_symlink() and target.read_text() == "new"                # written through the link
    with pytest.raises(OSError, match=f"No such file or directory: '{tmp_path / 'missing' / 'x.json'}'"):
        _files.write_json(tmp_path / "missing" / "x.json", {"a": 1})


def test_torch_save_and_write_conllu_keep_the_earlier_file_when_a_write_fails(tmp_path, monkeypatch):
    from betheproj.data.conllu import parse_conllu, write_conllu

    model = tmp_path / "m.pt"
    torch_save({"a": 1}, model)
    before = model.read_bytes()

    def full_disk(obj, f, *args, **kwargs):                                 # what torch.save says on a full disk
        Path(f).write_bytes(b"PK half")
        raise RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 64 vs 0")

    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(OSError, match=f"cannot write {model}"):
        torch_save({"a": 2}, model)
    assert model.read_bytes() == before and len(list(tmp_path.iterdir())) == 1
    monkeypatch.undo()

    sentences = parse_conllu("1\tHi\thi\tINTJ\t_\t_\t0\troot\t_\t_\n\n")
    for name in ("out.conllu", "out.conllu.gz"):
        out = tmp_path / name
        write_conllu(sentences, out)
        before = out.read_bytes()

        def no_space(*args, **kwargs):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        monkeypatch.setattr("pathlib.Path.write_text", no_space)
        monkeypatch.setattr("gzip.compress", no_space)
        with pytest.raises(OSError, match=f"No space left on device: '{out}'"):
            write_conllu(sentences, out, [[0]])
        monkeypatch.undo()
        assert out.read_bytes() == before
        from betheproj.data.conllu import read_conllu
        assert read_conllu(out)[0].words[0][1] == "Hi"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.pt", "out.conllu", "out.conllu.gz"]


def test_save_figure_writes_atomically_in_the_suffixs_format(tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    try:
        _files.save_figure(fig, tmp_path / "a.png", 50)
        _files.save_figure(fig, tmp_path / "a.svg", 50)
        assert (tmp_path / "a.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert b"<svg" in (tmp_path / "a.svg").read_bytes()[:400]
    finally:
        plt.close(fig)

    class Broken:                                              # savefig failing part-way (a full disk)
        def savefig(self, name, **options):
            Path(name).write_bytes(b"\x89PNG half")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), name)

    before = (tmp_path / "a.png").read_bytes()
    with pytest.raises(OSError, match=f"No space left on device: '{tmp_path / 'a.png'}'"):
        _files.save_figure(Broken(), tmp_path / "a.png", 50)
    assert (tmp_path / "a.png").read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["a.png",
                                                                                                        "a.svg"]


def test_torch_load_checks_sparse_tensors(tmp_path):
    good, bad = tmp_path / "good.pt", tmp_path / "bad.pt"
    torch.save({"w": torch.sparse_coo_tensor([[0, 2]], [1.0, 2.0], (3,), check_invariants=True)}, good)
    assert torch.equal(torch_load(good, "test file")["w"].to_dense(), torch.tensor([1.0, 0.0, 2.0]))
    # index 7 in a size-3 tensor: unchecked, torch.load reads it and to_dense() silently drops the value
    damaged = torch.sparse_coo_tensor([[0, 7]], [1.0, 2.0], (3,), check_invariants=False)
    torch.save({"w": damaged}, bad)
    with pytest.raises(ValueError, match=f"{bad} is not a test file"):
        torch_load(bad, "test file")
    assert not torch.sparse.check_sparse_tensor_invariants.is_enabled()     # the global setting is left as it was
