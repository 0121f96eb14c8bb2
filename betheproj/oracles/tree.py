"""Tree-structured pairwise MRF oracle: log-space sum-product and max-product up/down passes.

The tree is given by a parent array with ``parent[0] = -1`` (node 0 is the root) and
``0 <= parent[i] < i``; any tree can be numbered so (breadth- or depth-first order).  Edge ``i-1`` of
the potentials couples ``parent[i]`` (rows) with ``i`` (columns), so a chain is the tree
``[-1, 0, 1, ..., N-2]``.  With ``lengths``, example ``b`` keeps the subtree of nodes ``< lengths[b]``
(a valid tree because parents precede children).  Nodes of the same depth are processed together.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from .base import (
    Marginals,
    PairwisePotentials,
    _max_shifted,
    bethe_entropy,
    check_marginals,
    check_potentials,
    log_partition,
    raise_if_not_finite,
)

__all__ = ["Tree", "check_parents"]


def check_parents(parents: Sequence[int] | Tensor) -> Tensor:
    """Validate a parent array (``parent[0] = -1``, ``0 <= parent[i] < i``) and return it as a long tensor."""
    if isinstance(parents, (str, bytes)) or not isinstance(parents, (Sequence, Tensor)):
        raise TypeError(f"parents must be a sequence of integers or an integer tensor, got {type(parents).__name__}")
    try:
        p = torch.as_tensor(parents)
    except (TypeError, ValueError, RuntimeError) as err:
        raise TypeError(f"parents must be a sequence of integers, got {parents!r}") from err
    if p.dim() != 1 or p.numel() == 0:
        raise ValueError(f"parents must be a non-empty 1-D sequence, got shape {tuple(p.shape)}")
    if p.is_floating_point() or p.is_complex() or p.dtype == torch.bool:
        raise TypeError(f"parents must hold integers, got {p.dtype}")
    p = p.long()
    if int(p[0]) != -1:
        raise ValueError(f"parents[0] must be -1 (node 0 is the root), got {int(p[0])}")
    idx = torch.arange(len(p))
    bad = (p[1:] < 0) | (p[1:] >= idx[1:])
    if bad.any():
        i = int(torch.nonzero(bad)[0]) + 1
        raise ValueError(f"parents[{i}] = {int(p[i])} must lie in [0, {i}) (number nodes so parents precede "
                         "children)")
    return p


def _neg_inf(like: Tensor) -> Tensor:
    return torch.full((), float("-inf"), dtype=like.dtype, device=like.device)


class Tree:
    """Exact inference on a tree-structured pairwise MRF given by ``parents`` (length ``N``)."""

    def __init__(self, parents: Sequence[int] | Tensor):
        self.parents = check_parents(parents)
        n = len(self.parents)
        depth = torch.zeros(n, dtype=torch.long)
        for i in range(1, n):
            depth[i] = depth[self.parents[i]] + 1
        self.levels = [torch.nonzero(depth == d).flatten() for d in range(1, int(depth.max()) + 1)]

    @property
    def num_nodes(self) -> int:
        return len(self.parents)

    def _check(self, potentials: object) -> PairwisePotentials:
        potentials = check_potentials(potentials)
        if potentials.node.shape[1] != self.num_nodes:
            raise ValueError(f"potentials have N={potentials.node.shape[1]} positions but the tree has "
                             f"{self.num_nodes} nodes")
        return potentials

    def _setup(self, pot: PairwisePotentials):
        """The max-shifted node scores and edge tables (:func:`~betheproj.oracles.base._max_shifted`), the valid
        positions, parents, levels and the shift [B] to add back to ``log Z``."""
        shifted, shift = _max_shifted(pot)
        node = shifted.node
        valid = torch.arange(node.shape[1], device=node.device) < pot.lengths[:, None]
        parents = self.parents.to(node.device)
        levels = [lv.to(node.device) for lv in self.levels]
        return node, shifted.full_edge(), valid, parents, levels, shift

    def _upward(self, pot: PairwisePotentials):
        """Inside scores, upward messages split into finite part and -inf count (to exclude one exactly)."""
        node, edge, valid, parents, levels, shift = self._setup(pot)
        inside = node.clone()
        fin = torch.zeros_like(node)                   # finite part of the sum of children's messages
        cnt = torch.zeros(node.shape, dtype=torch.long, device=node.device)  # number of -inf messages
        up = torch.zeros_like(node)                    # message from node i to parent[i], indexed by i
        for lv in reversed(levels):
            msg = torch.logsumexp(edge[:, lv - 1] + inside[:, lv, None, :], dim=-1)   # [B, k, C]
            msg = torch.where(valid[:, lv, None], msg, torch.zeros((), dtype=msg.dtype))
            up[:, lv] = msg
            is_inf = torch.isinf(msg)
            fin.index_add_(1, parents[lv], torch.where(is_inf, torch.zeros((), dtype=msg.dtype), msg))
            cnt.index_add_(1, parents[lv], is_inf.long())
            # inside of the parents is final once all their children (this level) are in
            par = parents[lv].unique()
            inside[:, par] = torch.where(cnt[:, par] > 0, _neg_inf(node), node[:, par] + fin[:, par])
        return node, edge, valid, parents, levels, shift, inside, up, fin, cnt

    def marginals(self, potentials: PairwisePotentials) -> Marginals:
        """Node and edge marginals and ``log Z`` by sum-product in log space, leaves to root and back."""
        pot = self._check(potentials)
        with torch.no_grad():
            node, edge, valid, parents, levels, shift, inside, up, fin, cnt = self._upward(pot)
            log_z = torch.logsumexp(inside[:, 0], dim=-1) + shift
            raise_if_not_finite(log_z)
            down = torch.zeros_like(node)              # message from parent[i] into node i
            edge_marg = torch.zeros_like(edge)
            for lv in levels:
                par = parents[lv]
                # parent's belief without node lv's own message: exact even with -inf messages
                own_inf = torch.isinf(up[:, lv])
                rest_cnt = cnt[:, par] - own_inf.long()
                rest = node[:, par] + down[:, par] + fin[:, par] - torch.where(
                    own_inf, torch.zeros((), dtype=node.dtype), up[:, lv])
                rest = torch.where(rest_cnt > 0, _neg_inf(node), rest)              # [B, k, C]
                pair = rest[..., :, None] + edge[:, lv - 1] + inside[:, lv, None, :]  # [B, k, C, C]
                down[:, lv] = torch.logsumexp(rest[..., :, None] + edge[:, lv - 1], dim=-2)
                bsz, k, c, _ = pair.shape
                edge_marg[:, lv - 1] = torch.softmax(pair.reshape(bsz, k, c * c), -1).reshape(bsz, k, c, c)
            # normalised per node, so rounding of large scores cannot unbalance the sums
            node_marg = torch.softmax(inside + down, dim=-1)
            node_marg = torch.where(valid[..., None], node_marg, torch.zeros((), dtype=node.dtype))
            edge_valid = valid[:, 1:]
            edge_marg = torch.where(edge_valid[..., None, None], edge_marg, torch.zeros((), dtype=node.dtype))
        return Marginals(node_marg, edge_marg, log_z, pot.lengths)

    def log_partition(self, potentials: PairwisePotentials) -> Tensor:
        """``log Z`` [B], differentiable: its gradient is the marginals."""
        return log_partition(self, potentials)

    def map(self, potentials: PairwisePotentials) -> Tensor:
        """Max-product MAP: labels [B, N], ``-1`` past each length."""
        pot = self._check(potentials)
        with torch.no_grad():
            node, edge, valid, parents, levels, _ = self._setup(pot)
            best = node.clone()
            back = torch.zeros(node.shape, dtype=torch.long, device=node.device)
            for lv in reversed(levels):
                msg, arg = (edge[:, lv - 1] + best[:, lv, None, :]).max(dim=-1)
                msg = torch.where(valid[:, lv, None], msg, torch.zeros((), dtype=msg.dtype))
                back[:, lv] = arg
                best.index_add_(1, parents[lv], msg)
            root_best, root = best[:, 0].max(-1)
            raise_if_not_finite(root_best)
            labels = torch.full(node.shape[:2], -1, dtype=torch.long, device=node.device)
            labels[:, 0] = root
            for lv in levels:
                par_label = labels[:, parents[lv]]
                lab = back[:, lv].gather(2, par_label.clamp_min(0)[..., None]).squeeze(-1)
                labels[:, lv] = torch.where(valid[:, lv], lab, torch.full_like(lab, -1))
        return labels

    def degree(self, lengths: Tensor, n: int) -> Tensor:
        """Number of valid edges at each node [B, N] (a node's valid children and its parent)."""
        if n != self.num_nodes:
            raise ValueError(f"n={n} positions but the tree has {self.num_nodes} nodes")
        valid = torch.arange(n, device=lengths.device) < lengths[:, None]
        deg = torch.zeros(valid.shape, dtype=torch.long, device=lengths.device)
        child_valid = valid[:, 1:].long()
        deg[:, 1:] += child_valid
        deg.index_add_(1, self.parents[1:].to(lengths.device), child_valid)
        return deg

    def entropy(self, marginals: Marginals) -> Tensor:
        """Bethe entropy [B] (the exact entropy on a tree)."""
        marginals = check_marginals(marginals)
        if marginals.node.shape[1] != self.num_nodes:
            raise ValueError(f"marginals have N={marginals.node.shape[1]} positions but the tree has "
                             f"{self.num_nodes} nodes")
        return bethe_entropy(marginals.node, marginals.edge, self.degree(marginals.lengths, marginals.node.shape[1]))

    def __repr__(self) -> str:
        return f"Tree(parents={self.parents.tolist()})"
