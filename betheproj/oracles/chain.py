"""Linear-chain CRF oracle: forward-backward marginals, log-partition, Viterbi MAP, Bethe entropy.

Forward-backward runs in two regimes and picks per example:

* a *scaled probability-space* recursion with matrix products (``alpha_t = (alpha_{t-1} M) * P_t``,
  renormalised every step), the fast path;
* an exact *log-space* recursion (``logsumexp`` over ``[B, C, C]``), for the examples the fast path cannot
  certify.

The certificate: every quantity of the fast path is at most 1 after renormalisation, so a product that
underflows loses at most ``tiny`` (the smallest normal float).  A term lost at forward step ``t`` changes
the path mass by at most ``C^2 tiny / s_t`` relative to the renormalised scale, and the mass seen through
step ``t`` is ``d_t = sum_j alpha_t(j) beta_t(j)``.  Summing, the relative error of ``Z`` and the absolute
error of every marginal is at most ``4 C^2 tiny sum_t (1/(s_t d_t) + 1/(r_t d_t))`` (``r_t`` the backward
normalisers).  Examples whose bound exceeds machine epsilon (huge score gaps, ``-inf`` dead ends) are
recomputed in log space, so results are exact to rounding for any magnitudes and ``-inf`` patterns.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .base import (
    Marginals,
    PairwisePotentials,
    _finite_max,
    _max_shifted,
    _valid_node,
    bethe_entropy,
    check_marginals,
    check_potentials,
    log_partition,
    raise_if_not_finite,
)

__all__ = ["LinearChain"]


class LinearChain:
    """Exact inference in a linear-chain pairwise MRF ``p(y) ∝ exp(sum_t node[t, y_t] + sum_t edge[t, y_t, y_t+1])``.

    All methods are batched over examples of different lengths; see :class:`~betheproj.ChainPotentials`.
    Per-position edges that are one [C, C] table per example viewed over the positions (stride 0, as
    ``edge[:, None].expand(B, N-1, C, C)`` makes) are recognised and cost no more than shared ones.
    """

    per_example_edges = True      # the solvers may hand it such views (see betheproj.inference.solve)

    def __init__(self) -> None:
        self._cache: tuple | None = None

    def marginals(self, potentials: PairwisePotentials) -> Marginals:
        """Node and edge marginals and ``log Z`` (eq. 1's optimum); edge marginals are computed on access.

        The solvers call this with the same edge scores and shifted node scores; the exponentiated edge
        scores of the last call are kept beside a copy of the scores they came from, and reused only for
        scores equal to that copy (so no in-place change, even through ``.data``, is mistaken for them)."""
        pot = check_potentials(potentials)
        with torch.no_grad():
            return _forward_backward(pot, self)

    def _edge_factors(self, edge: Tensor, shared: bool) -> tuple[Tensor, Tensor]:
        """``edge_max`` and ``exp(edge - edge_max)`` (time-major [N-1, B, C, C] unless shared)."""
        cache = getattr(self, "_cache", None)
        if (cache is not None and cache[0].shape == edge.shape and cache[0].dtype == edge.dtype
                and cache[0].device == edge.device and torch.equal(cache[0], edge)):
            return cache[1], cache[2]
        edge_max = _finite_max(edge, (-1, -2))
        m = torch.exp(edge - edge_max)                            # [C, C] or [B, N-1, C, C]
        if not shared:
            m = m.transpose(0, 1).contiguous()                    # [N-1, B, C, C]
        if edge.numel() >= 4096:                                  # worth keeping
            self._cache = (edge.detach().clone(), edge_max, m)
        return edge_max, m

    def log_partition(self, potentials: PairwisePotentials) -> Tensor:
        """``log Z`` [B], differentiable: its gradient is the marginals."""
        return log_partition(self, check_potentials(potentials))

    def map(self, potentials: PairwisePotentials) -> Tensor:
        """Viterbi decoding (eq. 3): labels [B, N] (long), ``-1`` past each length."""
        pot = check_potentials(potentials)
        with torch.no_grad():
            return _viterbi(pot)

    def degree(self, lengths: Tensor, n: int) -> Tensor:
        """Number of valid edges at each node [B, N]."""
        pos = torch.arange(n, device=lengths.device)
        last = lengths[:, None] - 1
        valid = pos < lengths[:, None]
        return ((pos > 0) & valid).long() + (pos < last).long()

    def entropy(self, marginals: Marginals) -> Tensor:
        """Bethe entropy [B], equal to the exact entropy on a chain."""
        marginals = check_marginals(marginals)
        return bethe_entropy(marginals.node, marginals.edge, self.degree(marginals.lengths, marginals.node.shape[1]))

    def __repr__(self) -> str:
        return "LinearChain()"


def _forward_backward(pot: PairwisePotentials, oracle: LinearChain | None = None) -> Marginals:
    b, n, c = pot.node.shape
    lengths = pot.lengths
    short = lengths < n                                           # examples that end before N
    any_short = bool(short.any())
    node, valid = _valid_node(pot) if any_short else (pot.node, None)
    dtype, device = node.dtype, node.device
    zero = torch.zeros((), dtype=dtype, device=device)
    tiny = torch.finfo(dtype).tiny

    # fast path: scaled probability space, time-major [N, B, C] so every step touches contiguous memory
    p = torch.empty(n, b, c, dtype=dtype, device=device)
    p.copy_(node.transpose(0, 1))                                 # [N, B, C], a copy (modified below)
    node_max = _row_max(p)                                        # [N, B, 1]
    node_max = torch.where(torch.isfinite(node_max), node_max, zero)
    p.sub_(node_max).exp_()
    edge = pot.edge
    shared = pot.shared_edge
    # one [C, C] table per example, viewed over the positions with stride 0 (the solvers' per-example offsets)
    per_example = not shared and n > 1 and edge.stride(1) == 0
    if per_example:
        edge_max = _finite_max(edge[:, 0], (-1, -2))                               # [B, 1, 1]
        m = torch.exp(edge[:, 0] - edge_max)                                      # [B, C, C]
    else:
        edge_max, m = (oracle or LinearChain())._edge_factors(edge, shared)

    alpha = torch.empty_like(p)
    s = torch.empty(n, b, dtype=dtype, device=device)
    alpha[0] = p[0]
    for t in range(n):
        if t:
            if shared:
                torch.mm(alpha[t - 1], m, out=alpha[t])
            else:
                torch.bmm(alpha[t - 1, :, None, :], m if per_example else m[t - 1], out=alpha[t, :, None, :])
            alpha[t] *= p[t]
        torch.sum(alpha[t], -1, out=s[t])
        alpha[t] *= (1.0 / s[t])[:, None]

    beta = torch.empty_like(p)
    r = torch.empty(n, b, dtype=dtype, device=device)
    beta[n - 1] = 1.0
    mt = m.t() if shared else None
    v = torch.empty(b, c, dtype=dtype, device=device)
    for t in range(n - 2, -1, -1):
        torch.mul(p[t + 1], beta[t + 1], out=v)
        if shared:
            torch.mm(v, mt, out=beta[t])
        else:
            torch.bmm(m if per_example else m[t], v[:, :, None], out=beta[t, :, :, None])
        torch.sum(beta[t], -1, out=r[t])
        beta[t] *= (1.0 / r[t])[:, None]
        if any_short:
            done = (t >= lengths - 1)
            beta[t] = torch.where(done[:, None], torch.ones((), dtype=dtype), beta[t])
    if any_short:
        r = torch.where((torch.arange(n, device=device)[:, None] >= lengths - 1), torch.inf, r)
    else:
        r[n - 1] = torch.inf

    ab = alpha * beta                                             # [N, B, C]
    d = ab.sum(-1)                                                # [N, B]
    node_marg = ab.mul_((1.0 / d)[..., None]).transpose(0, 1)     # [B, N, C]
    if valid is None:
        valid = torch.ones(b, n, dtype=torch.bool, device=device)
    valid_t = valid.t()
    log_z = torch.where(valid_t, torch.log(s) + node_max[..., 0], zero).sum(0)
    if n > 1:
        edge_valid = torch.arange(n - 1, device=device) < (lengths[:, None] - 1)
        if shared:
            e_shift = edge_max.reshape(-1).expand(b, n - 1)
        else:
            e_shift = edge_max.reshape(b, 1).expand(b, n - 1) if per_example else edge_max.reshape(b, n - 1)
        log_z = log_z + torch.where(edge_valid, e_shift, zero).sum(-1)
    bound = 4.0 * c * c * tiny * torch.where(valid_t, (1.0 / s + 1.0 / r) / d, zero).sum(0)
    ok = torch.isfinite(bound) & (bound <= torch.finfo(dtype).eps) & torch.isfinite(log_z)
    if ab.numel() and not bool(ab.amin() > 0):
        # a marginal that underflowed to 0 (alpha and beta positive) is one the bound cannot see: it bounds
        # the absolute error, and a mass of 1e-23 read as an exact 0 looks forbidden to the solver.  ``> 0``,
        # not ``== 0``: another example's padding may hold NaN (0/0 at a dead end), which makes the minimum NaN
        ok &= ~((ab == 0) & (alpha > 0) & (beta > 0)).any(-1).any(0)
    if any_short:
        node_marg = torch.where(valid[..., None], node_marg, zero)

    slow = torch.nonzero(~ok).flatten()
    slow_state = None
    if slow.numel():
        node_marg = node_marg.contiguous()
        # shifted once, for both recursions; new tensors, so the lazy edge marginals see no later writes
        sub, shift = _max_shifted(pot.index(slow))
        la, lb, lz = _log_forward_backward(sub)
        lz = lz + shift
        raise_if_not_finite(lz, examples=slow)
        # normalised per position, so rounding of large scores cannot unbalance the sums
        marg = torch.softmax(la + lb, dim=-1)
        node_marg[slow] = torch.where(valid[slow][..., None], marg, zero)
        log_z[slow] = lz
        slow_state = (sub, la, lb, lz)

    def scaled_pairs() -> tuple[Tensor, Tensor, Tensor]:
        """``alpha_t``, ``v_{t+1} = P_{t+1} * beta_{t+1}`` [N-1, B, C] and each step's normaliser ``z_t`` [N-1, B]:
        the fast-path edge marginal is ``xi_t = (alpha_t / z_t) (x) v_{t+1} * M``."""
        v = p[1:] * beta[1:]
        a_prev = alpha[:-1]
        if shared:
            z = (torch.matmul(a_prev, m) * v).sum(-1)
        else:
            z = (torch.matmul(a_prev[..., None, :], m).squeeze(-2) * v).sum(-1)
        return a_prev, v, z

    def slow_edges() -> Tensor:
        """Exact log-space edge marginals of the uncertified examples, zero past their lengths."""
        sub, la, lb, lz = slow_state
        sub_ev = torch.arange(n - 1, device=device) < (sub.lengths[:, None] - 1)
        return torch.where(sub_ev[..., None, None], _log_edge_marginals(sub, la, lb, lz), zero)

    def edge_marginals() -> Tensor:
        if n == 1:
            return node.new_zeros(b, 0, c, c)
        a_prev, v, z = scaled_pairs()
        xi = torch.mul((a_prev / z[..., None])[..., :, None], v[..., None, :])
        xi.mul_(m)                                                # [N-1, B, C, C]
        if any_short:
            ev = torch.arange(n - 1, device=device)[:, None] < (lengths - 1)
            xi.masked_fill_(~ev[..., None, None], 0.0)
        xi = xi.transpose(0, 1)                                   # [B, N-1, C, C] view
        if slow_state is not None:
            xi[slow] = slow_edges()
        return xi

    def weighted_pairs(weights: Tensor) -> tuple[Tensor, Tensor]:
        """``alpha_t w_b / z_t`` (zero past each length) and ``v_{t+1}`` [N-1, B, C]: for one transition table
        per example, the fast-path edge marginals summed over positions with weights ``w`` [B] are
        ``M * sum_t (alpha_t w_b / z_t) (x) v_{t+1}``, without materialising them."""
        a_prev, v, z = scaled_pairs()
        a = a_prev * (weights.to(dtype)[None, :] / z)[..., None]
        if any_short:      # past a length the recursion may hold 0/0 (a dead end in the padding): mask, not scale
            ev = torch.arange(n - 1, device=device)[:, None] < (lengths - 1)
            a = torch.where(ev[..., None], a, zero)
        return a, v

    def edge_sum(weights: Tensor) -> Tensor:
        """``sum_{b,t} weights[b] * edge_marginals[b, t]`` [C, C] for shared transitions: ``M * (A^T V)``."""
        if n == 1:
            return node.new_zeros(c, c)
        a, v = weighted_pairs(weights)
        if slow_state is not None:        # uncertified examples may hold inf/NaN, and A^T V mixes examples
            a[:, slow] = 0.0
            v = v.clone()
            v[:, slow] = 0.0
        total = m * (a.reshape(-1, c).t() @ v.reshape(-1, c))
        if slow_state is not None:
            total = total + torch.einsum("b,bnij->ij", weights.to(dtype)[slow], slow_edges())
        return total

    def edge_total() -> Tensor:
        """Each example's edge marginals summed over its positions [B, C, C]."""
        if n == 1:
            return node.new_zeros(b, c, c)
        a, v = weighted_pairs(torch.ones(b, dtype=dtype, device=device))
        total = m * torch.einsum("tbi,tbj->bij", a, v)
        if slow_state is not None:
            total[slow] = slow_edges().sum(1)
        return total

    mu = Marginals(node_marg, edge_marginals, log_z, lengths, edge_total=edge_total if shared or per_example else None)
    if shared:
        mu.edge_sum = edge_sum
    return mu


def _row_max(x: Tensor) -> Tensor:
    """``x.amax(-1, keepdim=True)``, exactly, by halving the last dimension with elementwise maxima first: a
    reduction over a short contiguous dimension is several times slower in PyTorch on CPU than elementwise
    passes (2.2 ms against 1.0 ms at [14, 6877, 26])."""
    k = x.shape[-1]
    while k > 8:
        h = (k + 1) // 2                       # the two halves overlap by one entry when k is odd
        x = torch.maximum(x[..., :h], x[..., k - h:])
        k = h
    return x.amax(-1, keepdim=True)


def _log_forward_backward(pot: PairwisePotentials) -> tuple[Tensor, Tensor, Tensor]:
    """Exact log-space forward-backward: log alpha, log beta [B, N, C] and log Z [B] (the slow path runs it on
    :func:`~betheproj.oracles.base._max_shifted` potentials)."""
    node, valid = _valid_node(pot)
    b, n, c = node.shape
    edge = pot.full_edge()
    lengths = pot.lengths
    la = torch.empty_like(node)
    la[:, 0] = node[:, 0]
    for t in range(1, n):
        la[:, t] = torch.logsumexp(la[:, t - 1, :, None] + edge[:, t - 1], dim=1) + node[:, t]
    lb = torch.zeros_like(node)
    for t in range(n - 2, -1, -1):
        nxt = torch.logsumexp(edge[:, t] + (node[:, t + 1] + lb[:, t + 1])[:, None, :], dim=2)
        lb[:, t] = torch.where((t >= lengths - 1)[:, None], torch.zeros((), dtype=node.dtype), nxt)
    last = la.gather(1, (lengths - 1)[:, None, None].expand(b, 1, c)).squeeze(1)
    log_z = torch.logsumexp(last, dim=-1)
    return la, lb, log_z


def _log_edge_marginals(pot: PairwisePotentials, la: Tensor, lb: Tensor, log_z: Tensor) -> Tensor:
    node, _ = _valid_node(pot)
    edge = pot.full_edge()
    score = la[:, :-1, :, None] + edge + (node[:, 1:] + lb[:, 1:])[:, :, None, :]
    b, m, c, _ = score.shape
    return torch.softmax(score.reshape(b, m, c * c), dim=-1).reshape(b, m, c, c)


def _viterbi(pot: PairwisePotentials) -> Tensor:
    # max-product on max-shifted scores, the running score re-centred at its maximum after every position: a
    # running sum of raw scores (1e4 per position in float32) would absorb the O(1) differences between labels
    node, _ = _valid_node(pot)
    node = node - _finite_max(node, -1)
    edge = pot.edge - _finite_max(pot.edge, (-1, -2))
    shared = pot.shared_edge
    lengths = pot.lengths
    b, n, c = node.shape
    score = node[:, 0]
    backptr = torch.zeros(b, n, c, dtype=torch.long, device=node.device)
    final = score.clone()
    for t in range(1, n):
        e = edge if shared else edge[:, t - 1]
        best, arg = (score[:, :, None] + e).max(dim=1)
        score = best + node[:, t]
        score = score - _finite_max(score, -1)
        backptr[:, t] = arg
        final = torch.where((t == lengths - 1)[:, None], score, final)
    raise_if_not_finite(final.amax(-1))
    labels = torch.full((b, n), -1, dtype=torch.long, device=node.device)
    last = final.argmax(-1)
    for t in range(n - 1, -1, -1):
        at_end = t == lengths - 1
        if t < n - 1:
            from_next = backptr[:, t + 1].gather(1, labels[:, t + 1].clamp_min(0)[:, None]).squeeze(1)
            cur = torch.where(at_end, last, from_next)
        else:
            cur = last
        labels[:, t] = torch.where(t <= lengths - 1, cur, torch.full_like(cur, -1))
    return labels
