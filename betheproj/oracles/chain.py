"""Linear-chain CRF oracle: forward-backward marginals, log-partition, Viterbi MAP, Bethe entropy.

Forward-backward runs in two regimes and picks per example:

* a *scaled probability-space* recursion with matrix products (``alpha_t = (alpha_{t-1} M) * P_t``,
  renormalised every step), the fast path;
* an exact *log-space* recursion (``logsumexp`` over ``[B, C, C]``), for the examples the fast path cannot
  certify.  It carries every log-message as a max-plus part and a correction that holds the log-sums and the
  exact rounding errors (TwoSum) of the max-plus sums (:func:`~betheproj.oracles.base._split_add`), so no O(1)
  score or log-sum is rounded away beside a huge one (``-P + log 2`` or ``-P + 1`` beside ``P = 1e20``).

The certificate: every quantity of the fast path is at most 1 after renormalisation, so a product that
underflows loses at most ``tiny`` (the smallest normal float).  A term lost at forward step ``t`` changes
the path mass by at most ``C^2 tiny / s_t`` relative to the renormalised scale, and the mass seen through
step ``t`` is ``d_t = sum_j alpha_t(j) beta_t(j)``.  Summing, the relative error of ``Z`` and the absolute
error of every marginal is at most ``4 C^2 tiny sum_t (1/(s_t d_t) + 1/(r_t d_t))`` (``r_t`` the backward
normalisers).  Examples whose bound exceeds machine epsilon (huge score gaps, ``-inf`` dead ends) are
recomputed in log space, and so are those where a product ``alpha_t(j) beta_t(j)`` underflowed to 0, or an
``alpha`` or ``beta`` itself where the marginal, estimated in log space, may be a normal number (a positive
marginal read as 0 looks forbidden to the solvers; a label that no labelling of finite score passes through is an
exact 0 and is left out, :func:`_reachable`), and so are those with an edge marginal that rests on a factor
that underflowed (an ``alpha``, a product ``p beta`` or a transition factor) while it may be a normal number
(:func:`_lost_edge`).  Marginals thus have an absolute error below ``eps`` for any magnitudes and ``-inf``
patterns, and none that may be a normal number comes back 0 (short of scores beyond ``~1/eps^2`` times their O(1)
parts, whose rounding errors are then rounded in turn); ``log Z`` has a relative error of order ``N eps``, also
where huge shifts cancel (``1e15`` at one position, ``-1e15`` at the next: they are summed in two parts).  Their
*relative* error is that of rounding only down to about ``eps`` times the fast path's scale: far smaller marginals
(below ~1e-20 in float32) can rest on a product that lost digits as a subnormal before a renormalisation, which no
check sees (measured on random float32 scores of standard deviation 10: relative errors up to 1e-4 at 1e-20, 5e-2 at
1e-30).

Viterbi re-centres its running scores at every position but does not keep their rounding errors: an O(1) score
of a label that trails the best one by more than ``~1/eps`` is rounded away, which can change the MAP among
labellings whose scores differ by O(1) beside such a penalty.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from .base import (
    Marginals,
    PairwisePotentials,
    _finite_max,
    _max_shifted,
    _recentre,
    _split_add,
    _split_lse,
    _split_softmax,
    _sum_shifts,
    _valid_node,
    bethe_entropy,
    check_degree_args,
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
        self._cache: tuple[Tensor, Tensor, Tensor, tuple[Tensor, Tensor] | None] | None = None

    def marginals(self, potentials: PairwisePotentials) -> Marginals:
        """Node and edge marginals and ``log Z`` (eq. 1's optimum); edge marginals are computed on access.

        The solvers call this with the same edge scores and shifted node scores; the exponentiated edge
        scores of the last call are kept beside a copy of the scores they came from, and reused only for
        scores equal to that copy (so no in-place change, even through ``.data``, is mistaken for them)."""
        pot = check_potentials(potentials)
        with torch.no_grad():
            return _forward_backward(pot, self)

    def _edge_factors(self, edge: Tensor, shared: bool
                      ) -> tuple[Tensor, Tensor, tuple[Tensor, Tensor] | None]:
        """``edge_max``, ``exp(edge - edge_max)`` (time-major [N-1, B, C, C] unless shared) and the logs of each
        table's largest factors that underflowed, by row and by column ([C] or [N-1, B, C] each, see
        :func:`_underflowed`)."""
        cache = getattr(self, "_cache", None)
        if (cache is not None and cache[0].shape == edge.shape and cache[0].dtype == edge.dtype
                and cache[0].device == edge.device and torch.equal(cache[0], edge)):
            return cache[1], cache[2], cache[3]
        edge_max = _finite_max(edge, (-1, -2))
        m = torch.exp(edge - edge_max)                            # [C, C] or [B, N-1, C, C]
        m_lost = _underflowed(edge, edge_max, m)
        if not shared:
            m = m.transpose(0, 1).contiguous()                    # [N-1, B, C, C]
            m_lost = None if m_lost is None else (m_lost[0].transpose(0, 1), m_lost[1].transpose(0, 1))
        if edge.numel() >= 4096:                                  # worth keeping
            self._cache = (edge.detach().clone(), edge_max, m, m_lost)
        return edge_max, m, m_lost

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
        n = check_degree_args(lengths, n)
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
        m_lost = _underflowed(edge[:, 0], edge_max, m)                            # [B, C] twice, or None
    else:
        edge_max, m, m_lost = (oracle or LinearChain())._edge_factors(edge, shared)

    alpha = torch.empty_like(p)
    s = torch.empty(n, b, 1, dtype=dtype, device=device)        # the normalisers, kept [N, B, 1] for the steps
    alpha[0] = p[0]
    # each position's views made once (the steps are small at small B: per-op overhead is most of their cost), and
    # ``x[t].mul_(y)``, not ``x[t] *= y``, which copies the product back onto itself (``__setitem__``)
    alpha_t, s_t, p_t = alpha.unbind(0), s.unbind(0), p.unbind(0)
    for t in range(n):
        if t:
            if shared:
                torch.mm(alpha_t[t - 1], m, out=alpha_t[t])
            else:
                torch.bmm(alpha_t[t - 1][:, None, :], m if per_example else m[t - 1], out=alpha_t[t][:, None, :])
            alpha_t[t].mul_(p_t[t])
        torch.sum(alpha_t[t], -1, keepdim=True, out=s_t[t])
        alpha_t[t].mul_(s_t[t].reciprocal())
    s = s[..., 0]

    beta = torch.empty_like(p)
    r = torch.empty(n, b, 1, dtype=dtype, device=device)
    beta[n - 1] = 1.0
    mt = m.mT                                                     # read only when shared: [C, C] transposed
    v = torch.empty(b, c, dtype=dtype, device=device)
    beta_t, r_t = beta.unbind(0), r.unbind(0)
    done = (torch.arange(n, device=device)[:, None] >= lengths - 1)[..., None].unbind(0) if any_short else ()
    for t in range(n - 2, -1, -1):
        torch.mul(p_t[t + 1], beta_t[t + 1], out=v)
        if shared:
            torch.mm(v, mt, out=beta_t[t])
        else:
            torch.bmm(m if per_example else m[t], v[:, :, None], out=beta_t[t][:, :, None])
        torch.sum(beta_t[t], -1, keepdim=True, out=r_t[t])
        beta_t[t].mul_(r_t[t].reciprocal())
        if any_short:
            beta_t[t].masked_fill_(done[t], 1.0)
    r = r[..., 0]
    if any_short:
        r = torch.where((torch.arange(n, device=device)[:, None] >= lengths - 1), torch.inf, r)
    else:
        r[n - 1] = torch.inf

    ab = alpha * beta                                             # [N, B, C]
    ab_min = ab.amin() if ab.numel() else ab.new_ones(())       # an empty batch (B = 0) has nothing to check
    # ``> 0``, not ``== 0`` below: another example's padding may hold NaN (0/0 at a dead end)
    zeros = None if bool(ab_min > 0) else ab == 0
    # the smallest positive alpha beta (<= alpha, beta: each sums to 1), for the edges' gate below; its zeros (a
    # label forbidden or unreachable, or mass lost to underflow) are the node checks' (NaN stays NaN)
    ab_pos = ab_min if zeros is None else torch.where(zeros, 1.0, ab).amin()
    d = ab.sum(-1)                                                # [N, B]
    node_marg = ab.mul_((1.0 / d)[..., None]).transpose(0, 1)     # [B, N, C]
    if valid is None:
        valid = torch.ones(b, n, dtype=torch.bool, device=device)
    valid_t = valid.t()
    shifts = [(torch.where(valid_t, node_max[..., 0], zero), 0)]
    if n > 1:
        edge_valid = torch.arange(n - 1, device=device) < (lengths[:, None] - 1)
        if shared:
            e_shift = edge_max.reshape(-1).expand(b, n - 1)
        else:
            e_shift = edge_max.reshape(b, 1).expand(b, n - 1) if per_example else edge_max.reshape(b, n - 1)
        shifts.append((torch.where(edge_valid, e_shift, zero), -1))
    big, small = _sum_shifts(*shifts)              # huge shifts that cancel leave their O(1) part
    log_z = big + (small + torch.where(valid_t, torch.log(s), zero).sum(0))
    bound = 4.0 * c * c * tiny * torch.where(valid_t, (1.0 / s + 1.0 / r) / d, zero).sum(0)
    ok = torch.isfinite(bound) & (bound <= torch.finfo(dtype).eps) & torch.isfinite(log_z)
    if zeros is not None:
        # a marginal that underflowed to 0 is one the bound cannot see: it bounds the absolute error, and a mass of
        # 1e-23 read as an exact 0 looks forbidden to the solver.  Recomputed: any product alpha * beta that
        # underflowed, and a 0 from an alpha or beta that underflowed where the marginal may be a normal number
        # (read at the zero products only: forbidden labels make few of them, and a pass over all of alpha and beta
        # in log space cost as much as the recursion)
        at = torch.nonzero(zeros).unbind(1)                                   # (t, b, j) of each zero product
        ok[at[1][(alpha[at] > 0) & (beta[at] > 0)]] = False
        # first with every transition factor taken as 1 (cheap); then, where that is not enough, without the labels
        # that no labelling of finite score passes through (forbidden labels, unreachable states: exact zeros), and
        # with the transitions for the rest
        maybe = torch.nonzero(ok & (_lost_at(alpha, beta, s, r, d, node, node_max, lengths, at) >= math.log(tiny)))
        if maybe.numel():
            k = maybe.flatten()
            sub_edge = edge if shared else (edge[k, 0] if per_example else edge[k])
            reach = _reachable(node[k], sub_edge, lengths[k])
            reach_all = torch.zeros_like(zeros)                               # [N, B, C]; False outside k
            reach_all[:, k] = reach
            live = reach_all[at]                                             # the zero products still in question
            still = _lost_at(alpha, beta, s, r, d, node, node_max, lengths,
                             tuple(x[live] for x in at))[k] >= math.log(tiny)
            k, reach = k[still], reach[:, still]
            if k.numel():
                sub_edge = sub_edge if shared else sub_edge[still]
                lost = _lost_marginal(alpha[:, k], beta[:, k], s[:, k], r[:, k], d[:, k], node[k], sub_edge,
                                      lengths[k], reach)
                ok[k] = lost < math.log(tiny)
    # the nodes' checks do not see an edge marginal that rests on a factor that underflowed (see _lost_edge).  None
    # did in the common case: alpha_t >= alpha_t beta_t, and p_{t+1} beta_{t+1} >= alpha_{t+1} beta_{t+1} s_{t+1}
    # (as alpha_{t+1} = (alpha_t M) p_{t+1} / s_{t+1} with alpha_t M <= 1).  Where alpha_{t+1} beta_{t+1} is 0, the
    # edge marginals into that label are at most its node marginal, which the node checks vouch for.  ``>=``: NaN
    # takes the long way
    if n > 1 and b and (m_lost is not None or not bool(ab_pos * s[1:].amin().clamp_max(1.0) >= tiny)):

        def transitions(k: Tensor) -> tuple[Tensor, Tensor]:
            if shared:
                return m, edge - edge_max
            if per_example:
                return m[k], edge[k, 0] - edge_max[k]
            return m[:, k], (edge[k] - edge_max[k]).transpose(0, 1)

        ok &= ~_lost_edge(alpha[:-1], p[1:], beta[1:], p[1:] * beta[1:], s[1:] * d[1:], m_lost, transitions,
                          edge_valid.t() & ok)
    if any_short:
        node_marg = torch.where(valid[..., None], node_marg, zero)

    slow = torch.nonzero(~ok).flatten()
    slow_state: _LogState | None = None
    if slow.numel():
        node_marg = node_marg.contiguous()
        # on shifted copies, so the lazy edge marginals see no later writes
        slow_state, lz = _log_forward_backward(pot.index(slow))
        raise_if_not_finite(lz, examples=slow)
        # normalised per position, so rounding of large scores cannot unbalance the sums
        node_marg[slow] = torch.where(valid[slow][..., None], _log_node_marginals(slow_state), zero)
        log_z[slow] = lz

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

    def slow_edges(state: _LogState) -> Tensor:
        """Exact log-space edge marginals of the uncertified examples (their ``slow_state``), zero past their
        lengths."""
        sub_ev = torch.arange(n - 1, device=device) < (state[0].lengths[:, None] - 1)
        return torch.where(sub_ev[..., None, None], _log_edge_marginals(state), zero)

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
            xi[slow] = slow_edges(slow_state)
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
            total = total + torch.einsum("b,bnij->ij", weights.to(dtype)[slow], slow_edges(slow_state))
        return total

    def edge_total() -> Tensor:
        """Each example's edge marginals summed over its positions [B, C, C]."""
        if n == 1:
            return node.new_zeros(b, c, c)
        a, v = weighted_pairs(torch.ones(b, dtype=dtype, device=device))
        total = m * torch.einsum("tbi,tbj->bij", a, v)
        if slow_state is not None:
            total[slow] = slow_edges(slow_state).sum(1)
        return total

    mu = Marginals(node_marg, edge_marginals, log_z, lengths, edge_total=edge_total if shared or per_example else None)
    if shared:
        mu.edge_sum = edge_sum
    return mu


