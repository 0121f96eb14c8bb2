"""Non-convex nearest-prototype energies of the handwriting experiment, eqs. (21) and (22)."""

from __future__ import annotations

import torch
from torch import Tensor

from ..oracles.base import Marginals, check_marginals
from .base import Energy, Gradient, as_weight, weight_per_example

__all__ = ["NearestPrototype", "PrototypeDistance"]


def _integer_lengths(lengths: Tensor, p: int) -> Tensor:
    """``prototype_lengths`` as a long tensor [P]: integers, or floats within rounding error of integers (such
    as the row sums of count prototypes), never truncated."""
    lengths = torch.as_tensor(lengths)
    if lengths.dtype == torch.bool or lengths.is_complex():
        raise TypeError(f"prototype_lengths must be an integer (or integral floating-point) tensor [P], "
                        f"got {lengths.dtype}")
    if lengths.shape != (p,):
        raise ValueError(f"prototype_lengths must have shape [P]=({p},), got {tuple(lengths.shape)}")
    if lengths.is_floating_point():
        if not torch.isfinite(lengths).all():
            raise ValueError("prototype_lengths must be finite")
        rounded = lengths.round()
        eps = torch.finfo(lengths.dtype).eps
        tol = min(max(1e-6, 16 * eps), 1e-2) * rounded.abs().clamp_min(1.0)
        off = (lengths - rounded).abs() > tol
        if off.any():
            raise ValueError(f"prototype_lengths must hold integers, got {lengths[off][0].item()!r} "
                             f"(floating-point lengths are rounded only within rounding error)")
        lengths = rounded
    lengths = lengths.long()
    if (lengths < 0).any():
        raise ValueError("prototype_lengths must be non-negative")
    return lengths


