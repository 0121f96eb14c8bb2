"""Pairwise MRFs on arbitrary graphs with per-node label sets, a feature map linear in ``w``, and three MAP routines.

Kulesza & Pereira, *Structured Learning with Approximate Inference* (NIPS 2007) study the pairwise MRF of their
eq. (3), ``P(y|x) ∝ prod_i psi_i(y_i|x) prod_ij psi_ij(y_i, y_j|x)`` with log-linear potentials
``psi = exp(w . f)``.  In log space this module writes

    score(y) = sum_i theta_i(y_i) + sum_{e=(i,j)} theta_e(y_i, y_j),
    theta_i(y_i) = <w, F_i[y_i]> + o_i(y_i),   theta_e(y_i, y_j) = <w, G_e[y_i, y_j]> + o_e(y_i, y_j),

so ``score(y) = w . Phi(x, y) + o(y)`` with ``Phi(x, y) = sum_i F_i[y_i] + sum_e G_e[y_i, y_j]`` (the fixed offsets
``o`` hold potentials that are not learned, e.g. the edge potentials ``lambda`` of section 4).  Written over the
indicator vector ``z`` of section 5 (``mu_i(y_i)``, ``mu_e(y_i, y_j)``), ``Phi(x, z)`` is linear in ``z``, which
defines ``Phi`` for fractional points of the local polytope: the expected features.

MAP routines (all return a :class:`MAPResult`):

* :func:`exact_map`: enumeration of all labellings (small models), eq. (1);
* :func:`lp_map`: LP-relaxed MAP over the local polytope (section 3.1 and eq. 6), solved by
  :func:`betheproj.factor_graphs.lp_map`; returns the (possibly fractional) vertex ``mu``;
* :func:`lbp_map`: max-product loopy BP (eq. 5) with the parallel schedule and messages normalised to sum 1
  (section 4.1), with a convergence report.

The constructions of the paper are in :mod:`betheproj.mrf.paper`, the quantities of Theorem 1 in
:mod:`betheproj.mrf.bounds`.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from ..factor_graphs import FactorGraph, belief_propagation
from ..factor_graphs import lp_map as _fg_lp_map

__all__ = [
    "PairwiseMRF", "LinearPairwiseMRF", "LocalMarginals", "MAPResult",
    "exact_map", "lp_map", "lbp_map", "grid_edges", "agreement_table",
]

MAX_CONFIGURATIONS = 1 << 22


# ------------------------------------------------------------------------------------------------------------------
# validation helpers
# ------------------------------------------------------------------------------------------------------------------
def _as_float_array(name: str, x: object, ndim: int | None = None, allow_neg_inf: bool = True) -> np.ndarray:
    if type(x).__module__.startswith("torch"):
        x = x.detach().cpu().numpy()  # type: ignore[attr-defined]
    if x is None or isinstance(x, (str, bytes)):
        raise TypeError(f"{name} must be an array of floats, got {type(x).__name__}")
    arr = np.asarray(x)
    if arr.dtype == object or not (np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)):
        raise TypeError(f"{name} must be an array of real numbers, got dtype {arr.dtype}")
    arr = np.array(arr, dtype=np.float64)
    if ndim is not None and arr.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {arr.shape}")
    if np.isnan(arr).any():
        raise ValueError(f"{name} contains NaN")
    if np.isposinf(arr).any() or (not allow_neg_inf and np.isneginf(arr).any()):
        raise ValueError(f"{name} must be finite{' or -inf' if allow_neg_inf else ''}")
    return arr


def _as_int(name: str, x: object) -> int:
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(x).__name__}")
    return int(x)


def _check_positive_int(name: str, x: object) -> int:
    v = _as_int(name, x)
    if v < 1:
        raise ValueError(f"{name} must be a positive int, got {v}")
    return v


def _check_float(name: str, x: object, lo: float, hi: float, hi_open: bool = True) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float, np.floating, np.integer)):
        raise TypeError(f"{name} must be a float, got {type(x).__name__}")
    v = float(x)
    if not (lo <= v < hi if hi_open else lo <= v <= hi):
        raise ValueError(f"{name} must lie in [{lo}, {hi}{')' if hi_open else ']'}, got {v}")
    return v


def grid_edges(rows: int, cols: int) -> list[tuple[int, int]]:
    """The 4-neighbour edges of a ``rows x cols`` grid, nodes numbered row-major (``r * cols + c``)."""
    rows, cols = _check_positive_int("rows", rows), _check_positive_int("cols", cols)
    out = []
    for r in range(rows):
        for c in range(cols):
            v = r * cols + c
            if c + 1 < cols:
                out.append((v, v + 1))
            if r + 1 < rows:
                out.append((v, v + cols))
    return out


# ------------------------------------------------------------------------------------------------------------------
# the MRF
# ------------------------------------------------------------------------------------------------------------------
class PairwiseMRF:
    """A pairwise MRF (Kulesza & Pereira 2007, eq. 3, in log space) on an arbitrary graph.

    ``labels[i]``: node ``i``'s label set, either an int ``c`` (labels ``0 .. c-1``) or a sequence of distinct
    hashable label names (label sets may differ between nodes, as in Figure 1).  Labellings are always given as
    label *indices* into these sets (see :meth:`label_index` / :meth:`label_names`).  ``edges[e] = (i, j)``,
    ``i != j``, no edge twice.  ``node_potentials[i]``: ``theta_i`` of shape ``(c_i,)``; ``edge_potentials[e]``:
    ``theta_e`` of shape ``(c_i, c_j)`` (rows: node ``i``), or one 2-D table shared by all edges.  Log-potentials
    are finite or ``-inf`` (a forbidden label or pair); both default to zero.
    """

    def __init__(self, labels: Sequence[int | Sequence[Hashable]], edges: Sequence[tuple[int, int]],
                 node_potentials: Sequence[object] | None = None,
                 edge_potentials: Sequence[object] | object | None = None):
        self._labels, self._edges = _check_structure(labels, edges)
        self._cards = tuple(len(lab) for lab in self._labels)
        n, m = len(self._cards), len(self._edges)
        if node_potentials is None:
            self._node = [np.zeros(c) for c in self._cards]
        else:
            if not isinstance(node_potentials, (Sequence, np.ndarray)) or isinstance(node_potentials, str):
                raise TypeError("node_potentials must be a sequence of 1-D arrays, got "
                                f"{type(node_potentials).__name__}")
            if len(node_potentials) != n:
                raise ValueError(f"node_potentials must hold one array per node ({n}), got {len(node_potentials)}")
            self._node = []
            for i, u in enumerate(node_potentials):
                arr = _as_float_array(f"node_potentials[{i}]", u, ndim=1)
                if arr.shape != (self._cards[i],):
                    raise ValueError(f"node_potentials[{i}] must have shape ({self._cards[i]},) (node {i}'s label "
                                     f"set), got {arr.shape}")
                self._node.append(arr)
        if edge_potentials is None:
            self._edge = [np.zeros((self._cards[i], self._cards[j])) for i, j in self._edges]
        else:
            shared = None
            if not isinstance(edge_potentials, (list, tuple)):
                shared = _as_float_array("edge_potentials", edge_potentials)
                if shared.ndim != 2:
                    raise ValueError("edge_potentials must be a list of 2-D tables or one shared 2-D table, got "
                                     f"shape {shared.shape}")
            elif len(edge_potentials) != m:
                raise ValueError(f"edge_potentials must hold one table per edge ({m}), got {len(edge_potentials)}")
            self._edge = []
            for e, (i, j) in enumerate(self._edges):
                t = shared if shared is not None else _as_float_array(f"edge_potentials[{e}]", edge_potentials[e],
                                                                        ndim=2)
                want = (self._cards[i], self._cards[j])
                if t.shape != want:
                    raise ValueError(f"edge_potentials[{e}] must have shape {want} for edge ({i}, {j}), got "
                                     f"{t.shape}")
                self._edge.append(t.copy())

    @classmethod
    def _trusted(cls, like: PairwiseMRF, node: list[np.ndarray], edge: list[np.ndarray]) -> PairwiseMRF:
        """``like``'s structure with potentials already known to be valid (no checks, no copies)."""
        obj = cls.__new__(cls)
        obj._labels, obj._edges, obj._cards, obj._node, obj._edge = like._labels, like._edges, like._cards, node, edge
        return obj

    # --- access -------------------------------------------------------------------------------------------------
    @property
    def num_nodes(self) -> int:
        return len(self._cards)

    @property
    def num_edges(self) -> int:
        return len(self._edges)

    @property
    def edges(self) -> tuple[tuple[int, int], ...]:
        return self._edges

    @property
    def labels(self) -> tuple[tuple[Hashable, ...], ...]:
        """Every node's label set (names)."""
        return self._labels

    @property
    def cardinalities(self) -> tuple[int, ...]:
        return self._cards

    @property
    def node_potentials(self) -> list[np.ndarray]:
        """``theta_i`` (copies)."""
        return [u.copy() for u in self._node]

    @property
    def edge_potentials(self) -> list[np.ndarray]:
        """``theta_e`` (copies; rows index the edge's first node)."""
        return [t.copy() for t in self._edge]

    def neighbors(self, node: int) -> list[int]:
        """The neighbours of ``node``."""
        v = self._check_node("node", node)
        return [j if i == v else i for i, j in self._edges if v in (i, j)]

    def _check_node(self, name: str, v: object) -> int:
        v = _as_int(name, v)
        if not 0 <= v < self.num_nodes:
            raise ValueError(f"{name} = {v} is not a node (the MRF has {self.num_nodes})")
        return v

    def label_index(self, names: Sequence[Hashable]) -> np.ndarray:
        """Label indices of a labelling given by label names (one per node)."""
        if len(names) != self.num_nodes:
            raise ValueError(f"names must hold one label per node ({self.num_nodes}), got {len(names)}")
        out = []
        for i, nm in enumerate(names):
            if nm not in self._labels[i]:
                raise ValueError(f"names[{i}] = {nm!r} is not in node {i}'s label set {self._labels[i]}")
            out.append(self._labels[i].index(nm))
        return np.array(out, dtype=np.int64)

    def label_names(self, labelling: Sequence[int] | np.ndarray) -> list[Hashable]:
        """Label names of a labelling given by indices."""
        y = self.check_labelling(labelling)
        return [self._labels[i][int(y[i])] for i in range(self.num_nodes)]

    def check_labelling(self, labelling: object, name: str = "labelling") -> np.ndarray:
        """``labelling`` as an int64 array of valid label indices (raises naming ``name`` otherwise)."""
        if type(labelling).__module__.startswith("torch"):
            labelling = labelling.detach().cpu().numpy()  # type: ignore[attr-defined]
        y = np.asarray(labelling)
        if y.shape != (self.num_nodes,) or not (np.issubdtype(y.dtype, np.integer) or y.size == 0):
            raise ValueError(f"{name} must hold {self.num_nodes} integer label indices, got {labelling!r}")
        y = y.astype(np.int64)
        if ((y < 0) | (y >= np.array(self._cards))).any():
            raise ValueError(f"{name} has label indices outside the label sets (sizes {self._cards}): {y.tolist()}")
        return y

    # --- scores -------------------------------------------------------------------------------------------------
    def score(self, labelling: Sequence[int] | np.ndarray) -> float:
        """``sum_i theta_i(y_i) + sum_e theta_e(y_i, y_j)`` (``-inf`` for a forbidden labelling)."""
        y = self.check_labelling(labelling)
        s = float(sum(self._node[i][y[i]] for i in range(self.num_nodes)))
        return s + float(sum(t[y[i], y[j]] for t, (i, j) in zip(self._edge, self._edges, strict=True)))

    def expected_score(self, marginals: LocalMarginals) -> float:
        """``<theta, mu>`` for a point ``mu`` of the local polytope (the LP objective of section 3.1)."""
        mu = self.check_marginals(marginals)
        s = 0.0
        for th, m in itertools.chain(zip(self._node, mu.node, strict=True), zip(self._edge, mu.edge, strict=True)):
            s += float(np.sum(np.where(m > 0, th, 0.0) * m))
        return s

    def all_scores(self, max_configurations: int = MAX_CONFIGURATIONS) -> np.ndarray:
        """The score of every labelling as an array of shape ``cardinalities`` (enumeration; small models)."""
        _check_enumerable(self._cards, max_configurations)
        total = np.zeros(self._cards if self._cards else ())
        n = self.num_nodes
        for i, u in enumerate(self._node):
            total = total + u.reshape([-1 if k == i else 1 for k in range(n)])
        for (i, j), t in zip(self._edges, self._edge, strict=True):
            tt = t if i < j else t.T
            shape = [1] * n
            shape[i], shape[j] = self._cards[i], self._cards[j]
            total = total + tt.reshape(shape)
        return total

    def check_marginals(self, marginals: object, name: str = "marginals") -> LocalMarginals:
        if isinstance(marginals, MAPResult):
            marginals = marginals.marginals
        if not isinstance(marginals, LocalMarginals):
            raise TypeError(f"{name} must be LocalMarginals (or a MAPResult), got {type(marginals).__name__}")
        if len(marginals.node) != self.num_nodes or len(marginals.edge) != self.num_edges:
            raise ValueError(f"{name} must hold {self.num_nodes} node and {self.num_edges} edge marginals, got "
                             f"{len(marginals.node)} and {len(marginals.edge)}")
        for i, m in enumerate(marginals.node):
            if m.shape != (self._cards[i],):
                raise ValueError(f"{name}.node[{i}] must have shape ({self._cards[i]},), got {m.shape}")
        for e, (i, j) in enumerate(self._edges):
            if marginals.edge[e].shape != (self._cards[i], self._cards[j]):
                raise ValueError(f"{name}.edge[{e}] must have shape {(self._cards[i], self._cards[j])}, got "
                                 f"{marginals.edge[e].shape}")
        return marginals

    def one_hot(self, labelling: Sequence[int] | np.ndarray) -> LocalMarginals:
        """The vertex ``z`` of the local polytope indicating ``labelling`` (section 5's indicator vector)."""
        y = self.check_labelling(labelling)
        node = [np.eye(c)[y[i]] for i, c in enumerate(self._cards)]
        edge = []
        for i, j in self._edges:
            t = np.zeros((self._cards[i], self._cards[j]))
            t[y[i], y[j]] = 1.0
            edge.append(t)
        return LocalMarginals(node, edge)

    # --- conversions --------------------------------------------------------------------------------------------
    def with_potentials(self, node_potentials: Sequence[object] | None = None,
                        edge_potentials: Sequence[object] | object | None = None) -> PairwiseMRF:
        """The same graph and label sets with new potentials."""
        return PairwiseMRF(self._labels, self._edges, node_potentials, edge_potentials)

    def to_factor_graph(self) -> FactorGraph:
        """The equivalent :class:`~betheproj.factor_graphs.FactorGraph` (factor ``e`` is edge ``e``)."""
        return FactorGraph.pairwise(self._node, list(self._edges), list(self._edge))

    def tree_parents(self, parents: Sequence[int] | None = None) -> np.ndarray:
        """Check that the graph is the tree ``parents`` (default: the chain ``0 - 1 - ... - N-1``) in the numbering
        of :class:`~betheproj.oracles.Tree` (``parents[0] = -1``, ``0 <= parents[i] < i``); returns, for every node
        ``i >= 1``, the id of the edge joining it to its parent (as an array indexed ``i - 1``)."""
        n = self.num_nodes
        if parents is None:
            parents = [-1] + list(range(n - 1))
        p = [int(v) for v in parents]
        if len(p) != n or p[0] != -1 or any(not 0 <= p[i] < i for i in range(1, n)):
            raise ValueError(f"parents must have length {n}, parents[0] = -1 and 0 <= parents[i] < i, got {p}")
        if self.num_edges != n - 1:
            raise ValueError(f"the graph has {self.num_edges} edges, a tree on {n} nodes has {n - 1}")
        where = {frozenset(e): k for k, e in enumerate(self._edges)}
        out = np.empty(max(n - 1, 0), dtype=np.int64)
        for i in range(1, n):
            k = where.get(frozenset((p[i], i)))
            if k is None:
                raise ValueError(f"the graph has no edge between node {i} and its parent {p[i]}")
            out[i - 1] = k
        return out

    def to_pairwise_potentials(self, parents: Sequence[int] | None = None, dtype: object = None):
        """The potentials as a batch-of-one :class:`~betheproj.oracles.PairwisePotentials` for the chain or tree
        oracles (``parents`` as in :meth:`tree_parents`).  Label sets of different sizes are padded to the
        largest with ``-inf`` potentials, so the oracles never choose a padded label."""
        import torch

        from ..oracles.base import PairwisePotentials

        dtype = torch.float64 if dtype is None else dtype
        eids = self.tree_parents(parents)
        n, c = self.num_nodes, max(self._cards)
        p = [-1] + list(range(n - 1)) if parents is None else [int(v) for v in parents]
        node = np.full((1, n, c), -np.inf)
        for i, u in enumerate(self._node):
            node[0, i, : u.size] = u
        edge = np.full((1, max(n - 1, 0), c, c), -np.inf)
        for i in range(1, n):
            e = int(eids[i - 1])
            t = self._edge[e] if self._edges[e][0] == p[i] else self._edge[e].T
            edge[0, i - 1, : t.shape[0], : t.shape[1]] = t
        if n == 1:
            edge = np.zeros((c, c))
        return PairwisePotentials(torch.as_tensor(node, dtype=dtype), torch.as_tensor(edge, dtype=dtype))

    def __repr__(self) -> str:
        return f"PairwiseMRF(nodes={self.num_nodes}, edges={self.num_edges}, cardinalities={self._cards})"


