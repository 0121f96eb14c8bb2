"""What decoding for segment F1 costs: ``decode_segments`` (exact segment posteriors in log space, then the
threshold DP) against Viterbi (``LinearChain.map``) and forward-backward (``LinearChain.marginals``) on the same
BIO chains, in the same run.

Run by hand:  python benchmarks/segments.py  [--fields 47] [--batch 1000] [--length 40] [--repeats 3]
              python benchmarks/segments.py --memory 2000

The default size is the citation experiment's: 47 fields (95 labels with O), citations of up to 40 tokens.
``--memory N`` instead decodes one chain of N tokens and prints how much the process's peak resident size grew: the
decoder takes the segment posteriors one end position at a time, so it never holds the F N^2 of the whole table
(``segment_log_marginals``' size is printed beside it).
"""

from __future__ import annotations

import argparse
import resource

import torch
from _common import best_time, positive_int, run

import betheproj as bp
from betheproj.inference import BIOFields, decode_segments


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fields", type=positive_int, default=47, help="fields F: 2 F + 1 BIO labels (default 47)")
    parser.add_argument("--batch", type=positive_int, default=1000, help="chains (default 1000)")
    parser.add_argument("--length", type=positive_int, default=40, help="longest chain N (default 40)")
    parser.add_argument("--repeats", type=positive_int, default=3, help="timed calls, the best kept (default 3)")
    parser.add_argument("--memory", type=positive_int, metavar="N",
                        help="decode one chain of N tokens and print the growth of the peak resident size")
    args = parser.parse_args()
    labels = ["O"] + [f"{tag}-f{k}" for k in range(args.fields) for tag in "BI"]
    fields = BIOFields.from_labels(labels)
    gen = torch.Generator().manual_seed(0)
    c = len(labels)
    if args.memory:
        n = args.memory
        pot = bp.ChainPotentials(3 * torch.randn(1, n, c, generator=gen, dtype=torch.float64),
                                 3 * torch.randn(c, c, generator=gen, dtype=torch.float64))
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss       # KiB on Linux
        seconds = best_time(lambda: decode_segments(pot, fields, 0.5), 1)
        grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
        print(f"one chain of {n} tokens, {c} labels ({args.fields} fields), float64: {seconds:.2f} s, peak resident "
              f"size grew by {grew / 1024:.0f} MB (the whole segment table would hold "
              f"{args.fields * n * n * 8 / 2**20:.0f} MB)")
        return
    pot = bp.ChainPotentials(3 * torch.randn(args.batch, args.length, c, generator=gen, dtype=torch.float64),
                             3 * torch.randn(c, c, generator=gen, dtype=torch.float64),
                             torch.randint(max(1, args.length // 2), args.length + 1, (args.batch,), generator=gen))
    chain = bp.LinearChain()
    times = {"viterbi": best_time(lambda: chain.map(pot), args.repeats),
             "marginals": best_time(lambda: chain.marginals(pot), args.repeats),
             "segments": best_time(lambda: decode_segments(pot, fields, 0.5), args.repeats)}
    print(f"B = {args.batch}, N <= {args.length}, {c} labels ({args.fields} fields), float64, "
          f"{torch.get_num_threads()} threads")
    for name, seconds in times.items():
        print(f"{name:<10} {seconds:8.3f} s  {1e3 * seconds / args.batch:7.3f} ms a chain")
    print(f"decode_segments: {times['segments'] / times['viterbi']:.1f}x Viterbi's time, "
          f"{times['segments'] / times['marginals']:.1f}x forward-backward's")


if __name__ == "__main__":
    run(main)