class NearestPrototype(Energy):
    """``psi * min_i ||w_i - S(mu)||_1``: pull inferred statistics to the nearest prototype.

    ``statistic="unigram"`` is ``L^u`` (eq. 21): ``S(mu) = U(mu) = sum_n mu_n``, prototypes [P, C].
    ``statistic="word"`` is ``L^w`` (eq. 22): ``S(mu)`` is the node marginals, prototypes [P, M, C] with
    ``prototype_lengths`` [P] (entries past a prototype's length are ignored); example ``b`` compares only with
    prototypes of its own length, and has zero energy when there is none.  The gradient is the subgradient
    ``psi * sign(S(mu) - w_nearest)``.
    ``psi`` is a float or a per-example [B] tensor.
    """

    edge_totals = True          # node marginals only

    def __init__(self, prototypes: Tensor, psi: float | Tensor = 1.0, statistic: str = "unigram",
                 prototype_lengths: Tensor | None = None):
        if statistic not in ("unigram", "word"):
            raise ValueError(f"statistic must be 'unigram' or 'word', got {statistic!r}")
        if not isinstance(prototypes, Tensor) or not prototypes.is_floating_point():
            raise TypeError("prototypes must be a floating-point tensor")
        want = 2 if statistic == "unigram" else 3
        if prototypes.dim() != want or prototypes.shape[0] == 0:
            raise ValueError(f"prototypes must be {'[P, C]' if want == 2 else '[P, M, C]'} with P >= 1 for "
                             f"statistic={statistic!r}, got shape {tuple(prototypes.shape)}")
        if not torch.isfinite(prototypes).all():
            raise ValueError("prototypes must be finite")
        if statistic == "word" and prototype_lengths is None:
            raise ValueError("prototype_lengths [P] is required with statistic='word'")
        if prototype_lengths is not None:
            prototype_lengths = _integer_lengths(prototype_lengths, prototypes.shape[0])
            if statistic == "word":
                if int(prototype_lengths.max()) > prototypes.shape[1]:
                    raise ValueError(f"prototype_lengths must be at most M={prototypes.shape[1]} (the positions "
                                     f"stored per prototype), got {int(prototype_lengths.max())}")
                # entries past a prototype's length are padding: zero, like the masked marginals they meet
                keep = torch.arange(prototypes.shape[1], device=prototypes.device) < prototype_lengths.to(
                    prototypes.device)[:, None]
                prototypes = torch.where(keep[..., None], prototypes, torch.zeros((), dtype=prototypes.dtype))
        self.prototypes = prototypes
        self.prototype_lengths = prototype_lengths
        self.statistic = statistic
        self.psi = as_weight(psi)

    def _stats(self, marginals: Marginals) -> tuple[Tensor, Tensor, Tensor]:
        """Flattened statistics [B, D], prototypes [P, D] and the candidate mask [B, P]."""
        mu = marginals.node * marginals.node_mask()[..., None]
        b, n, c = mu.shape
        protos = self.prototypes.to(mu)
        if self.statistic == "unigram":
            return mu.sum(1), protos, self._candidates(marginals.lengths)
        m = protos.shape[1]
        if m < n:
            protos = torch.cat([protos, protos.new_zeros(protos.shape[0], n - m, c)], 1)
        protos = protos[:, :n].reshape(protos.shape[0], -1)
        return mu.reshape(b, -1), protos, self._candidates(marginals.lengths)

    def _candidates(self, lengths: Tensor) -> Tensor:
        """[B, P]: the prototypes each example is compared with."""
        if self.prototype_lengths is None:
            return torch.ones(lengths.shape[0], self.prototypes.shape[0], dtype=torch.bool, device=lengths.device)
        return self.prototype_lengths.to(lengths.device)[None, :] == lengths[:, None]

    def _nearest(self, marginals: Marginals) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        stats, protos, cand = self._stats(marginals)
        dist = torch.cdist(stats[None], protos[None], p=1.0)[0]                    # [B, P]
        dist = torch.where(cand, dist, torch.full((), float("inf"), dtype=dist.dtype))
        best, arg = dist.min(-1)
        has = cand.any(-1)
        return stats, protos, best, arg, has

    def value(self, marginals: Marginals) -> Tensor:
        stats, protos, _, arg, has = self._nearest(marginals)
        psi = weight_per_example(self.psi, stats.shape[0], stats)
        dist = (stats - protos[arg]).abs().sum(-1)         # differentiable, unlike the cdist minimum
        return torch.where(has, psi * dist, torch.zeros((), dtype=stats.dtype))

    def grad(self, marginals: Marginals) -> Gradient:
        mu = marginals.node
        stats, protos, _, arg, has = self._nearest(marginals)
        psi = weight_per_example(self.psi, stats.shape[0], stats)
        sign = torch.sign(stats - protos[arg]) * (psi * has)[:, None]
        if self.statistic == "unigram":
            g = sign[:, None, :].expand_as(mu)
        else:
            g = sign.reshape(mu.shape)
        return Gradient(g * marginals.node_mask()[..., None], None)

    def pieces(self, lengths: Tensor) -> tuple[Tensor, PrototypeDistance]:
        """``L = min_i psi ||w_i - S(mu)||_1`` as convex pieces for :func:`betheproj.inference.solve_global`:
        one row per (example, candidate prototype) pair, ``rows`` [R] naming the example of each.  Examples
        with ``psi < 0`` have none (there ``psi min_i d_i = max_i psi d_i``, a maximum of concave pieces): see
        :meth:`remainder`."""
        rows, which = torch.nonzero(self._candidates(lengths) & self._sign_rows(lengths)[:, None], as_tuple=True)
        return rows, PrototypeDistance(self.prototypes[which.to(self.prototypes.device)], self._psi_of(rows),
                                       self.statistic)

    def remainder(self, lengths: Tensor) -> tuple[Tensor, NearestPrototype]:
        """The examples :meth:`pieces` leaves out that have an energy (``psi < 0`` and a candidate prototype),
        ``rows`` [R], and this energy over them: :func:`~betheproj.inference.solve_global` solves them from
        the base marginals (a stationary point)."""
        rows = torch.nonzero(self._candidates(lengths).any(-1) & ~self._sign_rows(lengths)).flatten()
        return rows, NearestPrototype(self.prototypes, self._psi_of(rows), self.statistic, self.prototype_lengths)

    def _psi_of(self, rows: Tensor) -> float | Tensor:
        psi = self.psi
        return psi[rows.to(psi.device)] if isinstance(psi, Tensor) and psi.dim() == 1 else psi

    def _sign_rows(self, lengths: Tensor) -> Tensor:
        """[B]: whether each example's ``psi`` is non-negative."""
        like = torch.zeros((), dtype=self.prototypes.dtype, device=lengths.device)
        return weight_per_example(self.psi, lengths.shape[0], like) >= 0

    def validate(self, marginals: Marginals) -> None:
        check_marginals(marginals)
        c = marginals.node.shape[2]
        if self.prototypes.shape[-1] != c:
            raise ValueError(f"prototypes have {self.prototypes.shape[-1]} labels, marginals have C={c}")
        weight_per_example(self.psi, marginals.batch_size, marginals.node)

    def __mul__(self, w: float | Tensor) -> NearestPrototype:
        """``w * L`` as the nearest-prototype energy of weight ``w * psi`` (rather than a
        :class:`~betheproj.energies.base.Scaled` one), so that it keeps :meth:`pieces` for
        :func:`~betheproj.inference.solve_global`."""
        w = as_weight(w, "weight")
        for name, t in (("weight", w), ("psi", self.psi)):
            if isinstance(t, Tensor) and t.dim() > 1:
                raise ValueError(f"{name} must be a float, a scalar tensor or a per-example [B] tensor, got shape "
                                 f"{tuple(t.shape)}")
        if isinstance(w, Tensor) and isinstance(self.psi, Tensor):
            if w.dim() == 1 and self.psi.dim() == 1 and w.shape != self.psi.shape:
                raise ValueError(f"weight [B]={tuple(w.shape)} and psi [B]={tuple(self.psi.shape)} have other batch "
                                 "sizes")
            if w.device != self.psi.device:
                raise ValueError(f"weight is on {w.device} but psi is on {self.psi.device}")
        return NearestPrototype(self.prototypes, w * self.psi, self.statistic, self.prototype_lengths)

    __rmul__ = __mul__

    def __repr__(self) -> str:
        return f"NearestPrototype(statistic={self.statistic!r}, P={self.prototypes.shape[0]})"