def _check_structure(labels: object, edges: object) -> tuple[tuple[tuple[Hashable, ...], ...],
                                                             tuple[tuple[int, int], ...]]:
    if not isinstance(labels, (Sequence, np.ndarray)) or isinstance(labels, str):
        raise TypeError(f"labels must be a sequence (one label set or size per node), got {type(labels).__name__}")
    out_labels = []
    for i, lab in enumerate(labels):
        if isinstance(lab, (int, np.integer)) and not isinstance(lab, (bool, np.bool_)):
            if lab < 1:
                raise ValueError(f"labels[{i}] must be at least 1 (a node needs a label), got {int(lab)}")
            out_labels.append(tuple(range(int(lab))))
        elif isinstance(lab, (Sequence, np.ndarray)) and not isinstance(lab, str):
            names = tuple(lab.tolist() if isinstance(lab, np.ndarray) else lab)
            if not names:
                raise ValueError(f"labels[{i}] is empty (a node needs a label)")
            try:
                distinct = len(set(names)) == len(names)
            except TypeError:
                raise TypeError(f"labels[{i}] must hold hashable label names, got {names!r}") from None
            if not distinct:
                raise ValueError(f"labels[{i}] repeats a label: {names!r}")
            out_labels.append(names)
        else:
            raise TypeError(f"labels[{i}] must be an int (the number of labels) or a sequence of label names, got "
                            f"{type(lab).__name__}")
    if not out_labels:
        raise ValueError("labels is empty (the MRF needs at least one node)")
    if not isinstance(edges, (Sequence, np.ndarray)) or isinstance(edges, str):
        raise TypeError(f"edges must be a sequence of (i, j) pairs, got {type(edges).__name__}")
    n = len(out_labels)
    seen: set[frozenset[int]] = set()
    out_edges = []
    for e, edge in enumerate(edges):
        if not isinstance(edge, (Sequence, np.ndarray)) or isinstance(edge, str) or len(edge) != 2:
            raise ValueError(f"edges[{e}] must be a pair (i, j), got {edge!r}")
        i, j = (_as_int(f"edges[{e}][{k}]", edge[k]) for k in range(2))
        for k, v in ((0, i), (1, j)):
            if not 0 <= v < n:
                raise ValueError(f"edges[{e}][{k}] = {v} is not a node (the MRF has {n})")
        if i == j:
            raise ValueError(f"edges[{e}] = ({i}, {j}) is a self-loop")
        key = frozenset((i, j))
        if key in seen:
            raise ValueError(f"edges[{e}] = ({i}, {j}) repeats an edge")
        seen.add(key)
        out_edges.append((i, j))
    return tuple(out_labels), tuple(out_edges)


