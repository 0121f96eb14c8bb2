"""Exact inference by enumerating every labelling: the reference for tests on tiny models.

Each labelling's score is summed with the exact rounding errors of its partial sums kept apart (TwoSum), and
probabilities are a softmax of the scores less the best one, so huge scores cannot absorb the O(1) ones."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch
from torch import Tensor

from .._checks import check_count
from .base import (
    Marginals,
    PairwisePotentials,
    _finite_max,
    _max_shifted,
    _split_add,
    _two_sum,
    bethe_entropy,
    check_degree_args,
    check_marginals,
    check_potentials,
    log_partition,
    raise_if_not_finite,
)
from .tree import Tree, check_parents

__all__ = ["BruteForce"]


class BruteForce:
    """Enumerates all ``C^N`` labellings of a chain (``parents=None``) or tree; refuses more than ``max_states``."""

    def __init__(self, parents: Sequence[int] | Tensor | None = None, max_states: int = 2_000_000):
        self.parents = None if parents is None else check_parents(parents)
        self.max_states = check_count("max_states", max_states)

    def _parents(self, n: int, what: str = "potentials") -> Tensor:
        if self.parents is None:
            return torch.arange(-1, n - 1)
        if len(self.parents) != n:
            raise ValueError(f"{what} have N={n} positions but the tree has {len(self.parents)} nodes")
        return self.parents

    def _labellings(self, pot: PairwisePotentials, b: int) -> tuple[Tensor, Tensor]:
        """All labellings [K, L] of example ``b``, and the parents of its nodes."""
        length = int(pot.lengths[b])
        c = pot.node.shape[2]
        if c ** length > self.max_states:
            raise ValueError(f"brute force over {c}^{length} labellings exceeds max_states={self.max_states}")
        ys = torch.tensor(list(itertools.product(range(c), repeat=length)), dtype=torch.long,
                          device=pot.node.device).reshape(-1, length)
        return ys, self._parents(pot.node.shape[1])[:length]

    def _joint(self, pot: PairwisePotentials, b: int) -> tuple[Tensor, Tensor]:
        """All labellings [K, L] of example ``b`` and their scores [K]."""
        ys, parents = self._labellings(pot, b)
        length = ys.shape[1]
        node = pot.node[b, :length]
        edge = pot.full_edge()[b, : length - 1]
        score = node[torch.arange(length, device=ys.device), ys].sum(-1)
        if length > 1:
            child = torch.arange(1, length, device=ys.device)
            score = score + edge[child - 1, ys[:, parents[1:]], ys[:, child]].sum(-1)
        return ys, score

    def _relative_scores(self, shifted: tuple[PairwisePotentials, tuple[Tensor, Tensor], Tensor, Tensor],
                         b: int) -> tuple[Tensor, Tensor, tuple[Tensor, Tensor]]:
        """All labellings [K, L] of example ``b`` of :func:`~betheproj.oracles.base._max_shifted` potentials
        ``shifted``, their scores less the best one [K], and the best score (with the shift) in two parts.

        Each score is summed with the exact rounding errors of its partial sums (and of the shifts) kept apart,
        so that a huge score that the leading labellings share cannot absorb the O(1) ones that tell them apart."""
        pot, shift, node_err, edge_err = shifted
        ys, parents = self._labellings(pot, b)
        score = err = pot.node.new_zeros(())
        for t in range(ys.shape[1]):
            y = ys[:, t]
            score, err = _split_add(score, err, pot.node[b, t, y], node_err[b, t, y])
            if t:
                y_par = ys[:, parents[t]]
                score, err = _split_add(score, err, pot.edge[b, t - 1, y_par, y], edge_err[b, t - 1, y_par, y])
        best = _finite_max(score, 0)
        top, top_err = _two_sum(shift[0][b], best[0])
        return ys, (score - best) + err, (top, top_err + shift[1][b])

    def marginals(self, potentials: PairwisePotentials) -> Marginals:
        """Node and edge marginals and ``log Z`` by summing over every labelling (the tests' reference)."""
        pot = check_potentials(potentials)
        b, n, c = pot.node.shape
        node_m = torch.zeros_like(pot.node)
        edge_m = pot.node.new_zeros(b, n - 1, c, c)
        log_z = pot.node.new_zeros(b)
        parents = self._parents(n)
        shifted = _max_shifted(pot)          # scores of order 1 to sum, not raw 1e4s (float32)
        for i in range(b):
            ys, score, best = self._relative_scores(shifted, i)
            length = ys.shape[1]
            log_z[i] = best[0] + (best[1] + torch.logsumexp(score, 0))
            prob = torch.softmax(score, 0)
            for t in range(length):
                node_m[i, t].index_add_(0, ys[:, t], prob)
            for t in range(1, length):
                flat = ys[:, parents[t]] * c + ys[:, t]
                edge_m[i, t - 1].view(-1).index_add_(0, flat, prob)
        raise_if_not_finite(log_z)
        return Marginals(node_m, edge_m, log_z, pot.lengths)

    def log_partition(self, potentials: PairwisePotentials) -> Tensor:
        """``log Z`` [B], differentiable: its gradient is the marginals."""
        return log_partition(self, potentials)

    def map(self, potentials: PairwisePotentials) -> Tensor:
        """The highest-scoring labelling [B, N], ``-1`` past each length."""
        potentials = check_potentials(potentials)
        b, n, _ = potentials.node.shape
        labels = torch.full((b, n), -1, dtype=torch.long, device=potentials.node.device)
        shifted = _max_shifted(potentials)
        for i in range(b):
            ys, score, _ = self._relative_scores(shifted, i)
            _raise_if_infeasible(score, i)
            labels[i, : ys.shape[1]] = ys[score.argmax()]
        return labels

    def exact_entropy(self, potentials: PairwisePotentials) -> Tensor:
        """Entropy of the joint distribution, ``-sum_y p(y) log p(y)`` [B]."""
        potentials = check_potentials(potentials)
        out = potentials.node.new_zeros(potentials.node.shape[0])
        shifted = _max_shifted(potentials)
        for i in range(len(out)):
            _, score, _ = self._relative_scores(shifted, i)
            _raise_if_infeasible(score, i)
            logp = torch.log_softmax(score, 0)
            p = torch.exp(logp)
            out[i] = -(torch.where(p > 0, p * logp, torch.zeros_like(p))).sum()
        return out

    def degree(self, lengths: Tensor, n: int) -> Tensor:
        """Number of valid edges at each node [B, N]."""
        n = check_degree_args(lengths, n)
        return Tree(self._parents(n)).degree(lengths, n)

    def entropy(self, marginals: Marginals) -> Tensor:
        """Bethe entropy [B] of ``marginals`` (exact on chains and trees)."""
        marginals = check_marginals(marginals)
        n = marginals.node.shape[1]
        degree = Tree(self._parents(n, "marginals")).degree(marginals.lengths, n)
        return bethe_entropy(marginals.node, marginals.edge, degree)

    def __repr__(self) -> str:
        return "BruteForce()" if self.parents is None else f"BruteForce(parents={self.parents.tolist()})"


def _raise_if_infeasible(score: Tensor, example: int) -> None:
    raise_if_not_finite(score.max()[None], examples=torch.tensor([example], device=score.device))
