"""What forbidden structure costs LinearChain: marginals of a second-order chain written as a first-order chain over
pair states (y_{t-1}, y_t), against the same scores with every ``-inf`` replaced by a finite -100 (same run).

Run by hand:  python benchmarks/chain_forbidden.py  [--structure pairs|bio] [--labels 24] [--repeats 3]

``--structure bio`` measures the common case instead: a first-order BIO chain over ``2 L + 1`` labels (``I-f`` only
after ``B-f`` or ``I-f``, never first), whose only zero marginals inside an example are the ``I`` labels at its
first position.

The pair states hold a START label before the first token, so most states are unreachable at some position: their
marginals are exact zeros, which LinearChain's checks for underflowed marginals must tell from lost ones.  Before
those checks left out the labels that no finite labelling reaches, they estimated every zero in log space through
the [C, C] table at every position.  The finite copy has no zero marginal and takes the fast path alone.
"""

from __future__ import annotations

import argparse

import torch
from _common import best_time, positive_int, run

import betheproj as bp


def pair_chain(labels: int, b: int, n: int, seed: int = 0) -> bp.ChainPotentials:
    states = [(labels, y) for y in range(labels)] + [(a, y) for a in range(labels) for y in range(labels)]
    gen = torch.Generator().manual_seed(seed)
    c = len(states)
    node = 3 * torch.randn(b, n, c, generator=gen, dtype=torch.float64)
    node[:, 0, labels:] = -torch.inf                            # START states only at position 0
    cur = torch.tensor([y for _, y in states])
    prev = torch.tensor([a for a, _ in states])
    allowed = cur[:, None] == prev[None, :]                     # (a, b) -> (b, c)
    edge = torch.where(allowed, torch.randn(c, c, generator=gen, dtype=torch.float64), -torch.inf)
    lengths = torch.randint(n // 2, n + 1, (b,), generator=gen)
    return bp.ChainPotentials(node, edge, lengths)


def bio_chain(fields: int, b: int, n: int, seed: int = 0) -> bp.ChainPotentials:
    c = 2 * fields + 1                                          # O, then B-f, then I-f
    gen = torch.Generator().manual_seed(seed)
    node = 3 * torch.randn(b, n, c, generator=gen, dtype=torch.float64)
    node[:, 0, fields + 1:] = -torch.inf                        # no I-f first
    allowed = torch.ones(c, c, dtype=torch.bool)
    inside = torch.arange(fields + 1, c)
    allowed[:, inside] = False
    allowed[inside - fields, inside] = True                     # B-f -> I-f
    allowed[inside, inside] = True                              # I-f -> I-f
    edge = torch.where(allowed, torch.randn(c, c, generator=gen, dtype=torch.float64), -torch.inf)
    lengths = torch.randint(n // 2, n + 1, (b,), generator=gen)
    return bp.ChainPotentials(node, edge, lengths)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--structure", choices=("pairs", "bio"), default="pairs",
                        help="second-order pair states (default) or a first-order BIO chain")
    parser.add_argument("--labels", type=positive_int, default=None,
                        help="labels L: L * (L + 1) pair states (default 24), or 2 L + 1 BIO labels (default 47)")
    parser.add_argument("--batch", type=positive_int, default=256)
    parser.add_argument("--length", type=positive_int, default=40)
    parser.add_argument("--repeats", type=positive_int, default=3)
    args = parser.parse_args()
    if args.structure == "pairs":
        pot = pair_chain(args.labels or 24, args.batch, args.length)
    else:
        pot = bio_chain(args.labels or 47, args.batch, args.length)
    finite = bp.ChainPotentials(pot.node.clamp_min(-100.0), pot.edge.clamp_min(-100.0), pot.lengths)
    c = pot.node.shape[-1]
    forbidden_s = best_time(lambda: bp.LinearChain().marginals(pot).log_partition, args.repeats)
    finite_s = best_time(lambda: bp.LinearChain().marginals(finite).log_partition, args.repeats)
    zeros = int((bp.LinearChain().marginals(pot).node == 0).sum())
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, float64, shared [C, C] transitions; "
          f"B={args.batch}, N<={args.length}, C={c} {'pair states' if args.structure == 'pairs' else 'BIO labels'}, "
          f"{zeros:,} exact zero node marginals")
    print(f"node marginals + log Z, best of {args.repeats}: with -inf {forbidden_s:.3f} s, finite copy "
          f"{finite_s:.3f} s; ratio {forbidden_s / finite_s:.2f}x")


if __name__ == "__main__":
    run(main)