def _check_enumerable(cards: Sequence[int], max_configurations: int) -> None:
    max_configurations = _check_positive_int("max_configurations", max_configurations)
    total = math.prod(cards)
    if total > max_configurations:
        raise ValueError(f"the MRF has {total} labellings, more than max_configurations={max_configurations}; "
                         "use lp_map or lbp_map")


def agreement_table(labels_i: Sequence[Hashable], labels_j: Sequence[Hashable]) -> np.ndarray:
    """``I(y_i = y_j)`` by label *name* as a ``(len(labels_i), len(labels_j))`` 0/1 table (Figure 1's edges)."""
    return np.array([[1.0 if a == b else 0.0 for b in labels_j] for a in labels_i])


# ------------------------------------------------------------------------------------------------------------------
# points of the local polytope and MAP results
# ------------------------------------------------------------------------------------------------------------------
@dataclass
class LocalMarginals:
    """A point ``z = (mu_i, mu_e)`` of the local polytope: ``node[i]`` of shape ``(c_i,)``, ``edge[e]`` of shape
    ``(c_i, c_j)``.  Integral points are the labellings (section 5's indicator vectors)."""

    node: list[np.ndarray]
    edge: list[np.ndarray]

    def is_integral(self, tol: float = 1e-6) -> bool:
        """Whether every entry lies within ``tol`` of 0 or 1."""
        return all(float(np.max(np.minimum(np.abs(m), np.abs(m - 1.0)), initial=0.0)) <= tol
                   for m in itertools.chain(self.node, self.edge))

    def fractional_nodes(self, tol: float = 1e-6) -> list[int]:
        return [i for i, m in enumerate(self.node) if float(np.max(np.minimum(np.abs(m), np.abs(m - 1.0)))) > tol]

    def argmax(self) -> np.ndarray:
        """Per-node ``argmax mu_i`` (the labelling when integral, a rounding otherwise)."""
        return np.array([int(np.argmax(m)) for m in self.node], dtype=np.int64)

    def stack(self) -> np.ndarray:
        """All entries as one vector: node blocks, then edge blocks (row-major), the column order of
        :class:`LocalPolytope`."""
        return np.concatenate([m.reshape(-1) for m in itertools.chain(self.node, self.edge)])


