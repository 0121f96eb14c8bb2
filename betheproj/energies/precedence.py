"""Soft order constraints on node marginals: "every ``first_j`` token comes before every ``then_j`` token".

For label-indicator (or weight) vectors ``f_j`` and ``t_j`` over the ``C`` labels, the measurement

    V_j(mu) = sum_{k < i} <mu_k, t_j> <mu_i, f_j>

is, on the vertices of the marginal polytope (one labelling ``y``), the number of ordered position pairs with a
``then_j`` token before a ``first_j`` token: zero exactly when the order holds.  The energy

    L_psi(mu) = sum_j psi_j * loss(V_j(mu) - b_j)

applies a scalar loss (eqs. 4-5) to these *bilinear* measurements of the node marginals, so it is non-convex (as
the OCR energies are); the solvers only need its gradient, which is closed-form through prefix sums:

    dV_j/dmu_i = f_j * sum_{k < i} <mu_k, t_j>  +  t_j * sum_{k > i} <mu_k, f_j>.

It is a torch expression in ``psi``, so learning differentiates it (eq. 15).  Templates share their vectors (a
field group comes first in many): :class:`~betheproj.energies.vector_pairs.VectorPairs` measures them through
the distinct ones, ``O(N G^2)`` per example instead of ``O(N J C)``.  Order is not a count, so no
:class:`~betheproj.energies.LinearMeasurements` can state it: a count constraint moves a label's score at every
position alike, an order constraint moves it only where the other field's mass lies on the wrong side.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..oracles.base import Marginals, check_marginals
from .base import Gradient, as_weight
from .linear import Loss, MeasurementLoss, label_vectors, measurement_offset
from .vector_pairs import VectorPairs

__all__ = ["Precedence"]


class Precedence(MeasurementLoss):
    """``sum_j psi_j * loss(V_j(mu) - b_j)`` with ``V_j`` the soft count of order violations (module docstring).

    Args:
        first: ``f`` [J, C], the labels (weights) that must come first.
        then: ``t`` [J, C], the labels that must come after them.
        offset: ``b``, a float or [J] (violations tolerated before the loss starts).
        loss: a :class:`~betheproj.energies.Loss` or its name (default the smoothed hinge of eq. 20).
        psi: weights, a float, ``[B]``, ``[1, J]`` or ``[B, J]``; the loss of a non-negative ``V`` is
            non-decreasing, so ``psi >= 0`` penalises violations.
    """

    edge_totals = True          # node marginals only

    def __init__(self, first: Tensor, then: Tensor, offset: float | Tensor = 0.0,
                 loss: Loss | str = "smoothed_hinge", psi: float | Tensor = 1.0):
        self.first = label_vectors("first", first)
        self.then = label_vectors("then", then)
        if self.first.shape != self.then.shape:
            raise ValueError(f"first and then must have the same shape [J, C], got {tuple(self.first.shape)} "
                             f"and {tuple(self.then.shape)}")
        self.num_measurements = self.first.shape[0]
        self._pairs_of = VectorPairs(self.first, self.then)
        self.offset = measurement_offset(offset, self.num_measurements)
        self.loss = loss if isinstance(loss, Loss) else Loss(loss)
        self.psi = as_weight(psi)

    def _pairs(self, marginals: Marginals) -> tuple[Tensor, Tensor, Tensor]:
        """``V`` [B, J], and the distinct vectors' masses strictly before and strictly after each position."""
        mass = self._pairs_of.masses(marginals)
        # exclusive prefix and suffix sums, each its own cumsum: the suffix as total - prefix lost the mass after
        # late positions to the total's rounding (float32 gradients 20% off at N = 3000)
        none = mass.new_zeros(mass.shape[0], 1, mass.shape[2])
        before = torch.cat([none, mass[:, :-1].cumsum(1)], 1)
        after = torch.cat([mass[:, 1:].flip(1).cumsum(1).flip(1), none], 1)
        # V[b, x, y] = sum_i <mu_i, g_x> * (g_y mass before i), for all pairs of distinct vectors at once
        return self._pairs_of.gather(mass.transpose(1, 2) @ before), before, after

    def measurements(self, marginals: Marginals) -> Tensor:
        """``V_j(mu)`` [B, J] (before the offset)."""
        return self._pairs(marginals)[0]

    def _z(self, marginals: Marginals) -> Tensor:
        return self._minus_offset(self.measurements(marginals))

    def grad(self, marginals: Marginals) -> Gradient:
        v, before, after = self._pairs(marginals)
        w = self._slopes(self._minus_offset(v))                                       # [B, J]
        grid = self._pairs_of.scatter(w)          # [B, G, G]: x = first vector, y = then vector
        coef = before @ grid.transpose(1, 2) + after @ grid                           # [B, N, G]
        return Gradient(self._pairs_of.node_gradient(coef, marginals), None)

    def validate(self, marginals: Marginals) -> None:
        check_marginals(marginals)
        c = marginals.node.shape[-1]
        if self.first.shape[1] != c:
            raise ValueError(f"first/then have {self.first.shape[1]} labels, marginals have C={c}")
        self._weights(marginals.node.shape[0], marginals.node)

    def __repr__(self) -> str:
        return f"Precedence(J={self.num_measurements}, loss={self.loss.name})"