def _reachable(node: Tensor, edge: Tensor, lengths: Tensor) -> Tensor:
    """[N, B, C]: whether some labelling of finite score passes through each label, by a forward and a backward
    pass over the supports of the node scores [B, N, C] (zeroed past each length) and of the edge scores ([C, C],
    [B, C, C] per example or [B, N-1, C, C]): the marginals' exact zeros are the other labels'.  Supports are 0 / 1
    in float32, tested ``> 0`` after each product (a sum of at most C ones); the backward pass starts at each
    example's last position."""
    n = node.shape[1]
    live = (node > -torch.inf).transpose(0, 1)                              # [N, B, C]
    if n == 1:
        return live
    a = (edge > -torch.inf).to(torch.float32)
    if a.dim() == 4:
        a = a.transpose(0, 1)                                               # [N-1, B, C, C]

    def step(x: Tensor, t: int, back: bool) -> Tensor:
        x = x.to(torch.float32)
        table = a[t] if a.dim() == 4 else a
        if table.dim() == 2:
            return (x @ table.t() if back else x @ table) > 0
        return (torch.bmm(table, x[:, :, None])[..., 0] if back else torch.bmm(x[:, None], table)[:, 0]) > 0

    fwd = torch.empty_like(live)
    fwd[0] = live[0]
    for t in range(1, n):
        fwd[t] = step(fwd[t - 1], t - 1, False) & live[t]
    bwd = torch.empty_like(live)
    bwd[n - 1] = live[n - 1]
    last = (lengths - 1)[:, None]
    for t in range(n - 2, -1, -1):
        bwd[t] = torch.where(t >= last, live[t], step(bwd[t + 1], t, True) & live[t])
    return fwd & bwd