@dataclass
class MAPResult:
    """The outcome of :func:`exact_map`, :func:`lp_map` or :func:`lbp_map`.

    ``labels``: label indices (for a fractional LP solution the per-node argmax, a rounding).  ``marginals``: the
    point of the local polytope the routine returns (one-hot for exact and LBP MAP; the LP vertex, possibly
    fractional, for LP MAP); this is what a learner should use, ``Phi(x, z)`` (section 5).  ``objective``: its score
    ``<theta, z>``.  ``integral``: whether ``marginals`` is a labelling.  Convergence report (LBP): ``converged``,
    ``iterations``, ``max_change`` (largest change of a normalised log-message in the last iteration), ``history``;
    ``ties``: nodes whose decoding was ambiguous (for exact MAP: number of optimal labellings - 1 in ``num_ties``).
    """

    method: str
    labels: np.ndarray
    marginals: LocalMarginals
    objective: float
    integral: bool
    converged: bool = True
    iterations: int = 0
    max_change: float = 0.0
    history: list[float] = field(default_factory=list)
    ties: list[int] = field(default_factory=list)
    num_ties: int = 0
    beliefs: list[np.ndarray] | None = None

    @property
    def node_marginals(self) -> list[np.ndarray]:
        return self.marginals.node

    @property
    def edge_marginals(self) -> list[np.ndarray]:
        return self.marginals.edge