class PrototypeDistance(Energy):
    """``psi * ||t_b - S(mu_b)||_1`` to a given target per example (one convex piece of :class:`NearestPrototype`):
    ``targets`` [B, C] for ``statistic="unigram"``, [B, M, C] (zero-padded) for ``"word"``.  For ``"word"`` and
    one-hot targets it is linear on the polytope: ``2 psi sum_n (1 - mu_n(t_n))``."""

    edge_totals = True          # node marginals only

    def __init__(self, targets: Tensor, psi: float | Tensor = 1.0, statistic: str = "unigram"):
        if statistic not in ("unigram", "word"):
            raise ValueError(f"statistic must be 'unigram' or 'word', got {statistic!r}")
        if not isinstance(targets, Tensor) or not targets.is_floating_point():
            raise TypeError(f"targets must be a floating-point tensor, got "
                            f"{targets.dtype if isinstance(targets, Tensor) else type(targets).__name__}")
        if targets.dim() != (2 if statistic == "unigram" else 3):
            raise ValueError("targets must be a [B, C] (unigram) or [B, M, C] (word) tensor")
        if not torch.isfinite(targets).all():
            raise ValueError("targets must be finite")
        self.targets, self.statistic, self.psi = targets, statistic, as_weight(psi)

    def _diff(self, marginals: Marginals) -> Tensor:
        """``S(mu) - t``: [B, C] (unigram) or [B, max(N, M), C] (word; the shorter of the two zero-padded, so that a
        target's entries past N count as they do past the example's length)."""
        mu = marginals.node * marginals.node_mask()[..., None]
        t = self.targets.to(mu)
        if self.statistic == "unigram":
            return mu.sum(1) - t
        n, m = mu.shape[1], t.shape[1]
        mu = torch.cat([mu, mu.new_zeros(mu.shape[0], max(m - n, 0), mu.shape[2])], 1)
        t = torch.cat([t, t.new_zeros(t.shape[0], max(n - m, 0), t.shape[2])], 1)
        return mu - t

    def value(self, marginals: Marginals) -> Tensor:
        diff = self._diff(marginals)
        return weight_per_example(self.psi, diff.shape[0], diff) * diff.abs().flatten(1).sum(-1)

    def grad(self, marginals: Marginals) -> Gradient:
        diff = self._diff(marginals)
        psi = weight_per_example(self.psi, diff.shape[0], diff)
        sign = torch.sign(diff) * psi.reshape(-1, *([1] * (diff.dim() - 1)))
        mu = marginals.node
        g = sign[:, None, :].expand_as(mu) if self.statistic == "unigram" else sign[:, :mu.shape[1]]
        return Gradient(g * marginals.node_mask()[..., None], None)

    def validate(self, marginals: Marginals) -> None:
        check_marginals(marginals)
        if self.targets.shape[0] != marginals.batch_size or self.targets.shape[-1] != marginals.node.shape[2]:
            raise ValueError(f"targets must have B={marginals.batch_size} rows and C={marginals.node.shape[2]} labels")
        weight_per_example(self.psi, marginals.batch_size, marginals.node)