def _lost_at(alpha: Tensor, beta: Tensor, s: Tensor, r: Tensor, d: Tensor, node: Tensor, node_max: Tensor,
             lengths: Tensor, at: tuple[Tensor, ...]) -> Tensor:
    """[B]: :func:`_lost_marginal`'s estimate made cruder and cheap, every transition factor and every predecessor
    (successor) taken as 1, the most they can be (no recursion), and read at the zero products ``alpha beta`` whose
    indices (t, b, j) ``at`` holds only; ``node_max`` [N, B, 1] is each row's finite maximum of ``node`` [B, N, C]
    (0 where there is none)."""
    t, k, j = at
    keep = t < lengths[k]
    t, k, j = t[keep], k[keep], j[keep]
    c = alpha.shape[-1]
    tiny = torch.finfo(alpha.dtype).tiny
    a, b = alpha[t, k, j], beta[t, k, j]
    log_a = torch.where(a > 0, torch.log(a.clamp_min(tiny)),
                        node[k, t, j] - node_max[t, k, 0] - torch.log(s[t, k] / c))
    log_b = torch.where(b > 0, torch.log(b.clamp_min(tiny)), -torch.log(r[t, k] / c))
    lost = alpha.new_full((alpha.shape[1],), -torch.inf)
    return lost.scatter_reduce_(0, k, log_a + log_b - torch.log(d[t, k]), "amax")