def _check_mrf(mrf: object) -> PairwiseMRF:
    if not isinstance(mrf, PairwiseMRF):
        raise TypeError(f"mrf must be a PairwiseMRF, got {type(mrf).__name__}")
    return mrf


def exact_map(mrf: PairwiseMRF, *, max_configurations: int = MAX_CONFIGURATIONS) -> MAPResult:
    """Exact MAP, eq. (1) ``argmax_y score(y)``, by enumerating all ``prod_i c_i`` labellings.

    Ties are broken towards the lexicographically smallest labelling (``num_ties`` counts the other optima within
    ``1e-9`` relative).  Raises ``ValueError`` above ``max_configurations`` labellings or when every labelling is
    forbidden (score ``-inf``)."""
    mrf = _check_mrf(mrf)
    scores = mrf.all_scores(max_configurations)
    flat = scores.reshape(-1)
    k = int(np.argmax(flat))
    best = float(flat[k])
    if best == -np.inf:
        raise ValueError("every labelling of the MRF has score -inf (contradictory potentials)")
    ties = int(np.sum(flat >= best - 1e-9 * max(1.0, abs(best)))) - 1
    y = np.array(np.unravel_index(k, mrf.cardinalities), dtype=np.int64).reshape(-1)
    return MAPResult("exact", y, mrf.one_hot(y), best, True, num_ties=ties)


