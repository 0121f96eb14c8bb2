"""Chain-marginal throughput of betheproj.LinearChain beside torch-struct's LinearChainCRF (same run).

Run by hand:  python benchmarks/oracle.py  [--repeats 5]
Goals (issue 2, 2 CPU cores, float32): >= 300,000 sequences/s at B=6877, N=14, C=26; >= 20x torch-struct
at B=1, N=10, C=225.  torch-struct is measured in a subprocess under a memory cap, so running out of
memory is reported rather than fatal.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys

import torch
from _common import best_time, positive_float, positive_int, run

import betheproj as bp


def problem(b: int, n: int, c: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    node = torch.randn(b, n, c, generator=gen) * 2
    edge = torch.randn(c, c, generator=gen)
    return node, edge


def ours(b: int, n: int, c: int, repeats: int) -> dict:
    node, edge = problem(b, n, c)
    pot = bp.ChainPotentials(node, edge)
    # a new oracle per call: nothing (the exponentiated transitions it keeps between calls) carries over
    t_node = best_time(lambda: bp.LinearChain().marginals(pot).log_partition, repeats)
    t_edge = best_time(lambda: bp.LinearChain().marginals(pot).edge, repeats)
    return {"node+logZ": b / t_node, "node+edge+logZ": b / t_edge}


def torch_struct_child(b: int, n: int, c: int, repeats: int, mem_gb: float) -> None:
    """Runs in a subprocess: prints sequences/s of torch-struct's partition + marginals as JSON."""
    limit = int(mem_gb * 2**30)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    import warnings

    warnings.filterwarnings("ignore")
    from torch_struct import LinearChainCRF

    node, edge = problem(b, n, c)
    # torch-struct folds node scores into edges: log_potentials[b, t, next, prev]
    log_pot = edge.t()[None, None] + node[:, 1:, :, None]
    log_pot = log_pot.clone()
    log_pot[:, 0] += node[:, 0, None, :]

    def run():
        # one forward pass for log Z and its backward pass for the edge marginals (reading both
        # ``dist.marginals`` and ``dist.partition`` would run the forward pass twice)
        lp = log_pot.detach().requires_grad_(True)
        log_z = LinearChainCRF(lp).partition
        (marginals,) = torch.autograd.grad(log_z.sum(), lp)
        return marginals.sum().item() + log_z.sum().item()

    try:
        t = best_time(run, repeats)
        print(json.dumps({"rate": b / t}))
    except (MemoryError, RuntimeError) as err:
        print(json.dumps({"error": f"{type(err).__name__}: {str(err).splitlines()[0][:80]}"}))


def torch_struct(b: int, n: int, c: int, repeats: int, mem_gb: float) -> dict:
    cmd = [sys.executable, __file__, "--child", f"{b},{n},{c}", "--repeats", str(repeats), "--mem-gb", str(mem_gb)]
    out = subprocess.run(cmd, capture_output=True, text=True)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if not lines:
        return {"error": f"exit {out.returncode}: {out.stderr.strip().splitlines()[-1][:80] if out.stderr else ''}"}
    return json.loads(lines[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=positive_int, default=5)
    parser.add_argument("--mem-gb", type=positive_float, default=16.0)
    parser.add_argument("--child")
    args = parser.parse_args()
    if args.child:
        b, n, c = map(int, args.child.split(","))
        torch_struct_child(b, n, c, args.repeats, args.mem_gb)
        return
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, float32, shared [C, C] transitions")
    print(f"{'B':>6} {'N':>4} {'C':>4} | {'ours node+logZ':>16} {'ours +edges':>14} | {'torch-struct':>14} | ratio")
    for b, n, c in [(6877, 14, 26), (256, 14, 26), (1, 10, 225)]:
        o = ours(b, n, c, args.repeats)
        ts = torch_struct(b, n, c, args.repeats, args.mem_gb)
        peer = f"{ts['rate']:>14,.1f}" if "rate" in ts else f"{'failed':>14}"
        ratio = f"{o['node+edge+logZ'] / ts['rate']:.1f}x (with edges), {o['node+logZ'] / ts['rate']:.1f}x" \
            if "rate" in ts else ts["error"]
        print(f"{b:>6} {n:>4} {c:>4} | {o['node+logZ']:>16,.0f} {o['node+edge+logZ']:>14,.0f} | {peer} | {ratio}")
    print("rates are sequences/s (best of repeats); torch-struct computes log Z (one forward pass) and the edge "
          "marginals by autograd (its backward pass); ratio = ours / torch-struct")


if __name__ == "__main__":
    run(main)
