"""Sums of scalar convex losses of linear measurements of the marginals, eqs. (4)-(5):
``L_psi(mu) = sum_j psi_j * l(a_j^T mu - b_j)``.

The losses penalise positive arguments (``z = a^T mu - b > 0`` is a violation of ``a^T mu <= b``), except
the symmetric ``squared`` and ``smoothed_abs``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .._checks import check_positive, check_type
from ..oracles.base import Marginals, check_marginals
from .base import Energy, Gradient, as_weight, in_dtype

__all__ = ["Loss", "LOSSES", "LinearMeasurements", "MeasurementLoss", "smoothed_hinge", "squared_hinge", "squared",
           "smoothed_abs"]


@dataclass(frozen=True)
class Loss:
    """A univariate convex loss ``l(z)`` with its derivative; ``width`` sets the smoothing of the kinks."""

    name: str
    width: float = 1.0

    def __post_init__(self) -> None:
        if self.name not in LOSSES:
            raise ValueError(f"loss must be one of {sorted(LOSSES)}, got {self.name!r}")
        object.__setattr__(self, "width", check_positive("width", self.width))

    def __call__(self, z: Tensor) -> Tensor:
        return LOSSES[self.name][0](z, self._width(z))

    def derivative(self, z: Tensor) -> Tensor:
        return LOSSES[self.name][1](z, self._width(z))

    def _width(self, z: Tensor) -> float:
        check_type(f"{self.name}: z", z, Tensor, "a tensor")
        # a width below z's smallest normal number would become 0 in z's dtype (0 / 0 at the kink)
        return max(self.width, torch.finfo(z.dtype).tiny) if z.is_floating_point() else self.width


def _smoothed_hinge(z: Tensor, w: float) -> Tensor:
    # Rennie & Srebro (2005) smooth hinge on the violation z: 0, z^2/(2w), z - w/2
    return torch.where(z <= 0, torch.zeros_like(z), torch.where(z < w, z * z / (2 * w), z - w / 2))


def _smoothed_hinge_d(z: Tensor, w: float) -> Tensor:
    return (z / w).clamp(0.0, 1.0)


def _squared_hinge(z: Tensor, w: float) -> Tensor:
    return 0.5 * z.clamp_min(0.0) ** 2


def _squared_hinge_d(z: Tensor, w: float) -> Tensor:
    return z.clamp_min(0.0)


def _squared(z: Tensor, w: float) -> Tensor:
    return 0.5 * z * z


def _squared_d(z: Tensor, w: float) -> Tensor:
    return z


def _smoothed_abs(z: Tensor, w: float) -> Tensor:
    # Huber: z^2/(2w) for |z| <= w, |z| - w/2 beyond
    a = z.abs()
    return torch.where(a <= w, z * z / (2 * w), a - w / 2)


def _smoothed_abs_d(z: Tensor, w: float) -> Tensor:
    return (z / w).clamp(-1.0, 1.0)


LOSSES = {
    "smoothed_hinge": (_smoothed_hinge, _smoothed_hinge_d),
    "squared_hinge": (_squared_hinge, _squared_hinge_d),
    "squared": (_squared, _squared_d),
    "smoothed_abs": (_smoothed_abs, _smoothed_abs_d),
}

smoothed_hinge = Loss("smoothed_hinge")
squared_hinge = Loss("squared_hinge")
squared = Loss("squared")
smoothed_abs = Loss("smoothed_abs")


def _measure_tensor(name: str, a: Tensor | None, inner: int) -> Tensor | None:
    """Check a measurement tensor: ``inner`` trailing label dims, then [J], [J, T] or [B, J, T] leading."""
    if a is None:
        return None
    if not isinstance(a, Tensor) or not a.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor")
    if a.dim() not in (1 + inner, 2 + inner, 3 + inner):
        raise ValueError(f"{name} must have {1 + inner} to {3 + inner} dims ([J, ...], [J, positions, ...] or "
                         f"[B, J, positions, ...]), got shape {tuple(a.shape)}")
    if not torch.isfinite(a).all():
        raise ValueError(f"{name} must be finite")
    return a


def label_vectors(name: str, v: Tensor, rows: str = "J") -> Tensor:
    """Check a table of label vectors: a finite floating-point ``[rows, C]`` tensor."""
    if not isinstance(v, Tensor) or not v.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor [{rows}, C]")
    if v.dim() != 2:
        raise ValueError(f"{name} must have shape [{rows}, C], got {tuple(v.shape)}")
    if not torch.isfinite(v).all():
        raise ValueError(f"{name} must be finite")
    return v


def measurement_offset(offset: float | Tensor, j: int, per_example: bool = False) -> float | Tensor:
    """Check an offset ``b``: a finite float or a finite floating-point ``[J]`` tensor (or ``[B, J]`` when
    ``per_example``; the batch size is checked against the marginals by :meth:`MeasurementLoss._minus_offset`)."""
    offset = as_weight(offset, "offset")
    if not isinstance(offset, Tensor):
        return offset
    shapes = "a float, [J] or [B, J]" if per_example else "a float or [J]"
    if offset.dim() > (2 if per_example else 1) or (offset.dim() >= 1 and offset.shape[-1] != j):
        raise ValueError(f"offset must be {shapes} with J={j}, got shape {tuple(offset.shape)}")
    return offset


def _contract(spec: str, x: Tensor, vectors: Tensor) -> Tensor:
    """``einsum(spec, x, vectors)`` for measurement vectors with a leading batch dim of 1 (shared by every
    example: contracted without it, never expanded to ``B`` copies) or ``B`` (per example); ``{}`` in ``spec``
    stands for that dim's letter ``b``."""
    if vectors.shape[0] == 1:
        return torch.einsum(spec.format(""), x, vectors[0])
    return torch.einsum(spec.format("b"), x, vectors)


