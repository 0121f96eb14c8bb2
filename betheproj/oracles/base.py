"""Containers and the oracle protocol shared by every pairwise structure.

A pairwise model over ``N`` positions with ``C`` labels is described by node scores ``[B, N, C]`` and
edge scores ``[B, N-1, C, C]`` (or one shared ``[C, C]`` table).  Edge ``k`` couples node ``parent[k+1]``
(rows) with node ``k+1`` (columns); for a linear chain ``parent[k+1] = k``, so a chain is the tree whose
parent array is ``[-1, 0, 1, ..., N-2]``.  Positions at or past ``lengths[b]`` are padding and are ignored.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, NoReturn, Protocol, TypeVar, cast, overload, runtime_checkable

import torch
from torch import Tensor

from .._checks import check_int, check_integer_vector, check_type

__all__ = ["PairwisePotentials", "ChainPotentials", "Marginals", "Oracle", "bethe_entropy", "log_partition",
           "tree_parents", "has_pairwise_factors", "keeps_width", "edge_row_ends"]


def _check_float(name: str, x: object, ndim: tuple[int, ...]) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"{name} must be a float32 or float64 tensor, got {x.dtype}")
    if x.dim() not in ndim:
        shapes = " or ".join(f"{d}-D" for d in ndim)
        raise ValueError(f"{name} must be {shapes}, got shape {tuple(x.shape)}")
    if torch.isnan(x).any():
        raise ValueError(f"{name} contains NaN")
    if torch.isposinf(x).any():
        raise ValueError(f"{name} contains +inf (scores must be finite or -inf)")
    return x


def _check_lengths(lengths: object, batch: int, n: int, device: torch.device) -> Tensor:
    if lengths is None:
        return torch.full((batch,), n, dtype=torch.long, device=device)
    if not isinstance(lengths, Tensor):
        try:
            lengths = torch.as_tensor(lengths)
        except (TypeError, ValueError, RuntimeError):
            raise TypeError(f"lengths must be an integer tensor or a sequence of ints, got {lengths!r}") from None
    if lengths.is_floating_point() or lengths.is_complex() or lengths.dtype == torch.bool:
        raise TypeError(f"lengths must be an integer tensor, got {lengths.dtype}")
    if lengths.shape != (batch,):
        raise ValueError(f"lengths must have shape [B]=({batch},), got {tuple(lengths.shape)}")
    if batch and (int(lengths.min()) < 1 or int(lengths.max()) > n):
        raise ValueError(f"lengths must lie in [1, N]=[1, {n}], got values in "
                         f"[{int(lengths.min())}, {int(lengths.max())}]")
    return lengths.to(device=device, dtype=torch.long)


class PairwisePotentials:
    """Log-potentials ``theta`` of a pairwise MRF: ``node`` [B, N, C], ``edge`` [B, N-1, C, C] or [C, C].

    Entries may be ``-inf`` (forbidden labels or transitions) but not NaN or ``+inf``.  ``lengths`` [B]
    (default: all ``N``) marks the valid prefix of every example.
    """

    __slots__ = ("node", "edge", "lengths")

    def __init__(self, node: Tensor, edge: Tensor, lengths: Tensor | None = None):
        node = _check_float("node", node, (3,))
        b, n, c = node.shape
        if c == 0:
            raise ValueError("node has an empty label set (C = 0)")
        if n == 0:
            raise ValueError("node has no positions (N = 0)")
        edge = _check_float("edge", edge, (2, 4))
        expected = (b, n - 1, c, c)
        if edge.dim() == 2 and edge.shape != (c, c):
            raise ValueError(f"edge must be [C, C]=({c}, {c}) or [B, N-1, C, C]={expected}, "
                             f"got {tuple(edge.shape)}")
        if edge.dim() == 4 and edge.shape != expected:
            raise ValueError(f"edge must be [B, N-1, C, C]={expected} or [C, C], got {tuple(edge.shape)}")
        if edge.dtype != node.dtype:
            raise TypeError(f"edge dtype {edge.dtype} does not match node dtype {node.dtype}")
        if edge.device != node.device:
            raise ValueError(f"edge is on {edge.device} but node is on {node.device}")
        self.node = node
        self.edge = edge
        self.lengths = _check_lengths(lengths, b, n, node.device)

    @property
    def shape(self) -> tuple[int, int, int]:
        return tuple(self.node.shape)  # type: ignore[return-value]

    @property
    def shared_edge(self) -> bool:
        return self.edge.dim() == 2

    def full_edge(self) -> Tensor:
        """Edge scores as [B, N-1, C, C] (a view when shared)."""
        b, n, c = self.node.shape
        return self.edge.expand(b, n - 1, c, c) if self.shared_edge else self.edge

    def index(self, idx: Tensor) -> PairwisePotentials:
        """The sub-batch ``idx`` (``self`` itself when ``idx`` is the whole batch in order: no copy)."""
        if _whole_batch(idx, self.node.shape[0]):
            return self
        edge = self.edge if self.shared_edge else self.edge[idx]
        return _unchecked(PairwisePotentials, self.node[idx], edge, self.lengths[idx])

    def shifted(self, node: Tensor | None, edge: Tensor | None) -> PairwisePotentials:
        """``theta + delta`` for finite offsets ``delta`` (``None`` = zero); ``-inf`` entries stay ``-inf``."""
        new_node = self.node if node is None else self.node + node
        new_edge = self.edge if edge is None else self.edge + edge
        return _unchecked(PairwisePotentials, new_node, new_edge, self.lengths)

    def detach(self) -> PairwisePotentials:
        """The same potentials cut from the autograd graph (``self`` where neither tensor requires grad)."""
        if not (self.node.requires_grad or self.edge.requires_grad):
            return self
        node, edge = (x.detach() if x.requires_grad else x for x in (self.node, self.edge))
        return _unchecked(PairwisePotentials, node, edge, self.lengths)

    def to(self, device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> PairwisePotentials:
        """The same potentials on ``device`` and/or in ``dtype`` (float32 or float64), checked again: finite
        scores beyond float32's range are refused, not turned into infinities; ``self`` when nothing changes."""
        node, edge = self.node.to(device=device, dtype=dtype), self.edge.to(device=device, dtype=dtype)
        if node is self.node and edge is self.edge:
            return self
        if dtype is not None and dtype != self.node.dtype:
            for name, old, new in (("node", self.node, node), ("edge", self.edge, edge)):
                if bool((torch.isfinite(old) & ~torch.isfinite(new.to(old.device))).any()):
                    raise ValueError(f"{name} holds finite scores beyond the range of {dtype}")
        return PairwisePotentials(node, edge, self.lengths.to(device=node.device))

    def __repr__(self) -> str:
        return (f"PairwisePotentials(node={tuple(self.node.shape)}, edge={tuple(self.edge.shape)}, "
                f"dtype={self.node.dtype})")