def _lost_marginal(alpha: Tensor, beta: Tensor, s: Tensor, r: Tensor, d: Tensor, node: Tensor, edge: Tensor,
                   lengths: Tensor, reach: Tensor) -> Tensor:
    """[B]: the log of an upper estimate of the largest node marginal that the fast path returns as 0, ``-inf`` if
    none: ``alpha beta / d`` with the ``alpha``, ``beta`` [N, B, C] entries that underflowed to 0 re-estimated in log
    space from their predecessors (successors), to a factor C per step (max instead of sum).  ``edge`` is [C, C],
    [B, C, C] or [B, N-1, C, C] (:func:`_lost_at` is the cruder estimate with every transition factor and every
    predecessor (successor) taken as 1, the most they can be).  ``reach`` [N, B, C]: the labels whose zeros may be
    lost (see :func:`_reachable`); the others' are exact."""
    n, c = alpha.shape[0], alpha.shape[-1]
    log_p = (node - _finite_max(node, -1)).transpose(0, 1)                   # [N, B, C]
    tiny = torch.finfo(alpha.dtype).tiny                  # no logs of 0 or subnormals: several times slower
    log_a, log_b = torch.log(alpha.clamp_min(tiny)), torch.log(beta.clamp_min(tiny))
    log_m = edge - _finite_max(edge, (-1, -2))
    log_a[0] = torch.where(alpha[0] > 0, log_a[0], log_p[0] - torch.log(s[0])[:, None])
    for t in range(1, n):
        best = (log_a[t - 1, :, :, None] + (log_m if log_m.dim() < 4 else log_m[:, t - 1])).amax(-2)
        log_a[t] = torch.where(alpha[t] > 0, log_a[t], best + log_p[t] - torch.log(s[t] / c)[:, None])
    for t in range(n - 2, -1, -1):
        nxt = (log_p[t + 1] + log_b[t + 1])[:, None, :]
        best = ((log_m if log_m.dim() < 4 else log_m[:, t]) + nxt).amax(-1)
        log_b[t] = torch.where(beta[t] > 0, log_b[t], best - torch.log(r[t] / c)[:, None])
    valid = (torch.arange(n, device=lengths.device)[:, None] < lengths)[..., None]
    lost = torch.where(valid & reach & (alpha * beta == 0), log_a + log_b - torch.log(d)[..., None], -torch.inf)
    return lost.amax(-1).amax(0)


