"""The feature map of a pairwise MRF with log-linear potentials, ``Phi(x, z)`` (Kulesza & Pereira, NIPS 2007,
section 5): linear in the point ``z`` of the local polytope, so fractional LP solutions have expected features."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np

from .._checks import check_count
from .pairwise import (
    MAX_CONFIGURATIONS,
    LocalMarginals,
    MAPResult,
    PairwiseMRF,
    _as_float_array,
    _check_enumerable,
)

__all__ = ["LinearPairwiseMRF"]


def _check_list(name: str, value: object, count: int, what: str) -> None:
    """``value`` holds ``count`` entries: a list, tuple or array stacked along its first axis."""
    is_array = isinstance(value, np.ndarray) or type(value).__module__.startswith("torch")
    if not (isinstance(value, (list, tuple)) or is_array) or getattr(value, "ndim", 1) == 0:
        raise TypeError(f"{name} must be a list with {what}, got {type(value).__name__}")
    if len(value) != count:  # type: ignore[arg-type]
        raise ValueError(f"{name} must hold {what} ({count}), got {len(value)}")  # type: ignore[arg-type]


class LinearPairwiseMRF:
    """An input ``x`` of a pairwise MRF with log-linear potentials: the feature map ``Phi(x, z)`` of section 5.

    ``node_features[i]``: ``F_i`` of shape ``(c_i, d)``; ``edge_features[e]``: ``G_e`` of shape ``(c_i, c_j, d)``
    (``None``, or an omitted list, for zero).  ``node_offsets``/``edge_offsets``: fixed log-potentials ``o`` that
    are not learned (default zero; ``-inf`` forbids a label or pair).  Then ``theta(w) = <w, F> + o`` and
    ``score_w(y) = w . Phi(x, y) + o(y)`` with ``Phi(x, y) = sum_i F_i[y_i] + sum_e G_e[y_i, y_j]``; for a point
    ``z = (mu_i, mu_e)`` of the local polytope ``Phi(x, z) = sum_i mu_i F_i + sum_e <mu_e, G_e>``, linear in ``z``.
    """

    def __init__(self, labels: Sequence[int | Sequence[Hashable]], edges: Sequence[tuple[int, int]],
                 node_features: Sequence[object] | None = None, edge_features: Sequence[object | None] | None = None,
                 node_offsets: Sequence[object] | None = None, edge_offsets: Sequence[object] | object | None = None,
                 *, num_features: int | None = None):
        self.structure = PairwiseMRF(labels, edges, node_offsets, edge_offsets)
        cards, edges_ = self.structure.cardinalities, self.structure.edges
        d = None if num_features is None else check_count("num_features", num_features)
        self._nf: list[np.ndarray | None] = [None] * len(cards)
        self._ef: list[np.ndarray | None] = [None] * len(edges_)
        if node_features is not None:
            _check_list("node_features", node_features, len(cards), "one (c_i, d) array (or None) per node")
            for i, f in enumerate(node_features):
                if f is None:
                    continue
                arr = _as_float_array(f"node_features[{i}]", f, ndim=2, allow_neg_inf=False)
                if arr.shape[0] != cards[i]:
                    raise ValueError(f"node_features[{i}] must have shape ({cards[i]}, d), got {arr.shape}")
                d = self._same_d(d, arr.shape[1], f"node_features[{i}]")
                self._nf[i] = arr
        if edge_features is not None:
            _check_list("edge_features", edge_features, len(edges_), "one (c_i, c_j, d) array (or None) per edge")
            for e, f in enumerate(edge_features):
                if f is None:
                    continue
                arr = _as_float_array(f"edge_features[{e}]", f, ndim=3, allow_neg_inf=False)
                i, j = edges_[e]
                if arr.shape[:2] != (cards[i], cards[j]):
                    raise ValueError(f"edge_features[{e}] must have shape ({cards[i]}, {cards[j]}, d), got "
                                     f"{arr.shape}")
                d = self._same_d(d, arr.shape[2], f"edge_features[{e}]")
                self._ef[e] = arr
        if d is None:
            raise ValueError("no features given: pass node_features or edge_features, or num_features")
        self.num_features = d
        self._has_offsets = node_offsets is not None or edge_offsets is not None

    @staticmethod
    def _same_d(d: int | None, new: int, name: str) -> int:
        if new < 1:
            raise ValueError(f"{name} has no feature columns")
        if d is not None and new != d:
            raise ValueError(f"{name} has {new} features, the others {d}")
        return new

    @property
    def num_nodes(self) -> int:
        return self.structure.num_nodes

    @property
    def edges(self) -> tuple[tuple[int, int], ...]:
        return self.structure.edges

    @property
    def cardinalities(self) -> tuple[int, ...]:
        return self.structure.cardinalities

    @property
    def has_offsets(self) -> bool:
        return self._has_offsets

    def _check_w(self, w: object) -> np.ndarray:
        arr = _as_float_array("w", w, ndim=1, allow_neg_inf=False)
        if arr.shape != (self.num_features,):
            raise ValueError(f"w must have shape ({self.num_features},), got {arr.shape}")
        return arr

    def potentials(self, w: object) -> PairwiseMRF:
        """The MRF with ``theta_i = F_i w + o_i`` and ``theta_e = G_e w + o_e``."""
        w = self._check_w(w)
        s = self.structure
        with np.errstate(over="ignore", invalid="ignore"):
            node_fw = [0.0 if f is None else f @ w for f in self._nf]
            edge_fw = [0.0 if f is None else f @ w for f in self._ef]
        if not all(np.isfinite(t).all() for t in (*node_fw, *edge_fw)):
            raise ValueError("w is too large: the feature scores F w overflow float64")
        with np.errstate(over="ignore"):
            node = [o + t for o, t in zip(s._node, node_fw, strict=True)]
            edge = [o + t for o, t in zip(s._edge, edge_fw, strict=True)]
        if any(np.isposinf(t).any() for t in (*node, *edge)):
            raise ValueError("w is too large: the scores F w + offsets overflow float64")
        return PairwiseMRF._trusted(s, node, edge)        # finite F w, offsets without NaN/+inf: no NaN/+inf

    def features(self, z: object) -> np.ndarray:
        """``Phi(x, z)`` for a labelling (label indices: array, list or tensor), a :class:`LocalMarginals` point or a
        :class:`MAPResult` (its ``marginals``): the expected features for fractional ``z`` (section 5)."""
        out = np.zeros(self.num_features)
        if isinstance(z, (LocalMarginals, MAPResult)):
            mu = self.structure.check_marginals(z, "z")
            for m, f in zip(mu.node, self._nf, strict=True):
                if f is not None:
                    out += m @ f
            for m, f in zip(mu.edge, self._ef, strict=True):
                if f is not None:
                    out += np.tensordot(m, f, axes=2)
            return out
        y = self.structure.check_labelling(z, "z")
        for i, f in enumerate(self._nf):
            if f is not None:
                out += f[y[i]]
        for e, (i, j) in enumerate(self.structure.edges):
            f = self._ef[e]
            if f is not None:
                out += f[y[i], y[j]]
        return out

    def offset(self, z: object) -> float:
        """``o(z)``, the part of the score not multiplied by ``w``."""
        if isinstance(z, (LocalMarginals, MAPResult)):
            return self.structure.expected_score(z if isinstance(z, LocalMarginals) else z.marginals)
        return self.structure.score(z)

    def feature_matrix(self) -> np.ndarray:
        """``Phi`` as a ``(d, dim z)`` matrix over the stacked ``z`` of :meth:`LocalMarginals.stack`."""
        cols = []
        for i, f in enumerate(self._nf):
            cols.append(np.zeros((self.cardinalities[i], self.num_features)) if f is None else f)
        for e, (i, j) in enumerate(self.edges):
            f = self._ef[e]
            cols.append(np.zeros((self.cardinalities[i] * self.cardinalities[j], self.num_features)) if f is None
                        else f.reshape(-1, self.num_features))
        return np.concatenate(cols, axis=0).T

    def all_features(self, max_configurations: int = MAX_CONFIGURATIONS) -> np.ndarray:
        """``Phi(x, y)`` of every labelling, shape ``cardinalities + (d,)`` (enumeration)."""
        cards = self.cardinalities
        _check_enumerable(cards, max_configurations)
        n, d = self.num_nodes, self.num_features
        total = np.zeros(tuple(cards) + (d,))
        for i, f in enumerate(self._nf):
            if f is not None:
                total = total + f.reshape([-1 if k == i else 1 for k in range(n)] + [d])
        for (i, j), f in zip(self.edges, self._ef, strict=True):
            if f is not None:
                ff = f if i < j else f.transpose(1, 0, 2)
                shape = [1] * n + [d]
                shape[i], shape[j] = cards[i], cards[j]
                total = total + ff.reshape(shape)
        return total

    def __repr__(self) -> str:
        return (f"LinearPairwiseMRF(nodes={self.num_nodes}, edges={len(self.edges)}, "
                f"features={self.num_features})")
