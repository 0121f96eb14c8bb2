"""The ``betheproj`` command line."""

from __future__ import annotations

import argparse
import contextlib
import errno
import io
import math
import os
import re
import signal
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, NoReturn, TextIO, TypeVar

from . import __version__

if TYPE_CHECKING:
    from pathlib import Path

    import torch

__all__ = ["main"]


class _Parser(argparse.ArgumentParser):
    """argparse, with usage errors as one line on stderr, and ``-inf``, ``-nan`` or ``-1e-3`` read as a value
    (argparse's own test for a negative number, ``-1`` or ``-.5``, read ``--rate -inf`` as a second option and
    said "expected one argument" instead of the range)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:      # argparse's, passed through
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = re.compile(r"^-(\d+\.?\d*|\.\d+)(e[+-]?\d+)?$|^-(inf|infinity|nan)$",
                                                   re.IGNORECASE)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


SEED_MAX = 2 ** 63 - 1


def int_type(low: int, high: int | None = None, high_text: str | None = None) -> Callable[[str], int]:
    """An argparse type: an int in ``[low, high]`` (``high`` None: no upper bound; ``high_text`` names it in the
    error).  Shared with the benchmark scripts and the example."""
    span = f">= {low}" if high is None else f"in [{low}, {high_text or high}]"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"must be an integer {span}, got {text!r}")
        return value

    return parse


# the argparse type of every ``--seed``: what NumPy and torch generators take
_seed = int_type(0, SEED_MAX, "2**63 - 1")


def _unit_float(text: str) -> float:
    """The argparse type of a probability threshold: a number in [0, 1]."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0.0 <= value <= 1.0:                  # NaN fails too
        raise argparse.ArgumentTypeError(f"must be a number in [0, 1], got {text!r}")
    return value