def _underflowed(edge: Tensor, edge_max: Tensor, m: Tensor) -> tuple[Tensor, Tensor] | None:
    """Of each table [..., C, C], the largest ``edge - edge_max`` whose factor ``m = exp(edge - edge_max)``
    underflowed (to 0 or a subnormal) in each row and in each column ([..., C] each, ``-inf`` for none), or ``None``
    where no finite score's factor did (the common case, one reduction; an exact 0 from a ``-inf`` score is not an
    underflow)."""
    tiny = torch.finfo(m.dtype).tiny
    if not m.numel() or bool(m.amin() >= tiny):
        return None
    lost = torch.where(m < tiny, edge - edge_max, -torch.inf)
    rows = lost.amax(-1)
    return (rows, lost.amax(-2)) if bool(rows.amax() > -torch.inf) else None


def _lost_edge(alpha: Tensor, p: Tensor, beta: Tensor, v: Tensor, z: Tensor, m_lost: tuple[Tensor, Tensor] | None,
               transitions: Callable[[Tensor], tuple[Tensor, Tensor]], mask: Tensor) -> Tensor:
    """[B]: whether a fast-path edge marginal ``xi_t(i, j) = (alpha_t(i) / z_t) v_{t+1}(j) M_t(i, j)`` rests on a
    factor that underflowed while its value, estimated in log space, is a normal number: a subnormal ``alpha``, a
    product ``v = p beta`` below ``tiny`` of a positive ``p`` and ``beta``, or a factor ``M`` below ``tiny`` of a
    finite score.  With ``1 / z_t`` up to ``eps / (4 C^2 tiny)`` such a marginal can be ~1e-20 in float32 and be
    read as 0 (forbidden, to the solvers) or lose digits, while every node marginal is right.

    ``alpha`` [N-1, B, C] holds positions 0..N-2; ``p``, ``beta`` and ``v`` positions 1..N-1; ``z`` [N-1, B] is
    ``s_{t+1} d_{t+1}``; ``m_lost`` the logs of each table's largest underflowed factors by row and by column
    ([C], [B, C] or [N-1, B, C] each, ``None`` for none); ``transitions(k)`` gives ``M`` and ``log M`` of the
    examples ``k``, broadcastable to [N-1, len(k), C, C]; ``mask`` [N-1, B] the positions to check.  (The caller
    skips it where no factor can be below ``tiny``.)  Bounds pick the examples to check entry by entry: for a lost
    ``M(i, j)``, ``alpha_t(i)`` with the row's largest lost factor and the largest ``v_{t+1}``, or the largest
    ``alpha_t`` and ``v_{t+1}(j)`` with the column's (O(C) per position; estimating every entry of the [C, C]
    tables took ten times the recursion's time for the bird migration's 1,024 cells); for a lost ``alpha`` or
    ``v``, every other factor taken as 1 (the most it can be)."""
    tiny = torch.finfo(alpha.dtype).tiny
    lost = torch.zeros(alpha.shape[1], dtype=torch.bool, device=alpha.device)
    fa = fv = None
    bounds = []                                   # per position: the log of the largest marginal on a lost factor
    if m_lost is not None:
        rows, cols = m_lost
        log_a, log_v = torch.log(alpha), torch.log(v)
        bounds.append(torch.minimum((log_a + rows).amax(-1) + log_v.amax(-1),
                                    log_a.amax(-1) + (log_v + cols).amax(-1)))
    if not bool(alpha.amin() >= tiny):                            # ``>=``: NaN (in padding) takes the long way
        fa = (alpha > 0) & (alpha < tiny)
        if bool(fa.any()):
            bounds.append(torch.log(torch.where(fa, alpha, 0.0).amax(-1)))
    if not bool(v.amin() >= tiny):
        fv = (v < tiny) & (p > 0) & (beta > 0)
        if bool(fv.any()):
            bounds.append(torch.where(fv, torch.log(p) + torch.log(beta), -torch.inf).amax(-1))
    if not bounds:
        return lost
    bound = bounds[0]
    for other in bounds[1:]:
        bound = torch.maximum(bound, other)
    k = torch.nonzero((mask & (bound - torch.log(z) >= math.log(tiny))).any(0)).flatten()
    if k.numel():
        m, log_m = transitions(k)
        log_v = torch.log(p[:, k]) + torch.log(beta[:, k])       # v's exact log where it underflowed
        est = (torch.log(alpha[:, k]) - torch.log(z[:, k])[..., None])[..., :, None] + log_v[..., None, :] + log_m
        under = (m < tiny) & (log_m > -torch.inf)
        if fa is not None:
            under = under | fa[:, k, :, None]
        if fv is not None:
            under = under | fv[:, k, None, :]
        est = torch.where(under & mask[:, k, None, None], est, -torch.inf)
        lost[k] = est.amax((-1, -2)).amax(0) >= math.log(tiny)
    return lost


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