ChainPotentials = PairwisePotentials
"""The potentials of a :class:`~betheproj.LinearChain` (the same container as for trees)."""


def _whole_batch(idx: Tensor, b: int) -> bool:
    """Whether ``idx`` is the whole batch ``0..b-1`` in order (callers then use the whole tensors, no copy)."""
    return idx.numel() == b and bool((idx == torch.arange(b, device=idx.device)).all())


_P = TypeVar("_P", bound=PairwisePotentials)


def _unchecked(cls: type[_P], node: Tensor, edge: Tensor, lengths: Tensor) -> _P:
    obj = cls.__new__(cls)
    obj.node, obj.edge, obj.lengths = node, edge, lengths
    return obj


def _valid_node(pot: PairwisePotentials) -> tuple[Tensor, Tensor]:
    """Node scores zeroed past each length [B, N, C], and the mask of valid positions [B, N]."""
    b, n, _ = pot.node.shape
    valid = torch.arange(n, device=pot.node.device) < pot.lengths[:, None]
    return torch.where(valid[..., None], pot.node, torch.zeros((), dtype=pot.node.dtype)), valid


def _finite_max(x: Tensor, dim: int | tuple[int, ...]) -> Tensor:
    """``x.amax(dim, keepdim=True)`` with 0 where that maximum is not finite (all ``-inf``): the shift of
    max-shifted scores."""
    m = x.amax(dim, keepdim=True)
    return torch.where(torch.isfinite(m), m, torch.zeros((), dtype=x.dtype, device=x.device))