def _path(text: str) -> str:
    """The argparse type of an input path: not empty (``Path("")`` is the current folder, and the errors that
    followed named files there)."""
    if not text:
        raise argparse.ArgumentTypeError("must name a file or folder, got an empty path")
    return text


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="betheproj", description="Structured prediction with non-local "
                     "energies on marginals (Bethe projections).")
    parser.add_argument("--version", action="version", version=f"betheproj {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    sub.add_parser("demo", help="solve generated problems with every method and print the results")
    ocr = sub.add_parser("ocr", help="the handwriting experiment of section 8.2 (Table 3, Figures 1 and 2)")
    ocr.add_argument("--data", required=True, type=_path, help="folder holding ocr_letters.npz (or the file itself)")
    ocr.add_argument("--folds", default="0-9", help="test folds, e.g. '0-9' (default) or '0,3'")
    ocr.add_argument("--rows", default="all",
                     help="comma-separated rows among 2gram, Lu, Lu-mm, Lw, Lw-mm, 55class (default: all)")
    ocr.add_argument("--out", default="ocr-results", help="folder for results.json and the PNGs (default ocr-results)")
    ocr.add_argument("--seed", type=_seed, default=0,
                     help="seed of the random Fourier features, the bandwidth sample and the minibatch order "
                          "(default 0)")
    ocr.add_argument("--device", default="cpu", help="where the models train and infer: cpu (default) or cuda")
    ocr.add_argument("--quiet", action="store_true", help="no progress bars or per-fold lines")
    cit = sub.add_parser("citations", help="citation field extraction with learned soft global constraints "
                         "(section 8.1, Table 1, Figures 1 and 2)")
    cit.add_argument("--data", type=_path, help="folder holding training.docs, dev.docs and testing.docs (required "
                     "to train; not with --predict)")
    cit.add_argument("--out", default="citations-results",
                     help="folder for results.json, the PNGs and model.pt (default citations-results)")
    cit.add_argument("--seed", type=_seed, default=None,
                     help="seed of Algorithm 3's minibatch order when learning the constraint weights (default 0)")
    cit.add_argument("--cross-fit", type=int_type(2), default=None, metavar="K",
                     help="learn the constraint weights on dev and on the training split's K-fold cross-fitted "
                          "potentials (each fold scored by a CRF trained on the others); default: on dev alone, as "
                          "the paper")
    cit.add_argument("--predict", metavar="FILE",
                     help="tag the raw citation strings of FILE (one a line; - for standard input) with the model "
                          "in --out; prints nested tags")
    cit.add_argument("--mbr", type=_unit_float, nargs="?", const=-1.0, default=None, metavar="T",
                     help="with --predict: decode for segment F1, the segments more probable than T, instead of "
                          "Proposition 1's MAP; without T, the threshold dev chose in the training run (saved in "
                          "--out's model.pt)")
    cit.add_argument("--quiet", action="store_true", help="no progress bars")
    cgm = sub.add_parser("cgm", help="bird-migration collective graphical model (section 8.3) on a generated instance")
    cgm.add_argument("--grid", type=int, default=10, help="G: a G x G grid of cells, s = G^4 (default 10)")
    cgm.add_argument("--steps", type=int, default=10, help="T time steps (default 10)")
    cgm.add_argument("--population", type=int, default=100_000, help="M individuals (default 100000)")
    cgm.add_argument("--rate", type=float, default=0.5, help="detection rate alpha > 0 (default 0.5)")
    cgm.add_argument("--seasons", type=int, default=1, help="independent seasons observed (default 1)")
    cgm.add_argument("--noise", type=float, default=0.0,
                     help="Gaussian noise on the true transition log-potentials (default 0)")
    cgm.add_argument("--seed", type=_seed, default=0,
                     help="seed of the generated instance: attractiveness, start, noise and counts (default 0)")
    cgm.add_argument("--compare", action="store_true", help="also solve with CVXPY + Clarabel (the cgm extra)")
    cgm.add_argument("--learn", action="store_true", help="learn the transition model by hard EM from the counts")
    cgm.add_argument("--schedule", choices=("quasi_newton", "alternate"), default=None,
                     help="with --learn, hard EM's schedule: L-BFGS on the parameters with an E-step per evaluation "
                          "(quasi_newton, the default), or alternating E- and M-steps")
    cgm.add_argument("--out", default="cgm-results",
                     help="folder for results.json and flows.png (default cgm-results)")
    cgm.add_argument("--device", default="cpu",
                     help="where the solver runs: cpu (default; a NumPy fast path up to a 20 x 20 grid) or cuda")
    cgm.add_argument("--quiet", action="store_true", help="no progress bars")
    from .parsing.cli import register as register_parse

    register_parse(sub)
    return parser


def _int_list(text: str, name: str, low: int, high: int) -> list[int]:
    values: list[int] = []
    for part in text.split(","):
        try:
            a, b = (int(v) for v in (part.split("-") if "-" in part else (part, part)))
        except ValueError:
            raise ValueError(f"{name} must be integers or ranges like '0-9,12', got {text!r}") from None
        if a > b:
            raise ValueError(f"{name}: the range {part!r} runs backwards (write '{b}-{a}')")
        if a < low or b > high:                  # before the range is listed: '0-1000000000000' fills memory
            raise ValueError(f"{name} must lie in {low}..{high}, got {text!r}")
        values.extend(range(a, b + 1))
    return sorted(set(values))


def _out_folder(path: str, files: tuple[str, ...], flag: str = "--out") -> Path:
    """``path`` as a folder, created if missing, that takes new files (probed) and where none of the ``files`` the
    command will write is a folder: checked before any long work, so a bad path fails at once."""
    from pathlib import Path

    from ._files import check_writable

    if not path:
        raise ValueError(f"{flag} must name a folder, got an empty path")
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"{flag}: {folder} exists and is not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ValueError(f"{flag}: cannot create the folder {folder} ({err.strerror or err})") from None
    check_writable(folder, flag)
    for name in files:
        if (folder / name).is_dir():
            raise ValueError(f"{flag}: {folder / name} is a folder; the results are written to a file of that name")
    return folder


def _physical_memory() -> int | None:
    """Bytes of memory of this machine, or ``None`` where the OS does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def _address_space_left() -> int | None:
    """Bytes this process may still map under its address-space limit (``ulimit -v``), or ``None`` without one."""
    try:
        import resource

        limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    except (ImportError, AttributeError, ValueError, OSError):    # no resource module off Unix
        return None
    if limit == resource.RLIM_INFINITY or limit < 0:
        return None
    try:                                          # what is mapped already (torch alone maps about 0.7 GB)
        with open("/proc/self/statm") as handle:
            used = int(handle.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        used = 0
    return max(limit - used, 0)


_CGROUP_FILES = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")   # v2, v1


def _cgroup_limit() -> int | None:
    """The memory limit of this process's container (cgroup v2 or v1), or ``None`` where none is set or readable."""
    for path in _CGROUP_FILES:
        try:
            with open(path) as handle:
                text = handle.read().strip()
        except OSError:
            continue
        return int(text) if text.isdigit() else None          # "max": no limit
    return None


def _memory_limit() -> tuple[int, str]:
    """The most memory a run can use and what sets it, for the error: the machine's memory (64 GB where the OS does
    not say), or less under an address-space limit (``ulimit -v``) or a container's memory limit."""
    have = _physical_memory() or 64 * 2 ** 30
    what = f"this machine's {_bytes(have)}"
    for limit, name in ((_cgroup_limit(), "memory limit of this container (cgroup)"),
                        (_address_space_left(), "of address space left under this process's limit (ulimit -v)")):
        if limit is not None and limit < have:
            have, what = limit, f"the {_bytes(limit)} {name}"
    return have, what


def _check_cgm_options(args: argparse.Namespace) -> None:
    """The ranges the library checks, named as options (``--rate`` where the library says ``rate``)."""
    from ._checks import check_int, check_nonnegative, check_positive

    # sizes beyond int64 (which the tensors index in) would also overflow the memory estimate's float
    check_int("--grid", args.grid, 1, 2 ** 63 - 1)
    check_int("--steps", args.steps, 2, 2 ** 63 - 1)
    check_int("--population", args.population, 1, 2 ** 63 - 1)
    check_positive("--rate", args.rate)
    from .cgm.model import _POISSON_LAM_MAX

    if args.rate * args.population > _POISSON_LAM_MAX:
        raise ValueError(f"--rate x --population must be at most {_POISSON_LAM_MAX:.3g} (numpy's Poisson sampler "
                         f"draws the observed counts), got {args.rate!r} x {args.population!r}")
    if args.population > 2 ** 53:
        raise ValueError(f"--population must be at most 2**53 = {2 ** 53} (the float64 model holds counts exactly "
                         f"only up to there), got {args.population}")
    # the observed counts are Poisson draws of mean at most rate x population: ten standard deviations above it
    # must stay exact too (the draw itself is checked again, but only after --out is created)
    lam = args.rate * args.population
    if lam < sys.float_info.min:                 # as the solver requires, but before --out is created
        raise ValueError(f"--rate x --population must be a normal float64 number (the scale of the expected counts), "
                         f"got {args.rate!r} x {args.population!r} = {lam!r}")
    if lam + 10 * math.sqrt(lam) > 2 ** 53:
        raise ValueError(f"--rate x --population must leave the observed counts (Poisson draws of mean up to "
                         f"{lam:.4g}) at most 2**53 = {2 ** 53}, which the float64 model holds exactly; got "
                         f"{args.rate!r} x {args.population!r}")
    check_int("--seasons", args.seasons, 1, 2 ** 63 - 1)
    check_nonnegative("--noise", args.noise)
    # noise x the N(0, 1) draws (|z| < 9 in float64) plus log-probabilities (> -746) must stay finite: checked by the
    # model too, but only after --out is created
    if args.noise > sys.float_info.max / 64:
        raise ValueError(f"--noise must be at most {sys.float_info.max / 64:.3g} (it scales N(0, 1) draws added to "
                         f"float64 log-potentials), got {args.noise!r}")


# CVXPY + Clarabel's peak per edge marginal of one example's problem (measured 2026-11-28 on this project's 2-core
# machine, less the interpreter's 240 MB: 6.4 KB at G = 8, T = 10; 4.8 KB at G = 10, T = 10; 4.3 KB at T = 20)
_IP_BYTES = 5_000


def _check_cgm_size(grid: int, steps: int, seasons: int, device: torch.device | None = None,
                    compare: bool = False) -> None:
    """``ValueError`` naming ``--grid``, ``--steps`` and ``--seasons`` when the instance cannot fit in memory, before
    anything is allocated.

    The transition model, the simulated counts and the solver hold about ``6 + 2 x seasons`` float64 arrays of
    ``(steps - 1) x s`` entries, ``s = G^4`` (measured peak: 5.2 of them at G = 32, T = 10, one season, 392 MB),
    which must fit in the machine's memory, in a container's memory limit and in the address space left under
    ``ulimit -v``.  With ``compare`` the interior-point solver's problem, about 5 KB per edge marginal of an
    example (``(steps - 1) x s``), must fit beside them (7.2 GB at G = 20, T = 10).
    With a CUDA ``device`` they must fit in its memory too (the instance is drawn in the machine's)."""
    if grid < 1 or steps < 2 or seasons < 1:
        return                                   # out of range: the library names the argument
    s = grid ** 4
    need = 8 * s * (steps - 1) * (6 + 2 * seasons)
    have, what = _memory_limit()
    if need > have:
        raise ValueError(f"--grid {grid} --steps {steps} --seasons {seasons}: a {grid} x {grid} grid has "
                         f"s = G^4 = {s:,} pairs of cells per step, and the run needs about {_bytes(need)} of memory "
                         f"(6 + 2 x seasons arrays of (steps - 1) x s floats), more than {what}; use a smaller "
                         f"--grid, --steps or --seasons")
    ip_need = need + _IP_BYTES * s * (steps - 1)
    if compare and ip_need > have:
        raise ValueError(f"--compare: CVXPY + Clarabel need about {_bytes(ip_need)} of memory at --grid {grid} --steps "
                         f"{steps} (about {_bytes(_IP_BYTES)} per edge marginal, (steps - 1) x s = "
                         f"{s * (steps - 1):,} of them), more than {what}; compare on a smaller --grid or --steps")
    if device is not None and device.type == "cuda":
        import torch

        have = torch.cuda.get_device_properties(device).total_memory
        if need > have:
            raise ValueError(f"--grid {grid} --steps {steps} --seasons {seasons}: the run needs about {_bytes(need)} "
                             f"of memory on {device}, more than its {_bytes(have)}; use a smaller --grid, --steps or "
                             f"--seasons, or --device cpu")


def _bytes(n: float) -> str:
    if n < 1000:
        return f"{n:,.0f} bytes"
    for unit in ("KB", "MB", "GB"):
        n /= 1000
        if n < 1000:
            return f"{n:,.1f} {unit}"
    return f"{n / 1000:,.1f} TB"


def _need_matplotlib() -> None:
    """Fail before the work, not after it, when the figures cannot be drawn."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ImportError("matplotlib is needed for the figures: pip install 'betheproj[plot]'") from None


def _ocr(args: argparse.Namespace) -> None:
    from ._checks import check_device
    from .data.ocr import load_ocr
    from .experiments import ocr

    folds = _int_list(args.folds, "--folds", 0, 9)
    rows = list(ocr.ROWS) if args.rows == "all" else [r.strip() for r in args.rows.split(",")]
    unknown = [repr(r) for r in rows if r not in ocr.ROWS]
    if unknown:
        raise ValueError(f"--rows must be among {', '.join(ocr.ROWS)}, got {', '.join(unknown)}")
    rows = list(dict.fromkeys(rows))                         # each row once, in the order given
    device = check_device("--device", args.device)
    data = load_ocr(args.data)
    if any(r in ocr.ENERGY_ROWS for r in rows):
        _need_matplotlib()
    ocr.check_folds(data, folds, rows)                       # before --out is created
    out = _out_folder(args.out, ("results.json", "accuracy_vs_iterations.png", "iterations_histogram.png"))
    log = None if args.quiet else (lambda line: print(line, file=sys.stderr))
    results = ocr.run(data, folds, rows, ocr.OCRConfig(seed=args.seed), progress=not args.quiet, log=log,
                      device=device)
    print(ocr.format_table(results))
    from ._files import write_json

    write_json(out / "results.json", results)
    written = [out / "results.json"]
    if any(r in ocr.ENERGY_ROWS for r in rows):
        ocr.plot_iterations(results, str(out / "accuracy_vs_iterations.png"))
        ocr.plot_histogram(results, str(out / "iterations_histogram.png"))
        written += [out / "accuracy_vs_iterations.png", out / "iterations_histogram.png"]
    print("wrote " + ", ".join(str(p) for p in written))


def _citations(args: argparse.Namespace) -> None:
    from pathlib import Path

    from .experiments import citations

    out = Path(args.out)
    if args.predict is not None:
        if args.data is not None:
            raise ValueError("--data is for training; --predict tags with the model already in --out (give one)")
        if args.seed is not None:
            raise ValueError("--seed is for training (Algorithm 3's minibatch order); --predict uses the model "
                             "already in --out and draws nothing at random")
        if args.cross_fit is not None:
            raise ValueError("--cross-fit is for training (how the constraint weights are learned); --predict uses the "
                             "model already in --out")
        if args.predict == "":
            raise ValueError("--predict: give a file (or - for standard input), got an empty name")
        if not args.out:                         # Path("") is the working folder
            raise ValueError("--out must name a folder, got an empty path")
        source = Path(args.predict)
        if args.predict != "-" and (not source.exists() or source.is_dir()):   # a pipe is read like a file
            raise FileNotFoundError(f"--predict: expected a file of raw citations, one a line, at {source}, found "
                                    f"{'a folder' if source.is_dir() else 'none'}")
        index, model, _, chosen = citations.load_run(out / "model.pt")
        if args.mbr == -1.0:                     # --mbr alone (const, outside [0, 1]): the training run's choice
            if chosen is None:
                raise ValueError(f"--mbr: {out / 'model.pt'} holds no segment-MBR threshold (trained before it was "
                                 "saved there, or without mbr_thresholds); give one (--mbr 0.5)")
            args.mbr = chosen
        if args.predict == "-":
            from ._files import read_stdin

            text = read_stdin("--predict")
        else:
            try:
                text = source.read_text(encoding="utf-8-sig")     # a byte-order mark is no part of the first word
            except UnicodeDecodeError as err:
                raise ValueError(f"--predict: {source} is not UTF-8 text ({err})") from None
        lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")   # one output line per input line
                                                                            # (read_text turns \r into \n too)
        if lines and lines[-1] == "":
            lines.pop()
        for line in citations.tag_strings(lines, index, model, progress=not args.quiet, mbr_threshold=args.mbr):
            print(line)
        return
    if args.mbr is not None:
        raise ValueError("--mbr is for --predict (how new citations are decoded); training reports both decoders")
    if args.data is None:
        raise ValueError("--data is required (or --predict FILE to tag with a trained model)")
    from .data.citations import SPLITS, citation_file, load_citations

    data = load_citations(args.data)
    for split, name in SPLITS.items():
        if not data[split]:
            raise ValueError(f"--data: {citation_file(Path(args.data) / name)} holds no citations")
    _need_matplotlib()
    out = _out_folder(args.out, ("results.json", "f1_vs_iterations.png", "iterations_histogram.png", "model.pt"))
    log = None if args.quiet else (lambda line: print(line, file=sys.stderr))
    config = citations.CitationConfig(seed=0 if args.seed is None else args.seed, cross_fit=args.cross_fit or 0)
    results = citations.run(data, config, progress=not args.quiet, log=log, save=out / "model.pt")
    print(citations.format_table(results))
    from ._files import write_json

    write_json(out / "results.json", results)
    citations.plot_iterations(results, str(out / "f1_vs_iterations.png"))
    citations.plot_histogram(results, str(out / "iterations_histogram.png"))
    print(f"wrote {out / 'results.json'}, {out / 'f1_vs_iterations.png'}, {out / 'iterations_histogram.png'}, "
          f"{out / 'model.pt'}")


@contextlib.contextmanager
def _deferred_interrupt() -> Iterator[list[bool]]:
    """Ctrl-C recorded, not raised, inside the block (in the main thread): a KeyboardInterrupt raised while torch's
    native modules load can abort the interpreter (pybind11's ``terminate``) instead of reaching our handler."""
    seen: list[bool] = []
    if threading.current_thread() is not threading.main_thread():
        yield seen
        return
    previous = signal.signal(signal.SIGINT, lambda *_: seen.append(True))
    try:
        yield seen
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler if previous is None else previous)


class _ClosedStdout(io.TextIOBase):
    """Standard output when the process started without one (``betheproj ... >&-``): Python's ``sys.stdout`` is then
    None and ``print`` drops its text silently; writing here is an error instead, as in coreutils."""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        raise OSError(errno.EBADF, "standard output is closed")


_T = TypeVar("_T")


class _NamedStdout:
    """Standard output whose write errors name it: a full disk under ``betheproj ... > file`` said "No space left
    on device" alone, as if a file the command writes were full.  Everything else goes to the stream."""

    def __init__(self, stream: TextIO):
        self.stream = stream

    def _named(self, call: Callable[..., _T], *args: object) -> _T:
        try:
            return call(*args)
        except OSError as err:
            if err.filename is not None or err.errno is None:
                raise
            raise OSError(err.errno, err.strerror, "standard output") from None   # EPIPE stays a BrokenPipeError

    def write(self, text: str) -> int:
        return self._named(self.stream.write, text)

    def flush(self) -> None:
        self._named(self.stream.flush)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def main(argv: list[str] | None = None) -> int:
    """Run ``betheproj ARGS``; returns the exit status (0, 1 on a closed pipe, 2 on an error or running out of
    memory, 130 on Ctrl-C)."""
    if sys.stdout is None:
        sys.stdout = _ClosedStdout()
    try:
        with _deferred_interrupt() as interrupted:
            args = _parser().parse_args(argv)    # imports torch (through the parse subcommand): about 2 s
    except KeyboardInterrupt:
        interrupted = [True]
    if interrupted:
        print("betheproj: interrupted", file=sys.stderr)
        return 130
    stdout = sys.stdout
    if not isinstance(stdout, _ClosedStdout | _NamedStdout):
        sys.stdout = _NamedStdout(stdout)
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _one_line_warning
            return _run(args)
    finally:
        if isinstance(sys.stdout, _NamedStdout):          # else dropped (a closed pipe, a full disk): left so
            sys.stdout = stdout


def error_text(err: BaseException) -> str:
    """An error as one line (an ``OSError`` as its reason and file name), whatever the exception held."""
    detail: object = err
    if isinstance(err, UnicodeEncodeError):                 # text the output's encoding (a non-UTF-8 locale) lacks
        return (f"cannot write {err.object[err.start:err.end]!r} in the {err.encoding} encoding of the output: run "
                f"with PYTHONIOENCODING=utf-8 or in a UTF-8 locale")
    if isinstance(err, OSError) and err.strerror:          # its reason without "[Errno N]"
        detail = f"{err.strerror}: {err.filename}" if err.filename else err.strerror
    return " ".join(str(detail).split())


def _one_line_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                      file: TextIO | None = None, line: str | None = None) -> None:
    """Library warnings on the command line: one line on stderr, without the source line."""
    text = " ".join(str(message).split())
    print(f"betheproj: warning: {text}", file=sys.stderr)


