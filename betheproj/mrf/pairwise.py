"""Pairwise MRFs on arbitrary graphs with per-node label sets, points of their local polytope and MAP results.

Kulesza & Pereira, *Structured Learning with Approximate Inference* (NIPS 2007) study the pairwise MRF of their
eq. (3), ``P(y|x) ∝ prod_i psi_i(y_i|x) prod_ij psi_ij(y_i, y_j|x)`` with log-linear potentials
``psi = exp(w . f)``.  In log space this module writes

    score(y) = sum_i theta_i(y_i) + sum_{e=(i,j)} theta_e(y_i, y_j),
    theta_i(y_i) = <w, F_i[y_i]> + o_i(y_i),   theta_e(y_i, y_j) = <w, G_e[y_i, y_j]> + o_e(y_i, y_j),

so ``score(y) = w . Phi(x, y) + o(y)`` with ``Phi(x, y) = sum_i F_i[y_i] + sum_e G_e[y_i, y_j]`` (the fixed offsets
``o`` hold potentials that are not learned, e.g. the edge potentials ``lambda`` of section 4).  Written over the
indicator vector ``z`` of section 5 (``mu_i(y_i)``, ``mu_e(y_i, y_j)``), ``Phi(x, z)`` is linear in ``z``, which
defines ``Phi`` for fractional points of the local polytope: the expected features.

MAP routines are in :mod:`betheproj.mrf.map` (exact, LP-relaxed, loopy BP), the feature map ``Phi`` in
:mod:`betheproj.mrf.linear`; the constructions of the paper are in :mod:`betheproj.mrf.paper`, the quantities
of Theorem 1 in :mod:`betheproj.mrf.bounds`.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from .._checks import check_count, check_int
from ..factor_graphs import FactorGraph

if TYPE_CHECKING:
    import torch

    from ..oracles.base import PairwisePotentials

__all__ = ["PairwiseMRF", "LocalMarginals", "MAPResult", "grid_edges", "agreement_table"]

MAX_CONFIGURATIONS = 1 << 22


# ------------------------------------------------------------------------------------------------------------------
# validation helpers
# ------------------------------------------------------------------------------------------------------------------
def _is_tensor(x: object) -> bool:
    return type(x).__module__.startswith("torch")


def _as_float_array(name: str, x: object, ndim: int | None = None, allow_neg_inf: bool = True) -> np.ndarray:
    if _is_tensor(x):
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


def grid_edges(rows: int, cols: int) -> list[tuple[int, int]]:
    """The 4-neighbour edges of a ``rows x cols`` grid, nodes numbered row-major (``r * cols + c``)."""
    rows, cols = check_count("rows", rows), check_count("cols", cols)
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
    ``theta_e`` of shape ``(c_i, c_j)`` (rows: node ``i``), or one 2-D table shared by all edges (lists, or arrays
    or tensors stacked along their first axis).  Log-potentials are finite or ``-inf`` (a forbidden label or pair);
    both default to zero.
    """

    def __init__(self, labels: Sequence[int | Sequence[Hashable]], edges: Sequence[tuple[int, int]],
                 node_potentials: Sequence[object] | None = None,
                 edge_potentials: Sequence[object] | object | None = None):
        self._labels, self._edges = _check_structure(labels, edges)
        self._cards = tuple(len(lab) for lab in self._labels)
        n, m = len(self._cards), len(self._edges)
        if node_potentials is None:
            self._node: list[np.ndarray] = [np.zeros(c) for c in self._cards]
        else:
            stacked = isinstance(node_potentials, np.ndarray) or _is_tensor(node_potentials)
            if (not (isinstance(node_potentials, Sequence) or stacked) or isinstance(node_potentials, str)
                    or getattr(node_potentials, "ndim", 1) == 0):
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
            self._edge: list[np.ndarray] = [np.zeros((self._cards[i], self._cards[j])) for i, j in self._edges]
        else:
            shared = None
            tables: Sequence[object] = ()                  # one table per edge, unless shared
            if not isinstance(edge_potentials, (list, tuple)):
                shared = _as_float_array("edge_potentials", edge_potentials)
                if shared.ndim == 3:                         # one table per edge, stacked
                    tables, shared = list(shared), None
                elif shared.ndim != 2:
                    raise ValueError("edge_potentials must be a list of 2-D tables or one shared 2-D table, got "
                                     f"shape {shared.shape}")
            else:
                tables = edge_potentials
            if shared is None and len(tables) != m:
                raise ValueError(f"edge_potentials must hold one table per edge ({m}), got {len(tables)}")
            self._edge = []
            for e, (i, j) in enumerate(self._edges):
                t = shared if shared is not None else _as_float_array(f"edge_potentials[{e}]", tables[e], ndim=2)
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
        v = check_int(name, v)
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
    def score(self, labelling: object) -> float:
        """``sum_i theta_i(y_i) + sum_e theta_e(y_i, y_j)`` (``-inf`` for a forbidden labelling).  ``ValueError``
        where finite potentials sum past float64's range, as in :meth:`all_scores`."""
        y = self.check_labelling(labelling)
        with np.errstate(over="ignore", invalid="ignore"):
            s = float(sum(self._node[i][y[i]] for i in range(self.num_nodes)))
            s = s + float(sum(t[y[i], y[j]] for t, (i, j) in zip(self._edge, self._edges, strict=True)))
        if not np.isfinite(s):
            if any(np.isneginf(self._node[i][y[i]]) for i in range(self.num_nodes)) or any(
                    np.isneginf(t[y[i], y[j]]) for t, (i, j) in zip(self._edge, self._edges, strict=True)):
                return -np.inf                               # a forbidden part, whatever the other sums
            raise _overflow()
        return s

    def expected_score(self, marginals: LocalMarginals) -> float:
        """``<theta, mu>`` for a point ``mu`` of the local polytope (the LP objective of section 3.1); ``-inf``
        where ``mu`` puts mass on a forbidden label or pair, ``ValueError`` where finite terms sum past float64's
        range."""
        mu = self.check_marginals(marginals)
        s, forbidden = 0.0, False
        with np.errstate(over="ignore", invalid="ignore"):
            for th, m in itertools.chain(zip(self._node, mu.node, strict=True),
                                         zip(self._edge, mu.edge, strict=True)):
                s += float(np.sum(np.where(m > 0, th, 0.0) * m))
                forbidden = forbidden or bool(np.any(np.isneginf(th) & (m > 0)))
        if forbidden:
            return -np.inf
        if not np.isfinite(s):
            raise _overflow()
        return s

    def all_scores(self, max_configurations: int = MAX_CONFIGURATIONS) -> np.ndarray:
        """The score of every labelling as an array of shape ``cardinalities`` (enumeration; small models).
        ``ValueError`` where finite potentials sum past float64's range (a labelling read as forbidden, or as
        scoring ``+inf``)."""
        _check_enumerable(self._cards, max_configurations)
        total = np.zeros(self._cards if self._cards else ())
        n = self.num_nodes
        terms = [(u, [-1 if k == i else 1 for k in range(n)]) for i, u in enumerate(self._node)]
        for (i, j), t in zip(self._edges, self._edge, strict=True):
            shape = [1] * n
            shape[i], shape[j] = self._cards[i], self._cards[j]
            terms.append((t if i < j else t.T, shape))
        with np.errstate(over="ignore"):
            for t, shape in terms:
                total = total + t.reshape(shape)
        infinite = np.isinf(total)
        if infinite.any():
            forbidden = np.zeros(total.shape, dtype=bool)       # a -inf term: the only legitimate infinite score
            for t, shape in terms:
                forbidden = forbidden | np.isneginf(t).reshape(shape)
            if (infinite & ~forbidden).any():
                raise _overflow()
        return total

    def check_marginals(self, marginals: object, name: str = "marginals") -> LocalMarginals:
        """``marginals`` (or a :class:`MAPResult`'s) as :class:`LocalMarginals` of this model: one node and edge
        table per node and edge, of the right shapes, with finite entries no lower than ``-1e-6`` (an LP solver's
        rounding); ``TypeError``/``ValueError`` naming ``name`` otherwise."""
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
        for part, tables in (("node", marginals.node), ("edge", marginals.edge)):
            for k, m in enumerate(tables):
                if not np.all(np.isfinite(m)) or np.any(m < -1e-6):
                    raise ValueError(f"{name}.{part}[{k}] must hold finite marginals >= 0, got {m.tolist()}")
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
        """The same graph and label sets with new potentials (``None`` is zero, as in the constructor: pass
        :attr:`node_potentials` or :attr:`edge_potentials` to keep either)."""
        return PairwiseMRF(self._labels, self._edges, node_potentials, edge_potentials)

    def to_factor_graph(self) -> FactorGraph:
        """The equivalent :class:`~betheproj.factor_graphs.FactorGraph` (factor ``e`` is edge ``e``)."""
        return FactorGraph.pairwise(self._node, list(self._edges), list(self._edge))

    def tree_parents(self, parents: Sequence[int] | None = None) -> np.ndarray:
        """Check that the graph is the tree ``parents`` (default: the chain ``0 - 1 - ... - N-1``) in the numbering
        of :class:`~betheproj.oracles.Tree` (``parents[0] = -1``, ``0 <= parents[i] < i``); returns, for every node
        ``i >= 1``, the id of the edge joining it to its parent (as an array indexed ``i - 1``)."""
        return self._tree(parents)[1]

    def _tree(self, parents: Sequence[int] | None) -> tuple[list[int], np.ndarray]:
        """:meth:`tree_parents`' checks: ``parents`` as a list of ints (read once) and the edge ids."""
        n = self.num_nodes
        if parents is None:
            parents = [-1] + list(range(n - 1))
        if not isinstance(parents, str | np.ndarray):
            parents = list(parents)                          # a generator is read once
        if isinstance(parents, str) or not all(isinstance(v, int | np.integer) and not isinstance(v, bool)
                                               for v in np.asarray(parents).tolist()):
            raise TypeError(f"parents must be integers, got {parents!r}")
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
        return p, out

    def to_pairwise_potentials(self, parents: Sequence[int] | None = None, dtype: torch.dtype | None = None
                               ) -> PairwisePotentials:
        """The potentials as a batch-of-one :class:`~betheproj.oracles.PairwisePotentials` for the chain or tree
        oracles (``parents`` as in :meth:`tree_parents`).  Label sets of different sizes are padded to the
        largest with ``-inf`` potentials, so the oracles never choose a padded label.  Finite potentials beyond
        the range of ``dtype`` are refused (as by :meth:`PairwisePotentials.to`), not turned into infinities."""
        import torch

        from ..oracles.base import PairwisePotentials

        dtype = torch.float64 if dtype is None else dtype
        p, eids = self._tree(parents)                        # a generator is read once, here
        n, c = self.num_nodes, max(self._cards)
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
        pot = PairwisePotentials(torch.as_tensor(node, dtype=torch.float64), torch.as_tensor(edge, dtype=torch.float64))
        return pot.to(dtype=dtype)

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
        i, j = (check_int(f"edges[{e}][{k}]", edge[k]) for k in range(2))
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


