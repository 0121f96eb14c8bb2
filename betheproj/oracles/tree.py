"""Tree-structured pairwise MRF oracle: log-space sum-product and max-product up/down passes.

The tree is given by a parent array with ``parent[0] = -1`` (node 0 is the root) and
``0 <= parent[i] < i``; any tree can be numbered so (breadth- or depth-first order).  Edge ``i-1`` of
the potentials couples ``parent[i]`` (rows) with ``i`` (columns), so a chain is the tree
``[-1, 0, 1, ..., N-2]``.  With ``lengths``, example ``b`` keeps the subtree of nodes ``< lengths[b]``
(a valid tree because parents precede children).  Nodes of the same depth are processed together.

Sum-product runs in two regimes, chosen per example (as the chain's does): in scaled probability space, every
message normalised (:meth:`Tree._scaled`, the fast path: 2-5x the speed of the other), where it is certified that
no product of its factors underflows; otherwise exactly in log space, every message carried as a max-plus part and
a correction that holds the log-sums and the exact rounding errors of the max-plus sums
(:func:`~betheproj.oracles.base._split_add`), so that no O(1) score or log-sum is rounded away beside a huge one.
Max-product re-centres every message but, like the chain's Viterbi, rounds an O(1) score of a label that trails
the best one by more than ``~1/eps``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from .base import (
    Marginals,
    PairwisePotentials,
    _finite_max,
    _log_partition_of,
    _max_shifted,
    _recentre,
    _split_add,
    _split_lse,
    _split_softmax,
    _split_sum,
    _sum_shifts,
    bethe_entropy,
    check_degree_args,
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
        # each level's children split into rounds of distinct parents (a parent's k-th child is in round k), so
        # that their messages can be added to the parents one at a time, with the rounding error of each sum
        self.rounds = []
        for lv in self.levels:
            count: dict[int, int] = {}
            rank = []
            for p in self.parents[lv].tolist():
                rank.append(count.get(p, 0))
                count[p] = rank[-1] + 1
            self.rounds.append([torch.nonzero(torch.tensor(rank) == k).flatten() for k in range(max(rank) + 1)])

    @property
    def num_nodes(self) -> int:
        return len(self.parents)

    def _check(self, potentials: object) -> PairwisePotentials:
        potentials = check_potentials(potentials)
        if potentials.node.shape[1] != self.num_nodes:
            raise ValueError(f"potentials have N={potentials.node.shape[1]} positions but the tree has "
                             f"{self.num_nodes} nodes")
        return potentials

    def _setup(self, pot: PairwisePotentials, errors: bool = True
               ) -> tuple[Tensor, Tensor | None, Tensor, Tensor | None, Tensor, Tensor, list[Tensor],
                          list[list[Tensor]], tuple[Tensor, Tensor]]:
        """The max-shifted node scores and edge tables and their rounding errors
        (:func:`~betheproj.oracles.base._max_shifted`; ``None`` with ``errors=False``), the valid positions,
        parents, levels, rounds and the shift [B] to add back to ``log Z``."""
        shifted, shift, node_err, edge_err = _max_shifted(pot, errors)
        node = shifted.node
        valid = torch.arange(node.shape[1], device=node.device) < pot.lengths[:, None]
        parents = self.parents.to(node.device)
        levels = [lv.to(node.device) for lv in self.levels]
        rounds = [[r.to(node.device) for r in rs] for rs in self.rounds]
        return node, node_err, shifted.edge, edge_err, valid, parents, levels, rounds, shift

    def _upward(self, pot: PairwisePotentials
                ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, list[Tensor], Tensor, Tensor, Tensor,
                           Tensor, Tensor, Tensor, Tensor, Tensor]:
        """Inside scores and upward messages in two parts (see :func:`~betheproj.oracles.base._split_add`), each
        message re-centred; the sums of children's messages split into finite part and -inf count (to exclude
        one exactly); ``log Z`` [B]."""
        node, node_err, edge, edge_err, valid, parents, levels, rounds, shift = self._setup(pot)
        assert node_err is not None and edge_err is not None          # kept by _setup's default errors=True
        zero = torch.zeros((), dtype=node.dtype, device=node.device)
        in_big, in_small = node.clone(), node_err.clone()
        fin_big, fin_small = torch.zeros_like(node), torch.zeros_like(node)   # sums of the children's messages
        cnt = torch.zeros(node.shape, dtype=torch.long, device=node.device)  # number of -inf messages
        up_big, up_small = torch.zeros_like(node), torch.zeros_like(node)    # from node i to parent[i], at i
        off_big, off_small = shift
        for lv, lv_rounds in zip(reversed(levels), reversed(rounds), strict=True):
            big, small = _split_add(edge[:, lv - 1], edge_err[:, lv - 1], in_big[:, lv, None, :],
                                    in_small[:, lv, None, :])
            big, small, shift_big, shift_small = _recentre(*_split_lse(big, small, -1))     # [B, k, C], [B, k]
            ok = valid[:, lv]
            big, small = torch.where(ok[..., None], big, zero), torch.where(ok[..., None], small, zero)
            level_big, level_small = _split_sum(torch.where(ok, shift_big, zero))
            off_big, off_small = _split_add(off_big, off_small, level_big,
                                            level_small + torch.where(ok, shift_small, zero).sum(-1))
            up_big[:, lv], up_small[:, lv] = big, small
            is_inf = torch.isinf(big)
            big = torch.where(is_inf, zero, big)
            for r in lv_rounds:
                par = parents[lv[r]]
                fin_big[:, par], fin_small[:, par] = _split_add(fin_big[:, par], fin_small[:, par], big[:, r],
                                                                small[:, r])
            cnt.index_add_(1, parents[lv], is_inf.long())
            # inside of the parents is final once all their children (this level) are in
            par = parents[lv].unique()
            big, in_small[:, par] = _split_add(node[:, par], node_err[:, par], fin_big[:, par], fin_small[:, par])
            in_big[:, par] = torch.where(cnt[:, par] > 0, _neg_inf(node), big)
        root_big, root_small, top_big, top_small = _recentre(in_big[:, 0], in_small[:, 0])
        big, small = _split_add(off_big, off_small, top_big, top_small)
        log_z = big + (small + torch.logsumexp(root_big + root_small, -1))
        return (node, node_err, edge, edge_err, valid, parents, levels, log_z, in_big, in_small, up_big, up_small,
                fin_big, fin_small, cnt)

    def marginals(self, potentials: PairwisePotentials) -> Marginals:
        """Node and edge marginals and ``log Z`` by sum-product, leaves to root and back: in scaled probability
        space where that is certified to lose nothing to underflow (:meth:`_scaled`), else in log space."""
        pot = self._check(potentials)
        with torch.no_grad():
            # examples whose edge tables alone rule the fast pass out skip it (it would be wasted work)
            edge = pot.full_edge()
            edge_max, m = _edge_factors(edge)
            rows = torch.nonzero(~_gapped(edge, pot.lengths, m)).flatten()
            if rows.numel() == 0:
                return self._exact(pot)
            if rows.numel() == len(pot.lengths):
                node_marg, fast_edges, log_z, ok = self._scaled(pot, (edge_max, m))
            else:
                node_marg, fast_edges, log_z, ok = self._scaled(pot.index(rows), (edge_max[rows], m[rows]))
                node_marg, fast_edges, log_z, ok = _spread(rows, len(pot.lengths), node_marg, fast_edges, log_z,
                                                           ok)
            slow = torch.nonzero(~ok).flatten()
            if slow.numel() == 0:
                return Marginals(node_marg, fast_edges, log_z, pot.lengths)
            if slow.numel() == ok.numel():
                return self._exact(pot)
            exact = self._exact(pot.index(slow), examples=slow)
            node_marg[slow], log_z[slow] = exact.node, _log_partition_of(exact)

        @torch.no_grad()
        def edge_marginals() -> Tensor:
            edge = fast_edges()
            edge[slow] = exact.edge
            return edge

        return Marginals(node_marg, edge_marginals, log_z, pot.lengths)

    def _scaled(self, pot: PairwisePotentials, factors: tuple[Tensor, Tensor] | None = None
                ) -> tuple[Tensor, Callable[[], Tensor], Tensor, Tensor]:
        """Sum-product with normalised messages in probability space (the chain's fast path, on a tree): node
        marginals [B, N, C], a function giving the edge marginals, ``log Z`` [B], and ``ok`` [B], whether the
        example is certified (the others' outputs are meaningless).

        Upward, node ``i``'s inside vector ``I_i`` (``p_i = exp(node_i - max)`` times its children's non-zero
        messages, normalised to sum 1) goes through ``M_i = exp(edge_i - max)`` to its parent, normalised to sum 1
        again; the normalisers' logs make ``log Z``.  A parent counts its children's zero messages per label, so
        that downward its belief without one child's message (``rest``) is exact even where that message is 0.
        Node marginals are ``I_i`` times the downward message; an edge's, the parent's marginal times the child's
        conditional ``M_i(y, .) I_i / (M_i I_i)(y)``.  Certified where every non-zero entry of ``M``, of the
        normalised vectors and of ``rest`` is at least ``sqrt(tiny)`` (so no product of two underflows) and every
        product of a node's factors (at most 1 each, so decreasing as they are multiplied in) is normal: then every
        zero is structural (a ``-inf`` score) and each quantity carries only rounding errors, relative, a few
        ``eps`` per step.  Edge tables with score gaps beyond ``~354`` nats in float64 (``~44`` in float32), beliefs
        as peaked, and ``-inf`` patterns that leave no labelling are left to the exact recursion (:meth:`_exact`).
        ``factors``: :func:`_edge_factors` of these examples, which the caller found not :func:`_gapped`."""
        node, edge, lengths = pot.node, pot.full_edge(), pot.lengths
        b, n, c = node.shape
        dtype, device = node.dtype, node.device
        lim = math.sqrt(torch.finfo(dtype).tiny)
        zero = torch.zeros((), dtype=dtype, device=device)
        valid = torch.arange(n, device=device) < lengths[:, None]                      # [B, N]
        parents = self.parents.to(device)
        levels = [lv.to(device) for lv in self.levels]
        rounds = [[r.to(device) for r in rs] for rs in self.rounds]

        node_max = _finite_max(node, -1)                                                 # [B, N, 1]
        nz = torch.where(valid[..., None], torch.exp(node - node_max), 1.0)   # times the non-zero messages
        if factors is None:
            edge_max, m = _edge_factors(edge)                                           # [B, N-1, 1, 1], M
            bad = _gapped(edge, lengths, m)
        else:                                  # the caller's, of examples it found not gapped
            (edge_max, m), bad = factors, torch.zeros(b, dtype=torch.bool, device=device)
        shifts = [(torch.where(valid, node_max[..., 0], zero), -1)]
        if n > 1:
            shifts.append((torch.where(valid[:, 1:], edge_max[..., 0, 0], zero), -1))
        shift = _sum_shifts(*shifts)                 # huge shifts that cancel leave their O(1) part

        zeros = torch.zeros(b, n, c, dtype=torch.int32, device=device)  # children's zero messages, per label
        scale = torch.zeros(b, n, dtype=dtype, device=device)    # log of the children's messages' normalisers
        raw_all = torch.ones_like(nz)                            # the products before normalisation
        up = torch.ones_like(nz)                                 # normalised messages to the parents
        root = torch.zeros(1, dtype=torch.long, device=device)
        for lv, lv_rounds in zip([*reversed(levels), root], [*reversed(rounds), []], strict=True):   # root last
            ok_lv = valid[:, lv]
            raw = nz[:, lv]
            raw_all[:, lv] = raw
            t = torch.where(zeros[:, lv] == 0, raw, zero).sum(-1, keepdim=True)
            nz[:, lv] = raw / t                                  # normalised by I_i's sum (zero labels too)
            inside_lv = torch.where(zeros[:, lv] == 0, nz[:, lv], zero)                  # I_i, normalised
            total = scale[:, lv] + torch.log(t[..., 0])                              # log of the true I_i's sum
            if lv is root:                                                          # log Z
                log_z = shift[0] + (shift[1] + torch.where(ok_lv, total, zero).sum(-1))
                break
            u = torch.matmul(m[:, lv - 1], inside_lv[..., None])[..., 0]            # [B, k, C] parent labels
            s_ = u.sum(-1, keepdim=True)
            u = torch.where(ok_lv[..., None], u / s_, 1.0)                         # padding: a neutral message
            up[:, lv] = u
            par = parents[lv]
            factor = torch.where(u > 0, u, 1.0)
            for r in lv_rounds:                                  # children of distinct parents at a time
                nz[:, par[r]] = nz[:, par[r]] * factor[:, r]
            zeros.index_add_(1, par, (u == 0).to(torch.int32))
            scale.index_add_(1, par, torch.where(ok_lv, total + torch.log(s_[..., 0]), zero))
        inside = torch.where(zeros == 0, nz, zero)               # every I_i (nz and zeros are final at its level)
        # products of factors at most 1 decrease step by step: none lost digits to underflow if the last is normal
        # (p and the non-zero messages: 0 only where the score is -inf)
        bad |= (valid[..., None] & (node > -math.inf) & (raw_all < torch.finfo(dtype).tiny)).flatten(1).any(-1)

        down = torch.zeros_like(nz)                              # normalised messages from the parent
        down[:, 0] = 1.0
        rest = torch.zeros_like(nz)                              # the parent's belief without i's message
        for lv in levels:
            par = parents[lv]
            msg = up[:, lv]
            others = zeros[:, par] - (msg == 0).to(torch.int32)
            belief = nz[:, par] * down[:, par]
            belief = torch.where(others == 0, torch.where(msg > 0, belief / msg, belief), zero)
            top = belief.amax(-1, keepdim=True)
            r_lv = belief / top
            rest[:, lv] = r_lv
            d = torch.matmul(r_lv[..., None, :], m[:, lv - 1])[..., 0, :]          # [B, k, C] own labels
            down[:, lv] = d / d.sum(-1, keepdim=True)

        v = valid[..., None]
        fine = torch.isfinite(nz) & torch.isfinite(down) & torch.isfinite(rest)
        bad |= (v & ~fine).flatten(1).any(-1)
        # every factor of a product at least sqrt(tiny): nz (also where a child's message is 0: rest reads it
        # there), rest and the downward messages
        for x in (nz, rest, down):
            bad |= (v & (x > 0) & (x < lim)).flatten(1).any(-1)
        ok = ~bad & torch.isfinite(log_z)
        marg = inside * down
        marg = marg / marg.sum(-1, keepdim=True)
        node_marg = torch.where(v & ok[:, None, None], marg, zero)

        parent_marg = marg[:, parents[1:]]                       # [B, N-1, C], kept from later writes

        def edge_marginals() -> Tensor:
            """``xi_i(y, y') = mu_parent(y) M_i(y, y') I_i(y') / (M_i I_i)(y)`` [B, N-1, C, C]: the parent's
            marginal times the child's conditional, each in [0, 1] (an entry underflows only below ``tiny``)."""
            if n == 1:
                return node.new_zeros(b, 0, c, c)
            pair = m * inside[:, 1:, None, :]
            given = torch.matmul(m, inside[:, 1:, :, None])                         # (M_i I_i)(y), [B, N-1, C, 1]
            xi = parent_marg[..., None] * (pair / torch.where(given > 0, given, 1.0))
            return torch.where((valid[:, 1:] & ok[:, None])[..., None, None], xi, zero)

        return node_marg, edge_marginals, log_z, ok

    def _exact(self, pot: PairwisePotentials, examples: Tensor | None = None) -> Marginals:
        """Marginals by sum-product in log space, each message in two parts (see the module docstring); errors name
        the examples ``examples[b]``."""
        with torch.no_grad():
            (node, node_err, edge, edge_err, valid, parents, levels, log_z, in_big, in_small, up_big, up_small,
             fin_big, fin_small, cnt) = self._upward(pot)
            raise_if_not_finite(log_z, examples=examples)
            zero = torch.zeros((), dtype=node.dtype, device=node.device)
            down_big, down_small = torch.zeros_like(node), torch.zeros_like(node)   # from parent[i] into i
            edge_marg = torch.zeros_like(edge)
            for lv in levels:
                par = parents[lv]
                # parent's belief without node lv's own message: exact even with -inf messages
                own_inf = torch.isinf(up_big[:, lv])
                own_big = torch.where(own_inf, zero, up_big[:, lv])
                rest = _split_add(fin_big[:, par], fin_small[:, par], -own_big, -up_small[:, lv])
                rest = _split_add(*rest, node[:, par], node_err[:, par])
                rest_big, rest_small = _split_add(*rest, down_big[:, par], down_small[:, par])     # [B, k, C]
                rest_big = torch.where(cnt[:, par] - own_inf.long() > 0, _neg_inf(node), rest_big)
                pair = _split_add(rest_big[..., :, None], rest_small[..., :, None], edge[:, lv - 1],
                                  edge_err[:, lv - 1])                                      # [B, k, C, C]
                down_big[:, lv], down_small[:, lv], _, _ = _recentre(*_split_lse(*pair, -2))
                pair_big, pair_small = _split_add(*pair, in_big[:, lv, None, :], in_small[:, lv, None, :])
                bsz, k, c, _ = pair_big.shape
                edge_marg[:, lv - 1] = _split_softmax(pair_big.reshape(bsz, k, c * c),
                                                      pair_small.reshape(bsz, k, c * c)).reshape(bsz, k, c, c)
            # normalised per node, so rounding of large scores cannot unbalance the sums
            node_marg = _split_softmax(*_split_add(in_big, in_small, down_big, down_small))
            node_marg = torch.where(valid[..., None], node_marg, zero)
            edge_valid = valid[:, 1:]
            edge_marg = torch.where(edge_valid[..., None, None], edge_marg, zero)
        return Marginals(node_marg, edge_marg, log_z, pot.lengths)

    def log_partition(self, potentials: PairwisePotentials) -> Tensor:
        """``log Z`` [B], differentiable: its gradient is the marginals."""
        return log_partition(self, potentials)

    def map(self, potentials: PairwisePotentials) -> Tensor:
        """Max-product MAP: labels [B, N], ``-1`` past each length."""
        pot = self._check(potentials)
        with torch.no_grad():
            node, _, edge, _, valid, parents, levels, _, _ = self._setup(pot, errors=False)   # max-product: no TwoSum
            best = node.clone()
            back = torch.zeros(node.shape, dtype=torch.long, device=node.device)
            for lv in reversed(levels):
                msg, arg = (edge[:, lv - 1] + best[:, lv, None, :]).max(dim=-1)
                # re-centred, so that a score every label pays cannot absorb the O(1) ones of other children
                msg = msg - _finite_max(msg, -1)
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
        n = check_degree_args(lengths, n)
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


def _edge_factors(edge: Tensor) -> tuple[Tensor, Tensor]:
    """Each edge table's largest score [B, N-1, 1, 1] and ``M = exp(edge - max)`` [B, N-1, C, C]."""
    b, n1, c, _ = edge.shape
    edge_max = _finite_max(edge, (-1, -2)) if n1 else edge.new_zeros(b, 0, 1, 1)
    return edge_max, torch.exp(edge - edge_max)


def _gapped(edge: Tensor, lengths: Tensor, m: Tensor) -> Tensor:
    """[B]: whether an edge table of the example (``edge`` [B, N-1, C, C], ``m = exp(edge - max)``) holds a
    finite entry below ``sqrt(tiny)`` times its largest, which :meth:`Tree._scaled` cannot certify."""
    valid = torch.arange(1, edge.shape[1] + 1, device=edge.device) < lengths[:, None]
    return ((m < math.sqrt(torch.finfo(edge.dtype).tiny)) & (edge > -math.inf)
            & valid[..., None, None]).flatten(1).any(-1)


def _spread(rows: Tensor, b: int, node: Tensor, edges: Callable[[], Tensor], log_z: Tensor,
            ok: Tensor) -> tuple[Tensor, Callable[[], Tensor], Tensor, Tensor]:
    """The fast pass's outputs for the examples ``rows`` placed in a batch of ``b`` (the others not certified)."""
    full = node.new_zeros(b, *node.shape[1:])
    full[rows] = node
    z = log_z.new_zeros(b)
    z[rows] = log_z
    certified = torch.zeros(b, dtype=torch.bool, device=ok.device)
    certified[rows] = ok

    def edge_marginals() -> Tensor:
        part = edges()
        out = part.new_zeros(b, *part.shape[1:])
        out[rows] = part
        return out

    return full, edge_marginals, z, certified