def _run(args: argparse.Namespace) -> int:
    try:
        if args.command == "demo":
            from .demo import run_demo
            run_demo()
        elif args.command == "ocr":
            _ocr(args)
        elif args.command == "citations":
            _citations(args)
        elif args.command == "parse":
            from .parsing.cli import run as run_parse

            run_parse(args)
        elif args.command == "cgm":
            if args.schedule is not None and not args.learn:
                raise ValueError("--schedule applies to hard EM only: add --learn, or leave --schedule out")
            _check_cgm_options(args)
            from ._checks import check_device

            device = check_device("--device", args.device)
            _check_cgm_size(args.grid, args.steps, args.seasons, device, compare=args.compare)
            from .experiments import cgm

            _need_matplotlib()
            if args.compare:
                from .cgm.interior_point import check_installed

                check_installed()
            _out_folder(args.out, ("results.json", "flows.png"))
            cgm.run(args.grid, args.steps, args.population, args.rate, args.seasons, args.noise, args.seed,
                    args.compare, args.learn, args.out, args.schedule or "quasi_newton", progress=not args.quiet,
                    device=device)
        sys.stdout.flush()                       # a full disk or a closed pipe is reported here, not at exit
    except BrokenPipeError:                      # e.g. `betheproj citations --predict F | head`
        sys.stdout = open(os.devnull, "w")       # so the interpreter's final flush stays quiet
        return 1
    except KeyboardInterrupt:
        from .progress import close_bars

        close_bars()
        print(f"betheproj {args.command}: interrupted", file=sys.stderr)
        _drop_stdout()
        return 130
    # Warning: a library warning that the caller's warnings filter (``python -W error``) turned into an error
    except (ValueError, TypeError, ImportError, OSError, EOFError, Warning) as err:
        message = error_text(err)
        from .progress import close_bars

        close_bars()
        print(f"betheproj {args.command}: error: {message}", file=sys.stderr)
        _drop_stdout()
        return 2
    except (MemoryError, RuntimeError) as err:
        oom = memory_text(err)
        if oom is None:                          # any other RuntimeError is a bug: its traceback says where
            raise
        print(f"betheproj {args.command}: error: {oom}", file=sys.stderr)
        _drop_stdout()
        return 2
    return 0


