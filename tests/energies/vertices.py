"""Marginals at a vertex of the polytope (one labelling per example), for hand-counted energy values."""

import torch

from betheproj.oracles.base import Marginals


def one_hot(labels: list[list[int]], c: int, n: int | None = None) -> Marginals:
    """Node marginals that put all mass on ``labels`` (lists of label ids), padded to ``n`` positions, float64."""
    n = n or max(len(y) for y in labels)
    node = torch.zeros(len(labels), n, c, dtype=torch.float64)
    for b, y in enumerate(labels):
        node[b, torch.arange(len(y)), torch.tensor(y)] = 1.0
    return Marginals(node, None, None, torch.tensor([len(y) for y in labels]))
