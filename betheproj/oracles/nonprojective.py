"""Non-projective dependency trees: the matrix-tree theorem (marginals) and Chu-Liu-Edmonds (MAP).

Matrix-tree theorem (Kirchhoff; for parsing Koo et al. 2007, Smith & Smith 2007, McDonald & Satta 2007): with
arc weights ``A[h, m] = exp(theta(h -> m))`` and the Laplacian over the words ``1..n``

    L[m, m] = sum_{h != m} A[h, m] (h = 0..n),    L[h, m] = -A[h, m] (h != m, both words),

``Z = sum_trees prod_arcs A = det L`` and ``P(h -> m) = A[h, m] d log det L / d A[h, m]``.  With a single root
child (Koo et al. 2007, sec. 3.3) the root weights leave the diagonal and replace the first row,
``L^[0, m] = A[0, m]``, and ``Z = det L^``.

Two regimes, chosen per example (as ``chain.py`` does):

* fast: scores shifted by their per-modifier (column) maximum, which scales ``det L`` by a known factor, then
  one LU factorisation; marginals in closed form from ``L^{-1}``.  Accepted when ``n kappa_1(L) eps <=
  sqrt(eps)`` (rounding errors below ``sqrt(eps)``; marginals are clamped at 0).  Float32 scores are computed
  in float64 and returned in float32: float32's check failed from ``n = 20`` on typical scores.
* exact: log-space Gaussian elimination that never subtracts (Grassmann-Taksar-Heyman: the Laplacian is a
  column diagonally dominant M-matrix, so the pivots, the off-diagonals and the column excesses of every Schur
  complement are sums of positive terms), marginals by autograd.  With one root child,
  ``Z = sum_r A[0, r] T_r`` where ``T_r`` is the weight of the spanning arborescences of the words rooted at
  ``r`` (the minor of the word Laplacian without ``r``): the linear term of ``det`` in the root weights, which
  one elimination carries (:func:`_gth_single_root_log_z`), ``O(n^3)`` as well.

The closed-form marginals are accurate absolutely, not relatively: an arc that closes a cycle with near-certain
arcs (true marginal ``e^-80``) comes out as ``0`` or rounding noise.  :func:`log_arc_marginals` gives every
arc's log marginal to a relative accuracy (certifying the closed form by a rounding bound, eliminating again
where it cannot), for the logits loopy BP's TREE factor sends and for the arcs in no tree or in every tree.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

from .._checks import check_real
from .base import PairwisePotentials, _unchecked
from .dependency import (
    _added_back,
    _DependencyOracle,
    _differentiable,
    _lse,
    _mask_head_major,
    _no_tree,
    _prepare,
    _raise_no_tree,
    _raise_overflow,
    _shifted_columns,
)

__all__ = ["matrix_tree", "log_arc_marginals", "chu_liu_edmonds", "NonProjective"]


def matrix_tree(scores: Tensor, lengths: Tensor, single_root: bool = False) -> tuple[Tensor, Tensor]:
    """Log-partition [B] and arc marginals [B, N+1, N+1] (head-major, ``[b, h, m] = P(head(m) = h)``) of the
    arc-factored distribution over non-projective trees, by the matrix-tree theorem (see the module docstring).

    ``scores[b, h, m]`` [B, N+1, N+1] are arc log-potentials; column 0, the diagonal and positions past
    ``lengths[b]`` are ignored (zero marginals), other ``-inf`` entries are forbidden arcs.  Raises
    ``ValueError`` when an example has no valid tree.  ``log Z`` is differentiable (to first order) with
    respect to ``scores``; its gradient is the marginals.
    """
    if not isinstance(single_root, bool):
        raise TypeError(f"single_root must be a bool, got {type(single_root).__name__}")
    masked, lengths = _prepare(scores, lengths)
    with torch.no_grad():
        # shifted as the oracle does (_shifted_columns): the exact path works on the scores themselves, where a
        # huge column or root row (1e15) would round away the O(1) differences that decide the marginals
        shifted, shift = _shifted_columns(masked, single_root)
        log_z, marg = _matrix_tree(shifted, lengths, single_root)
        log_z = _added_back(shift, log_z)
    return _differentiable(scores, log_z, marg), marg


def log_arc_marginals(scores: Tensor, lengths: Tensor, single_root: bool = False,
                      rtol: float | None = None) -> tuple[Tensor, Tensor]:
    """Log-partition [B] and the logarithms of the arc marginals [B, N+1, N+1] (head-major, ``-inf`` at ignored
    arcs and at arcs in no tree), each to a relative accuracy ``rtol`` (default ``max(1e-6, sqrt(eps))``) however
    small the marginal.  Not differentiable.

    :func:`matrix_tree`'s closed form ``A[h, m] (L^{-1}[m, m] - L^{-1}[m, h])`` is accurate only absolutely: an
    arc that closes a cycle with likely arcs (``m -> h`` where ``h -> m`` is near certain) has two nearly equal
    terms, and its marginal, ``e^-300`` say, comes out as rounding noise or ``0``.  Each closed-form marginal
    is kept where a first-order rounding bound (:func:`_marginal_error_bound`) certifies it to ``rtol``; the
    others (and all of an example with ``n kappa eps > 0.01``, or with weights or marginals near the subnormal
    range) are recomputed by elimination without subtraction: with several roots one elimination per column
    for all its arcs (:func:`_column_log_marginals`, ``O(n^3)``), with one root child one forced ``log Z`` per
    arc (``O(n^3)``).  Float32 scores are computed in float64 (at float32's default ``rtol``) and returned in
    float32: float32's rounding bound certified few marginals, and its eliminations took 10 times as long at
    ``n = 40``."""
    if not isinstance(single_root, bool):
        raise TypeError(f"single_root must be a bool, got {type(single_root).__name__}")
    masked, lengths = _prepare(scores, lengths)
    if rtol is None:
        rtol = max(1e-6, torch.finfo(masked.dtype).eps ** 0.5)
    rtol = check_real("rtol", rtol, 0.0, low_open=True)
    if masked.dtype != torch.float64:
        log_z, log_marg = log_arc_marginals(masked.double(), lengths, single_root, rtol)
        log_z = log_z.to(masked.dtype)
        _raise_overflow(log_z)
        return log_z, log_marg.to(masked.dtype)
    with torch.no_grad():
        shifted, shift = _shifted_columns(masked, single_root)
        log_z, marg, ok, (root, words, keep, inv, kappa, lu, piv) = _fast_parts(shifted, lengths, single_root)
        slow = torch.nonzero(~ok).flatten()
        if slow.numel():
            log_z[slow] = _exact_log_z(shifted[slow], lengths[slow], single_root)
        _raise_no_tree(log_z, single_root=single_root)
        real = torch.isfinite(shifted)
        eps, tiny = torch.finfo(shifted.dtype).eps, torch.finfo(shifted.dtype).tiny
        bound = _marginal_error_bound(root, words, keep, inv, lu, piv, lengths, single_root)
        # a first-order bound, so only where n kappa eps is small; and not near the subnormal range, where the
        # weights' and the marginals' digits are lost to underflow
        certified = ((bound <= rtol * marg) & (marg >= tiny / eps) & (shifted >= math.log(tiny / eps))
                     & (lengths * kappa * eps <= 1e-2)[:, None, None])
        log_marg = torch.where(real & certified, torch.log(marg),
                               torch.full((), -math.inf, dtype=marg.dtype, device=marg.device))
        refine = torch.nonzero(real & ~certified)
        if refine.numel() and single_root:
            log_marg[tuple(refine.T)] = _forced_log_marginals(shifted, lengths, log_z, refine)
        elif refine.numel():
            log_marg[tuple(refine.T)] = _column_log_marginals(shifted, lengths, refine)
        log_z = _added_back(shift, log_z)
    return log_z, log_marg


def _arc_logits(log_marg: Tensor) -> Tensor:
    """``log p - log(1 - p)`` of head-major log arc marginals, with ``1 - p(h -> m) = sum_{h' != h} p(h' -> m)``
    summed in log space without cancellation (exclusive prefix and suffix log-sum-exps): ``inf`` for an arc in
    every tree, ``-inf`` for one in none."""
    ninf = log_marg.new_full((log_marg.shape[0], 1, log_marg.shape[2]), -math.inf)
    pre = torch.cat([ninf, log_marg.logcumsumexp(1)[:, :-1]], 1)
    suf = torch.cat([log_marg.flip(1).logcumsumexp(1)[:, :-1].flip(1), ninf], 1)
    return log_marg - torch.logaddexp(pre, suf)


def _marginal_error_bound(root: Tensor, words: Tensor, keep: Tensor, inv: Tensor, lu: Tensor, piv: Tensor,
                          lengths: Tensor, single_root: bool) -> Tensor:
    """A first-order bound [B, N+1, N+1] on the rounding error of the fast path's marginals: ``L^{-1}`` solved
    from ``P L_f U_f = L`` has ``|X^ - X| <= gamma_3n |X| P |L_f| |U_f| |X|`` (``gamma_k = k u / (1 - k u)``,
    ``u = eps / 2``; componentwise backward stability of the triangular solves, Higham, *Accuracy and
    Stability*, Theorem 9.4 and sec. 14.3), and each marginal is an arc weight times one or a difference of two
    entries of ``X``."""
    p, lower, upper = torch.lu_unpack(lu, piv)
    factors = p @ (lower.abs() @ upper.abs())
    x = inv.abs()
    k_u = 1.5 * torch.finfo(inv.dtype).eps * lengths.to(inv.dtype)       # 3 n u
    err = (k_u / (1.0 - k_u).clamp_min(0.5))[:, None, None] * (x @ factors @ x)
    err = err + torch.finfo(inv.dtype).eps * x                           # and the subtraction's own rounding
    d = torch.diagonal(err, dim1=-2, dim2=-1)
    bound = torch.zeros(root.shape[0], root.shape[1] + 1, root.shape[1] + 1, dtype=inv.dtype, device=inv.device)
    bound[:, 0, 1:] = root * (err[:, :, 0] if single_root else d)
    bound[:, 1:, 1:] = words * (d[:, None, :] * keep[None, :] + err.transpose(1, 2) * keep[:, None])
    return bound


def _column_log_marginals(s: Tensor, lengths: Tensor, arcs: Tensor) -> Tensor:
    """``log P(h -> m)`` for the rows ``(b, h, m)`` of ``arcs`` [K, 3] (several roots), one elimination per column
    ``(b, m)``.  With ``m``'s column eliminated last, the other pivots do not depend on it and ``det L`` is linear
    in that column: ``Z = det(minor) c(A[:, m])`` and ``Z(h -> m forced) = A[h, m] det(minor) c(e_h)``, where
    ``c(v)`` is the excess left in a column ``v`` carried through the elimination of the other words (``e_0``: a
    unit root weight).  So ``log P(h -> m) = theta[h, m] + log c(e_h) - log c(A[:, m])``, every column carried
    in log space as :func:`_gth_log_det` does: no subtraction, ``O(n^3)`` per column whatever its number of
    arcs."""
    c = s.shape[1]
    column, which = torch.unique(arcs[:, 0] * c + arcs[:, 2], return_inverse=True)
    count = torch.bincount(which)
    order = torch.argsort(which, stable=True)
    slot = torch.empty_like(which)
    slot[order] = torch.arange(len(which), device=s.device) - (count.cumsum(0) - count)[which[order]]
    heads = torch.full((len(column), int(count.max())), -1, dtype=torch.long, device=s.device)
    heads[which, slot] = arcs[:, 1]
    b_col, m_col = column // c, column % c
    ninf = torch.full((), -math.inf, dtype=s.dtype, device=s.device)
    zero = torch.zeros((), dtype=s.dtype, device=s.device)
    out_col = torch.empty(heads.shape, dtype=s.dtype, device=s.device)
    per = max(1, (1 << 22) // max(1, (c - 1) * (c + heads.shape[1])))
    for chunk in torch.argsort(lengths[b_col]).split(per):        # similar lengths together, each cut to its own
        b, m, hs = b_col[chunk], m_col[chunk], heads[chunk, : int(count[chunk].max())]
        n = int(lengths[b].max())
        k = torch.arange(len(chunk), device=s.device)[:, None]
        words = torch.arange(1, n + 1, device=s.device).expand(len(chunk), n)
        perm = words.gather(1, torch.sort((words == m[:, None]).long(), dim=1, stable=True).indices)   # m last
        sb = s[b]
        pivots = perm[:, :-1]
        full = torch.cat([sb[k[:, :, None], perm[:, :, None], pivots[:, None, :]],       # words -> pivots
                          sb[k, perm, m[:, None]][:, :, None],                          # the column itself
                          torch.where(perm[:, :, None] == hs[:, None, :], zero, ninf)], 2)   # unit columns e_h
        pad = pivots > lengths[b][:, None]                        # padded words: isolated, unit excess
        excess = torch.cat([torch.where(pad, zero, sb[k, 0, pivots]), sb[k[:, 0], 0, m][:, None],
                            torch.where(hs == 0, zero, ninf)], 1)
        carried, underflow = _eliminate_scaled(full, excess)
        if underflow.any():
            carried[underflow] = _eliminate_log(full[underflow], excess[underflow])
        out_col[chunk, : hs.shape[1]] = carried[:, 1:] - carried[:, :1]
    return s[arcs[:, 0], arcs[:, 1], arcs[:, 2]] + out_col[which, slot]


def _eliminate_log(full: Tensor, excess: Tensor) -> Tensor:
    """Log excesses [K, J] of the carried columns once the ``n - 1`` pivots of ``full`` [K, n, n - 1 + J] (log
    arc weights: rows the pivots then the kept word, columns the pivots then the carried columns) and
    ``excess`` [K, n - 1 + J] (log root weights) are eliminated (:func:`_gth_steps`)."""
    return _gth_steps(full, excess, full.shape[1] - 1)[1]


def _eliminate_scaled(full: Tensor, excess: Tensor) -> tuple[Tensor, Tensor]:
    """:func:`_eliminate_log` in linear space (the weights are at most 1: column-shifted scores), several times
    faster, with the examples [K] where a weight or a product fell below ``tiny / eps`` (its digits lost to
    underflow: those go to the log space).  Every operation adds, multiplies or divides non-negative numbers, so
    the result keeps its relative accuracy."""
    floor = torch.finfo(full.dtype).tiny / torch.finfo(full.dtype).eps
    a, r = torch.exp(full), torch.exp(excess)
    low = math.log(floor)
    underflow = ((full < low) & (full > -math.inf)).flatten(1).any(1) | ((excess < low) & (excess > -math.inf)).any(1)
    big = torch.full((), math.inf, dtype=a.dtype, device=a.device)

    def smallest(x: Tensor) -> Tensor:                            # smallest non-zero entry of each row of x [K, J]
        return torch.where(x > 0, x, big).amin(1)

    for _ in range(a.shape[1] - 1):
        # the diagonal entries an update writes are never read (a pivot's own column and row leave them out)
        col = a[:, 1:, 0]
        d = (r[:, 0] + col.sum(1)).clamp_min_(floor)             # > 0: column totals are kept, a tree exists
        row = a[:, 0, 1:]
        ratio = torch.cat([col, r[:, :1]], 1) / d[:, None]
        underflow |= smallest(ratio) * smallest(row) < floor      # a product that could underflow
        a = torch.addcmul(a[:, 1:, 1:], ratio[:, :-1, None], row[:, None, :])
        r = torch.addcmul(r[:, 1:], ratio[:, -1:], row)
    return torch.log(r), underflow


def _forced_log_marginals(s: Tensor, lengths: Tensor, log_z: Tensor, arcs: Tensor) -> Tensor:
    """``s[b, h, m] + log Z(b; h -> m forced) - log_z[b]`` for the rows ``(b, h, m)`` of ``arcs`` [K, 3] with one
    root child (``O(n^3)`` each), in chunks that keep the elimination's tensors to a few million entries."""
    n = s.shape[1] - 1
    per = max(1, (1 << 22) // max(1, n ** 2))
    order = torch.argsort(lengths[arcs[:, 0]])                 # similar lengths together, each chunk cut to its own
    out = torch.empty(len(arcs), dtype=s.dtype, device=s.device)
    for chunk in order.split(per):
        b, h, m = arcs[chunk].T
        c = int(lengths[b].max()) + 1
        forced = s[b, :c, :c].clone()
        k = torch.arange(len(chunk), device=s.device)
        forced[k, :, m] = -math.inf
        forced[k, h, m] = 0.0
        out[chunk] = s[b, h, m] + _exact_log_z(forced, lengths[b], True) - log_z[b]
    return out


def _matrix_tree(s: Tensor, lengths: Tensor, single_root: bool, strict: bool = True) -> tuple[Tensor, Tensor]:
    """``strict``: raise for an example with no tree (else its ``log Z`` is ``-inf``)."""
    if s.dtype != torch.float64:
        # in float64: float32's rounding check (n kappa eps <= sqrt(eps)) fails from kappa ~ 70 at n = 40, sending
        # the example to the elimination, where float64's bounds the error below float32's own rounding
        log_z, marg = _matrix_tree(s.double(), lengths, single_root, strict)
        log_z = log_z.to(s.dtype)
        _raise_overflow(log_z)
        return log_z, marg.to(s.dtype)
    log_z, marg, ok = _fast_matrix_tree(s, lengths, single_root)
    slow = torch.nonzero(~ok).flatten()
    if slow.numel():
        lz, mg = _exact_matrix_tree(s[slow], lengths[slow], single_root)
        if strict:
            _raise_no_tree(log_z.index_put((slow,), lz), single_root=single_root)
        log_z[slow], marg[slow] = lz, mg
    _raise_overflow(log_z)
    return log_z, marg


def _fast_matrix_tree(s: Tensor, lengths: Tensor, single_root: bool) -> tuple[Tensor, Tensor, Tensor]:
    log_z, marg, ok, _ = _fast_parts(s, lengths, single_root)
    return log_z, marg.clamp_min_(0.0), ok


def _fast_parts(s: Tensor, lengths: Tensor, single_root: bool
                ) -> tuple[Tensor, Tensor, Tensor, tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]]:
    """The fast path's ``log Z`` [B], marginals (head-major, not clamped), whether each example passed its checks,
    and ``(root, words, keep, inv, kappa, lu, piv)``: column-scaled arc weights, the rows the Laplacian keeps,
    ``L^{-1}``, ``L``'s 1-norm condition number [B] and its LU factorisation."""
    b, c, _ = s.shape
    n = c - 1
    dtype, device = s.dtype, s.device
    eps = torch.finfo(dtype).eps
    w = s[:, :, 1:]                                                       # [B, N+1, N] columns = modifiers
    shift = w.amax(1)
    shift = torch.where(torch.isfinite(shift), shift, torch.zeros((), dtype=dtype, device=device))
    a = torch.exp(w - shift[:, None, :])                                 # scales column m of L by exp(-shift_m)
    root, words = a[:, 0], a[:, 1:]                                      # [B, N], [B, N, N]
    pad = torch.arange(n, device=device) >= lengths[:, None]
    diag = words.sum(1) + (pad.to(dtype) if single_root else root + pad.to(dtype))
    lap = torch.diag_embed(diag) - words
    if single_root:
        lap[:, 0] = root
    lu, piv, info = torch.linalg.lu_factor_ex(lap)
    u = torch.diagonal(lu, dim1=-2, dim2=-1)
    swaps = (piv != torch.arange(1, n + 1, device=device, dtype=piv.dtype)).sum(-1)
    sign = torch.where(swaps % 2 == 1, -1.0, 1.0).to(dtype) * torch.sign(u).prod(-1)
    log_det = torch.log(u.abs()).sum(-1)
    eye = torch.eye(n, dtype=dtype, device=device).expand(b, n, n)
    inv = torch.linalg.lu_solve(lu, piv, eye)                            # L^{-1}; d log det / d L = L^{-T}
    # d log det / d A[h, m]: +L^{-1}[m, m] through L[m, m], -L^{-1}[m, h] through L[h, m] (rows kept), and
    # for the root: L^{-1}[m, m] (diagonal) or L^{-1}[m, 0] (the replaced first row)
    d = torch.diagonal(inv, dim1=-2, dim2=-1)
    keep = torch.ones(n, dtype=dtype, device=device)
    if single_root:
        keep[0] = 0.0
    word_marg = words * (d[:, None, :] * keep[None, :] - inv.transpose(1, 2) * keep[:, None])
    root_marg = root * (inv[:, :, 0] if single_root else d)
    marg = torch.zeros_like(s)
    marg[:, 0, 1:] = root_marg
    marg[:, 1:, 1:] = word_marg
    log_z = log_det + shift.sum(-1)
    kappa = _norm1(lap) * _norm1(inv)
    # marginals in [0, 1] up to the rounding allowed (NaN fails both comparisons)
    ok = ((info == 0) & (sign > 0) & torch.isfinite(log_z) & (lengths * kappa * eps <= eps ** 0.5)
          & ((marg >= -(eps ** 0.5)) & (marg <= 1 + eps ** 0.5)).flatten(1).all(-1))
    return log_z, marg, ok, (root, words, keep, inv, kappa, lu, piv)


def _norm1(x: Tensor) -> Tensor:
    """The 1-norm (largest column sum of magnitudes) of each matrix [B]: ``torch.linalg.matrix_norm(x, ord=1)``,
    which took 8 times as long on a batch of 32 matrices of 20 x 20."""
    return x.abs().sum(-2).amax(-1)


def _fast_covariance(s: Tensor, lengths: Tensor, single_root: bool) -> tuple[Tensor, Tensor]:
    """The arcs' covariance [B, V, V] (node layout, ``V = N (N+1)``, index ``m (N+1) + h`` for ``h -> m+1``) in
    closed form, and which examples the fast path certified.  With ``L`` linear in the weights,
    ``dL / dA_a = x_a e_m^T`` (``x_a = keep_m e_m - keep_h e_h``, a root arc ``e_m`` or ``e_0``), so
    ``d^2 log det L / dA_a dA_b = -(L^{-1} x_a)[m_b] (L^{-1} x_b)[m_a]`` and, with ``R[a, j] = A_a (L^{-1} x_a)[j]``
    (``R[a, m_a] = mu_a``), ``Cov(a, b) = mu_a [a = b] - R[a, m_b] R[b, m_a]``: ``O(V^2)`` work instead of one
    inference per arc."""
    b, c, _ = s.shape
    n = c - 1
    _, _, ok, (root, words, keep, inv, *_) = _fast_parts(s, lengths, single_root)
    t = inv.transpose(1, 2)                                               # t[m, j] = L^{-1}[j, m]
    r_root = root[:, :, None] * (t[:, :1] if single_root else t)         # [B, N(m), N(j)]
    r_word = words.transpose(1, 2)[..., None] * (keep[:, None, None] * t[:, :, None, :]
                                                 - keep[None, :, None] * t[:, None, :, :])   # [B, m, h-1, j]
    r = torch.cat([r_root[:, :, None], r_word], 2)                        # [B, N(m), C(h), N(j)]
    mu = torch.diagonal(r, dim1=1, dim2=3)                                # [B, C, N]: R[a, m_a]
    cov = (r[..., None] * r.permute(0, 3, 1, 2)[:, :, None]).reshape(b, n * c, n * c).neg_()   # [B, mh, m'h']
    cov.diagonal(dim1=1, dim2=2).add_(mu.transpose(1, 2).reshape(b, n * c))
    return cov, ok


def _gth_steps(la: Tensor, excess: Tensor, steps: int, carried: Tensor | None = None
               ) -> tuple[Tensor, Tensor, Tensor | None]:
    """Grassmann-Taksar-Heyman elimination in log space, without subtraction, of the first ``steps`` pivots of
    ``L = diag(excess + column sums) - a``: ``la`` [K, R, C] is ``log a`` (rows the pivots then other words,
    columns the pivots then other columns; the pivots' diagonal is ignored), ``excess`` [K, C] the log column
    excesses.  Eliminating pivot ``k`` maps ``a[i, j] += a[i, k] a[k, j] / d_k`` and ``excess[j] += a[k, j]
    excess[k] / d_k``, with ``d_k = excess[k] + sum_i a[i, k]``; ``carried`` [K, C], a second excess, is
    carried the same way without entering the pivots.  Returns ``sum_k log d_k`` [K] and what is left of
    ``excess`` and ``carried``.  Differentiable (a zero gradient where every term is ``-inf``) when an input
    requires grad."""
    k_, r, c = la.shape
    ninf = torch.full((), -torch.inf, dtype=la.dtype, device=la.device)
    zero = torch.zeros((), dtype=la.dtype, device=la.device)
    off = ~torch.eye(r, c, dtype=torch.bool, device=la.device)
    la = torch.where(off, la, ninf)
    lse: Callable[[Tensor, int], Tensor]
    pair: Callable[[Tensor, Tensor], Tensor]
    if torch.is_grad_enabled() and (la.requires_grad or excess.requires_grad
                                     or (carried is not None and carried.requires_grad)):
        lse, pair = _lse, lambda x, y: _lse(torch.stack([x, y], -1), -1)
    else:                                          # forward only: torch's own, -inf safe in the forward pass
        lse, pair = torch.logsumexp, torch.logaddexp
    total = la.new_zeros(k_)
    for k in range(steps):
        col = la[:, 1:, 0]
        ld = lse(torch.cat([excess[:, :1], col], 1), 1)
        total = total + ld
        ls = torch.where(torch.isfinite(ld), ld, zero)               # a singular pivot: Z = 0 already
        row = la[:, 0, 1:]
        upd = col[:, :, None] + row[:, None, :] - ls[:, None, None]
        la = torch.where(off[k + 1:, k + 1:], pair(la[:, 1:, 1:], upd), ninf)
        excess = pair(excess[:, 1:], row + (excess[:, :1] - ls[:, None]))
        if carried is not None:
            carried = pair(carried[:, 1:], row + (carried[:, :1] - ls[:, None]))
    return total, excess, carried


def _gth_log_det(la: Tensor, lr: Tensor) -> Tensor:
    """``log det L`` [B] of ``L = diag(r + sum_h a[h, :]) - a`` from ``log a`` [B, n, n] (diagonal ignored) and
    the column excesses ``log r`` [B, n]: the sum of the ``n`` log pivots of :func:`_gth_steps`."""
    return _gth_steps(la, lr, la.shape[1])[0]


def _exact_log_z(x: Tensor, lengths: Tensor, single_root: bool) -> Tensor:
    b, c, _ = x.shape
    n = c - 1
    zero = torch.zeros((), dtype=x.dtype, device=x.device)
    pad = torch.arange(n, device=x.device) >= lengths[:, None]          # padded words: isolated, excess 1
    la, lr = x[:, 1:, 1:], x[:, 0, 1:]
    if not single_root:
        return _gth_log_det(la, torch.where(pad, zero, lr))
    return _gth_single_root_log_z(la, lr, pad)


def _gth_single_root_log_z(la: Tensor, lr: Tensor, pad: Tensor) -> Tensor:
    """``log Z`` [B] of the trees with one root child, from log word arcs ``la`` [B, n, n] and log root arcs
    ``lr`` [B, n] (``pad`` [B, n]: padded words, isolated), in ``O(n^3)``.

    With root weights ``eps r``, ``det L(eps) = sum_S eps^|S| prod_{r in S} r_r Z_S`` (``S``: the root
    children), whose linear coefficient is ``Z``.  Eliminated last, a word ``w`` from which word arcs reach every
    word leaves every other pivot non-zero at ``eps = 0`` (each word still has an arc in from outside what was
    eliminated: the last arc of a path from ``w``), and the last pivot is ``O(eps)``.  So ``Z = prod_{k != w}
    d_k(0) rho_w``, the root weights carried through Grassmann-Taksar-Heyman elimination as a second excess
    ``rho`` (linearly), no subtraction.  Without such a word no tree has one root child (``Z = 0``); padded
    words come first, pivot 1."""
    b, n, _ = la.shape
    dev, dt = la.device, la.dtype
    ninf = torch.full((), -torch.inf, dtype=dt, device=dev)
    zero = torch.zeros((), dtype=dt, device=dev)
    off = ~torch.eye(n, dtype=torch.bool, device=dev)
    la = torch.where(off, la, ninf)
    reach = ((la > -torch.inf) | torch.eye(n, dtype=torch.bool, device=dev)).to(dt)     # i reaches j
    for _ in range(max(1, math.ceil(math.log2(max(n, 2))))):
        reach = ((reach @ reach) > 0).to(dt)
    source = ((reach > 0) | pad[:, None, :]).all(2) & ~pad               # [B, n]: reaches every word
    last = torch.argmax(source.to(torch.int8), dim=1)
    key = torch.where(pad, 0, 1).scatter(1, last[:, None], 2)
    order = torch.argsort(key, dim=1, stable=True)
    la = la.gather(1, order[:, :, None].expand(b, n, n)).gather(2, order[:, None, :].expand(b, n, n))
    pad, lr = pad.gather(1, order), lr.gather(1, order)
    base = torch.where(pad, zero, ninf)                                   # eps^0 excess: 1 on padded words
    rho = torch.where(pad, ninf, lr)                                      # eps^1 excess: the root weights
    total, _, left = _gth_steps(la, base, n - 1, carried=rho)
    assert left is not None                                               # carried through, as given
    return torch.where(source.any(1), total + left[:, 0], ninf)


def _exact_matrix_tree(s: Tensor, lengths: Tensor, single_root: bool) -> tuple[Tensor, Tensor]:
    with torch.enable_grad():
        x = s.detach().requires_grad_(True)
        log_z = _exact_log_z(x, lengths, single_root)
        (marg,) = torch.autograd.grad(log_z.sum(), x)
    return log_z.detach(), marg


# --------------------------------------------------------------------------------------------------- MAP

def _cycles(heads: np.ndarray) -> list[np.ndarray]:
    """Every cycle of the head graph ``heads`` (``heads[0] = -1``)."""
    state = np.zeros(len(heads), dtype=np.int8)                          # 0 new, 1 on the current path, 2 done
    found = []
    for start in range(1, len(heads)):
        path, v = [], start
        while v > 0 and state[v] == 0:
            state[v] = 1
            path.append(v)
            v = heads[v]
        if v > 0 and state[v] == 1:
            found.append(np.array(path[path.index(v):]))
        state[path] = 2
    return found


def _cycle_through(heads: np.ndarray, c: int) -> np.ndarray | None:
    """The cycle through node ``c`` of the head graph, if there is one."""
    path, v = [c], heads[c]
    while v > 0 and v != c and len(path) <= len(heads):
        path.append(v)
        v = heads[v]
    return np.array(path) if v == c else None


def _cle(s: np.ndarray) -> np.ndarray | None:
    """Maximum arborescence rooted at 0 of ``s[h, m]`` (``-inf`` = no arc; column 0 and the diagonal ``-inf``):
    heads [V] (``heads[0] = -1``), or ``None`` if none exists.  ``s`` is not modified.

    Chu-Liu-Edmonds: take every node's best head; contract a cycle ``C`` into one of its nodes ``c``, where the
    entering arc ``h -> c`` scores ``max_{m in C} s[h, m] - s[head(m), m]`` and the leaving arc ``c -> m`` scores
    ``max_{h in C} s[h, m]``; repeat until no cycle is left; then undo the contractions in reverse, breaking each
    cycle where the tree enters it.  Contractions happen in place on one ``[V, V]`` array, with the original arc
    behind every contracted arc recorded beside it.  A contraction changes only ``c``'s best head (every other
    node whose best head was in ``C`` now has ``c``, with the same score), so a new cycle passes through ``c``.
    """
    v = s.shape[0]
    heads = s.argmax(0)
    heads[0] = -1
    if v > 1 and (s[heads[1:], np.arange(1, v)] == -np.inf).any():
        return None
    pending = _cycles(heads)
    if not pending:
        return heads
    s = s.copy()
    nodes = np.arange(v)
    arc = nodes[:, None] * v + nodes[None, :]                            # original arc (h * V + m) behind s[h, m]
    rep = nodes.copy()                                                   # original node -> current node
    in_cycle = np.zeros(v, dtype=bool)
    history = []
    while pending:
        cyc = pending.pop()
        c = cyc[0]
        hc = heads[cyc]
        history.append((cyc, rep.copy(), arc[hc, cyc]))
        with np.errstate(over="ignore"):                                 # -inf: the caller names the range
            gain = s[:, cyc] - s[hc, cyc]                                # [V, |C|]
        j = gain.argmax(1)
        s_in, arc_in = gain[nodes, j], arc[nodes, cyc[j]]
        leave = cyc[s[cyc].argmax(0)]
        s[c, :], arc[c, :] = s[leave, nodes], arc[leave, nodes]
        s[:, c], arc[:, c] = s_in, arc_in
        s[cyc[1:], :] = -np.inf
        s[:, cyc[1:]] = -np.inf
        s[c, c] = -np.inf
        in_cycle[cyc] = True
        rep[in_cycle[rep]] = c
        moved = in_cycle[heads]
        moved[0] = False
        heads[moved] = c
        in_cycle[cyc] = False
        h = heads[c] = s[:, c].argmax()
        if s[h, c] == -np.inf:
            return None
        again = _cycle_through(heads, c)
        if again is not None:
            pending.append(again)
    current = np.nonzero(rep == nodes)[0][1:]                            # nodes not merged into another
    incoming = np.full(v, -1)                                            # the original arc entering each node
    incoming[current] = arc[heads[current], current]
    for cyc, rep_before, cycle_arcs in reversed(history):
        entering = incoming[cyc[0]]                                      # the arc entering the contracted node
        incoming[cyc] = cycle_arcs
        incoming[rep_before[entering % v]] = entering                    # replaces the cycle arc into that member
    out = incoming // v
    out[0] = -1
    return out


def _root_bounds(terms: np.ndarray, roots: np.ndarray) -> np.ndarray:
    """An upper bound on the total ``fsum(terms[heads[1:], 1:])`` of every tree whose one root child is ``r``, for
    each ``r`` of ``roots``: ``terms[0, r]`` plus every other word's best word head, with a margin for the
    rounding of that sum; ``-inf`` where another word has no word head (it would need the root too)."""
    word_best = terms[1:, 1:].max(axis=0)                                # [n]
    finite = np.isfinite(word_best)
    own = finite[roots - 1]
    with np.errstate(invalid="ignore", over="ignore"):                   # an overflow: no bound (inf)
        mag = np.abs(word_best[finite]).sum() + np.abs(terms[0, roots])
        ub = word_best[finite].sum() - np.where(own, word_best[roots - 1], 0.0) + terms[0, roots]
        ub = ub + 2 * (len(terms) + 2) * np.finfo(np.float64).eps * mag
    ub = np.where(np.isnan(ub), np.inf, ub)
    return np.where((~finite).sum() - ~own > 0, -np.inf, ub)


def _best_tree(s: np.ndarray, single_root: bool) -> np.ndarray | None:
    """:func:`chu_liu_edmonds` on masked scores (column 0 and the diagonal ``-inf``) shifted by
    :func:`~betheproj.oracles.dependency._shifted_columns` (the same ``single_root``; a float64 array it may
    modify): heads [n+1] (``heads[0] = -1``) or ``None``."""
    v = s.shape[0]
    best = _cle(s)
    if single_root and best is not None and (best[1:] == 0).sum() != 1:
        # the unconstrained optimum has several root children: try each root child (it is optimal otherwise)
        # every tree takes one arc per column (and here one root arc), so the scores, shifted as the marginals'
        # are (_shifted_columns), leave O(1) totals where some tree pays little: a huge column (1e20 for every
        # head) or root row would absorb the O(1) scores of the others in a raw sum (halves: a sum of scores
        # cannot overflow).  Root children are tried best bound first, and those whose bound is below the best
        # total found are not tried; ties go to the first one.
        terms = s / 2
        cols = np.arange(1, v)
        roots = np.nonzero(np.isfinite(s[0]))[0]
        bound = _root_bounds(terms, roots)
        best, best_score, best_r = None, -np.inf, v
        for k in np.argsort(-bound, kind="stable"):
            if bound[k] < best_score:
                break
            r = roots[k]
            sr = s.copy()
            sr[0] = -np.inf
            sr[0, r] = s[0, r]
            heads = _cle(sr)
            if heads is not None:
                total = math.fsum(terms[heads[1:], cols].tolist())
                if total > best_score or (total == best_score and r < best_r):
                    best, best_score, best_r = heads, total, r
    return best


def chu_liu_edmonds(scores: Tensor, single_root: bool = False) -> Tensor:
    """Highest-scoring non-projective tree of ONE sentence: heads [n] (long, heads of words ``1..n``, 0 = root).

    ``scores[h, m]`` [n+1, n+1] head-major; column 0 and the diagonal are ignored, ``-inf`` arcs are forbidden.
    Chu-Liu-Edmonds (cycle contraction in place, ``O(n^2)``); with ``single_root``, unless the unconstrained
    optimum already has one root child, it is run once per allowed root child ``r`` that could still win (an
    upper bound on its total reaches the best found) with the other root arcs removed, and the best result is
    kept (``O(n^3)`` at worst; ties go to the first root child).  Raises ``ValueError`` if no tree exists.
    """
    if not isinstance(scores, Tensor) or scores.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"scores must be a float32 or float64 tensor [n+1, n+1], got "
                        f"{scores.dtype if isinstance(scores, Tensor) else type(scores).__name__}")
    if scores.dim() != 2 or scores.shape[0] != scores.shape[1] or scores.shape[0] < 2:
        raise ValueError(f"scores must be a tensor [n+1, n+1] with n >= 1, got {tuple(scores.shape)}")
    if torch.isnan(scores).any() or torch.isposinf(scores).any():
        raise ValueError("scores must be finite or -inf")
    if not isinstance(single_root, bool):
        raise TypeError(f"single_root must be a bool, got {type(single_root).__name__}")
    s = _mask_head_major(scores.detach().to("cpu", torch.float64)[None], torch.tensor([len(scores) - 1]))
    best = _best_tree(_shifted_columns(s, single_root)[0][0].numpy().copy(), single_root)
    if best is None:
        raise ValueError(_no_tree(single_root=single_root))
    return torch.as_tensor(best[1:], dtype=torch.long, device=scores.device)


