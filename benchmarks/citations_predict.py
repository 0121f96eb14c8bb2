"""How closely ``betheproj citations --predict`` reproduces the data's own tokens and tag structure.

Run by hand:  python benchmarks/citations_predict.py --data ../shared/data/umass_citation/original [--split dev]

1. Tokenizer: each citation's tokens are joined back into plain text (no space before , ; : .) and split again
   by :func:`betheproj.data.citations.tokenize_citation`; counts the citations whose tokens come back exactly.
2. Nested tags: each well-formed line's gold BIO labels are written back by
   :func:`betheproj.experiments.citations.to_nested_tags`; counts the lines whose sequence of tags equals the
   original's, and checks that the labels round-trip.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from _common import run

from betheproj.data.citations import SPLITS, citation_lines, parse_citation, tokenize_citation
from betheproj.experiments.citations import to_nested_tags

TAGS = re.compile(r"</?[A-Za-z][\w.-]*>")


def detokenize(tokens: list[str]) -> str:
    text = ""
    for t in tokens:
        text += t if t in {",", ";", ":", "."} and text else (" " + t if text else t)
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="folder holding training.docs(.gz), dev.docs(.gz), ...")
    parser.add_argument("--split", default="dev", choices=sorted(SPLITS))
    args = parser.parse_args()
    lines = citation_lines(Path(args.data) / SPLITS[args.split])
    cites = [parse_citation(line) for line in lines]
    same_tokens = sum(tokenize_citation(detokenize(c.tokens)) == c.tokens for c in cites)
    print(f"tokenizer: {same_tokens} of {len(cites)} {args.split} citations give back their exact tokens")
    clean = [(line, c) for line, c in zip(lines, cites, strict=True) if c.repairs == 0]
    written = [to_nested_tags(c.tokens, c.labels) for _, c in clean]
    same_tags = sum(TAGS.findall(w) == TAGS.findall(line) for w, (line, _) in zip(written, clean, strict=True))
    labels = sum(parse_citation(w).labels == c.labels for w, (_, c) in zip(written, clean, strict=True))
    print(f"nested tags: {same_tags} of {len(clean)} well-formed lines get their original tag structure back; "
          f"labels round-trip for {labels}")


if __name__ == "__main__":
    run(main)