def lp_map(mrf: PairwiseMRF, *, tol: float = 1e-6) -> MAPResult:
    """LP-relaxed MAP over the local polytope (section 3.1; eq. 6 ``argmax_{z in Z'(x)} w . Phi(x, z)``).

    Solved by :func:`betheproj.factor_graphs.lp_map` (HiGHS, a vertex of the polytope).  ``marginals`` holds the
    possibly fractional ``mu_i`` and ``mu_e``; entries within ``tol`` of 0 or 1 count as integral."""
    mrf = _check_mrf(mrf)
    res = _fg_lp_map(mrf.to_factor_graph(), tol=tol)
    mu = LocalMarginals([m.copy() for m in res.variable_marginals], [m.copy() for m in res.factor_marginals])
    integral = mu.is_integral(tol)
    labels = mu.argmax()
    return MAPResult("lp", labels, mu, float(res.objective), integral, ties=mu.fractional_nodes(tol))


def lbp_map(mrf: PairwiseMRF, *, damping: float = 0.0, tol: float = 1e-9, max_iter: int = 1000,
            backend: str = "numpy") -> MAPResult:
    """Max-product loopy BP (Kulesza & Pereira 2007, eq. 5) with the parallel schedule, decoded by
    ``argmax_y b_i(y)`` with ``b_i ∝ psi_i prod_{j in N(i)} m_ji`` (section 4.1).

    Every message is normalised, to max 1 (section 4.1 normalises to sum 1, ``m_ij(-1) + m_ij(1) = 1``: the two
    differ by a positive factor per message, which changes neither the beliefs' argmax nor whether the messages
    converge), optionally damped in probability space, ``m <- (1 - damping) m_new + damping m_old``, and the run
    stops when the largest change of a normalised log-message entry drops below ``tol`` (or after ``max_iter``
    iterations; ``converged`` says which).  Messages start uniform.  With finite potentials the messages of
    section 4.1 converge: ``log m_ij(1) - log m_ij(-1)`` is clipped to ``[-log lambda, log lambda]``.
    ``backend="numpy"``: a vectorised implementation over directed edges; ``backend="factor_graphs"``:
    :func:`betheproj.factor_graphs.belief_propagation` with ``mode="max"``, ``schedule="parallel"``,
    ``normalize="max"`` (the same iterates, slower on small graphs).

    ``marginals`` is the one-hot point of the decoded labelling (LBP proposes that labelling); ``beliefs`` holds the
    max-marginal beliefs scaled to max 1; ``ties`` lists nodes whose two best beliefs are within ``1e-9``."""
    mrf = _check_mrf(mrf)
    damping = _check_float("damping", damping, 0.0, 1.0)
    if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not tol >= 0:
        raise ValueError(f"tol must be a non-negative float, got {tol!r}")
    max_iter = _check_positive_int("max_iter", max_iter)
    if backend == "numpy":
        beliefs, converged, iterations, history = _lbp_numpy(mrf, damping, float(tol), max_iter)
    elif backend == "factor_graphs":
        res = belief_propagation(mrf.to_factor_graph(), "max", schedule="parallel", damping=damping,
                                 normalize="max", tol=float(tol), max_iter=max_iter)
        beliefs, converged, iterations, history = res.variable_beliefs, res.converged, res.iterations, res.history
    else:
        raise ValueError(f"backend must be 'numpy' or 'factor_graphs', got {backend!r}")
    labels = np.array([int(np.argmax(b)) for b in beliefs], dtype=np.int64)
    ties = []
    for i, b in enumerate(beliefs):
        if b.size > 1:
            top2 = np.sort(b)[-2:]
            if top2[1] - top2[0] <= 1e-9 * max(top2[1], 1e-300):
                ties.append(i)
    return MAPResult("lbp", labels, mrf.one_hot(labels), mrf.score(labels), True, converged=converged,
                     iterations=iterations, max_change=history[-1] if history else 0.0, history=history,
                     ties=ties, beliefs=beliefs)