def _two_sum(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """``a + b`` rounded and its exact rounding error (Knuth's TwoSum), the error 0 where the sum is infinite (NaN
    there, and only there)."""
    s = a + b
    bv = s - a
    return s, ((a - (s - bv)) + (b - bv)).nan_to_num_(0.0)


def _split_sum(x: Tensor, dim: int = -1) -> tuple[Tensor, Tensor]:
    """The sum of finite ``x`` over ``dim`` in two parts: pairwise sums and their exact rounding errors (TwoSum)
    apart, so that huge terms that cancel (``-1e15 + 0.3 + 1e15``) leave their O(1) part (a plain sum rounds
    ``-1e15 + 0.3`` to a multiple of 0.125 first)."""
    x = x.movedim(dim, 0)
    err = x.new_zeros(x.shape[1:])
    if x.shape[0] == 0:
        return err.clone(), err
    while x.shape[0] > 1:
        half = x.shape[0] // 2
        s, e = _two_sum(x[:half], x[half:2 * half])
        err = err + e.sum(0)
        x = torch.cat([s, x[2 * half:]]) if x.shape[0] % 2 else s
    return x[0], err


def _sum_shifts(*terms: tuple[Tensor, int]) -> tuple[Tensor, Tensor]:
    """The total [B] of the shifts ``terms`` (each a tensor and the dimension to sum), to which only O(1) terms
    are added after (a fast path's log-normalisers): in two parts (:func:`_split_sum`) where large ones cancel,
    else the plain sum and 0, whose rounding error (at most ``n eps sum |x|``) is then of order ``n eps``
    relative to the total."""
    plain = cast(Tensor, sum(x.sum(dim) for x, dim in terms))       # a tensor: there is always a term
    size = sum(x.abs().sum(dim) for x, dim in terms)
    if not bool((size > 4 * (plain.abs() + 1)).any()):
        return plain, torch.zeros_like(plain)
    big, small = _split_sum(*terms[0])
    for x, dim in terms[1:]:
        big, small = _split_add(big, small, *_split_sum(x, dim))
    return big, small


@overload
def _max_shifted(pot: PairwisePotentials, errors: Literal[True] = True
                 ) -> tuple[PairwisePotentials, tuple[Tensor, Tensor], Tensor, Tensor]: ...
@overload
def _max_shifted(pot: PairwisePotentials, errors: bool
                 ) -> tuple[PairwisePotentials, tuple[Tensor, Tensor], Tensor | None, Tensor | None]: ...

def _max_shifted(pot: PairwisePotentials, errors: bool = True) -> tuple[PairwisePotentials, tuple[Tensor, Tensor],
                                                                          Tensor | None, Tensor | None]:
    """New potentials (no tensor shared with ``pot``): node scores zeroed past each length, each position's node
    scores and each edge table ([B, N-1, C, C]) shifted by their (finite) maximum; the total shift per example in
    two parts ([B] each, :func:`_split_sum`; with ``errors=False`` a plain sum and 0), which only rescales Z;
    and the rounding errors of the shifted node and edge scores (``None`` each with ``errors=False``, for
    max-product, which has no use for them: the same shifted scores, as ``a + (-b)`` is ``a - b``, without the
    TwoSum passes over every [C, C] table).  Exact recursions run on them so that a huge constant cannot absorb
    the O(1) scores beside it."""
    node, _ = _valid_node(pot)
    edge = pot.full_edge()
    zero = torch.zeros((), dtype=node.dtype, device=node.device)
    node_max, edge_max = _finite_max(node, -1), _finite_max(edge, (-1, -2))
    edge_valid = torch.arange(edge.shape[1], device=node.device) < (pot.lengths[:, None] - 1)
    edge_shift = torch.where(edge_valid, edge_max[..., 0, 0], zero)
    if not errors:                      # max-product has no use for the shift either: summed plainly
        total = node_max[..., 0].sum(-1) + edge_shift.sum(-1)
        return (_unchecked(PairwisePotentials, node - node_max, edge - edge_max, pot.lengths.clone()),
                (total, torch.zeros_like(total)), None, None)
    shift = _split_add(*_split_sum(node_max[..., 0]), *_split_sum(edge_shift))
    (node, node_err), (edge, edge_err) = _two_sum(node, -node_max), _two_sum(edge, -edge_max)
    return _unchecked(PairwisePotentials, node, edge, pot.lengths.clone()), shift, node_err, edge_err


# Exact log-space recursions carry every log-mass in two parts, ``big + small``: ``big`` is formed by max-plus
# (the best score, as Viterbi forms it) and ``small`` holds the log-sum corrections and the exact rounding errors
# of every sum of ``big`` parts.  Apart, no O(1) quantity is rounded away beside a huge score (``lse(-P, -P) =
# -P + log 2`` and ``-P + 1`` are ``-P`` in floats once ``P >> 1/eps``); ``small`` is rounded at its own scale.

def _split_add(big: Tensor, small: Tensor, other_big: Tensor, other_small: Tensor) -> tuple[Tensor, Tensor]:
    """The sum of two two-part log-masses, the rounding error of the ``big`` sum moved into ``small``."""
    total, err = _two_sum(big, other_big)
    return total, small + other_small + err


def _split_lse(big: Tensor, small: Tensor, dim: int) -> tuple[Tensor, Tensor]:
    """``logsumexp(big + small, dim)`` in two parts: ``big.amax(dim)`` and ``logsumexp(big - max + small, dim)``
    (0 where the max is ``-inf``).  ``small`` must be finite."""
    top = big.amax(dim, keepdim=True)
    live = torch.isfinite(top)
    corr = torch.logsumexp(big - torch.where(live, top, 0.0) + small, dim, keepdim=True)
    return top.squeeze(dim), torch.where(live, corr, 0.0).squeeze(dim)


def _recentre(big: Tensor, small: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Two-part log-masses [..., C] less their maxima over the last dimension (the finite one of ``big``), and
    those maxima [...]."""
    big_max = _finite_max(big, -1)
    big, err = _two_sum(big, -big_max)
    small = small + err
    small_max = small.amax(-1, keepdim=True)
    return big, small - small_max, big_max[..., 0], small_max[..., 0]


def _split_softmax(big: Tensor, small: Tensor) -> Tensor:
    """``softmax(big + small, -1)`` of two-part log-masses, ``big`` re-centred before the sum."""
    return torch.softmax(big - _finite_max(big, -1) + small, -1)


class Marginals:
    """Node marginals [B, N, C], edge marginals [B, N-1, C, C] and ``log_partition`` [B].

    Padding positions hold zeros.  Edge marginals may be computed lazily on first access (an oracle that
    can skip them when no one asks, does); ``has_edge`` tells whether they are already materialised.

    ``near`` (optional): potentials whose marginals lie close to these, a start for an oracle whose entropy at
    marginals it did not return is solved for by iteration (the dependency trees' conjugate entropy); the
    solvers set it on the averages of the accelerated method.  Other oracles ignore it.
    """

    def __init__(self, node: Tensor, edge: Tensor | Callable[[], Tensor] | None,
                 log_partition: Tensor | None, lengths: Tensor, *,
                 edge_total: Tensor | Callable[[], Tensor] | None = None, near: PairwisePotentials | None = None):
        self.node = node
        self.near = near
        self._edge = edge
        self.log_partition = log_partition
        self.lengths = lengths
        # optional ``weights [B] -> sum_{b,t} w_b edge[b, t]`` without materialising
        self.edge_sum: Callable[[Tensor], Tensor] | None = None
        self._edge_total = edge_total

    @property
    def edge(self) -> Tensor:
        if callable(self._edge):
            self._edge = self._edge()
        if self._edge is None:
            raise AttributeError("these marginals carry no edge marginals")
        return self._edge

    def edge_total(self) -> Tensor:
        """``sum_t edge[b, t]`` [B, C, C], each example's edge marginals summed over its valid positions (an
        oracle or a solver may provide them without materialising the per-position edges)."""
        if callable(self._edge_total):
            self._edge_total = self._edge_total()
        if self._edge_total is None:
            edge = self.edge
            b, t, *pair = edge.shape      # a product with the mask [B, 1, N-1]: no [B, N-1, C, C] temporary
            mask = self.edge_mask().to(edge.dtype)[:, None, :]
            self._edge_total = torch.bmm(mask, edge.reshape(b, t, pair[0] * pair[1])).reshape(b, *pair)
        return self._edge_total

    @property
    def has_edge(self) -> bool:
        return isinstance(self._edge, Tensor)

    @property
    def totals_only(self) -> bool:
        """Whether these marginals carry edge totals but no per-position edges (the solvers' shared-transition
        path hands such marginals to energies with ``edge_totals``)."""
        return self._edge is None and self._edge_total is not None

    @property
    def batch_size(self) -> int:
        return self.node.shape[0]

    def node_mask(self) -> Tensor:
        """[B, N] True at valid positions."""
        n = self.node.shape[1]
        return torch.arange(n, device=self.node.device) < self.lengths[:, None]

    def edge_mask(self) -> Tensor:
        """[B, N-1] True at valid edges."""
        n = self.node.shape[1]
        return torch.arange(n - 1, device=self.node.device) < (self.lengths[:, None] - 1)

    def __repr__(self) -> str:
        return f"Marginals(node={tuple(self.node.shape)}, dtype={self.node.dtype})"


def _log_partition_of(m: Marginals) -> Tensor:
    """``m.log_partition`` of marginals that carry one: an oracle's or a solution's (not the solver's own points,
    :meth:`~betheproj.inference.state.SolverState._point`, whose ``log_partition`` is ``None``)."""
    assert m.log_partition is not None
    return m.log_partition


def check_potentials(potentials: object) -> PairwisePotentials:
    """``potentials`` if it is a :class:`PairwisePotentials` (``ChainPotentials``), else a ``TypeError``."""
    if not isinstance(potentials, PairwisePotentials):
        raise TypeError(f"potentials must be PairwisePotentials/ChainPotentials, got {type(potentials).__name__}")
    return potentials


def check_marginals(marginals: object) -> Marginals:
    """``marginals`` if it is a :class:`Marginals`, else a ``TypeError``."""
    if not isinstance(marginals, Marginals):
        raise TypeError(f"marginals must be Marginals (an oracle's output), got {type(marginals).__name__}")
    return marginals


NO_LABELLING = "potentials admit no labelling of finite score (every labelling has a -inf potential)"


def raise_if_not_finite(score: Tensor, infeasible: str = NO_LABELLING, examples: Tensor | None = None) -> None:
    """A ``ValueError`` naming the examples (``examples[b]``, default ``b``) whose ``score`` [B] (``log Z`` or a
    best score) is not finite: ``infeasible`` where it is ``-inf``, an overflow message where it is ``+inf``."""
    bad = ~torch.isfinite(score)
    if not bad.any():
        return
    index = torch.arange(len(score), device=score.device) if examples is None else examples
    neg = bad & (score == float("-inf"))
    if neg.any():
        raise ValueError(f"{infeasible} for examples {index[neg][:10].tolist()}")
    remedy = "rescale them" + (" or use float64" if score.dtype != torch.float64 else "")
    raise ValueError(f"scores overflow {str(score.dtype).replace('torch.', '')} (log Z or a best score is not finite; "
                     f"{remedy}) for examples {index[bad][:10].tolist()}")


def _plogp(p: Tensor) -> Tensor:
    """``p log p``, 0 where ``p <= 0``."""
    if not p.requires_grad:
        # one new tensor, not five (edge-sized marginals); a negative p (rounding) gives log's NaN, set to 0 in place
        return torch.special.xlogy(p, p).nan_to_num_(0.0, float("inf"), float("-inf"))
    # differentiable at p = 0 (xlogy's gradient there is -inf): the masked branch's is finite
    return torch.where(p > 0, p * torch.log(p.clamp_min(torch.finfo(p.dtype).tiny)), torch.zeros_like(p))


def bethe_entropy(node: Tensor, edge: Tensor, degree: Tensor) -> Tensor:
    """Bethe entropy ``H_B = sum_e H(mu_e) - sum_n (d_n - 1) H(mu_n)`` [B] (exact on trees).

    ``degree`` [B, N] holds each node's number of valid edges and 0 at padding; padded marginals are zero.
    """
    for name, x in (("node", node), ("edge", edge), ("degree", degree)):
        check_type(name, x, Tensor, "a tensor")
    if node.dim() != 3 or edge.dim() != 4 or degree.shape != node.shape[:2] or edge.shape[0] != node.shape[0] \
            or edge.shape[2:] != (node.shape[2], node.shape[2]):
        raise ValueError(f"node [B, N, C], edge [B, E, C, C] and degree [B, N] must agree, got shapes "
                         f"{tuple(node.shape)}, {tuple(edge.shape)} and {tuple(degree.shape)}")
    h_node = -_plogp(node).sum(-1)
    h_edge = -_plogp(edge).sum((-1, -2))
    return h_edge.sum(-1) - ((degree - 1) * h_node).sum(-1)


@runtime_checkable
class Oracle(Protocol):
    """A tractable base structure: marginal inference, MAP and the Bethe entropy.

    Optionally ``support(potentials) -> Tensor`` [B, N, C] (bool): the node entries some configuration with
    finite score uses.  An oracle whose marginals can put rounding-level mass elsewhere (the matrix-tree
    theorem on arcs that lie in no tree) provides it, so that the solvers do not read that noise as mass.

    Optionally ``parents`` (a parent array [N], or ``None``): an oracle whose edges are not a chain's says
    which nodes each edge couples (edge ``k``: node ``parents[k+1]`` with node ``k+1``), so that the score of
    a labelling, ``<theta, S(y)>``, pairs the right labels (:func:`tree_parents`).

    Optionally ``check_labels(labels, lengths, name)``: a ``ValueError`` (naming ``name[i]``) for labellings
    [B, N] that are not configurations of the structure although every label is in range (dependency heads that
    are not a tree); the learners call it on gold labels, whose loss would otherwise be that of an impossible
    structure.

    Optionally ``pairwise_factors`` (a bool, ``True`` when absent): ``False`` for a structure without pairwise
    factors (the dependency oracles, whose tree constraint replaces them), which refuses non-zero edge potentials
    and whose edge marginals are all-zero placeholders.  A labelling's ``S(y)`` then has all-zero edge parts too
    (:func:`has_pairwise_factors`), so that an energy reads the same kind of statistics on ``S(y)`` as on
    ``mu``, and the losses' edge gradients ``mu - S(y)`` are zero rather than steps the oracle would refuse; the
    solvers and the surrogate likelihood drop an energy's edge gradient there (edge terms are constant).

    Optionally ``positional_labels`` (a bool, ``False`` when absent): ``True`` where the labels are positions of
    the example (a dependency tree's heads, ``C = N + 1``), so that a batch keeps its full width: trimming the
    padding would change the label set of a model whose columns are positions (:func:`keeps_width`).

    Optionally ``per_example_edges`` (a bool, ``False`` when absent): ``True`` where per-position edge potentials
    that are one [C, C] table per example viewed over the positions (stride 0) cost no more than shared ones and
    the marginals' ``edge_total()`` is cheap (:class:`~betheproj.LinearChain`); the solvers then keep one edge
    offset per example for energies that declare ``Energy.edge_totals``.
    """

    def marginals(self, potentials: PairwisePotentials) -> Marginals:
        """Node (and edge) marginals and ``log Z`` [B] of the MRF with log-potentials ``potentials`` (eq. 1's
        optimum); zero past each example's length."""
        ...

    def map(self, potentials: PairwisePotentials) -> Tensor:
        """The most probable configuration (eq. 3): labels [B, N] (long), ``-1`` past each length."""
        ...

    def entropy(self, marginals: Marginals) -> Tensor:
        """The Bethe entropy ``H_B(mu)`` [B] of ``marginals`` (exact on trees)."""
        ...

    def degree(self, lengths: Tensor, n: int) -> Tensor:
        """How many edges touch each node [B, N] (the counting numbers of ``H_B``), for lengths ``lengths``."""
        ...


def check_degree_args(lengths: object, n: object) -> int:
    """``n`` as an int >= 0 once ``lengths`` is known to be an integer tensor [B]: the arguments of an oracle's
    ``degree`` (the lengths' values are the marginals' own, checked where those were made)."""
    check_integer_vector("lengths", lengths)
    return check_int("n", n, 0)


def tree_parents(oracle: Oracle, n: int) -> Tensor | None:
    """The parent array [N] of ``oracle``'s structure (its ``parents``), or ``None`` for a chain (edge ``k``
    couples nodes ``k`` and ``k+1``); a ``ValueError`` if the tree has other than ``n`` nodes."""
    parents = getattr(oracle, "parents", None)
    if parents is None:
        return None
    if len(parents) != n:
        raise ValueError(f"potentials have N={n} positions but the oracle's tree has {len(parents)} nodes")
    return torch.as_tensor(parents, dtype=torch.long)


def keeps_width(oracle: Oracle, n: int) -> bool:
    """Whether a batch of width ``n`` for ``oracle`` must keep it rather than lose its padding: a tree's structure
    has ``n`` nodes (``parents``; a ``ValueError`` for a tree of another size, see :func:`tree_parents`), and
    positional labels (``positional_labels``: dependency heads) are ``n + 1`` whatever the lengths."""
    return tree_parents(oracle, n) is not None or bool(getattr(oracle, "positional_labels", False))


def has_pairwise_factors(oracle: Oracle) -> bool:
    """Whether ``oracle``'s structure has pairwise factors (its ``pairwise_factors``, ``True`` when absent): where
    it has none (the dependency oracles), the edge parts of a labelling's ``S(y)`` are zero, as are its
    marginals' edges."""
    return bool(getattr(oracle, "pairwise_factors", True))


def edge_row_ends(x: Tensor, parents: Tensor | None) -> Tensor:
    """``x`` [B, N, ...] at the row end of every edge, [B, N-1, ...]: node ``k`` on a chain (``parents=None``),
    node ``parents[k+1]`` on a tree (the column end is always ``x[:, 1:]``)."""
    check_type("x", x, Tensor, "a tensor [B, N, ...]")
    if x.dim() < 2:
        raise ValueError(f"x must be a tensor [B, N, ...], got shape {tuple(x.shape)}")
    if parents is not None:
        if not isinstance(parents, Tensor) or parents.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"parents must be None or an integer tensor [N], got {type(parents).__name__}"
                            f"{f' of {parents.dtype}' if isinstance(parents, Tensor) else ''}")
        if parents.shape != (x.shape[1],):
            raise ValueError(f"parents must be [N] with N = {x.shape[1]} (x's positions), got {tuple(parents.shape)}")
    return x[:, :-1] if parents is None else x[:, parents[1:].to(x.device)]


class _NoSecondDerivative(torch.autograd.Function):
    """Zero, whose derivative is an error.  Added to a gradient computed without autograd while autograd records
    the backward pass (``create_graph``, ``torch.autograd.functional.hessian``), so that differentiating that
    gradient raises instead of silently reading as 0."""

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        return torch.zeros((), dtype=x.dtype, device=x.device)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> NoReturn:
        raise RuntimeError("second derivatives of log Z are not implemented: its gradient, the marginals, comes "
                           "from the oracle, not from autograd")


def _first_order_only(grad: Tensor, wrt: Tensor) -> Tensor:
    """``grad`` (of ``log Z`` with respect to ``wrt``), made to raise if it is differentiated in turn."""
    return grad + _NoSecondDerivative.apply(wrt) if torch.is_grad_enabled() and wrt.requires_grad else grad


class _LogPartition(torch.autograd.Function):
    """``log Z(theta)`` whose gradient is the marginals: ``d log Z / d theta = mu`` (eq. 1's conjugacy); first
    order only (a second derivative is an error)."""

    @staticmethod
    def forward(ctx: Any, oracle: Oracle, node: Tensor, edge: Tensor, lengths: Tensor) -> Tensor:
        mu = oracle.marginals(_unchecked(PairwisePotentials, node, edge, lengths))
        ctx.mu, ctx.shared = mu, edge.dim() == 2
        ctx.save_for_backward(node, edge)
        return _log_partition_of(mu)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[None, Tensor, Tensor, None]:
        mu = ctx.mu
        g_node = grad[:, None, None] * mu.node
        if ctx.shared:
            g_edge = mu.edge_sum(grad) if mu.edge_sum is not None else torch.einsum("b,bnij->ij", grad, mu.edge)
        else:
            g_edge = grad[:, None, None, None] * mu.edge
        node, edge = ctx.saved_tensors
        return None, _first_order_only(g_node, node), _first_order_only(g_edge, edge), None


def log_partition(oracle: Oracle, potentials: PairwisePotentials) -> Tensor:
    """Differentiable ``log Z`` [B]: autograd returns the node and edge marginals as its gradient, so a CRF
    likelihood ``<theta, S(y)> - log Z`` can be trained through any oracle."""
    potentials = check_potentials(potentials)
    return _LogPartition.apply(oracle, potentials.node, potentials.edge, potentials.lengths)