class MeasurementLoss(Energy):
    """``sum_j psi_j * loss(z_j(mu))`` over ``J`` measurements (eqs. 4-5): a subclass sets ``num_measurements``,
    ``offset``, ``loss`` and ``psi`` and computes ``z = measurement - offset`` [B, J] in :meth:`_z`."""

    num_measurements: int
    offset: float | Tensor
    loss: Loss
    psi: float | Tensor

    def _z(self, marginals: Marginals) -> Tensor:
        raise NotImplementedError

    def _minus_offset(self, measured: Tensor) -> Tensor:
        """``z = measured - b`` [B, J] (eq. 5's ``a^T mu - b``)."""
        self._check_offset(measured.shape[0])
        return measured - in_dtype("offset", self.offset, measured)

    def _check_offset(self, batch: int) -> None:
        """A ``[B, J]`` offset must have the marginals' batch size."""
        offset = self.offset
        if isinstance(offset, Tensor) and offset.dim() == 2 and offset.shape[0] != batch:
            raise ValueError(f"offset must be a float, [J] or [B, J]=({batch}, {self.num_measurements}), "
                             f"got shape {tuple(offset.shape)}")

    def _weights(self, batch: int, like: Tensor) -> Tensor:
        """psi as [B, J]."""
        j = self.num_measurements
        psi = self.psi
        if not isinstance(psi, Tensor):
            return torch.full((batch, j), in_dtype("psi", psi, like), dtype=like.dtype, device=like.device)
        psi = in_dtype("psi", psi, like)
        if psi.dim() == 0:
            return psi.expand(batch, j)
        if psi.dim() == 1 and psi.shape[0] == batch:
            return psi[:, None].expand(batch, j)
        if psi.dim() == 2 and psi.shape[1] == j and psi.shape[0] in (1, batch):
            return psi.expand(batch, j)
        # a vector is per example: one weight per measurement is a row [1, J] (a [J] vector is read as [B] when
        # J = B, so it cannot be told apart there)
        hint = (f"; for one weight per measurement pass a row [1, J]=(1, {j}) (psi[None]): a vector is read as "
                f"per-example [B]" if psi.dim() == 1 and psi.shape[0] == j else "")
        raise ValueError(f"psi must be a float, [B]=({batch},), [1, J] or [B, J]=({batch}, {j}), "
                         f"got shape {tuple(psi.shape)}{hint}")

    def _slopes(self, z: Tensor) -> Tensor:
        """``dL/dz = psi * loss'(z)`` [B, J]."""
        return self._weights(z.shape[0], z) * self.loss.derivative(z)

    def value(self, marginals: Marginals) -> Tensor:
        z = self._z(marginals)
        return (self._weights(z.shape[0], z) * self.loss(z)).sum(-1)