def _lbp_numpy(mrf: PairwiseMRF, damping: float, tol: float, max_iter: int
               ) -> tuple[list[np.ndarray], bool, int, list[float]]:
    """Parallel max-product over directed edges ``d = 2e`` (``i -> j``) and ``2e + 1`` (``j -> i``) of edge
    ``e = (i, j)``, in log space, label sets padded with ``-inf``.  Cavities ``theta_i + sum_{k != j} m_ki`` are
    node totals minus the reverse message, with ``-inf`` entries counted apart so that the subtraction is exact."""
    cards = np.array(mrf.cardinalities)
    n, m, c = mrf.num_nodes, mrf.num_edges, int(cards.max())
    theta = np.full((n, c), -np.inf)
    for i, u in enumerate(mrf._node):
        theta[i, : u.size] = u
    if m == 0:
        dead = [i for i, t in enumerate(theta) if np.isneginf(t[: cards[i]]).all()]
        if dead:
            raise ValueError(f"node {dead[0]} has every label forbidden (-inf): there is no labelling")
        return [np.exp(t[: cards[i]] - t[: cards[i]].max()) for i, t in enumerate(theta)], True, 0, []
    table = np.full((2 * m, c, c), -np.inf)
    src = np.empty(2 * m, dtype=np.int64)
    dst = np.empty(2 * m, dtype=np.int64)
    for e, ((i, j), t) in enumerate(zip(mrf._edges, mrf._edge, strict=True)):
        table[2 * e, : t.shape[0], : t.shape[1]] = t
        table[2 * e + 1, : t.shape[1], : t.shape[0]] = t.T
        src[2 * e], dst[2 * e], src[2 * e + 1], dst[2 * e + 1] = i, j, j, i
    rev = np.arange(2 * m) ^ 1
    if n * 2 * m <= 1 << 16:
        incidence = np.zeros((n, 2 * m))
        incidence[dst, np.arange(2 * m)] = 1.0
    else:
        incidence = sp.csr_matrix((np.ones(2 * m), (dst, np.arange(2 * m))), shape=(n, 2 * m))
    valid = np.arange(c)[None, :] < cards[dst][:, None]
    msg = np.where(valid, 0.0, -np.inf)
    th_fin = np.where(np.isfinite(theta), theta, 0.0)
    th_inf = np.isneginf(theta).astype(np.float64)
    exact_inf = not (np.isfinite(theta).all() and np.isfinite(table).all())   # else every message stays finite

    def totals(mg: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        if not exact_inf:
            return theta + incidence @ mg, th_inf, mg, mg
        fin = np.where(np.isfinite(mg), mg, 0.0)
        ninf = np.isneginf(mg).astype(np.float64)
        return th_fin + incidence @ fin, th_inf + incidence @ ninf, fin, ninf

    history: list[float] = []
    converged = False
    it = 0
    log_keep, log_mix = (np.log1p(-damping), np.log(damping)) if damping > 0.0 else (0.0, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        while it < max_iter:
            it += 1
            b_fin, b_inf, fin, ninf = totals(msg)
            if exact_inf:
                cav = np.where(b_inf[src] - ninf[rev] > 0.5, -np.inf, b_fin[src] - fin[rev])
                new = _normalise_rows(np.max(cav[:, :, None] + table, axis=1))
            else:                                          # finite messages: the lean path
                new = (b_fin[src] - msg[rev])[:, :, None] + table
                new = new.max(axis=1)
                new -= new.max(axis=1, keepdims=True)
            if damping > 0.0:                              # exact zeros are kept (see factor_graphs.bp)
                new = _normalise_rows(np.where(np.isneginf(new), -np.inf, np.logaddexp(log_keep + new, log_mix + msg)))
            d = np.abs(new - msg)
            change = float(np.nanmax(d)) if exact_inf else float(d.max())
            if np.isnan(change):
                change = 0.0
            history.append(change)
            msg = new
            if change <= tol:
                converged = True
                break
        b_fin, b_inf, _, _ = totals(msg)
    beliefs = []
    for i in range(n):
        b = np.where(b_inf[i] > 0.5, -np.inf, b_fin[i])[: cards[i]]
        top = b.max()
        if top == -np.inf:
            raise ValueError(f"every label of node {i} has zero belief (contradictory potentials)")
        beliefs.append(np.exp(b - top))
    return beliefs, converged, it, history


def _normalise_rows(v: np.ndarray) -> np.ndarray:
    """Log-messages shifted to max 0 (raises when one is ``-inf`` for every label)."""
    top = v.max(axis=1, keepdims=True)
    if top.min() == -np.inf:
        d = int(np.nonzero(np.isneginf(top[:, 0]))[0][0])
        raise ValueError(f"message {d} (edge {d // 2}) is zero for every label (contradictory potentials)")
    return v - top


# ------------------------------------------------------------------------------------------------------------------
# the feature map
# ------------------------------------------------------------------------------------------------------------------
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
        d = None if num_features is None else _check_positive_int("num_features", num_features)
        self._nf: list[np.ndarray | None] = [None] * len(cards)
        self._ef: list[np.ndarray | None] = [None] * len(edges_)
        if node_features is not None:
            if not isinstance(node_features, (list, tuple)) or len(node_features) != len(cards):
                raise ValueError(f"node_features must be a list with one (c_i, d) array per node ({len(cards)})")
            for i, f in enumerate(node_features):
                if f is None:
                    continue
                arr = _as_float_array(f"node_features[{i}]", f, ndim=2, allow_neg_inf=False)
                if arr.shape[0] != cards[i]:
                    raise ValueError(f"node_features[{i}] must have shape ({cards[i]}, d), got {arr.shape}")
                d = self._same_d(d, arr.shape[1], f"node_features[{i}]")
                self._nf[i] = arr
        if edge_features is not None:
            if not isinstance(edge_features, (list, tuple)) or len(edge_features) != len(edges_):
                raise ValueError(f"edge_features must be a list with one (c_i, c_j, d) array (or None) per edge "
                                 f"({len(edges_)})")
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
        node = [o + t for o, t in zip(s._node, node_fw, strict=True)]
        edge = [o + t for o, t in zip(s._edge, edge_fw, strict=True)]
        return PairwiseMRF._trusted(s, node, edge)        # finite F w, offsets checked: no NaN/+inf

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
