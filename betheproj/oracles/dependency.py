"""Dependency trees as a base structure: arc-factored distributions over trees rooted at position 0.

A sentence of ``n`` words has positions ``1..n``; ``0`` is the root.  An arc-factored model scores a tree ``y``
(every word ``m`` has one head ``y_m``) as ``sum_m theta(y_m -> m)``, so the tree is a "labelling" of the
words whose label is the head: :class:`~betheproj.PairwisePotentials` with ``node[b, m-1, h] = theta(h -> m)``
([B, N, N+1]) and a shared all-zero ``[N+1, N+1]`` edge table (the tree constraint replaces pairwise
factors: the oracles' ``pairwise_factors`` is ``False``, so a tree's ``S(y)`` has all-zero edge parts, as its
marginals do).  Self-loops and heads past ``lengths[b]`` are ignored whatever their finite or ``-inf`` score (NaN
and ``+inf`` are refused anywhere); other ``-inf`` entries are forbidden arcs.

* :class:`~betheproj.oracles.nonprojective.NonProjective`: all arborescences (matrix-tree theorem for
  marginals, Chu-Liu-Edmonds for MAP).
* :class:`~betheproj.oracles.projective.Projective`: trees without crossing arcs (Eisner's algorithm).

Both optionally restrict the root to a single child (``single_root=True``).

Range: the scores are shifted by each word's best arc (a constant per word, which only rescales Z) and, with
``single_root``, by each word's best word head, then the root row by its best arc (every such tree takes one root
arc: a constant the root row shares, such as a root penalty, is absorbed too).  A tree's O(1) score differences are
then resolved to about ``eps`` times the penalty every tree pays below those best arcs (``|log Z|`` of the shifted
scores).  Marginals, MAP and entropy are exact however large the scores while some tree pays little (as usual);
where every tree must take arcs far below their words' best (two words whose best arcs form a cycle, each 1e17
above the alternatives), differences smaller than that penalty times ``eps`` are lost (at 1e17 in float64 or 1e8
in float32 every O(1) one).  The chain and tree oracles keep them up to ``~1/eps^2``
(two-part sums); here the matrix-tree determinant and Eisner's chart do not.

This module holds the shared parts: the conversions, the oracle base class and the entropy.  The functional
cores (``matrix_tree``, ``chu_liu_edmonds``, ``eisner``, ``eisner_map``) live in the two modules and are
re-exported here.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .base import (
    Marginals,
    PairwisePotentials,
    _check_float,
    _check_lengths,
    _finite_max,
    _first_order_only,
    _sum_shifts,
    _two_sum,
    _unchecked,
    check_degree_args,
    log_partition,
    raise_if_not_finite,
)

__all__ = ["arc_potentials", "heads_to_arcs", "arcs_to_heads", "DependencyMarginals"]
# also importable from here (lazily, see __getattr__): matrix_tree, chu_liu_edmonds, NonProjective (from
# .nonprojective) and eisner, eisner_map, Projective (from .projective)

_CORE = {"matrix_tree": "nonprojective", "chu_liu_edmonds": "nonprojective", "NonProjective": "nonprojective",
         "eisner": "projective", "eisner_map": "projective", "Projective": "projective"}


def __getattr__(name: str) -> Any:
    # lazy re-exports: the two algorithm modules import this one
    if name in _CORE:
        import importlib
        return getattr(importlib.import_module(f".{_CORE[name]}", __package__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# --------------------------------------------------------------------------------------------------- conversions

def arc_potentials(scores: Tensor, lengths: Tensor | None = None) -> PairwisePotentials:
    """Potentials from head-major arc scores ``scores[b, h, m]`` = score of ``h -> m``, [B, N+1, N+1].

    Column 0 (arcs into the root) is unused.  Returns ``node[b, m-1, h] = scores[b, h, m]`` [B, N, N+1] and a
    shared zero edge table [N+1, N+1].
    """
    scores = _check_scores(scores, "scores")
    node = scores[:, :, 1:].transpose(1, 2).contiguous()
    c = scores.shape[1]
    return PairwisePotentials(node, scores.new_zeros(c, c), lengths)


def heads_to_arcs(heads: Tensor, dtype: torch.dtype = torch.float64) -> Tensor:
    """One-hot arcs [B, N, N+1] (node layout, the sufficient statistics of a tree) from heads [B, N];
    heads ``< 0`` (padding) give zero rows."""
    if (not isinstance(heads, Tensor) or heads.dim() != 2 or heads.is_floating_point() or heads.is_complex()
            or heads.dtype == torch.bool):
        raise TypeError("heads must be an integer tensor [B, N]")
    b, n = heads.shape
    if (heads > n).any():
        raise ValueError(f"heads must be at most N={n}")
    loops = heads == torch.arange(1, n + 1, device=heads.device)
    if loops.any():
        i, j = (int(k) for k in loops.nonzero()[0])
        raise ValueError(f"heads[{i}, {j}] = {j + 1}: a word cannot be its own head")
    out = torch.zeros(b, n, n + 1, dtype=dtype, device=heads.device)
    valid = heads >= 0
    out.scatter_(2, heads.clamp_min(0)[..., None], valid[..., None].to(dtype))
    return out


def arcs_to_heads(arcs: Tensor) -> Tensor:
    """Heads [B, N] (long) from arc indicators or marginals [B, N, N+1] (the most probable head of each word);
    all-zero rows (padding) give ``-1``."""
    if not isinstance(arcs, Tensor):
        raise TypeError(f"arcs must be a tensor [B, N, N+1], got {type(arcs).__name__}")
    if arcs.dim() != 3 or arcs.shape[2] != arcs.shape[1] + 1:
        raise ValueError(f"arcs must be a tensor [B, N, N+1], got shape {tuple(arcs.shape)}")
    heads = arcs.argmax(-1)
    return torch.where((arcs != 0).any(-1), heads, torch.full_like(heads, -1))


# --------------------------------------------------------------------------------------------------- helpers

def _check_scores(scores: object, name: str) -> Tensor:
    scores = _check_float(name, scores, (3,))
    b, r, c = scores.shape
    if r != c or c < 2:
        raise ValueError(f"{name} must be head-major arc scores [B, N+1, N+1] with N >= 1, got {tuple(scores.shape)}")
    return scores


def _prepare(scores: object, lengths: object) -> tuple[Tensor, Tensor]:
    """Validated head-major scores with ignored entries set to ``-inf``, and lengths [B]."""
    scores = _check_scores(scores, "scores")
    b, c, _ = scores.shape
    lengths = _check_lengths(lengths, b, c - 1, scores.device)
    return _mask_head_major(scores, lengths), lengths


def _arc_mask(lengths: Tensor, c: int) -> Tensor:
    """[B, C, C] True at the arcs ``h -> m`` that exist: ``1 <= m <= n``, ``0 <= h <= n``, ``h != m``."""
    pos = torch.arange(c, device=lengths.device)
    inside = pos <= lengths[:, None]                                       # [B, C]
    mod = inside & (pos >= 1)
    return inside[:, :, None] & mod[:, None, :] & (pos[:, None] != pos[None, :])


def _mask_head_major(scores: Tensor, lengths: Tensor) -> Tensor:
    return torch.where(_arc_mask(lengths, scores.shape[1]), scores, torch.full((), -torch.inf, dtype=scores.dtype,
                                                                                device=scores.device))


def _lse(x: Tensor, dim: int) -> Tensor:
    """``logsumexp`` whose gradient is zero (not NaN) where every input is ``-inf``."""
    m = _finite_max(x.detach(), dim)
    s = torch.exp(x - m).sum(dim)
    pos = s > 0
    return torch.where(pos, torch.log(torch.where(pos, s, torch.ones_like(s))) + m.squeeze(dim),
                       torch.full((), -torch.inf, dtype=x.dtype, device=x.device))


def _no_tree(projective: bool = False, single_root: bool = False) -> str:
    kind = ("projective " if projective else "") + "tree" + (" with one root child" if single_root else "")
    return f"no valid dependency tree (every {kind} uses a -inf arc)"


def _raise_no_tree(log_z: Tensor, projective: bool = False, single_root: bool = False) -> None:
    raise_if_not_finite(log_z, _no_tree(projective, single_root))


def _raise_overflow(log_z: Tensor) -> None:
    """The overflow error where ``log Z`` (or a best score) is ``+inf`` once the column shifts are added back
    (``-inf``, no tree, is left to the caller)."""
    if bool((log_z == torch.inf).any()):
        raise_if_not_finite(torch.where(log_z == -torch.inf, torch.zeros((), dtype=log_z.dtype), log_z))


class _GradIsMarginals(torch.autograd.Function):
    """``log Z`` whose gradient with respect to the arc scores is the arc marginals (first order only: a second
    derivative is an error)."""

    @staticmethod
    def forward(ctx: Any, scores: Tensor, log_z: Tensor, marginals: Tensor) -> Tensor:
        ctx.save_for_backward(scores, marginals)
        return log_z.clone()

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        scores, marginals = ctx.saved_tensors
        return _first_order_only(grad[:, None, None] * marginals, scores), None, None


def _differentiable(scores: Tensor, log_z: Tensor, marginals: Tensor) -> Tensor:
    if scores.requires_grad and torch.is_grad_enabled():
        return _GradIsMarginals.apply(scores, log_z, marginals)
    return log_z


# --------------------------------------------------------------------------------------------------- oracle base

def _root_arcs(root: Tensor, err: Tensor, row: Tensor) -> Tensor:
    """Root arcs less their columns' constants (``root``, rounded, and its rounding error ``err``) less the root
    row's ``row``: ``root - row`` is exact where both are huge (Sterbenz), so the O(1) part ``err`` that the first
    subtraction rounded away comes back."""
    return (root - row) + err


def _shifted_columns(s: Tensor, single_root: bool = False) -> tuple[Tensor, Tensor]:
    """Head-major scores [B, N+1, N+1] less a constant per modifier column and, with ``single_root``, one for the
    root row, and those constants [B, N+1] (``[:, 0]`` the root row's, 0 without ``single_root``; ``[:, m]``
    column ``m``'s): every tree takes one arc into each word (and with ``single_root`` one out of the root), so
    ``log Z`` is the shifted one plus their sum.  A column's constant is its best arc (without ``single_root``) or
    best word head (0 where it has none), the root row's its best arc after that: a tree's penalty below them is
    never larger than below the columns' best arcs, and a constant the root row shares costs nothing.
    ``ValueError`` where an allowed arc's shifted score overflows (two allowed arcs differ by more than the
    dtype's range: the lower would read as forbidden, and a sentence whose trees all need it as having no tree)."""
    if single_root:
        top = _finite_max(s[:, 1:], 1)                                     # [B, 1, N+1]: best word heads
        root, err = _two_sum(s[:, :1], -top)
        row = _finite_max(root, 2)                                         # [B, 1, 1]
        shifted = torch.cat([_root_arcs(root, err, row), s[:, 1:] - top], 1)
        shift = torch.cat([row[:, 0], top[:, 0, 1:]], 1)
    else:
        top = _finite_max(s, 1)
        shifted = s - top
        shift = torch.cat([torch.zeros_like(top[:, 0, :1]), top[:, 0, 1:]], 1)
    # NaN and +inf scores are refused before; a finite score can only overflow to +-inf here
    if bool(((shifted.abs() == torch.inf) & (s != -torch.inf)).any()):
        raise ValueError(f"arc scores differ by more than {s.dtype}'s range (an allowed arc would read as "
                         f"forbidden): rescale the scores")
    return shifted, shift


def _added_back(shift: Tensor, value: Tensor) -> Tensor:
    """``value`` [B] (``log Z`` or a best score of the scores :func:`_shifted_columns` shifted) with the constants
    ``shift`` [B, N+1] added back: their total in two parts (huge constants that cancel leave their O(1) part), the
    O(1) ``value`` joining the small one first; the overflow error where the result is ``+inf``."""
    big, small = _sum_shifts((shift, -1))
    out = big + (small + value)
    _raise_overflow(out)
    return out


class DependencyMarginals(Marginals):
    """Arc marginals ``node[b, m-1, h] = P(head(m) = h)`` [B, N, N+1] with the (masked) potentials they came from.

    The tree entropy ``H = log Z - <theta, mu>`` is not a closed function of ``mu``; keeping ``theta`` makes it
    exact and free.  ``edge`` is a lazy all-zero [B, N-1, N+1, N+1] tensor (there are no pairwise factors; it
    exists so that code reading the edges of any oracle's marginals runs unchanged; the solvers never ask for it).
    """

    log_partition: Tensor         # always given (``Marginals.log_partition`` may be None)

    def __init__(self, node: Tensor, log_partition: Tensor, lengths: Tensor, theta: Tensor,
                 structure: tuple[str, bool], shift: Tensor | None = None,
                 shifted_log_partition: Tensor | None = None):
        b, n, c = node.shape
        super().__init__(node, lambda: node.new_zeros(b, n - 1, c, c), log_partition, lengths)
        self.edge_sum = lambda weights: node.new_zeros(c, c)
        self.theta = theta            # [B, N, N+1], -inf at ignored or forbidden arcs
        self.structure = structure
        # [B, N+1]: the root row's and each modifier column's constant (_shifted_columns), and log Z less their
        # sum: every tree takes one head per modifier (and with one root child one root arc), so log Z - <theta,
        # mu> is exact as (log Z - sum shift) - <theta - shift, mu>, both O(1) where theta is large (float32
        # rounds log Z itself at |theta| = 1e4 to 0.008)
        if shift is None and shifted_log_partition is None:
            shift, shifted_log_partition = torch.zeros_like(log_partition)[:, None].expand(b, c), log_partition
        elif shift is None or shifted_log_partition is None:
            raise ValueError("give shift and shifted_log_partition together")
        elif tuple(shift.shape) != (b, c):
            raise ValueError(f"shift must be [B, N+1]=({b}, {c}) (the root row's constant, then each word's), got "
                             f"{tuple(shift.shape)}")
        self.shift = shift
        self.shifted_log_partition = shifted_log_partition

    def shifted_theta(self) -> Tensor:
        """``theta`` [B, N, N+1] less the root row's and the columns' constants (``shift``)."""
        root, err = _two_sum(self.theta[..., :1], -self.shift[:, 1:, None])      # as _shifted_columns does
        return torch.cat([_root_arcs(root, err, self.shift[:, :1, None]),
                          self.theta[..., 1:] - self.shift[:, 1:, None]], -1)


def _damped_step(evals: Tensor, evecs: Tensor, g_eig: Tensor, g: Tensor, cut: Tensor, lam: Tensor,
                 support: Tensor, scale: Tensor) -> tuple[Tensor, Tensor]:
    """Levenberg-Marquardt step ``-S (S H S + lam I)^+ S g`` on the support [B, N, C] and its slope
    ``<g, step>`` [B], from the eigenpairs of the scaled ``S H S`` (``S = diag(scale)``; eigenvalues at most
    ``cut`` treated as zero) and ``S g`` in that basis."""
    zero = torch.zeros((), dtype=evals.dtype, device=evals.device)
    big = evals > cut
    inv = torch.where(big, 1.0 / (torch.where(big, evals, 1.0) + lam[:, None]), zero)
    step = -scale * (evecs @ (inv * g_eig)[..., None]).squeeze(-1)
    step = torch.where(support, step.reshape(support.shape), zero)
    return step, (g * step.flatten(1)).sum(-1)


def _near_start(near: object, mu: Tensor) -> Tensor | None:
    """The node scores of ``marginals.near``, checked: the conjugate entropy's start."""
    if near is None:
        return None
    if not isinstance(near, PairwisePotentials):
        raise TypeError(f"marginals.near must be PairwisePotentials or None, got {type(near).__name__}")
    if near.node.shape != mu.shape:
        raise ValueError(f"marginals.near.node must have the marginals' shape {tuple(mu.shape)}, got "
                         f"{tuple(near.node.shape)}")
    return near.node.detach().to(mu.device)


def _is_tree(heads: Tensor, words: Tensor, single_root: bool) -> Tensor:
    """[B]: whether ``heads`` [B, N] (heads of words ``1..N`` in ``0..N``, read where ``words``) reach the root 0
    from every word, by pointer doubling (``2^k > N`` steps up in ``k`` gathers), with exactly one word under
    the root if ``single_root`` (an example without words is a tree)."""
    b, n = heads.shape
    up = torch.cat([heads.new_zeros(b, 1), torch.where(words, heads, 0)], 1)     # the root points at itself
    for _ in range(max(n, 1).bit_length()):
        up = up.gather(1, up)
    tree = (up == 0).all(1)
    if single_root:
        tree &= ((words & (heads == 0)).sum(1) == 1) | ~words.any(1)
    return tree


def check_arc_potentials(potentials: object) -> None:
    """``potentials`` of a dependency oracle: :class:`PairwisePotentials` with node scores [B, N, N+1] (heads of
    each word) and an all-zero edge table."""
    if not isinstance(potentials, PairwisePotentials):
        raise TypeError(f"potentials must be PairwisePotentials (see arc_potentials), got "
                        f"{type(potentials).__name__}")
    b, n, c = potentials.node.shape
    if c != n + 1:
        raise ValueError(f"potentials.node must be [B, N, N+1] (node[b, m-1, h] = score of h -> m), got "
                         f"{tuple(potentials.node.shape)}")
    if bool((potentials.edge != 0).any()):
        raise ValueError("potentials.edge must be all zeros: dependency trees have no pairwise factors "
                         "(build potentials with arc_potentials)")


class _DependencyOracle:
    """Shared protocol implementation; subclasses provide ``_marginals_core(scores, lengths, strict)`` -> (log Z,
    arc marginals, both head-major; ``strict``: raise for an example with no tree, else its ``log Z`` is -inf)
    and ``_map_core(scores, lengths)`` -> heads [B, N]."""

    pairwise_factors = False      # zero edge potentials and marginals; a labelling's S(y) has no edge part either
    positional_labels = True      # a word's label is its head's position: batches keep their full width

    def __init__(self, single_root: bool = False):
        if not isinstance(single_root, bool):
            raise TypeError(f"single_root must be a bool, got {type(single_root).__name__}")
        self.single_root = single_root

    # subclasses ---------------------------------------------------------------------------------------------
    def _marginals_core(self, scores: Tensor, lengths: Tensor, strict: bool = True) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    def _map_core(self, scores: Tensor, lengths: Tensor) -> Tensor:
        raise NotImplementedError

    # protocol -----------------------------------------------------------------------------------------------
    def _scores(self, potentials: PairwisePotentials) -> tuple[Tensor, Tensor]:
        """Head-major masked scores [B, N+1, N+1] from validated potentials."""
        check_arc_potentials(potentials)
        b, n, c = potentials.node.shape
        node = potentials.node
        scores = torch.cat([torch.full((b, c, 1), -torch.inf, dtype=node.dtype, device=node.device),
                            node.transpose(1, 2)], 2)
        return _mask_head_major(scores, potentials.lengths), potentials.lengths

    def marginals(self, potentials: PairwisePotentials) -> DependencyMarginals:
        """Arc marginals [B, N, N+1] (zero at padding rows and invalid heads) and ``log Z`` [B], none of them
        differentiable (as the chain's): :meth:`log_partition` is the differentiable ``log Z``."""
        scores, lengths = self._scores(potentials)
        scores = scores.detach()          # else log Z and the entropy would carry the column shifts' gradient
        shifted, shift = _shifted_columns(scores, self.single_root)
        with torch.no_grad():
            shifted_log_z, marg = self._marginals_core(shifted, lengths)
        node = marg[:, :, 1:].transpose(1, 2).contiguous()
        theta = scores[:, :, 1:].transpose(1, 2)
        log_z = _added_back(shift, shifted_log_z)
        return DependencyMarginals(node, log_z, lengths, theta, self._structure(), shift, shifted_log_z)

    def support(self, potentials: PairwisePotentials) -> Tensor:
        """Arcs [B, N, N+1] (node layout) that lie in some tree of finite score.  The marginals of the others
        are rounding (~1e-16, or 0, depending on the batch's padding), which a solver must not read as mass."""
        scores, lengths = self._scores(potentials)
        finite = torch.isfinite(scores[:, :, 1:].transpose(1, 2))
        return finite & ~self._structural(finite, lengths, in_all_too=False)[0]

    def log_partition(self, potentials: PairwisePotentials) -> Tensor:
        """``log Z`` [B], differentiable: its gradient with respect to ``potentials.node`` is the marginals."""
        self._scores(potentials)
        return log_partition(self, potentials)

    def map(self, potentials: PairwisePotentials) -> Tensor:
        """Highest-scoring tree: heads [B, N] (long, 0 = root), ``-1`` past each length (as the chain's MAP)."""
        scores, lengths = self._scores(potentials)
        with torch.no_grad():
            return self._map_core(scores, lengths)

    def check_labels(self, labels: Tensor, lengths: Tensor, name: str = "labels") -> None:
        """``ValueError`` naming the first example (``name[i]``, or ``name`` with ``{i}`` filled in) whose heads
        ``labels`` [B, N] (0 = root, ignored past ``lengths``) are not a tree: a head outside ``0..n`` or the word
        itself, a cycle, no root child (or, with ``single_root``, several).  The loss of such a labelling would
        score parts this oracle masks (its raw scores are still there).  Crossing arcs are allowed for
        :class:`Projective` too: training a projective model on non-projective gold trees is common practice (the
        loss then compares the gold tree with the projective ones; the parser warns about it)."""
        if (not isinstance(labels, Tensor) or labels.dim() != 2 or labels.is_floating_point() or labels.is_complex()
                or labels.dtype == torch.bool):
            raise TypeError(f"labels must be an integer tensor [B, N] of heads, got "
                            f"{tuple(labels.shape) if isinstance(labels, Tensor) else type(labels).__name__}"
                            f"{' ' + str(labels.dtype) if isinstance(labels, Tensor) else ''}")
        b, n = labels.shape
        if (not isinstance(lengths, Tensor) or lengths.shape != (b,) or lengths.is_floating_point()
                or lengths.is_complex() or lengths.dtype == torch.bool):
            raise TypeError(f"lengths must be an integer tensor [B]=({b},), got "
                            f"{tuple(lengths.shape) if isinstance(lengths, Tensor) else type(lengths).__name__}")
        if b and (int(lengths.min()) < 0 or int(lengths.max()) > n):
            raise ValueError(f"lengths must lie in [0, N]=[0, {n}] (labels are [B, N]), got values in "
                             f"[{int(lengths.min())}, {int(lengths.max())}]")
        lengths = lengths.to(labels.device)
        pos = torch.arange(1, n + 1, device=labels.device)
        valid = pos <= lengths[:, None]
        h = torch.where(valid, labels.long(), torch.zeros((), dtype=torch.long, device=labels.device))
        bad = (valid & ((h < 0) | (h > lengths[:, None]) | (h == pos))).any(1)
        bad |= ~_is_tree(h.clamp(0, n), valid, self.single_root)
        if bool(bad.any()):
            i = int(bad.nonzero()[0])
            kind = "tree" + (" with one root child" if self.single_root else "")
            where = name.format(i=i) if "{i}" in name else f"{name}[{i}]"
            raise ValueError(f"{where} are not the heads of a {kind} (each word's head in 0..{int(lengths[i])}, "
                             f"not itself, no cycle): {labels[i, : int(lengths[i])].tolist()}")

    def degree(self, lengths: Tensor, n: int) -> Tensor:
        """[B, N]: 1 at each word, 0 at padding.  In factor-graph terms every head variable belongs to exactly one
        factor, the global TREE factor; there are no pairwise edges, so ``bethe_entropy`` with these degrees is
        just a sum of per-word head entropies (an upper bound).  Use :meth:`entropy` for the tree entropy."""
        n = check_degree_args(lengths, n)
        return (torch.arange(n, device=lengths.device) < lengths[:, None]).long()

    def entropy(self, marginals: Marginals) -> Tensor:
        """Entropy [B] of the arc-factored tree distribution with arc marginals ``marginals.node``.

        For marginals returned by this oracle it is ``log Z(theta) - <theta, mu>`` (exact, no work).  For any
        other point of the marginal polytope (e.g. the accelerated solver's averages of oracle outputs) it is the
        conjugate ``H(mu) = min_theta log Z(theta) - <theta, mu>`` (the variational representation, eq. 1's
        duality), computed by Newton's method with the exact Hessian ``Cov(arcs)`` and an eigendecomposition of it
        (``O(N^6)``) per iteration (of the Jacobi-scaled Hessian once the iteration stalls with gradient left
        along arcs of tiny curvature): ``NonProjective`` has the Hessian in closed form from the inverse Laplacian,
        ``Projective`` by one batched oracle call with every supported arc clamped (``Cov(a, b) = mu_a (mu_b | a) -
        mu_a mu_b``, ``O(N^2)`` inferences), so it is meant for short sentences.  The iteration starts from
        ``marginals.near``'s scores where given (the accelerated solver passes its latest oracle point: a few
        iterations instead of several times as many from ``log mu``); it runs in float64 whatever the marginals'
        dtype, its tolerances at theirs.  Marginals that are not finite,
        negative, or whose words' heads do not sum to 1 are a ``ValueError``, as are marginals whose support holds
        no tree of this structure; other points outside the polytope cannot make the iteration converge, and the
        value returned is then an upper bound.
        """
        if not isinstance(marginals, Marginals):
            raise TypeError(f"marginals must be Marginals, got {type(marginals).__name__}")
        b, n, c = marginals.node.shape
        if c != n + 1:
            raise ValueError(f"marginals.node must be arc marginals [B, N, N+1], got {tuple(marginals.node.shape)}")
        if isinstance(marginals, DependencyMarginals) and marginals.structure == self._structure():
            mu, theta = marginals.node, marginals.shifted_theta()
            lin = torch.where(mu > 0, theta * mu, torch.zeros((), dtype=mu.dtype, device=mu.device))
            # rounding of log Z - <theta, mu> leaves ~eps below 0 for one-tree inputs
            return (marginals.shifted_log_partition - lin.flatten(1).sum(-1)).clamp_min(0.0)
        mu = marginals.node
        lengths = _check_lengths(marginals.lengths, b, n, mu.device)
        words = (torch.arange(n, device=mu.device) < lengths[:, None])[..., None]
        tol = torch.finfo(mu.dtype).eps ** 0.5
        if not bool(torch.isfinite(mu).all()) or bool((words & (mu < -tol)).any()) \
                or bool((words[..., 0] & ((mu.sum(-1) - 1).abs() > tol)).any()):
            raise ValueError("marginals.node must hold arc marginals: finite, >= 0, each word's heads summing to 1")
        start = _near_start(marginals.near, mu)
        with torch.no_grad():
            # float64 arithmetic whatever the dtype (float32's eigensolver can fail to converge on these Hessians),
            # tolerances at the marginals' own rounding
            return self._conjugate_entropy(mu.double().clamp_min(0.0), lengths, torch.finfo(mu.dtype).eps,
                                           start=None if start is None else start.double()).clamp_min(0.0).to(mu.dtype)

    def _structure(self) -> tuple[str, bool]:
        return (type(self).__name__, self.single_root)

    def _conjugate_entropy(self, mu: Tensor, lengths: Tensor, eps: float, max_iter: int = 50,
                           start: Tensor | None = None) -> Tensor:
        """``min_theta log Z(theta) - <theta, mu>`` [B] by Newton's method from ``start`` (else ``log mu``), with
        tolerances at ``eps``, the rounding of the dtype the marginals came in (the arithmetic is ``mu``'s)."""
        b, n, c = mu.shape
        dtype, device = mu.dtype, mu.device
        zero = torch.zeros((), dtype=dtype, device=device)
        ninf = torch.full((), -torch.inf, dtype=dtype, device=device)
        valid = _arc_mask(lengths, c)[:, :, 1:].transpose(1, 2)             # node layout [B, N, C]
        support = valid & (mu > 0)
        support &= ~self._structural(support, lengths)[0]                 # arcs in no tree hold rounding only
        empty = ((torch.arange(n, device=device) < lengths[:, None]) & ~support.any(-1)).any(-1)
        if bool(empty.any()):
            raise ValueError(f"marginals.node are not arc marginals of {type(self).__name__}"
                             f"{'(single_root=True)' if self.single_root else ''}: no tree lies on the arcs they "
                             f"give mass to (e.g. crossing arcs for Projective) for examples "
                             f"{empty.nonzero().flatten()[:10].tolist()}")
        theta = torch.log(mu.clamp_min(torch.finfo(dtype).tiny))       # exact for independent heads
        if start is not None:
            # a start that forbids an arc of the support is none: that example starts from log mu
            usable = torch.where(support, torch.isfinite(start), True).flatten(1).all(-1)
            theta = torch.where(usable[:, None, None], start, theta)
        theta = torch.where(support, theta, ninf)
        edge = mu.new_zeros(c, c)

        def evaluate(th: Tensor, idx: Tensor) -> tuple[Tensor, Tensor]:
            m = self.marginals(_unchecked(PairwisePotentials, th, edge, lengths[idx]))
            f = m.log_partition - torch.where(support[idx], th * mu[idx], zero).flatten(1).sum(-1)
            return f, m.node

        f, cur = evaluate(theta, torch.arange(b, device=device))
        tol = 1e3 * eps
        active = torch.arange(b, device=device)
        scaled = torch.zeros(b, dtype=torch.bool, device=device)        # rows on the Jacobi-scaled iteration
        v = n * c
        for _ in range(max_iter):
            if active.numel() == 0:
                break
            g = torch.where(support[active], cur[active] - mu[active], zero)            # grad of log Z - <th, mu>
            done = g.flatten(1).abs().amax(-1) <= tol
            active, g = active[~done], g[~done]
            if active.numel() == 0:
                break
            hess = self._covariance(theta[active], cur[active], support[active], lengths[active])
            # Newton step with the pseudo-inverse (Cov is singular along each word's head-sum and other
            # equalities of the polytope; the gradient has no component there).  Rows that stalled with gradient
            # left along the eigenvectors cut go on with the Jacobi-scaled Hessian: the curvature along arcs of
            # tiny marginals (a pair of arcs that only occur together, each at 7e-8, has 5e-15 at log mu) lies
            # below the rounding of the largest eigenvalue, and unscaled the iteration never moved them.  Not from
            # the start: entries of Cov with only absolute accuracy (Projective's, differences of clamped
            # marginals) make the scaled steps of near-deterministic arcs noise, where the unscaled iteration
            # converges
            diag = torch.diagonal(hess, dim1=1, dim2=2)
            jacobi = torch.where(diag > 0, diag.clamp_min(torch.finfo(dtype).tiny).rsqrt(), zero)
            scale = torch.where(scaled[active, None], jacobi, support[active].flatten(1).to(dtype))
            evals, evecs = torch.linalg.eigh(scale[:, :, None] * hess * scale[:, None, :])
            top = evals.amax(-1, keepdim=True)
            cut = top * v * eps * 10
            gf = g.reshape(-1, v)
            g_eig = (evecs.transpose(1, 2) @ (scale * gf)[..., None]).squeeze(-1)

            lam = torch.zeros(active.numel(), dtype=dtype, device=device)
            step, slope = _damped_step(evals, evecs, g_eig, gf, cut, lam, support[active], scale)   # -(decrement)^2
            # stop where the predicted decrease is below the rounding of F: H is then exact to rounding
            far = -slope > 10 * eps * f[active].abs().clamp_min(1.0)
            unseen = torch.where(evals > cut, zero, g_eig).norm(dim=-1) > tol      # gradient the cut ignores
            stalled = active[~far & ~scaled[active] & unseen]
            scaled[stalled] = True
            keep = torch.nonzero(far).flatten()
            active, step, slope, top, evals, evecs, g_eig, gf, cut, scale, unseen = (
                x[keep] for x in (active, step, slope, top, evals, evecs, g_eig, gf, cut, scale, unseen))
            if active.numel() == 0:
                active = stalled
                continue
            pending = torch.arange(active.numel(), device=device)
            moved = torch.zeros(active.numel(), dtype=torch.bool, device=device)
            # the full Newton step, then ever more damped ones: directions of rounding-level curvature (arcs of
            # near-deterministic marginals) can make the undamped step useless at any length
            for k in range(30):
                if k:
                    lam = top[pending, 0] * 10.0 ** (k - 16)
                    step_p, slope_p = _damped_step(evals[pending], evecs[pending], g_eig[pending], gf[pending],
                                                   cut[pending], lam, support[active[pending]], scale[pending])
                else:
                    step_p, slope_p = step, slope
                rows = active[pending]
                th = torch.where(support[rows], theta[rows] + step_p, ninf)
                f_new, m_new = evaluate(th, rows)
                ok = torch.isfinite(f_new) & (f_new <= f[rows] + 1e-4 * slope_p)
                if ok.any():
                    r = rows[ok]
                    theta[r], f[r], cur[r] = th[ok], f_new[ok], m_new[ok]
                    moved[pending[ok]] = True
                pending = pending[~ok]
                if pending.numel() == 0:
                    break
            # no decrease: at the rounding floor (once scaled), or on to the scaled iteration
            again = active[~moved & ~scaled[active] & unseen]
            scaled[again] = True
            active = torch.cat([active[moved], again, stalled])
        return f

    @staticmethod
    def _clamp_each(theta: Tensor, support: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """One copy of ``theta`` per supported arc ``a = (h -> m)`` with all other heads of ``m`` set to ``-inf``
        [K, N, C], and the arcs' example, word and head indices [K]."""
        bi, mi, hi = support.nonzero().unbind(1)
        k = torch.arange(len(bi), device=theta.device)
        clamped = theta[bi].clone()
        keep = torch.nn.functional.one_hot(hi, theta.shape[-1]).bool()
        clamped[k, mi] = torch.where(keep, clamped[k, mi], -torch.inf)
        return clamped, bi, mi, hi

    def _structural(self, support: Tensor, lengths: Tensor, in_all_too: bool = True) -> tuple[Tensor, Tensor]:
        """The arcs of ``support`` (node layout [B, N, C]) that lie in no tree and in every tree made of supported
        arcs, exactly: the oracle's marginals put rounding-level mass, not 0, on arcs in no tree (and leave
        arcs in every tree near 1, not at it).  Candidates are the arcs whose marginal under equal scores lies
        within 1e-6 of 0 or 1; each is decided by ``log Z`` with the arc forced (its word's other heads removed)
        and with it removed, ``-inf`` when no tree is left.  ``in_all_too=False`` decides the first kind only
        (the second comes back all False)."""
        in_none, in_all = torch.zeros_like(support), torch.zeros_like(support)
        if not support.any():
            return in_none, in_all
        theta = torch.zeros(support.shape, dtype=torch.float64, device=support.device).masked_fill(~support,
                                                                                                    -torch.inf)
        edge = theta.new_zeros(theta.shape[-1], theta.shape[-1])
        log_z0, marg = self._marginals_core(*self._scores(_unchecked(PairwisePotentials, theta, edge, lengths)),
                                            strict=False)
        marg = marg[:, :, 1:].transpose(1, 2)                                 # node layout
        near = (marg < 1e-6) | (marg > 1.0 - 1e-6) if in_all_too else marg < 1e-6
        no_tree = log_z0 == -torch.inf                    # their marginals are meaningless: no arc is in a tree
        in_none[no_tree] = support[no_tree]
        near &= ~no_tree[:, None, None]
        forced, bi, mi, hi = self._clamp_each(theta, support & near)
        copies = [forced]
        if in_all_too:
            removed = theta[bi].clone()
            removed[torch.arange(len(bi), device=theta.device), mi, hi] = -torch.inf
            copies.append(removed)
        scores, lens = self._scores(_unchecked(PairwisePotentials, torch.cat(copies), edge,
                                               lengths[bi].repeat(len(copies))))
        log_z, _ = self._marginals_core(scores, lens, strict=False)
        in_none[bi, mi, hi] = log_z[:len(bi)] == -torch.inf
        if in_all_too:
            in_all[bi, mi, hi] = log_z[len(bi):] == -torch.inf
        return in_none, in_all

    def _covariance(self, theta: Tensor, mu: Tensor, support: Tensor, lengths: Tensor) -> Tensor:
        """``Cov(z_a, z_b) = mu_a (mu_b | arc a) - mu_a mu_b`` [B, V, V] (V = N (N+1)), by clamping every
        supported arc ``a = (h -> m)`` (all other heads of ``m`` set to ``-inf``) in one batched oracle call."""
        b, n, c = theta.shape
        v = n * c
        clamped, bi, mi, hi = self._clamp_each(theta, support)
        edge = theta.new_zeros(c, c)
        cond = self.marginals(_unchecked(PairwisePotentials, clamped, edge, lengths[bi])).node   # [K, N, C]
        flat_mu = mu.reshape(b, v)
        a = mi * c + hi
        hess = theta.new_zeros(b, v, v)
        hess[bi, a] = flat_mu[bi, a, None] * (cond.reshape(-1, v) - flat_mu[bi])
        hess = 0.5 * (hess + hess.transpose(1, 2))
        return torch.where(support.reshape(b, v, 1) & support.reshape(b, 1, v), hess, torch.zeros((), dtype=hess.dtype))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(single_root={self.single_root})"
