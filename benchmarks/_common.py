"""Shared by the benchmark scripts: argparse types for counts and a ``main`` wrapper that turns a user's mistake
(a missing data folder or model file, a bad value) into one line on stderr and exit status 2, as the
``betheproj`` command does (its argparse type and error line are the command's own).  ``BETHEPROJ_TRACEBACK=1``
shows the full traceback instead."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
from collections.abc import Callable
from types import ModuleType

from betheproj.cli import error_text, int_type

positive_int = int_type(1)          # argparse type: an int >= 1
seed_int = int_type(0)              # argparse type: an int >= 0 (a random seed)


def distinct(parser: argparse.ArgumentParser, option: str, values: list) -> list:
    """``values`` of a repeatable ``option`` (``nargs``), refused through ``parser`` if one is given twice: a
    repeated fold or seed would run (and count) the same work twice."""
    repeated = sorted({v for v in values if values.count(v) > 1})
    if repeated:
        parser.error(f"{option}: each value at most once, got {', '.join(map(str, repeated))} more than once")
    return values


def float_type(minimum: float, strict: bool, below: float | None = None) -> Callable[[str], float]:
    """argparse type: a finite float ``> minimum`` (``strict``) or ``>= minimum``, and ``< below`` if given."""
    want = f"{'>' if strict else '>='} {minimum:g}" + ("" if below is None else f" and < {below:g}")

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number {want}, got {text!r}") from None
        in_range = (value > minimum if strict else value >= minimum) and (below is None or value < below)
        if not in_range or value == float("inf"):
            raise argparse.ArgumentTypeError(f"must be a finite number {want}, got {text!r}")
        return value
    return parse


positive_float = float_type(0.0, strict=True)
nonnegative_float = float_type(0.0, strict=False)
fraction = float_type(0.0, strict=False, below=1.0)     # argparse type: a float in [0, 1)


def timing_args(doc: str, repeats: int, statistic: str) -> argparse.Namespace:
    """``--repeats`` (default ``repeats``, timed calls per measurement, reduced by ``statistic``) and ``--threads``
    (default 2, set for torch) of a timing script whose help is ``doc``."""
    import torch

    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=positive_int, default=repeats,
                        help=f"timed calls per measurement ({statistic})")
    parser.add_argument("--threads", type=positive_int, default=2, help="torch threads (default 2)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    return args


def call_times(fn: Callable[[], object], repeats: int) -> list[float]:
    """Seconds of each of ``repeats`` calls of ``fn``, after one untimed call (warm-up)."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def best_time(fn: Callable[[], object], repeats: int) -> float:
    """The fastest of ``repeats`` timed calls of ``fn`` (after a warm-up), in seconds."""
    return min(call_times(fn, repeats))


def require(module: str, package: str, extra: str) -> ModuleType:
    """Import ``module`` for a peer or a plot; if it is missing, say which package (and extra) provides it in one
    line and exit 2, before any work."""
    try:
        return importlib.import_module(module)
    except ImportError:
        print(f"{os.path.basename(sys.argv[0])}: error: this needs {package} (pip install {package}, or the "
              f"package's extra: pip install -e \".[{extra}]\")", file=sys.stderr)
        sys.exit(2)


def crfsuite() -> ModuleType:
    """The CRFsuite peer (python-crfsuite, the ``bench`` extra), or one line and exit 2."""
    return require("pycrfsuite", "python-crfsuite", "bench")


def run(main: Callable[[], object]) -> None:
    """``main()``; a ``FileNotFoundError``, ``ValueError``, ``ImportError`` (a missing optional package) or other
    ``OSError`` becomes one line and exit 2; a closed standard output (a pipe into ``head``) a quiet exit 1."""
    name = os.path.basename(sys.argv[0])
    try:
        main()
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr)
        sys.exit(130)
    except BrokenPipeError:                     # e.g. `python benchmarks/X.py ... | head -1`: the reader left
        sys.stdout = open(os.devnull, "w")      # so the interpreter's final flush stays quiet
        sys.exit(1)
    except (ValueError, OSError, ImportError) as err:
        if os.environ.get("BETHEPROJ_TRACEBACK"):
            raise
        print(f"{name}: error: {error_text(err)}", file=sys.stderr)
        sys.exit(2)
