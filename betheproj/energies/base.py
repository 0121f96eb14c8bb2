"""Non-local energies ``L_psi(mu)`` on marginals (problem (2)).

An energy maps marginals to one value per example.  Subclasses implement :meth:`Energy.value`; the
gradient defaults to autograd, so any differentiable function of ``mu.node`` (and ``mu.edge``) works in
every solver.  Energies with a closed-form gradient override :meth:`Energy.grad`.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from numbers import Real
from typing import TYPE_CHECKING, cast, overload

import numpy as np
import torch
from torch import Tensor

from .._checks import check_real, check_type
from ..oracles.base import Marginals, check_marginals

__all__ = ["Energy", "Gradient", "EnergySum", "Scaled", "FunctionEnergy", "as_weight"]


class Gradient:
    """``dL/dmu`` with the layout of the marginals: ``node`` [B, N, C] and ``edge`` [B, N-1, C, C] or ``None``."""

    __slots__ = ("node", "edge")

    def __init__(self, node: Tensor | None, edge: Tensor | None = None):
        for name, x in (("node", node), ("edge", edge)):
            check_type(f"Gradient {name}", x, (Tensor, type(None)), "a tensor or None")
        self.node = node
        self.edge = edge

    def __add__(self, other: Gradient) -> Gradient:
        return Gradient(_add(self.node, other.node), _add(self.edge, other.edge))

    def scale(self, w: Tensor | float) -> Gradient:
        """Multiply by a scalar or a per-example weight [B]."""
        if isinstance(w, Tensor):
            # the batch of a part with one: not a [C, C] table, nor one viewed as [1, 1, C, C] for every example
            batched = [x for x in (self.node, self.edge) if x is not None and x.dim() >= 3 and x.shape[0] != 1]
            b = batched[0].shape[0] if batched else None
            if w.dim() > 1 or (w.dim() == 1 and b is not None and w.shape[0] != b):
                raise ValueError(f"w must be a scalar or a per-example weight [B] (B = {b}), got shape "
                                 f"{tuple(w.shape)}")
        elif isinstance(w, bool | np.bool_) or not isinstance(w, Real):
            raise TypeError(f"w must be a number or a tensor, got {type(w).__name__}")
        return Gradient(_scale(self.node, w), _scale(self.edge, w))


def _add(a: Tensor | None, b: Tensor | None) -> Tensor | None:
    if a is None:
        return b
    if b is None:
        return a
    return a + b


def _scale(x: Tensor | None, w: Tensor | float) -> Tensor | None:
    if x is None:
        return None
    if isinstance(w, Tensor) and w.dim() == 1:
        w = w.reshape(-1, *([1] * (x.dim() - 1)))
    return x * w


def as_weight(psi: float | Tensor, name: str = "psi") -> float | Tensor:
    """Validate a weight: a finite scalar or a tensor (shape checked by the energy that uses it)."""
    if isinstance(psi, Tensor):
        if not psi.is_floating_point():
            raise TypeError(f"{name} must be a float or a floating-point tensor, got {psi.dtype}")
        if not torch.isfinite(psi).all():
            raise ValueError(f"{name} must be finite")
        return psi
    if isinstance(psi, bool | np.bool_) or not isinstance(psi, Real):
        raise TypeError(f"{name} must be a float or a tensor, got {type(psi).__name__}")
    return check_real(name, psi)


@overload
def in_dtype(name: str, value: float, like: Tensor) -> float: ...
@overload
def in_dtype(name: str, value: Tensor, like: Tensor) -> Tensor: ...

def in_dtype(name: str, value: float | Tensor, like: Tensor) -> float | Tensor:
    """A finite weight or offset (a float, or a tensor then moved to ``like``'s dtype and device) that ``like``'s
    dtype can hold: one beyond its range (``psi=1e39`` with float32 marginals) is a ValueError, not an overflow
    error or an infinite energy.  A tensor is checked only where the cast narrows its dtype."""
    big = torch.finfo(like.dtype).max
    if not isinstance(value, Tensor):
        if abs(value) > big:
            raise ValueError(f"{name} = {value:g} is beyond what {like.dtype} can represent (~{big:.1e}): solve "
                             f"in float64 or rescale it")
        return value
    out = value.to(like)
    if value.is_floating_point() and torch.finfo(value.dtype).max > big and bool(torch.isinf(out).any()):
        worst = value[torch.isinf(out)].abs().max().item()
        raise ValueError(f"{name} holds a value of magnitude {worst:g}, beyond what {like.dtype} can represent "
                         f"(~{big:.1e}): solve in float64 or rescale it")
    return out


def weight_per_example(psi: float | Tensor, batch: int, like: Tensor, name: str = "psi") -> Tensor:
    """Broadcast a scalar or [B] weight to [B] in ``like``'s dtype and device."""
    if isinstance(psi, Tensor):
        if psi.dim() != 0 and psi.shape != (batch,):
            raise ValueError(f"{name} must be a scalar or have shape [B]=({batch},), got {tuple(psi.shape)}")
        return in_dtype(name, psi, like).expand(batch)
    return torch.full((batch,), in_dtype(name, psi, like), dtype=like.dtype, device=like.device)


class Energy:
    """A non-local energy ``L_psi(mu)``: :meth:`value` [B], :meth:`grad` (autograd unless overridden).

    ``value`` of example ``b`` must depend on ``mu[b]`` only.  Energies add with ``+`` and scale with
    ``w * energy`` (``w`` a float or a per-example [B] tensor).  A subclass's ``value``, ``grad`` and
    ``total_grad`` raise a ``TypeError`` when given anything but :class:`Marginals` (checked for them);
    shapes are :meth:`validate`'s to check, once per solve.

    ``edge_totals`` (default ``False``) declares that :meth:`value` and :meth:`grad` read edge marginals only
    through :meth:`Marginals.edge_total <betheproj.oracles.base.Marginals.edge_total>` (each example's sum
    over positions), or not at all, so the edge gradient is the same at every position of an example; the
    solver then keeps one [C, C] edge offset per example instead of one per position.
    """

    if TYPE_CHECKING:     # read-only to a type checker: a subclass may override it with a property
        @property
        def edge_totals(self) -> bool: ...
    else:
        edge_totals = False
    __array_ufunc__ = None      # ``ndarray * energy`` defers to __rmul__ (a TypeError), not an array of energies

    def __init_subclass__(cls, **kwargs: object) -> None:
        # every subclass's value / grad / total_grad takes Marginals or raises a TypeError that says so, not
        # an AttributeError from inside its body (``validate`` checks shapes; this checks only the type)
        super().__init_subclass__(**kwargs)
        for name in ("value", "grad", "total_grad"):
            method = cls.__dict__.get(name)
            if callable(method) and not getattr(method, _CHECKS_MARGINALS, False):
                setattr(cls, name, _taking_marginals(method))

    def value(self, marginals: Marginals) -> Tensor:
        """``L_psi(mu)`` [B], one value per example: the one method a new energy must write."""
        raise NotImplementedError(f"{type(self).__name__} must implement value(marginals)")

    def grad(self, marginals: Marginals) -> Gradient:
        """``dL/dmu`` by autograd through :meth:`value` (differentiable in ``psi`` while autograd records).

        A closed form that overrides this should stay a torch expression in ``psi``, so that learning can
        differentiate it (eq. 15)."""
        return autograd_gradient(self, marginals)

    def total_grad(self, marginals: Marginals) -> Gradient:
        """For an energy with ``edge_totals``: :meth:`grad` with its edge part as [B, C, C], the gradient at
        every position (by default read off :meth:`grad`, where a [C, C] table is kept as it is; closed forms skip
        the per-position tensor)."""
        g = self.grad(marginals)
        if g.edge is None or g.edge.dim() == 2:         # a [C, C] table is already the same at every position
            return g
        if g.edge.shape[1] == 0:                        # N = 1: no edges, nothing on them
            return Gradient(g.node, g.edge.new_zeros(g.edge.shape[0], *g.edge.shape[2:]))
        return Gradient(g.node, g.edge[:, 0])

    def validate(self, marginals: Marginals) -> None:
        """Raise ``ValueError`` if the energy does not fit marginals of this shape (called once by solvers; ``value``
        and ``grad`` trust marginals it has accepted), ``TypeError`` if ``marginals`` is not a Marginals."""
        check_marginals(marginals)

    def __add__(self, other: Energy) -> Energy:
        if not isinstance(other, Energy):
            return NotImplemented
        return EnergySum([self, other])

    def __radd__(self, other: object) -> Energy:
        if type(other) is int and other == 0:            # sum(energies) starts from 0
            return self
        return NotImplemented

    def __mul__(self, w: float | Tensor) -> Energy:
        return Scaled(self, w)

    __rmul__ = __mul__


_CHECKS_MARGINALS = "_checks_marginals"      # the flag of a method wrapped by _taking_marginals


def _taking_marginals(method: Callable[..., object]) -> Callable[..., object]:
    """``method(self, marginals, ...)`` that first checks that ``marginals`` is a :class:`Marginals`."""
    @wraps(method)
    def checked(self: Energy, marginals: Marginals, *args: object, **kwargs: object) -> object:
        check_marginals(marginals)
        return method(self, marginals, *args, **kwargs)

    setattr(checked, _CHECKS_MARGINALS, True)
    return checked


def check_value_shape(energy: Energy, value: object, b: int) -> Tensor:
    """``value``, ``energy``'s value on a batch of ``b`` examples, which must be a tensor [B] (a [B, 1] or scalar
    value would broadcast against the [B] objective)."""
    if not isinstance(value, Tensor) or value.shape != (b,):
        got = tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
        raise ValueError(f"{type(energy).__name__}.value must return a tensor of shape [B]=({b},), got {got}")
    return value


def autograd_gradient(energy: Energy, marginals: Marginals, create_graph: bool | None = None) -> Gradient:
    """Gradient of ``energy.value`` w.r.t. the node marginals and, if ``value`` reads them, the edge marginals
    (for marginals that carry only edge totals, the gradient in the totals, the same at every valid position).

    ``create_graph`` (default: whether autograd is recording at the call) keeps the gradient differentiable
    in the energy's parameters ``psi``, for the psi-gradient of learning (eqs. 14-15, by double backward).
    The solvers run without recording, so they get plain tensors.  A value that does not require grad (it does not
    depend on the marginals, or autograd cannot see that it does) has a zero gradient.
    """
    if not callable(getattr(energy, "value", None)):
        raise TypeError(f"energy must be an Energy (with a value method), got {type(energy).__name__}")
    check_marginals(marginals)
    if create_graph is None:
        create_graph = torch.is_grad_enabled()
    with torch.enable_grad():
        node = marginals.node.detach().requires_grad_(True)
        leaves: dict[str, Tensor] = {}

        def edge_leaf() -> Tensor:
            leaves["edge"] = marginals.edge.detach().requires_grad_(True)
            return leaves["edge"]

        def total_leaf() -> Tensor:
            leaves["edge"] = marginals.edge_total().detach().requires_grad_(True)
            return leaves["edge"]

        if marginals.totals_only:
            probe = Marginals(node, None, marginals.log_partition, marginals.lengths, edge_total=total_leaf)
        else:
            probe = Marginals(node, edge_leaf, marginals.log_partition, marginals.lengths)
        value = check_value_shape(energy, energy.value(probe), marginals.node.shape[0])
        if value.is_complex():
            raise TypeError(f"{type(energy).__name__}.value must return a real tensor, got {value.dtype}")
        inputs = [node] + ([leaves["edge"]] if "edge" in leaves else [])
        if not value.requires_grad:
            return Gradient(torch.zeros_like(node), None)
        grads = torch.autograd.grad(value.sum(), inputs, create_graph=create_graph, allow_unused=True)
    g_node = grads[0] if grads[0] is not None else torch.zeros_like(node)
    g_edge = grads[1] if len(grads) > 1 else None
    if g_edge is not None and marginals.totals_only:      # d/d edge[b, t] = d/d total[b] at valid positions
        mask = marginals.edge_mask()[..., None, None]
        g_edge = torch.where(mask, g_edge[:, None], torch.zeros((), dtype=g_edge.dtype))
    if not create_graph:
        g_node = g_node.detach()
        g_edge = None if g_edge is None else g_edge.detach()
    return Gradient(g_node, g_edge)


class EnergySum(Energy):
    """``L(mu) = sum_k L_k(mu)``."""

    def __init__(self, terms: list[Energy]):
        if isinstance(terms, Energy) or not isinstance(terms, list | tuple):
            raise TypeError(f"terms must be a list of Energy instances, got {type(terms).__name__}")
        if not terms:
            raise ValueError("terms must hold at least one Energy (an empty sum has no batch size or dtype)")
        flat: list[Energy] = []
        for term in terms:
            if not isinstance(term, Energy):
                raise TypeError(f"terms must be Energy instances, got {type(term).__name__}")
            flat.extend(term.terms if isinstance(term, EnergySum) else [term])
        self.terms: list[Energy] = flat

    def value(self, marginals: Marginals) -> Tensor:
        return cast(Tensor, sum(term.value(marginals) for term in self.terms))      # a tensor: terms is not empty

    def grad(self, marginals: Marginals) -> Gradient:
        total = Gradient(None, None)
        for term in self.terms:
            total = total + term.grad(marginals)
        return total

    @property
    def edge_totals(self) -> bool:
        return all(term.edge_totals for term in self.terms)

    def total_grad(self, marginals: Marginals) -> Gradient:
        total = Gradient(None, None)
        for term in self.terms:
            total = total + term.total_grad(marginals)
        return total

    def validate(self, marginals: Marginals) -> None:
        check_marginals(marginals)
        for term in self.terms:
            term.validate(marginals)

    def __repr__(self) -> str:
        return " + ".join(repr(t) for t in self.terms)


class Scaled(Energy):
    """``w * L(mu)`` with ``w`` a float or a per-example [B] tensor."""

    def __init__(self, energy: Energy, weight: float | Tensor):
        if not isinstance(energy, Energy):
            raise TypeError(f"energy must be an Energy, got {type(energy).__name__}")
        self.energy = energy
        self.weight = as_weight(weight, "weight")

    @property
    def edge_totals(self) -> bool:
        return self.energy.edge_totals

    def value(self, marginals: Marginals) -> Tensor:
        return weight_per_example(self.weight, marginals.batch_size, marginals.node, "weight") \
            * self.energy.value(marginals)

    def grad(self, marginals: Marginals) -> Gradient:
        w = weight_per_example(self.weight, marginals.batch_size, marginals.node, "weight")
        return _batch_edge_table(self.energy.grad(marginals), 4).scale(w)

    def total_grad(self, marginals: Marginals) -> Gradient:
        w = weight_per_example(self.weight, marginals.batch_size, marginals.node, "weight")
        return _batch_edge_table(self.energy.total_grad(marginals), 3).scale(w)

    def validate(self, marginals: Marginals) -> None:
        check_marginals(marginals)
        weight_per_example(self.weight, marginals.batch_size, marginals.node, "weight")
        self.energy.validate(marginals)

    @property
    def pieces(self) -> Callable[[Tensor], tuple[Tensor, Energy]]:
        """``w L = min_k w L_k``: the wrapped energy's convex pieces (for
        :func:`~betheproj.inference.solve_global`), each scaled by its example's weight, which must be non-negative
        (``w < 0`` turns them concave).  An AttributeError where the wrapped energy has none."""
        return self._scaled_split("pieces")

    @property
    def remainder(self) -> Callable[[Tensor], tuple[Tensor, Energy]]:
        """The wrapped energy's ``remainder`` (the examples its :attr:`pieces` leave out), scaled likewise."""
        return self._scaled_split("remainder")

    def _scaled_split(self, name: str) -> Callable[[Tensor], tuple[Tensor, Energy]]:
        split = getattr(self.energy, name, None)
        if not callable(split):
            raise AttributeError(f"{type(self.energy).__name__} has no {name}(lengths), so {type(self).__name__} "
                                 f"has none")

        def scaled(lengths: Tensor) -> tuple[Tensor, Energy]:
            w = self.weight
            if isinstance(w, Tensor):                    # [B] (the shape checked as validate checks it)
                w = weight_per_example(w, lengths.shape[0], w, "weight")
            if bool((torch.as_tensor(w) < 0).any()):
                raise ValueError(f"weight must be non-negative for {name}(lengths): w < 0 makes each convex piece "
                                 f"concave (w * energy folds w into a nearest-prototype energy's own psi instead)")
            rows, part = split(lengths)
            return rows, Scaled(part, w[rows.to(w.device)] if isinstance(w, Tensor) else w)
        return scaled

    def __repr__(self) -> str:
        return f"{self.weight!r} * {self.energy!r}"


def _batch_edge_table(g: Gradient, rank: int) -> Gradient:
    """``g`` with an edge gradient given as one [C, C] table (the same for every example and position) viewed with
    leading singleton dims up to ``rank`` (4: [1, 1, C, C] for :meth:`Energy.grad`, 3: [1, C, C] for
    :meth:`Energy.total_grad`), so that a per-example weight [B] scales examples, not the table's rows."""
    if g.edge is None or g.edge.dim() != 2:
        return g
    return Gradient(g.node, g.edge.reshape(*([1] * (rank - 2)), *g.edge.shape))


class FunctionEnergy(Energy):
    """Wrap a differentiable function ``fn(marginals) -> [B]`` as an energy (gradient by autograd).

    ``fn`` must compute its value from ``marginals.node`` (and ``marginals.edge``) with torch operations: a value
    that autograd cannot trace back to them (``.detach()``, a round trip through NumPy or Python floats, ``argmax``)
    does not require grad and is taken for a constant, with a zero gradient, so the solvers stop at the base
    marginals and report them converged."""

    def __init__(self, fn: Callable[[Marginals], Tensor], name: str | None = None):
        if not callable(fn):
            raise TypeError("fn must be callable")
        self.fn = fn
        self.name = name or getattr(fn, "__name__", "fn")

    def value(self, marginals: Marginals) -> Tensor:
        return self.fn(marginals)

    def __repr__(self) -> str:
        return f"FunctionEnergy({self.name})"