def memory_text(err: BaseException) -> str | None:
    """An allocation failure as one line: Python's or NumPy's ``MemoryError``, or the ``RuntimeError`` of torch's
    CPU allocator or of CUDA running out of memory (e.g. under ``ulimit -v``); ``None`` for any other error."""
    text = " ".join(str(err).split())
    if isinstance(err, MemoryError):
        detail = text
    elif any(cls.__name__ == "OutOfMemoryError" for cls in type(err).__mro__):   # torch's CUDA OOM
        detail = text
    elif isinstance(err, RuntimeError) and "can't allocate memory" in text:          # torch's CPU allocator
        size = re.search(r"tried to allocate (\d+) bytes", text)
        detail = f"could not allocate {_bytes(int(size.group(1)))}" if size else text
    else:
        return None
    return "out of memory" + (f": {detail}" if detail else "")


def _drop_stdout() -> None:
    """Write what stdout still holds where it can be written, and send the rest to nowhere: the interpreter's
    own flush at exit would print "Exception ignored ..." and exit 120 on a full disk or a closed pipe."""
    try:
        sys.stdout.flush()
    except (OSError, ValueError):                # ValueError: stdout closed
        sys.stdout = open(os.devnull, "w")


if __name__ == "__main__":
    sys.exit(main())
