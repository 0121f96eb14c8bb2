"""The two approximate second-order decoders: Turbo Parser #1 (Martins et al., EMNLP 2010, section 4; Smith &
Eisner 2008), sum-product loopy BP on binary arc variables with one TREE factor and one pairwise factor per
sibling / grandparent part (vectorised over the batch and every part with dense ``[B, C, C, C]`` message tensors),
and the mean-field energy of Vilnis et al. (UAI 2015, eq. 9) solved by Bethe-RDA with the matrix-tree oracle,
decoded by Proposition 1."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from .._checks import check_count, check_damping_space, check_nonnegative, check_real
from ..energies.second_order import SecondOrderArcs, second_order_masks
from ..inference.decode import decode
from ..inference.solve import Solution, solve
from ..oracles.base import PairwisePotentials, _check_lengths
from ..oracles.dependency import _arc_mask, check_arc_potentials
from ..oracles.nonprojective import NonProjective, _arc_logits, log_arc_marginals
from .parser import GreedyFirst

__all__ = ["BPResult", "loopy_bp", "loopy_bp_parse", "mean_field_parse"]


@dataclass
class BPResult:
    """Output of :func:`loopy_bp`: arc beliefs [B, C, C] head-major (``b(y_hm = 1)``, 0 at absent arcs), their
    log-odds (``-inf`` at absent arcs), the iterations run and the last max message change."""

    beliefs: Tensor
    log_odds: Tensor
    iterations: int
    change: float
    converged: bool


def _pair_message(a: Tensor, w: Tensor) -> Tensor:
    """Log-odds message of a binary pairwise factor ``exp(w x y)`` to ``y`` given ``x``'s cavity log-odds ``a``:
    ``log (1 + e^{a + w}) - log (1 + e^a)`` (exact; ``0`` when ``a = -inf``, ``w`` when ``a = inf``)."""
    zero = torch.zeros((), dtype=a.dtype, device=a.device)           # logaddexp takes no CPU scalar with CUDA
    return torch.where(a == math.inf, w, torch.logaddexp(zero, a + w) - torch.logaddexp(zero, a))


def _damp(new: Tensor, old: Tensor, d: float, space: str = "probability") -> Tensor:
    """Damping in probability space on normalised binary messages, ``M <- (1 - d) M_new + d M_old`` (as
    :func:`betheproj.factor_graphs.belief_propagation`), in log-odds.  An infinite message (an exact zero, a
    hard constraint's verdict) is kept: mixed in, it would only shrink by ``d`` per iteration, never converge.
    ``space="log"``: the log-messages mixed instead, which for log-odds is ``(1 - d) new + d old``; where either is
    infinite the new message is taken (an old infinity would otherwise hold it for ever), as the factor graphs'
    log-space damping does (:func:`betheproj.factor_graphs._util.damp_log_message`)."""
    if d == 0.0:
        return new
    if space == "log":
        return torch.where(torch.isinf(new) | torch.isinf(old), new, torch.lerp(new, old, d))
    ld, lk = math.log(d), math.log1p(-d)
    ls_new, ls_old = torch.nn.functional.logsigmoid(new), torch.nn.functional.logsigmoid(old)
    on = torch.logaddexp(lk + ls_new, ld + ls_old)
    # log sigmoid(-x) = log sigmoid(x) - x (0 at x = -inf); where it cancels, x < -36, the true value is below 1e-16
    off = torch.logaddexp(lk + (ls_new - new), ld + torch.where(old == -math.inf, 0.0, ls_old - old))
    return torch.where(torch.isinf(new), new, on - off)


def _change(new: Tensor, old: Tensor) -> float:
    """Largest log-odds change, ``0`` where both are the same infinity."""
    if not new.numel():
        return 0.0
    return float(torch.where(new == old, torch.zeros((), dtype=new.dtype), (new - old).abs()).max())


@torch.no_grad()
def loopy_bp(theta: Tensor, sibling: Tensor | None, grandparent: Tensor | None, lengths: Tensor,
             max_iter: int = 20, damping: float = 0.0, tol: float = 1e-6, single_root: bool = False, *,
             damping_space: str = "probability") -> BPResult:
    """Turbo Parser #1 (Martins et al. 2010, section 4): sum-product loopy BP, parallel schedule, over binary arc
    variables ``y_hm`` with unary log-potentials ``theta[b, h, m]`` (head-major [B, C, C]; ``-inf``: pruned arc,
    no variable), one TREE factor and one pairwise factor ``exp(W y_hm y_hs)`` per sibling pair ``m < s``
    (``W = S[h, m, s] + S[h, s, m]``) and ``exp(G[g, h, m] y_gh y_hm)`` per grandparent part (``S``, ``G``: finite
    floating-point scores, or ``None`` for no such factors).

    Messages are log-odds (eqs. 4-5 for binary variables): the TREE factor sends ``logit(MARG_a) - l_a``
    (Table 1; ``MARG`` by the matrix-tree theorem on the incoming log-odds ``l``, to a relative accuracy, so an
    arc that closes a cycle with near-certain arcs gets its logit, -80 say, not the rounding floor's -708:
    :func:`betheproj.oracles.nonprojective.log_arc_marginals`), a pairwise factor sends
    :func:`_pair_message`.  The scores come as dense [B, C, C, C] tensors; the factors that exist (both arcs
    present, non-zero log-potential) are gathered once into flat index vectors, and every iteration updates all
    messages of the batch at once: a few gathers / ``index_add`` over the factors (``O(#parts)``, not
    ``O(B C^3)``: pruning leaves few parts) and one batched matrix-tree call, no Python loop over parts.
    The TREE factor's messages to arcs in no tree (every tree) are exact ``-inf`` (``inf``: those log marginals
    are exact zeros), which ``damping``, a mix of old and new messages in probability space, keeps.  With
    ``damping_space="log"`` the log-messages are mixed instead (the log-odds: ``(1 - d) new + d old``): a message
    that must fall by ``D`` nats then settles in ``O(log D)`` iterations, not ``D / log(1/d)`` (see
    :mod:`betheproj.factor_graphs.bp`).  BP stops when the largest log-odds change is below ``tol`` or after
    ``max_iter`` iterations.
    """
    if not isinstance(theta, Tensor) or theta.dim() != 3 or theta.shape[1] != theta.shape[2]:
        raise ValueError("theta must be head-major arc scores [B, C, C]")
    if not theta.is_floating_point() or bool((torch.isnan(theta) | (theta == math.inf)).any()):
        raise ValueError("theta must be floating-point arc scores without NaN or +inf (-inf marks a pruned arc)")
    damping = check_real("damping", damping, 0.0, 1.0, high_open=True)
    damping_space = check_damping_space(damping_space)
    max_iter = check_count("max_iter", max_iter)
    tol = check_nonnegative("tol", tol)
    b, c, _ = theta.shape
    lengths = _check_lengths(lengths, b, c - 1, theta.device)
    for name, t in (("sibling", sibling), ("grandparent", grandparent)):
        if t is not None and (not isinstance(t, Tensor) or t.shape != (b, c, c, c)):
            raise ValueError(f"{name} must be [B, C, C, C]=({b}, {c}, {c}, {c}), got "
                             f"{tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__}")
        # as SecondOrderArcs: a bool tensor would sum S + S^T as a logical or, and a -inf or NaN log-potential
        # turns messages into NaN
        if t is not None and not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor [B, C, C, C], got {t.dtype}")
        if t is not None and not bool(torch.isfinite(t).all()):
            raise ValueError(f"{name} scores must be finite (prune an arc with -inf in theta instead)")
    dtype, device = theta.dtype, theta.device
    ninf = torch.full((), -math.inf, dtype=dtype, device=device)
    zero = torch.zeros((), dtype=dtype, device=device)
    arcs = _arc_mask(lengths, c) & (theta > -math.inf)
    th = torch.where(arcs, theta, ninf)
    part_mask, _ = second_order_masks(lengths, c)
    # the pairwise factors as flat arc-index pairs (x, y) with log-potential w: exp(w y_x y_y)
    xs, ys, ws = [], [], []
    flat = torch.arange(b * c * c, device=device).reshape(b, c, c)
    if sibling is not None:
        upper = torch.ones(c, c, dtype=torch.bool, device=device).triu(1)
        w = sibling + sibling.transpose(2, 3)
        bi, h, m, s_ = torch.nonzero(part_mask & arcs[:, :, :, None] & arcs[:, :, None, :] & upper & (w != 0)).T
        xs.append(flat[bi, h, m])
        ys.append(flat[bi, h, s_])
        ws.append(w[bi, h, m, s_])
    if grandparent is not None:
        bi, g, h, m = torch.nonzero(part_mask & arcs[:, :, :, None] & arcs[:, None, :, :] & (grandparent != 0)).T
        xs.append(flat[bi, g, h])
        ys.append(flat[bi, h, m])
        ws.append(grandparent[bi, g, h, m])
    x = torch.cat(xs) if xs else torch.zeros(0, dtype=torch.long, device=device)
    y = torch.cat(ys) if ys else torch.zeros(0, dtype=torch.long, device=device)
    w = torch.cat(ws).to(dtype) if ws else torch.zeros(0, dtype=dtype, device=device)
    tree = torch.zeros_like(th)
    to_x = torch.zeros_like(w)                    # message of each factor to its arc x (log-odds)
    to_y = torch.zeros_like(w)

    def pairwise_in() -> Tensor:
        out = th.new_zeros(b * c * c).index_add_(0, x, to_x).index_add_(0, y, to_y)
        return out.reshape(b, c, c)

    change, it = math.inf, 0
    for it in range(1, max_iter + 1):                                         # noqa: B007
        cavity = th + pairwise_in()                                           # messages into TREE
        total = (cavity + tree).flatten()
        _, log_marg = log_arc_marginals(cavity, lengths, single_root)
        new_tree = torch.where(arcs, _arc_logits(log_marg) - cavity, zero)
        new_tree = _damp(new_tree, tree, damping, damping_space)
        # factor -> x from the cavity of y (its total without this factor's message to y), and vice versa
        new_x = _damp(_pair_message(total[y] - to_y, w), to_x, damping, damping_space)
        new_y = _damp(_pair_message(total[x] - to_x, w), to_y, damping, damping_space)
        change = max(_change(new, old) for old, new in ((tree, new_tree), (to_x, new_x), (to_y, new_y)))
        tree, to_x, to_y = new_tree, new_x, new_y
        if change < tol:
            break
    log_odds = torch.where(arcs, th + tree + pairwise_in(), ninf)
    beliefs = torch.where(arcs, torch.sigmoid(log_odds), zero)
    return BPResult(beliefs, log_odds, it, change, change < tol)


def _node_layout(head_major: Tensor) -> Tensor:
    return head_major[:, :, 1:].transpose(1, 2).contiguous()


def _head_major(node: Tensor) -> Tensor:
    b, n, c = node.shape
    return torch.cat([torch.full((b, c, 1), -math.inf, dtype=node.dtype, device=node.device), node.transpose(1, 2)],
                     2)


def loopy_bp_parse(potentials: PairwisePotentials, sibling: Tensor | None, grandparent: Tensor | None,
                   max_iter: int = 20, damping: float = 0.0, tol: float = 1e-6, decode_on: str = "beliefs",
                   single_root: bool = False, *, damping_space: str = "probability") -> tuple[Tensor, BPResult]:
    """Heads [B, N] (``-1`` past each length) of Turbo Parser #1: :func:`loopy_bp` then Chu-Liu-Edmonds on the
    beliefs (``decode_on="beliefs"``: the tree of highest expected number of correct arcs under the beliefs) or on
    their log-odds (``"log_odds"``; an arc in every tree, log-odds ``+inf``, counts 0 there)."""
    if decode_on not in ("beliefs", "log_odds"):
        raise ValueError(f"decode_on must be 'beliefs' or 'log_odds', got {decode_on!r}")
    check_arc_potentials(potentials)              # as the oracles and mean_field_parse (an edge table was ignored)
    res = loopy_bp(_head_major(potentials.node), sibling, grandparent, potentials.lengths, max_iter, damping,
                   tol, single_root, damping_space=damping_space)
    score = res.beliefs if decode_on == "beliefs" else res.log_odds
    # an arc in every tree (damped BP's exact log-odds +inf) is in whichever tree wins: any finite score decodes it
    score = torch.where(score == math.inf, torch.zeros((), dtype=score.dtype, device=score.device), score)
    finite = res.log_odds > -math.inf
    node = _node_layout(torch.where(finite, score, torch.full((), -math.inf, dtype=score.dtype)))
    edge = node.new_zeros(node.shape[2], node.shape[2])
    heads = GreedyFirst(NonProjective(single_root)).map(PairwisePotentials(node, edge, potentials.lengths))
    return heads, res


def mean_field_parse(potentials: PairwisePotentials, sibling: Tensor | None, grandparent: Tensor | None,
                     max_iter: int = 30, tol: float | None = None, method: str = "rda",
                     decode_on: str = "map", single_root: bool = False,
                     parts: tuple[Tensor | None, Tensor | None] | None = None) -> tuple[Tensor, Solution]:
    """Heads [B, N] from problem (2) with :class:`SecondOrderArcs` (eq. 9 mean field) solved by Bethe-RDA
    (Algorithm 1, ``method="rda"``) with the matrix-tree oracle, decoded by Proposition 1 (``decode_on="map"``:
    Chu-Liu-Edmonds on ``theta - grad L(mu*)``) or Chu-Liu-Edmonds on ``mu*`` itself (``"marginals"``).
    ``parts``: the part lists of :class:`SecondOrderArcs` (the fast sparse path)."""
    if decode_on not in ("map", "marginals"):
        raise ValueError(f"decode_on must be 'map' or 'marginals', got {decode_on!r}")
    oracle = NonProjective(single_root)
    sol = solve(oracle, potentials, SecondOrderArcs(sibling, grandparent, parts), method=method, max_iter=max_iter,
                tol=tol)
    greedy = GreedyFirst(oracle)
    if decode_on == "map":
        return decode(greedy, sol), sol
    mu = sol.marginals.node
    node = torch.where(potentials.node > -math.inf, mu, torch.full((), -math.inf, dtype=mu.dtype))
    return greedy.map(PairwisePotentials(node, node.new_zeros(node.shape[2], node.shape[2]),
                                         potentials.lengths)), sol
