"""The ``betheproj`` command line."""

from __future__ import annotations

import argparse
import sys

__all__ = ["main"]


class _Parser(argparse.ArgumentParser):
    """argparse, with usage errors as one line on stderr."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="betheproj", description="Structured prediction with non-local "
                     "energies on marginals (Bethe projections).")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    sub.add_parser("demo", help="solve generated problems with every method and print the results")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "demo":
            from .demo import run_demo
            run_demo()
    except (ValueError, TypeError, FileNotFoundError) as err:
        print(f"betheproj {args.command}: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