class LinearMeasurements(MeasurementLoss):
    """``sum_j psi_j * loss(a_j^T mu - b_j)`` (eqs. 4-5).

    Args:
        node: node measurement vectors, ``[J, C]`` (label counts: summed over valid positions),
            ``[J, N, C]`` (per position) or ``[B, J, N, C]``.
        edge: edge measurement vectors, ``[J, C, C]``, ``[J, N-1, C, C]`` or ``[B, J, N-1, C, C]``.
        offset: ``b``, a float, ``[J]`` or ``[B, J]``.
        loss: a :class:`Loss` or its name (``smoothed_hinge``, ``squared_hinge``, ``squared``, ``smoothed_abs``).
        psi: weights, a float, ``[B]`` (per example), ``[1, J]`` (per measurement) or ``[B, J]``;
            ``L`` is convex when ``psi >= 0``.
    """

    def __init__(self, node: Tensor | None = None, edge: Tensor | None = None, offset: float | Tensor = 0.0,
                 loss: Loss | str = "smoothed_hinge", psi: float | Tensor = 1.0):
        self.node = _measure_tensor("node", node, 1)
        self.edge = _measure_tensor("edge", edge, 2)
        if self.node is None and self.edge is None:
            raise ValueError("LinearMeasurements needs node and/or edge measurement vectors")
        jn = None if self.node is None else self.node.shape[-2 if self.node.dim() == 2 else -3]
        je = None if self.edge is None else self.edge.shape[-3 if self.edge.dim() == 3 else -4]
        if jn is not None and je is not None and jn != je:
            raise ValueError(f"node has J={jn} measurements but edge has J={je}")
        j = jn if jn is not None else je
        assert j is not None                      # node or edge vectors are given (checked above)
        self.num_measurements = j
        self.offset = measurement_offset(offset, self.num_measurements, per_example=True)
        self.loss = loss if isinstance(loss, Loss) else Loss(loss)
        self.psi = as_weight(psi)

    @property
    def edge_totals(self) -> bool:
        return self.edge is None or self.edge.dim() == 3       # [J, C, C]: the same vector at every position

    # -- helpers ---------------------------------------------------------------------------------
    def _node_vectors(self, a: Tensor, mu: Tensor) -> Tensor:
        """Node measurement vectors ``a`` (``self.node``) broadcast to [B or 1, J, N, C]."""
        a = a.to(mu)
        n = mu.shape[1]
        if a.dim() == 2:
            return a[None, :, None, :]
        a = a if a.dim() == 4 else a[None]
        if a.shape[-2] != n:
            raise ValueError(f"node measurement vectors have {a.shape[-2]} positions, marginals have N={n}")
        return a

    def _edge_vectors(self, a: Tensor, mu_edge_shape: torch.Size, like: Tensor) -> Tensor:
        """Edge measurement vectors ``a`` (``self.edge``) broadcast to [B or 1, J, N-1, C, C]."""
        a = a.to(like)
        if a.dim() == 3:
            return a[None, :, None]
        a = a if a.dim() == 5 else a[None]
        if a.shape[-3] != mu_edge_shape[1]:
            raise ValueError(f"edge measurement vectors have {a.shape[-3]} positions, marginals have "
                             f"N-1={mu_edge_shape[1]}")
        return a

    def measurements(self, marginals: Marginals) -> Tensor:
        """``a_j^T mu`` [B, J] (before the offset)."""
        node = marginals.node * marginals.node_mask()[..., None]       # padding is absent
        b = node.shape[0]
        z = node.new_zeros(b, self.num_measurements)
        if self.node is not None:
            a = self._node_vectors(self.node, node)
            if self.node.dim() == 2:
                z = z + node.sum(1) @ a[0, :, 0].t()
            else:
                z = z + _contract("bnc,{}jnc->bj", node, a)
        if self.edge is not None and self.edge.dim() == 3:
            z = z + torch.einsum("bij,kij->bk", marginals.edge_total(), self.edge.to(node))
        elif self.edge is not None:
            edge = marginals.edge * marginals.edge_mask()[..., None, None]
            ae = self._edge_vectors(self.edge, edge.shape, edge)
            z = z + _contract("bnij,{}knij->bk", edge, ae)
        return z

    def _z(self, marginals: Marginals) -> Tensor:
        return self._minus_offset(self.measurements(marginals))

    # -- Energy API ------------------------------------------------------------------------------
    def total_grad(self, marginals: Marginals) -> Gradient:
        if self.edge is None or self.edge.dim() != 3:
            return super().total_grad(marginals)
        w = self._slopes(self._z(marginals))
        g = self._node_grad(marginals, w)
        return Gradient(g, torch.einsum("bk,kij->bij", w, self.edge.to(marginals.node)))

    def _node_grad(self, marginals: Marginals, w: Tensor) -> Tensor | None:
        node = marginals.node
        if self.node is None:
            return None
        a = self._node_vectors(self.node, node)
        if self.node.dim() == 2:
            return (w @ a[0, :, 0])[:, None, :].expand_as(node) * marginals.node_mask()[..., None]
        g_node = _contract("bj,{}jnc->bnc", w, a)
        return g_node * marginals.node_mask()[..., None]

    def grad(self, marginals: Marginals) -> Gradient:
        node = marginals.node
        w = self._slopes(self._z(marginals))                                  # [B, J]
        g_node, g_edge = self._node_grad(marginals, w), None
        if self.edge is not None:
            b, n, c = node.shape
            ae = self._edge_vectors(self.edge, torch.Size((b, n - 1, c, c)), node)
            if self.edge.dim() == 3:
                g_edge = (torch.einsum("bk,kij->bij", w, ae[0, :, 0])[:, None]
                          * marginals.edge_mask()[..., None, None])
            else:
                g_edge = _contract("bk,{}knij->bnij", w, ae)
                g_edge = g_edge * marginals.edge_mask()[..., None, None]
        return Gradient(g_node, g_edge)

    def validate(self, marginals: Marginals) -> None:
        check_marginals(marginals)
        b, n, c = marginals.node.shape
        if self.node is not None and self.node.shape[-1] != c:
            raise ValueError(f"node measurement vectors have {self.node.shape[-1]} labels, marginals have C={c}")
        if self.edge is not None and self.edge.shape[-2:] != (c, c):
            raise ValueError(f"edge measurement vectors have label dims {tuple(self.edge.shape[-2:])}, "
                             f"expected ({c}, {c})")
        # per-example vectors: node [B, J, N, C] (4-D), edge [B, J, N-1, C, C] (5-D); edge [J, N-1, C, C] is 4-D
        for name, a, per_example in (("node", self.node, 4), ("edge", self.edge, 5)):
            if a is not None and a.dim() == per_example and a.shape[0] != b:
                raise ValueError(f"per-example {name} measurement vectors have B={a.shape[0]}, marginals have B={b}")
        if self.node is not None:
            self._node_vectors(self.node, marginals.node)
        if self.edge is not None:
            self._edge_vectors(self.edge, torch.Size((b, n - 1, c, c)), marginals.node)
        self._weights(b, marginals.node)
        self._check_offset(b)

    def __repr__(self) -> str:
        return f"LinearMeasurements(J={self.num_measurements}, loss={self.loss.name})"
