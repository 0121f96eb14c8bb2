"""File helpers shared by the command line and the model writers: a folder's writability, probed before long work,
``torch.save`` with its failures reported as an ``OSError`` naming the file (and ``torch.load`` with a file it cannot
read as a ``ValueError`` naming it), results written as strict JSON, and standard input read as UTF-8 text
(for a ``-`` given as an input file).

Imports nothing heavy at module level (the command line uses :func:`check_writable` before loading torch)."""

from __future__ import annotations

import json
import math
import os
import re
import sys
import tempfile
from pathlib import Path

__all__ = ["check_writable", "read_stdin", "torch_load", "torch_save", "write_json"]


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


def write_json(path: str | Path, obj: object) -> None:
    """Write ``obj`` to ``path`` as strict JSON (indented): a NaN or infinite float becomes ``null``, since
    ``json.dumps`` would write the bare ``NaN``/``Infinity`` that JSON does not allow and other readers reject."""
    Path(path).write_text(json.dumps(_finite_or_null(obj), indent=1, allow_nan=False))


def torch_save(obj: object, path: str | Path) -> None:
    """``torch.save(obj, path)``; a file that cannot be written (``torch.save`` raises ``RuntimeError`` for a missing
    or read-only folder, a full disk) is an ``OSError`` naming ``path``."""
    import torch

    try:
        torch.save(obj, path)
    except RuntimeError as err:
        text = str(err)
        found = re.search(r"strerror: (.+)", text)
        reason = found.group(1).strip() if found else (text.strip().splitlines() or ["unknown error"])[-1]
        raise OSError(f"cannot write {path} ({reason})") from None


def torch_load(path: str | Path, what: str, **options: object) -> object:
    """``torch.load(path, weights_only=True, **options)``; a file it cannot unpickle is a ``ValueError`` saying
    ``path`` is not a ``what`` (torch's own text, its advice on ``weights_only`` included, says nothing about our
    files).  An ``OSError`` (unreadable file) passes through."""
    import torch

    try:
        return torch.load(path, weights_only=True, **options)
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