def _overflow() -> ValueError:
    return ValueError("the potentials' sums overflow float64 for some labellings (finite scores past +-1.8e308): "
                      "rescale the potentials")


def _check_enumerable(cards: Sequence[int], max_configurations: int) -> None:
    max_configurations = check_count("max_configurations", max_configurations)
    total = math.prod(cards)
    if total > max_configurations:
        raise ValueError(f"the MRF has {total} labellings, more than max_configurations={max_configurations}; "
                         "use lp_map or lbp_map")


def _label_names(name: str, labels: object) -> list[Hashable]:
    """``labels`` as a list: a sequence (not a string) or a one-dimensional array or tensor of names."""
    if hasattr(labels, "tolist") and hasattr(labels, "shape"):            # a NumPy array or a torch tensor
        if len(labels.shape) != 1:
            raise ValueError(f"{name} must be one-dimensional, got shape {tuple(labels.shape)}")
        return labels.tolist()
    if isinstance(labels, str) or not isinstance(labels, Sequence):
        raise TypeError(f"{name} must be a sequence of label names, got {type(labels).__name__}")
    return list(labels)


def agreement_table(labels_i: Sequence[Hashable], labels_j: Sequence[Hashable]) -> np.ndarray:
    """``I(y_i = y_j)`` by label *name* as a ``(len(labels_i), len(labels_j))`` 0/1 table (Figure 1's edges)."""
    labels_i, labels_j = _label_names("labels_i", labels_i), _label_names("labels_j", labels_j)
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