_LogState = tuple[PairwisePotentials, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]
"""The exact recursion's state (:func:`_log_forward_backward`): the shifted potentials, their node and edge rounding
errors, and the forward and backward log-messages in two parts each (``fb``, ``fs``, ``bb``, ``bs``)."""


def _log_forward_backward(pot: PairwisePotentials) -> tuple[_LogState, Tensor]:
    """Exact log-space forward-backward on :func:`~betheproj.oracles.base._max_shifted` copies of ``pot``: the
    forward and backward log-messages [B, N, C] in two parts (see :func:`~betheproj.oracles.base._split_add`),
    re-centred at every position, beside the shifted potentials and their rounding errors; and ``log Z`` [B]."""
    sub, shift, node_err, edge_err = _max_shifted(pot)
    node, edge, lengths = sub.node, sub.edge, sub.lengths
    b, n, c = node.shape
    zero = torch.zeros((), dtype=node.dtype, device=node.device)
    fb, fs = torch.empty_like(node), torch.empty_like(node)
    fb[:, 0], fs[:, 0], off_big, off_small = _recentre(node[:, 0], node_err[:, 0])
    for t in range(1, n):
        big, small = _split_add(fb[:, t - 1, :, None], fs[:, t - 1, :, None], edge[:, t - 1], edge_err[:, t - 1])
        big, small = _split_add(*_split_lse(big, small, -2), node[:, t], node_err[:, t])
        fb[:, t], fs[:, t], shift_big, shift_small = _recentre(big, small)
        live = t < lengths                                        # offsets past the length are not Z's
        off_big, off_small = _split_add(off_big, off_small, torch.where(live, shift_big, zero),
                                        torch.where(live, shift_small, zero))
    bb, bs = torch.zeros_like(node), torch.zeros_like(node)
    for t in range(n - 2, -1, -1):
        big, small = _split_add(bb[:, t + 1], bs[:, t + 1], node[:, t + 1], node_err[:, t + 1])
        big, small = _split_add(big[:, None, :], small[:, None, :], edge[:, t], edge_err[:, t])
        big, small, _, _ = _recentre(*_split_lse(big, small, -1))
        done = (t >= lengths - 1)[:, None]
        bb[:, t], bs[:, t] = torch.where(done, zero, big), torch.where(done, zero, small)
    last = (lengths - 1)[:, None, None].expand(b, 1, c)
    final = fb.gather(1, last).squeeze(1) + fs.gather(1, last).squeeze(1)     # both parts re-centred: at most 0
    big, small = _split_add(*shift, off_big, off_small)
    log_z = big + (small + torch.logsumexp(final, dim=-1))
    return (sub, node_err, edge_err, fb, fs, bb, bs), log_z


