"""File helpers shared by the command line and the model writers: a folder's writability, probed before long work,
files written atomically (a failed write leaves the earlier file), ``torch.save`` with its failures reported as an
``OSError`` naming the file (and ``torch.load`` with a file it cannot read as a ``ValueError`` naming it), results
written as strict JSON, and standard input read as UTF-8 text (for a ``-`` given as an input file).

Imports nothing heavy at module level (the command line uses :func:`check_writable` before loading torch)."""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["check_writable", "read_stdin", "save_figure", "torch_load", "torch_save", "write_atomically",
           "write_json"]


def check_writable(folder: str | Path, what: str) -> None:
    """``ValueError`` naming ``what`` (an option, a file) when no file can be created in ``folder``: probed by
    creating and deleting a file there, which also catches read-only mounts and full quotas that permission bits
    do not show (and ``os.access`` does not see as root)."""
    folder = Path(folder)
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".betheproj-write-test-")
    except OSError as err:
        raise ValueError(f"{what}: cannot write in the folder {folder} ({err.strerror or err})") from None
    os.close(fd)
    os.unlink(probe)


def _finite_or_null(obj: object) -> object:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {key: _finite_or_null(value) for key, value in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite_or_null(value) for value in obj]
    return obj


def write_atomically(path: str | Path, write: Callable[[str], object]) -> None:
    """``write(name)`` into a new file beside ``path``, renamed over ``path`` once written: a write that fails (a
    full disk, an interrupt) leaves ``path`` as it was, never half-written, and leaves no file behind.  A symbolic
    link is written through (its target replaced); an existing pipe or device is written in place.  The file gets
    the permissions a new file gets (``0o666`` less the umask).  A folder that takes no new file is an ``OSError``
    naming ``path``."""
    if os.path.exists(path) and not os.path.isfile(path):      # through links: /dev/fd/N names a pipe
        write(str(path))
        return
    target = Path(os.path.realpath(path))
    try:
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".part")
    except OSError as err:
        raise OSError(err.errno, err.strerror, str(path)) from None
    os.close(fd)
    try:
        write(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, target)
    except BaseException as err:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(err, OSError) and err.filename == tmp:        # name the file asked for, not the part file
            raise OSError(err.errno, err.strerror, str(path)) from None
        raise


def write_json(path: str | Path, obj: object) -> None:
    """Write ``obj`` to ``path`` (atomically: :func:`write_atomically`) as strict JSON (indented): a NaN or infinite
    float becomes ``null``, since ``json.dumps`` would write the bare ``NaN``/``Infinity`` that JSON does not allow
    and other readers reject."""
    text = json.dumps(_finite_or_null(obj), indent=1, allow_nan=False)
    write_atomically(path, lambda name: Path(name).write_text(text))


def save_figure(fig: Figure, path: str | Path, dpi: int) -> None:
    """A matplotlib figure's ``savefig`` to ``path`` at ``dpi``, atomically (:func:`write_atomically`), in the format
    ``path``'s suffix names (PNG without one)."""
    fmt = Path(path).suffix[1:].lower() or "png"
    write_atomically(path, lambda name: fig.savefig(name, dpi=dpi, format=fmt))


def torch_save(obj: object, path: str | Path) -> None:
    """``torch.save(obj, path)``, atomically (:func:`write_atomically`: a failed write leaves an earlier file at
    ``path`` as it was); a file that cannot be written (``torch.save`` raises ``RuntimeError`` for a read-only
    folder, a full disk; a missing folder) is an ``OSError`` naming ``path``."""
    import torch

    def save(name: str) -> None:
        try:
            torch.save(obj, name)
        except RuntimeError as err:
            text = str(err)
            found = re.search(r"strerror: (.+)", text)
            reason = found.group(1).strip() if found else (text.strip().splitlines() or ["unknown error"])[-1]
            raise OSError(f"cannot write {path} ({reason})") from None

    try:
        write_atomically(path, save)
    except OSError as err:
        if err.filename is None:
            raise
        raise OSError(f"cannot write {path} ({err.strerror or err})") from None


def torch_load(path: str | Path, what: str, *, map_location: str | None = None) -> object:
    """``torch.load(path, weights_only=True, map_location=map_location)``; a file it cannot unpickle is a
    ``ValueError`` saying ``path`` is not a ``what`` (torch's own text, its advice on ``weights_only`` included, says
    nothing about our files).  Sparse tensors in it are checked (indices inside their size), so a damaged one is
    that ``ValueError`` too, not a wrong read later (the check being explicit also keeps torch 2.11 from warning that
    it is off).  An ``OSError`` (unreadable file) passes through."""
    import torch

    try:
        with torch.sparse.check_sparse_tensor_invariants(True):
            return torch.load(path, weights_only=True, map_location=map_location)
    except OSError:
        raise
    except Exception:  # noqa: BLE001 - any other failure to unpickle means "not a model file"
        raise ValueError(f"{path} is not a {what} (torch.load cannot read it: not a file torch.save wrote, or a "
                         "damaged one)") from None


def read_stdin(what: str) -> str:
    """All of standard input as UTF-8 text (a byte-order mark dropped), whatever the locale's encoding;
    ``ValueError`` naming ``what`` (an option) when it is not UTF-8."""
    stream = sys.stdin
    if stream is None:
        raise ValueError(f"{what}: there is no standard input to read")
    buffer = getattr(stream, "buffer", None)
    if buffer is None:                     # a text-only stream (tests, embedding): already decoded
        return stream.read().removeprefix("\ufeff")
    try:
        return buffer.read().decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise ValueError(f"{what}: standard input is not UTF-8 text ({err})") from None
