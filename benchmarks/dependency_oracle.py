"""Dependency-tree marginals and MAP of betheproj's Projective (Eisner) and NonProjective (matrix-tree) oracles
beside torch-struct's DependencyCRF and NonProjectiveDependencyCRF (same run, same scores).

Run by hand:  python benchmarks/dependency_oracle.py  [--repeats 5] [--threads 2] [--dtype float64]

Each call computes log Z and the arc marginals of a batch of B sentences of lengths drawn from [N/2, N], scores
N(0, 4), several root children allowed: ours by ``oracle.marginals``, torch-struct's by its ``partition`` and one
backward pass (reading ``dist.marginals`` fails under this torch: its in-place padding of a leaf that requires
grad).  MAP: Eisner's Viterbi pass and backtracking against torch-struct's ``argmax`` (it has none for
non-projective trees).  Printed: sentences/s (fastest of ``--repeats`` calls after a warm-up), the ratio
ours / torch-struct, and the largest differences between the two marginals and log Z (for MAP, between the scores
of the trees they return).  torch-struct's arc scores are head-major ``[B, N, N]`` over the words with the root's
arcs on the diagonal.
"""

from __future__ import annotations

import argparse
import math
import warnings

import torch
from _common import best_time, positive_int, run

from betheproj.oracles import NonProjective, Projective, arc_potentials

SIZES = ((32, 10), (32, 20), (32, 40), (8, 80))


def problem(b: int, n: int, dtype: torch.dtype, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Head-major scores [B, N+1, N+1] (row 0 the root) and lengths [B] in [N/2, N] (the first N)."""
    gen = torch.Generator().manual_seed(seed)
    scores = (torch.randn(b, n + 1, n + 1, generator=gen, dtype=torch.float64) * 2).to(dtype)
    lengths = torch.randint(max(1, n // 2), n + 1, (b,), generator=gen)
    lengths[0] = n
    return scores, lengths


def theirs_layout(scores: torch.Tensor) -> torch.Tensor:
    """torch-struct's arc scores: ``[b, h-1, m-1]`` for words, the root's arc into ``m`` at ``[b, m-1, m-1]``."""
    words = scores[:, 1:, 1:].clone()
    idx = torch.arange(words.shape[1])
    words[:, idx, idx] = scores[:, 0, 1:]
    return words


def ours_layout(marg: torch.Tensor) -> torch.Tensor:
    """torch-struct's marginals [B, N, N] in the node layout of ours, ``[b, m-1, h]`` [B, N, N+1]."""
    b, n, _ = marg.shape
    idx = torch.arange(n)
    out = marg.new_zeros(b, n, n + 1)
    out[:, :, 1:] = marg.transpose(1, 2)
    out[:, idx, idx + 1] = 0.0
    out[:, :, 0] = marg[:, idx, idx]
    return out


def measure(b: int, n: int, dtype: torch.dtype, repeats: int) -> list[dict]:
    from torch_struct import DependencyCRF, NonProjectiveDependencyCRF

    scores, lengths = problem(b, n, dtype)
    pot = arc_potentials(scores, lengths)
    lp = theirs_layout(scores)
    rows = []
    for name, oracle, peer in (("projective (Eisner)", Projective(), DependencyCRF),
                               ("non-projective (matrix-tree)", NonProjective(), NonProjectiveDependencyCRF)):
        def theirs(peer=peer) -> tuple[torch.Tensor, torch.Tensor]:
            x = lp.detach().requires_grad_(True)
            log_z = peer(x, lengths, multiroot=True).partition
            (marg,) = torch.autograd.grad(log_z.sum(), x)
            return log_z.detach(), marg

        def ours(oracle=oracle) -> tuple[torch.Tensor, torch.Tensor]:
            m = oracle.marginals(pot)
            return m.log_partition, m.node

        (lz_o, m_o), (lz_t, m_t) = ours(), theirs()
        words = (torch.arange(n) < lengths[:, None])[..., None]
        diff = (torch.where(words, ours_layout(m_t), 0.0) - m_o).abs().max().item()
        t_o, t_t = best_time(ours, repeats), best_time(theirs, repeats)
        rows.append({"oracle": name, "B": b, "N": n, "ours": b / t_o, "torch-struct": b / t_t,
                     "ratio": t_t / t_o, "marginals": diff, "log Z": (lz_o - lz_t).abs().max().item()})

    # MAP: Eisner's Viterbi pass and backtracking against torch-struct's argmax (torch-struct has no MAP for
    # non-projective trees); compared by the score of the tree each returns
    def tree_score(heads: torch.Tensor) -> torch.Tensor:
        words = heads >= 0
        m = torch.arange(1, n + 1).expand_as(heads)
        return torch.where(words, scores[torch.arange(b)[:, None], heads.clamp_min(0), m], 0.0).sum(-1)

    def theirs_map() -> torch.Tensor:
        x = lp.detach().requires_grad_(True)
        arcs = ours_layout(DependencyCRF(x, lengths, multiroot=True).argmax.detach())
        words = torch.arange(n) < lengths[:, None]
        return torch.where(words, arcs.argmax(-1), -1)

    oracle = Projective()
    t_o, t_t = best_time(lambda: oracle.map(pot), repeats), best_time(theirs_map, repeats)
    gap = (tree_score(oracle.map(pot)) - tree_score(theirs_map())).abs().max().item()
    rows.append({"oracle": "projective MAP (Eisner)", "B": b, "N": n, "ours": b / t_o, "torch-struct": b / t_t,
                 "ratio": t_t / t_o, "marginals": float("nan"), "log Z": gap})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=positive_int, default=5, help="timed calls per measurement (fastest)")
    parser.add_argument("--threads", type=positive_int, default=2, help="torch threads (default 2)")
    parser.add_argument("--dtype", choices=("float64", "float32"), default="float64")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", module="torch_struct")
    try:
        import torch_struct  # noqa: F401
    except ImportError:
        parser.error("torch-struct is not installed: pip install torch-struct --no-deps")
    dtype = getattr(torch, args.dtype)
    print(f"{args.dtype}, {args.threads} threads; sentences/s, fastest of {args.repeats} calls")
    print("| oracle | B | N | ours | torch-struct | ours / torch-struct | max marginal difference "
          "| max log Z (MAP: tree score) difference |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for b, n in SIZES:
        for r in measure(b, n, dtype, args.repeats):
            print(f"| {r['oracle']} | {r['B']} | {r['N']} | {r['ours']:,.0f} | {r['torch-struct']:,.0f} | "
                  f"{r['ratio']:.1f}x | {'-' if math.isnan(r['marginals']) else format(r['marginals'], '.1e')} | "
                  f"{r['log Z']:.1e} |", flush=True)


if __name__ == "__main__":
    run(main)