class NonProjective(_DependencyOracle):
    """Arc-factored distribution over non-projective dependency trees (all arborescences rooted at 0).

    Marginals and ``log Z`` by the matrix-tree theorem (:func:`matrix_tree`), MAP by Chu-Liu-Edmonds
    (:func:`chu_liu_edmonds`); ``single_root=True`` allows exactly one child of the root.  Potentials come from
    :func:`~betheproj.oracles.dependency.arc_potentials`.
    """

    def _marginals_core(self, scores: Tensor, lengths: Tensor, strict: bool = True) -> tuple[Tensor, Tensor]:
        return _matrix_tree(scores, lengths, self.single_root, strict)

    def _structural(self, support: Tensor, lengths: Tensor, in_all_too: bool = True) -> tuple[Tensor, Tensor]:
        """The base class's exact answer read off :func:`log_arc_marginals` under equal scores, whose zeros are
        exact (logit ``-inf``: in no tree, ``inf``: in every tree): one call instead of a forced inference per
        candidate arc.  A batch with an example without any tree goes to the base class."""
        if not support.any():
            return torch.zeros_like(support), torch.zeros_like(support)
        b, n, c = support.shape
        scores = torch.full((b, c, c), -math.inf, dtype=torch.float64, device=support.device)
        scores[:, :, 1:] = torch.zeros((), dtype=torch.float64, device=support.device).masked_fill(
            ~support, -math.inf).transpose(1, 2)
        try:
            log_marg = log_arc_marginals(scores, lengths, self.single_root)[1]
        except ValueError:
            return super()._structural(support, lengths, in_all_too)
        logit = _arc_logits(log_marg)[:, :, 1:].transpose(1, 2)
        in_all = support & (logit == math.inf) if in_all_too else torch.zeros_like(support)
        return support & (logit == -math.inf), in_all

    def _covariance(self, theta: Tensor, mu: Tensor, support: Tensor, lengths: Tensor) -> Tensor:
        """Closed form (:func:`_fast_covariance`) where the fast path certifies the example, else one inference per
        arc (the base class)."""
        scores, lengths = self._scores(_unchecked(PairwisePotentials, theta, theta.new_zeros(theta.shape[-1],
                                                                                             theta.shape[-1]), lengths))
        cov, ok = _fast_covariance(scores, lengths, self.single_root)
        slow = torch.nonzero(~ok).flatten()
        if slow.numel():
            cov[slow] = super()._covariance(theta[slow], mu[slow], support[slow], lengths[slow])
        b, v = cov.shape[:2]
        return cov.masked_fill_(~(support.reshape(b, v, 1) & support.reshape(b, 1, v)), 0.0)

    def _map_core(self, scores: Tensor, lengths: Tensor) -> Tensor:
        b, c, _ = scores.shape
        out = np.full((b, c - 1), -1, dtype=np.int64)
        # one conversion for the whole batch
        s = _shifted_columns(scores.detach().to("cpu", torch.float64), self.single_root)[0].numpy()
        for i, n in enumerate(lengths.tolist()):
            best = _best_tree(s[i, : n + 1, : n + 1].copy(), self.single_root)
            if best is None:
                raise ValueError(f"example {i}: {_no_tree(single_root=self.single_root)}")
            out[i, :n] = best[1:]
        return torch.as_tensor(out, device=scores.device)