def _log_node_marginals(state: _LogState) -> Tensor:
    _, _, _, fb, fs, bb, bs = state
    return _split_softmax(*_split_add(fb, fs, bb, bs))


def _log_edge_marginals(state: _LogState) -> Tensor:
    sub, node_err, edge_err, fb, fs, bb, bs = state
    nxt = _split_add(sub.node[:, 1:], node_err[:, 1:], bb[:, 1:], bs[:, 1:])
    big, small = _split_add(fb[:, :-1, :, None], fs[:, :-1, :, None], sub.edge, edge_err)
    big, small = _split_add(big, small, nxt[0][:, :, None, :], nxt[1][:, :, None, :])
    b, m, c, _ = big.shape
    return _split_softmax(big.reshape(b, m, c * c), small.reshape(b, m, c * c)).reshape(b, m, c, c)


def _viterbi(pot: PairwisePotentials) -> Tensor:
    # max-product on max-shifted scores, the running score re-centred at its maximum after every position: a
    # running sum of raw scores (1e4 per position in float32) would absorb the O(1) differences between labels
    # (a running score is at most 0, so its maximum is finite or -inf: ``clamp_min(lowest)`` is _finite_max's
    # shift in one kernel, not three, every position.)  Per-position tables are shifted one position at a time
    # (the same values, without a copy of all [B, N-1, C, C]); stride-0 ones once per example, kept a view.
    # Shared and stride-0 tables are stored transposed, so the [B, C, C] sums are laid out (next, previous) and the
    # maximum runs over contiguous memory; per-position ones are read as they lie and reduced over dim 1.  No
    # back-pointers are kept, only the running scores: the backtrace redoes, for the one label chosen at t + 1, the
    # same sums and takes their first maximum (``amax`` without indices: 2-3x faster at C = 95 than ``max(dim=1)``).
    node, _ = _valid_node(pot)
    node = node - _finite_max(node, -1)
    edge = pot.edge
    shared = pot.shared_edge
    lengths = pot.lengths
    b, n, c = node.shape
    edge_max = None                               # per-position tables' maxima, taken off position by position
    if shared:
        edge = (edge - _finite_max(edge, (-1, -2))).t().contiguous()                   # [next, previous]
    elif n > 1 and edge.stride(1) == 0:
        table = edge[:, :1] - _finite_max(edge[:, :1], (-1, -2))
        edge = table.transpose(-1, -2).contiguous().expand(edge.shape)                 # [B, N-1, next, previous]
    else:
        edge_max = _finite_max(edge, (-1, -2))
    lowest = torch.finfo(node.dtype).min
    scores = node.new_empty(b, n, c)              # the running score after each position
    scores[:, 0] = node[:, 0]
    work = node.new_empty(b, c, c)                # the [B, C, C] sums of every position, in one buffer
    for t in range(1, n):
        if edge_max is None:
            torch.add(scores[:, t - 1, None, :], edge if shared else edge[:, t - 1], out=work)
            score = torch.amax(work, -1)
        else:
            torch.sub(edge[:, t - 1], edge_max[:, t - 1], out=work).add_(scores[:, t - 1, :, None])
            score = torch.amax(work, 1)
        score += node[:, t]
        torch.sub(score, score.amax(-1, keepdim=True).clamp_min(lowest), out=scores[:, t])
    rows = torch.arange(b, device=node.device)
    final = scores[rows, lengths - 1]                  # each example's running score at its last position
    raise_if_not_finite(final.amax(-1))
    labels = torch.full((b, n), -1, dtype=torch.long, device=node.device)
    last = final.argmax(-1)
    cur = last
    for t in range(n - 1, -1, -1):
        if t < n - 1:
            nxt = labels[:, t + 1].clamp_min(0)
            # the same sums as the forward pass made for label nxt at t + 1
            if shared:
                back = scores[:, t] + edge[nxt]
            elif edge_max is None:
                back = scores[:, t] + edge[rows, t, nxt]
            else:
                back = (edge[rows, t, :, nxt] - edge_max[:, t, 0]) + scores[:, t]
            cur = torch.where(lengths - 1 == t, last, back.argmax(-1))
        labels[:, t] = torch.where(t <= lengths - 1, cur, -1)
    return labels
