"""``betheproj parse``: train, evaluate and run the arc-factored dependency parser on CoNLL-U files.

Hooked into the main command line by :func:`register` (adds the ``parse`` subcommand) and :func:`run`
(executes it; raises ``ValueError`` / ``FileNotFoundError`` for the caller's one-line error report).
:func:`main` runs the subcommand on its own with the same error style.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

if TYPE_CHECKING:
    from collections.abc import Callable

    import numpy as np

    from ..cli import _Parser
    from ..data.conllu import Sentence
    from .parser import DependencyParser
    from .second_order import SecondOrderParser

__all__ = ["register", "run", "main"]

LOSS_NAMES = ("crf", "svm", "softmax_margin")         # the perceptron loss makes no step from w = 0
DECODERS = ("mean_field", "loopy_bp")
DEFAULT_LOSS, DEFAULT_LAM = "crf", 1e-4
FIRST_ORDER_ONLY = ("loss", "lam", "projective", "single_root", "xpos")
"""``parse train`` options of arc-factored training only: their defaults are ``None`` so that giving them with
``--second-order`` is an error (the stated defaults are applied in :func:`run`)."""


class _DecodingOptions(TypedDict, total=False):
    max_iter: int
    damping: float


_DECODING: dict[str, _DecodingOptions] = {"mean_field": {"max_iter": 10},
                                          "loopy_bp": {"max_iter": 20, "damping": 0.3}}   # chosen on dev


def register(subparsers: argparse._SubParsersAction[_Parser]) -> argparse.ArgumentParser:
    """Add ``parse {train,eval,predict}`` to ``subparsers`` (of the ``betheproj`` parser); returns its parser."""
    from ..cli import _path, _seed

    parse = subparsers.add_parser("parse", help="dependency parser (Turbo Parsers: arc-factored by Algorithm 1, or "
                                  "second-order) on CoNLL-U files: train, eval, predict")
    sub = parse.add_subparsers(dest="parse_command", required=True, parser_class=type(parse),
                               metavar="{train,eval,predict}")
    train = sub.add_parser("train", help="train a parser on a CoNLL-U treebank (gold UPOS, lemmas and heads)")
    train.add_argument("--train", required=True, type=_path, metavar="FILE",
                       help="training treebank (.conllu or .conllu.gz)")
    train.add_argument("--dev", type=_path, metavar="FILE", help="development treebank: UAS after every epoch")
    train.add_argument("--model", required=True, metavar="OUT", help="where to write the model")
    train.add_argument("--loss", choices=LOSS_NAMES, default=None,
                       help=f"member of the loss family L_{{beta,gamma}} (Figure 4; default {DEFAULT_LOSS}; not with "
                            "--second-order)")
    train.add_argument("--epochs", type=int, default=None,
                       help="passes over the data (default 10; 3 with --second-order)")
    train.add_argument("--second-order", type=_path, metavar="FIRST",
                       help="train a second-order (sibling + grandparent) model by Algorithm 3 with the mean-field "
                            "energy on top of the arc-factored model FIRST (which also prunes arcs)")
    train.add_argument("--lam", type=float, default=None,
                       help="regularisation lambda: steps are capped at 1/(lambda m) (default 1e-4; not with "
                            "--second-order)")
    train.add_argument("--bits", type=int, default=22, help="hashed weight vector of 2^bits entries: 8..30, 8..28 with "
                       "--second-order (default 22); training needs about 28 bytes a weight (1.9 GB at 26), 34 with "
                       "--second-order")
    train.add_argument("--projective", action="store_true", default=None,
                       help="projective trees (Eisner) instead of CLE (not with --second-order, which is "
                            "non-projective)")
    train.add_argument("--single-root", action="store_true", default=None,
                       help="exactly one word attaches to the root (not with --second-order, which keeps FIRST's "
                            "setting)")
    train.add_argument("--xpos", action="store_true", default=None,
                       help="also use feature templates over the XPOS column (not with --second-order, which keeps "
                            "FIRST's setting)")
    train.add_argument("--no-context", action="store_true",
                       help="leave out the context templates (first order: neighbouring words, three-tag "
                            "back-offs; second order: word-tag back-offs, neighbouring tags)")
    train.add_argument("--seed", type=_seed, default=0, help="shuffling seed (default 0)")
    train.add_argument("--quiet", action="store_true", help="no progress bars or per-epoch lines")
    ev = sub.add_parser("eval", help="UAS of a model on a treebank (punctuation excluded)")
    ev.add_argument("--model", required=True, type=_path, metavar="M", help="a model written by 'parse train'")
    ev.add_argument("--data", required=True, type=_path, metavar="FILE", help="treebank with gold heads")
    ev.add_argument("--punct", action="store_true", help="also score punctuation (gold UPOS PUNCT)")
    _decoding_options(ev)
    pred = sub.add_parser("predict", help="parse a CoNLL-U file: write it back with predicted HEAD")
    pred.add_argument("--model", required=True, type=_path, metavar="M", help="a model written by 'parse train'")
    pred.add_argument("--input", required=True, type=_path, metavar="FILE",
                      help="CoNLL-U input (FORM, LEMMA, UPOS used, and XPOS by models trained with --xpos; - for "
                           "standard input)")
    pred.add_argument("--output", metavar="FILE", help="output CoNLL-U (default, or -: standard output)")
    _decoding_options(pred)
    return parse


def _decoding_options(command: argparse.ArgumentParser) -> None:
    """The options ``eval`` and ``predict`` share."""
    command.add_argument("--batch-size", type=int,
                         help="sentences per decoding batch of arc-factored models (default 256)")
    command.add_argument("--decoder", choices=DECODERS,
                         help="second-order models: Bethe-RDA mean field (10 iterations; the default) or loopy BP "
                              "(20, damping 0.3)")
    command.add_argument("--quiet", action="store_true", help="no progress bar")


def _log(quiet: bool) -> Callable[[str], None] | None:
    return None if quiet else (lambda line: print(line, file=sys.stderr, flush=True))


def _positive(value: int, name: str) -> None:
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")


def _output_path(value: str, option: str, inputs: dict[str, str | None]) -> Path:
    """``value`` checked, before any work, to be a file ``option`` can write: its folder exists, is a folder and
    takes a new file (probed; not for an existing pipe or device), and it is not itself a folder, nor the file of one
    of the ``inputs`` (option -> path, ``None`` where not given), which writing would overwrite."""
    import os

    from .._files import check_writable

    if not value:
        raise ValueError(f"{option} must name a file, got an empty path")
    out = Path(value)
    if out.is_dir():
        raise ValueError(f"{option} {out} is a directory; expected a file name")
    for name, path in inputs.items():
        if path not in (None, "-") and out.exists() and Path(path).exists() and os.path.samefile(out, path):
            raise ValueError(f"{option} {out} is the {name} file {path}; writing there would overwrite it")
    if out.exists() and not out.is_file():      # a pipe or a device (bash's >(...), /dev/stdout): written in place,
        return out                               # not created in its folder (/dev/fd takes no new file)
    folder = out.parent
    if not folder.exists():
        raise FileNotFoundError(f"the folder of {option} {out} does not exist")
    if not folder.is_dir():
        raise ValueError(f"the folder of {option} {out} ({folder}) is not a directory")
    check_writable(folder, f"{option} {out}")
    return out


def _require_scorable(data: list[Sentence], option: str, path: str, punct: bool = False) -> None:
    """``ValueError`` when ``data`` (read from ``option`` ``path``) has no word with a gold HEAD to score."""
    from .metrics import scorable_words

    if not scorable_words(data, punct):
        scope = "" if punct else " (punctuation excluded)"
        raise ValueError(f"{option} {path} has no words with a gold HEAD{scope}")


def _read_state(path: str) -> dict[str, Any]:
    """The saved state of an arc-factored or a second-order model, whichever ``path`` holds (read once)."""
    from . import parser, second_order

    formats = {parser.FORMAT: parser.VERSION, second_order.FORMAT: second_order.VERSION}
    return parser.read_model(path, formats, "parser model file")


def _load(path: str) -> DependencyParser | SecondOrderParser:
    """An arc-factored or a second-order model, whichever ``path`` holds."""
    from . import parser, second_order

    state = _read_state(path)
    if state["format"] == second_order.FORMAT:
        return second_order.SecondOrderParser.from_state(state, path)
    return parser.DependencyParser.from_state(state, path)


def _load_first(path: str) -> DependencyParser:
    """The arc-factored model ``--second-order`` builds on; a second-order or a projective model there is named as
    such."""
    from . import parser, second_order

    state = _read_state(path)
    if state["format"] == second_order.FORMAT:
        raise ValueError(f"--second-order {path} is a second-order model; --second-order needs an arc-factored one "
                         "(written by 'parse train' without --second-order)")
    first = parser.DependencyParser.from_state(state, path)
    if first.projective:
        raise ValueError(f"--second-order {path} is a projective model; second-order parsing is non-projective: give "
                         "an arc-factored model trained without --projective")
    return first


def _check_memory(data: list[Sentence], option: str, path: str, second_order: bool = False) -> None:
    """``ValueError`` naming ``option``, ``path`` and the line of the longest sentence of ``data`` when parsing it
    (its arcs' features; with ``second_order`` the dense part tables of second-order decoding) cannot fit in this
    machine's memory (or under a container's or ``ulimit -v``'s limit: :func:`betheproj.cli._memory_limit`)."""
    from ..cli import _bytes, _memory_limit

    if not data:
        return
    have, limit = _memory_limit()
    longest = max(data, key=len)
    n = len(longest)
    if second_order:
        need = BYTES_PER_CUBE * (n + 1) ** 3
        what = ("second-order decoding (its (n + 1)^3 sibling and grandparent tables)", "split it, or parse with an "
                "arc-factored model")
    else:
        need = BYTES_PER_ARC * n * (n + 1)
        what = ("arc-factored parsing (the features of its n (n + 1) arcs)", "split it")
    if need > have:
        where = "<stdin>" if path == "-" else path
        raise ValueError(f"{option} {where}:{longest.line}: a sentence of {n} words needs about {_bytes(need)} of "
                         f"memory in {what[0]}, more than {limit}; {what[1]}")


def _check_decoding(parser: DependencyParser | SecondOrderParser, args: argparse.Namespace) -> None:
    """An option that does not apply to the model's kind is an error (as ``train``'s are), not ignored."""
    from .second_order import SecondOrderParser

    second = isinstance(parser, SecondOrderParser)
    if second and args.batch_size is not None:
        raise ValueError(f"--batch-size applies to arc-factored models; {args.model} is a second-order model")
    if not second and args.decoder is not None:
        raise ValueError(f"--decoder applies to second-order models; {args.model} is an arc-factored model")


def _heads(parser: DependencyParser | SecondOrderParser, data: list[Sentence], args: argparse.Namespace
           ) -> list[np.ndarray]:
    from .second_order import SecondOrderParser

    if isinstance(parser, SecondOrderParser):
        method = args.decoder or "mean_field"
        return parser.predict(data, method=method, progress=not args.quiet, **_DECODING[method])
    return parser.predict(data, batch_size=args.batch_size or 256, progress=not args.quiet)


def run(args: argparse.Namespace) -> None:
    """Execute ``parse train|eval|predict`` for parsed ``args``."""
    from ..data.conllu import load_conllu, write_conllu
    from .parser import DependencyParser, check_gold_trees
    from .second_order import SecondOrderParser

    if args.parse_command == "train":
        if args.epochs is not None:
            _positive(args.epochs, "--epochs")
        high = 28 if args.second_order else 30             # the second-order part features' largest table
        if not 8 <= args.bits <= high:
            raise ValueError(f"--bits must lie in 8..{high}{' with --second-order' if args.second_order else ''}, "
                             f"got {args.bits}")
        _check_bits_memory(args.bits, bool(args.second_order))
        if args.lam is not None and not (math.isfinite(args.lam) and args.lam > 0):
            raise ValueError(f"--lam must be a finite number > 0, got {args.lam}")
        if args.second_order:
            given = ["--" + name.replace("_", "-") for name in FIRST_ORDER_ONLY if getattr(args, name) is not None]
            if given:
                raise ValueError(f"{', '.join(given)} cannot be given with --second-order: the second-order model is "
                                 "trained by Algorithm 3 (no --loss or --lam), is non-projective, and keeps the "
                                 "--single-root and --xpos settings of FIRST")
        loss = DEFAULT_LOSS if args.loss is None else args.loss
        lam = DEFAULT_LAM if args.lam is None else args.lam
        out = _output_path(args.model, "--model", {"--train": args.train, "--dev": args.dev,
                                                   "--second-order": args.second_order})
        first = _load_first(args.second_order) if args.second_order else None
        train = load_conllu(args.train)
        if not train:
            raise ValueError(f"--train {args.train} holds no sentences")
        dev = load_conllu(args.dev) if args.dev else None
        if dev is not None:
            _require_scorable(dev, "--dev", args.dev)
        _check_memory(train, "--train", args.train, bool(args.second_order))
        if dev is not None:
            _check_memory(dev, "--dev", args.dev, bool(args.second_order))
        single_root = first.single_root if first is not None else bool(args.single_root)
        check_gold_trees(train, single_root, name=args.train)
        log = _log(args.quiet)
        start = time.perf_counter()
        parser: DependencyParser | SecondOrderParser
        if first is not None:                           # --second-order FIRST
            epochs = 3 if args.epochs is None else args.epochs
            parser = SecondOrderParser(first, bits=args.bits, context=not args.no_context)
            parser.fit(train, epochs=epochs, seed=args.seed, dev=dev, progress=not args.quiet, log=log)
            kind = "second order"
        else:
            epochs = 10 if args.epochs is None else args.epochs
            parser = DependencyParser(bits=args.bits, projective=bool(args.projective), single_root=single_root,
                                      xpos=bool(args.xpos), context=not args.no_context)
            parser.fit(train, loss=loss, epochs=epochs, lam=lam, seed=args.seed, dev=dev, progress=not args.quiet,
                       log=log)
            kind = loss
        seconds = time.perf_counter() - start
        parser.save(out)
        line = (f"trained on {_plural(len(train), 'sentence')} in {seconds:.1f}s ({kind}, "
                f"{_plural(epochs, 'epoch')})")
        dev_uas = parser.info["dev_uas"][-1] if parser.info.get("dev_uas") else parser.info.get("best_dev")
        if dev is not None and dev_uas is not None:
            line += f"; dev UAS {dev_uas:.2f}"
        print(f"{line}; wrote {out}")
    elif args.parse_command == "eval":
        if args.batch_size is not None:
            _positive(args.batch_size, "--batch-size")
        parser = _load(args.model)
        _check_decoding(parser, args)
        data = load_conllu(args.data)
        _require_scorable(data, "--data", args.data, args.punct)
        _check_memory(data, "--data", args.data, isinstance(parser, SecondOrderParser))
        start = time.perf_counter()
        heads = _heads(parser, data, args)
        seconds = time.perf_counter() - start
        from .metrics import PUNCT, attachment_counts

        correct, total = attachment_counts(data, heads, punct=args.punct)
        words = sum(len(s) for s in data)
        if args.punct:
            scope = "all words"
        elif any(PUNCT in s.upos for s in data):
            scope = "punctuation excluded"
        else:                                           # CoNLL-X tag sets: PUNC, Punctuation, ...
            scope = f"no word has UPOS {PUNCT}: none excluded"
        print(f"UAS {100.0 * correct / total:.2f} ({correct}/{total}, {scope}) on {len(data)} sentences; "
              f"parsed {words} words in {seconds:.2f}s ({words / max(seconds, 1e-9):.0f} words/s)")
    elif args.parse_command == "predict":
        if args.batch_size is not None:
            _positive(args.batch_size, "--batch-size")
        inputs = {"--model": args.model, "--input": args.input}
        output = None if args.output in (None, "-") else _output_path(args.output, "--output", inputs)
        parser = _load(args.model)
        _check_decoding(parser, args)
        if args.input == "-":
            from .._files import read_stdin
            from ..data.conllu import parse_conllu

            data = parse_conllu(read_stdin("--input"), "<stdin>")
        else:
            data = load_conllu(args.input)
        _check_memory(data, "--input", args.input, isinstance(parser, SecondOrderParser))
        heads = _heads(parser, data, args)
        if output is not None:
            write_conllu(data, output, heads)
            print(f"parsed {len(data)} sentences; wrote {output}", file=sys.stderr)
        else:
            write_conllu(data, sys.stdout, heads)
    else:  # pragma: no cover - argparse enforces the choices
        raise ValueError(f"unknown parse command {args.parse_command!r}")


def main(argv: list[str] | None = None) -> int:
    """``parse ...`` on its own (``python -m betheproj.parsing.cli train ...``): ``betheproj parse ...``."""
    from ..cli import main as betheproj_main

    return betheproj_main(["parse", *(sys.argv[1:] if argv is None else argv)])


BYTES_PER_CUBE = 32
"""Peak memory of second-order decoding (or training) per entry of a sentence's ``(n + 1)^3`` tables, measured with
``/usr/bin/time`` on one sentence (2026-11-27): 29 to 35 bytes at 150 and 300 words (float64 sibling and grandparent
tables and the decoders' work)."""

BYTES_PER_ARC = 900
"""Peak memory of arc-factored parsing (or training) per arc of a sentence's ``n (n + 1)``, measured with
``getrusage`` on one sentence of 1,000 words (2026-11-27): 750 bytes (:meth:`ArcFeatures.flat`), 880 with the XPOS
templates."""

BYTES_PER_WEIGHT = 28
"""Peak memory of first-order training per hashed weight, measured with ``/usr/bin/time`` on 30 sentences
(2026-11-30): 24 bytes a weight (1.93 GB at --bits 26 against 0.72 GB at 24), 28 with ``--dev`` (2.21 against
0.80 GB; 40 and 44 before the learner stopped keeping temporary copies of its dense vectors and a scratch vector that
compact examples never use)."""

BYTES_PER_SECOND_ORDER_WEIGHT = 30
"""The same for second-order training (``--dev``, one epoch, the first-order model's 2^24 weights included in each;
2026-11-30): 24.6 bytes a weight between --bits 24 and 26 (1.39 against 2.60 GB), 29.7 between 22 and 24 (1.03
against 1.39 GB); 30.5-33.4 before AdaGrad kept sparse gradients (:mod:`betheproj.parsing._sparse`)."""


def _check_bits_memory(bits: int, second_order: bool = False) -> None:
    """``ValueError`` naming ``--bits`` when training's dense weight vectors cannot fit in this machine's memory (or
    under a container's or ``ulimit -v``'s limit)."""
    from ..cli import _bytes, _memory_limit

    per_weight = BYTES_PER_SECOND_ORDER_WEIGHT if second_order else BYTES_PER_WEIGHT
    need, (have, limit) = per_weight * 2 ** bits, _memory_limit()
    if need > have:
        raise ValueError(f"--bits {bits}: training keeps dense vectors of 2^{bits} weights, about {_bytes(need)} of "
                         f"memory, more than {limit}; use a smaller --bits")


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


if __name__ == "__main__":
    sys.exit(main())
