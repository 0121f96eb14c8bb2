"""Soft exclusion of label bigrams: "patterns ``p_j`` and ``q_j`` do not both occur in one output".

A bigram pattern ``p = (l_p, r_p)`` (label-indicator or weight vectors over the ``C`` labels) has the soft count

    S_p(mu) = sum_i <mu_i, l_p> <mu_{i+1}, r_p>,

the number of positions with an ``l_p`` label followed by an ``r_p`` label on the vertices of the marginal
polytope (one labelling), computed from node marginals only (their product at neighbouring positions), so the
solver keeps the chain's fast path for shared transition scores.  The energy

    L_psi(mu) = sum_j psi_j * loss(S_{p_j}(mu) S_{q_j}(mu) - b_j)

penalises outputs that mix two patterns (two formats of a person's name, ``Last , First`` and ``First Last``, in
one citation); it is a polynomial of degree four in the node marginals, non-convex, with the closed-form gradient

    dS_p/dmu_i = l_p <mu_{i+1}, r_p> + r_p <mu_{i-1}, l_p>,

a torch expression in ``psi`` for learning (eq. 15).  Patterns share their vectors (a name label starts many
bigrams): :class:`~betheproj.energies.vector_pairs.VectorPairs` counts them through the distinct ones, as for
:class:`~betheproj.energies.Precedence`, ``O(N G^2)`` per example instead of ``O(N P C)``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..oracles.base import Marginals, check_marginals
from .base import Gradient, as_weight
from .linear import Loss, MeasurementLoss, label_vectors, measurement_offset
from .vector_pairs import VectorPairs

__all__ = ["BigramExclusion"]


class BigramExclusion(MeasurementLoss):
    """``sum_j psi_j * loss(S_{p_j}(mu) S_{q_j}(mu) - b_j)`` over bigram patterns (module docstring).

    Args:
        left, right: the patterns' label vectors, ``[P, C]`` each (pattern ``p``: ``left[p]`` then ``right[p]``).
        pairs: ``[J, 2]`` integer tensor, the two patterns of term ``j``.
        offset: ``b``, a float or ``[J]``.
        loss: a :class:`~betheproj.energies.Loss` or its name (default the smoothed hinge of eq. 20).
        psi: weights, a float, ``[B]``, ``[1, J]`` or ``[B, J]``.
    """

    edge_totals = True          # node marginals only

    def __init__(self, left: Tensor, right: Tensor, pairs: Tensor, offset: float | Tensor = 0.0,
                 loss: Loss | str = "smoothed_hinge", psi: float | Tensor = 1.0):
        label_vectors("left", left, "P")
        label_vectors("right", right, "P")
        if left.shape != right.shape:
            raise ValueError(f"left and right must have the same shape [P, C], got {tuple(left.shape)} and "
                             f"{tuple(right.shape)}")
        if (not isinstance(pairs, Tensor) or pairs.is_floating_point() or pairs.is_complex()
                or pairs.dtype == torch.bool):
            raise TypeError(f"pairs must be an integer tensor [J, 2], got "
                            f"{pairs.dtype if isinstance(pairs, Tensor) else type(pairs).__name__}")
        if pairs.dim() != 2 or pairs.shape[1] != 2:
            raise ValueError(f"pairs must be an integer tensor [J, 2], got shape {tuple(pairs.shape)}")
        if pairs.numel() and (int(pairs.min()) < 0 or int(pairs.max()) >= left.shape[0]):
            raise ValueError(f"pairs must index the {left.shape[0]} patterns")
        self.left, self.right, self.pairs = left, right, pairs.long()
        self.num_measurements = pairs.shape[0]
        self._patterns = VectorPairs(left, right)
        self.offset = measurement_offset(offset, self.num_measurements)
        self.loss = loss if isinstance(loss, Loss) else Loss(loss)
        self.psi = as_weight(psi)

    def _parts(self, marginals: Marginals) -> tuple[Tensor, Tensor, Tensor]:
        """Per-position masses ``<mu_i, g>`` of the distinct vectors [B, N, G], the counts ``S`` [B, P] and the
        products ``S_p S_q`` [B, J]."""
        mass = self._patterns.masses(marginals)
        # neighbours[b, x, y] = sum_i <mu_i, g_x> <mu_{i+1}, g_y>: every pattern's count at once
        s = self._patterns.gather(mass[:, :-1].transpose(1, 2) @ mass[:, 1:])
        pairs = self.pairs.to(mass.device)
        return mass, s, s[:, pairs[:, 0]] * s[:, pairs[:, 1]]

    def counts(self, marginals: Marginals) -> Tensor:
        """The patterns' soft counts ``S_p(mu)`` [B, P]."""
        return self._parts(marginals)[1]

    def _z(self, marginals: Marginals) -> Tensor:
        return self._minus_offset(self._parts(marginals)[2])

    def grad(self, marginals: Marginals) -> Gradient:
        mass, s, products = self._parts(marginals)
        w = self._slopes(self._minus_offset(products))                                   # [B, J]
        pairs = self.pairs.to(w.device)
        p, q = pairs[:, 0], pairs[:, 1]
        ds = torch.zeros_like(s).index_add(1, p, w * s[:, q]).index_add(1, q, w * s[:, p])   # dL/dS [B, P]
        grid = self._patterns.scatter(ds)                                                # [B, G, G]
        next_mass = torch.nn.functional.pad(mass[:, 1:], (0, 0, 0, 1))                  # <mu_{i+1}, g>
        prev_mass = torch.nn.functional.pad(mass[:, :-1], (0, 0, 1, 0))                 # <mu_{i-1}, g>
        coef = next_mass @ grid.transpose(1, 2) + prev_mass @ grid                       # [B, N, G]
        return Gradient(self._patterns.node_gradient(coef, marginals), None)

    def validate(self, marginals: Marginals) -> None:
        check_marginals(marginals)
        c = marginals.node.shape[-1]
        if self.left.shape[1] != c:
            raise ValueError(f"left/right have {self.left.shape[1]} labels, marginals have C={c}")
        self._weights(marginals.node.shape[0], marginals.node)

    def __repr__(self) -> str:
        return f"BigramExclusion(P={self.left.shape[0]}, J={self.num_measurements}, loss={self.loss.name})"
