"""A factor graph over discrete variables with per-variable label sets, soft and hard-constraint factors.

The distribution is ``p(y) ∝ exp(sum_i unary_i(y_i) + sum_C log psi_C(y_C))`` (Martins et al. 2010, eq. 2 with
the unary soft factors folded into their variables).  Variables are numbered ``0 .. num_variables-1`` in the
order they are added; factors are numbered in the order they are added.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ._util import as_index, as_log_array, as_numpy
from .factors import Dense, Factor

__all__ = ["FactorGraph"]


class FactorGraph:
    """Discrete variables (cardinality ``>= 1`` each, with unary log-potentials) and factors on them.

    >>> g = FactorGraph([2, 3])
    >>> g.set_unary(0, [0.0, 1.5])
    >>> g.add_factor(Dense((0, 1), np.zeros((2, 3))))
    0
    """

    def __init__(self, cardinalities: Sequence[int] = ()):
        self._cards: list[int] = []
        self._unary: list[np.ndarray] = []
        self._factors: list[Factor] = []
        self._adj: list[list[tuple[int, int]]] = []
        if not isinstance(cardinalities, (Sequence, np.ndarray)) or isinstance(cardinalities, str):
            raise TypeError(f"cardinalities must be a sequence of ints, got {type(cardinalities).__name__}")
        for k, c in enumerate(cardinalities):
            self._add(as_index(f"cardinalities[{k}]", c), f"cardinalities[{k}]")

    # --- construction -------------------------------------------------------------------------------------
    def _add(self, card: int, name: str) -> int:
        if card < 1:
            raise ValueError(f"{name} must be at least 1, got {card}")
        self._cards.append(card)
        self._unary.append(np.zeros(card))
        self._adj.append([])
        return len(self._cards) - 1

    def add_variable(self, cardinality: int, unary: object = None) -> int:
        """Add a variable with ``cardinality`` states (and optional unary log-potentials); returns its id."""
        v = self._add(as_index("cardinality", cardinality), "cardinality")
        if unary is not None:
            try:
                self.set_unary(v, unary)
            except (TypeError, ValueError):
                self._cards.pop()
                self._unary.pop()
                self._adj.pop()
                raise
        return v

    def add_variables(self, cardinalities: Sequence[int]) -> list[int]:
        """Add several variables; returns their ids."""
        return [self.add_variable(c) for c in cardinalities]

    def _check_var(self, name: str, v: object) -> int:
        v = as_index(name, v)
        if v >= len(self._cards):
            raise ValueError(f"{name} = {v} is not a variable of this graph (it has {len(self._cards)})")
        return v

    def set_unary(self, variable: int, unary: object) -> None:
        """Set the unary log-potentials of ``variable`` (length = its cardinality; ``-inf`` forbids a state)."""
        v = self._check_var("variable", variable)
        arr = as_log_array("unary", unary, ndim=1)
        if arr.shape != (self._cards[v],):
            raise ValueError(f"unary must have shape ({self._cards[v]},) (the cardinality of variable {v}), "
                             f"got {arr.shape}")
        self._unary[v] = arr

    def add_factor(self, factor: Factor) -> int:
        """Attach ``factor`` (a :class:`Dense`, hard-constraint or TREE factor); returns its id.

        Raises ``ValueError`` if it names unknown variables or does not fit their cardinalities (a table of
        the wrong shape, a hard factor on non-binary variables)."""
        if not isinstance(factor, Factor):
            raise TypeError(f"factor must be a Factor (Dense, XOR, OR, ...), got {type(factor).__name__}")
        for k, v in enumerate(factor.variables):
            if v >= len(self._cards):
                raise ValueError(f"factor.variables[{k}] = {v} is not a variable of this graph "
                                 f"(it has {len(self._cards)})")
        factor.check_cardinalities(tuple(self._cards[v] for v in factor.variables))
        f = len(self._factors)
        self._factors.append(factor)
        for k, v in enumerate(factor.variables):
            self._adj[v].append((f, k))
        return f

    def add_dense(self, variables: Sequence[int], table: object) -> int:
        """Shorthand for ``add_factor(Dense(variables, table))``."""
        return self.add_factor(Dense(variables, table))

    @classmethod
    def pairwise(cls, unary: Sequence[object], edges: Sequence[tuple[int, int]],
                 tables: Sequence[object] | object) -> FactorGraph:
        """A pairwise MRF ``p(y) ∝ exp(sum_i unary[i][y_i] + sum_e tables[e][y_i, y_j])``.

        ``unary[i]`` (array or tensor) gives variable ``i``'s log-potentials and thereby its number of labels
        (label sets may differ in size); ``edges[e] = (i, j)``; ``tables[e]`` has shape
        ``(len(unary[i]), len(unary[j]))``, or ``tables`` is one 2-D table shared by every edge.
        """
        if not isinstance(unary, (Sequence, np.ndarray)) or isinstance(unary, str):
            raise TypeError(f"unary must be a sequence of 1-D log-potential arrays, got {type(unary).__name__}")
        if not isinstance(edges, (Sequence, np.ndarray)) or isinstance(edges, str):
            raise TypeError(f"edges must be a sequence of (i, j) pairs, got {type(edges).__name__}")
        g = cls()
        for i, u in enumerate(unary):
            arr = as_log_array(f"unary[{i}]", u, ndim=1)
            if arr.size == 0:
                raise ValueError(f"unary[{i}] is empty (a variable needs at least one label)")
            g.add_variable(arr.size, arr)
        shared = None
        per_edge: Sequence[object] = ()
        if not isinstance(tables, (list, tuple)):
            shared = as_log_array("tables", tables)
            if shared.ndim != 2:
                raise ValueError(f"tables must be a list of 2-D tables or one shared 2-D table, got shape "
                                 f"{shared.shape}")
        elif len(tables) != len(edges):
            raise ValueError(f"tables must hold one table per edge ({len(edges)}), got {len(tables)}")
        else:
            per_edge = tables
        for e, edge in enumerate(edges):
            if not isinstance(edge, (Sequence, np.ndarray)) or len(edge) != 2:
                raise ValueError(f"edges[{e}] must be a pair (i, j), got {edge!r}")
            i, j = (g._check_var(f"edges[{e}][{k}]", edge[k]) for k in range(2))
            if i == j:
                raise ValueError(f"edges[{e}] is a self-loop ({i}, {j}): an edge joins two different variables")
            table = shared if shared is not None else as_log_array(f"tables[{e}]", per_edge[e], ndim=2)
            want = (g._cards[i], g._cards[j])
            if table.shape != want:
                name = "tables (shared)" if shared is not None else f"tables[{e}]"
                raise ValueError(f"{name} must have shape {want} for edge {e} ({i}, {j}), got {table.shape}")
            g.add_factor(Dense((i, j), table))
        return g

    # --- access -------------------------------------------------------------------------------------------
    @property
    def num_variables(self) -> int:
        return len(self._cards)

    @property
    def num_factors(self) -> int:
        return len(self._factors)

    @property
    def cardinalities(self) -> tuple[int, ...]:
        return tuple(self._cards)

    @property
    def factors(self) -> tuple[Factor, ...]:
        return tuple(self._factors)

    def unary(self, variable: int) -> np.ndarray:
        """The unary log-potentials of ``variable`` (a copy)."""
        return self._unary[self._check_var("variable", variable)].copy()

    def neighbors(self, variable: int) -> list[tuple[int, int]]:
        """``(factor id, position of the variable in that factor)`` for every factor on ``variable``."""
        return list(self._adj[self._check_var("variable", variable)])

    def degree(self, variable: int) -> int:
        """Number of factors on ``variable`` (``d_i`` of the Bethe entropy; unaries do not count)."""
        return len(self._adj[self._check_var("variable", variable)])

    def is_tree(self) -> bool:
        """Whether the bipartite variable-factor graph is a forest (then BP is exact)."""
        parent = list(range(self.num_variables + self.num_factors))

        def find(x: int) -> int:
            while parent[x] != x:
                parent[x] = parent[parent[x]]
                x = parent[x]
            return x

        for f, factor in enumerate(self._factors):
            node = self.num_variables + f
            for v in factor.variables:
                a, b = find(node), find(v)
                if a == b:
                    return False
                parent[a] = b
        return True

    def score(self, assignment: Sequence[int]) -> float:
        """``sum_i unary_i(y_i) + sum_C log psi_C(y_C)`` (``-inf`` if a hard constraint is violated)."""
        y = np.asarray(as_numpy(assignment))
        if y.size == 0 and self.num_variables == 0:
            y = y.astype(np.int64)                 # [] reads as a float array: no labels, none of them a float
        if y.shape != (self.num_variables,) or not np.issubdtype(y.dtype, np.integer):
            raise ValueError(f"assignment must be {self.num_variables} integer labels, got {assignment!r}")
        if ((y < 0) | (y >= np.array(self._cards, dtype=np.int64))).any():
            raise ValueError(f"assignment has labels outside the variables' ranges {self.cardinalities}")
        total = float(sum(self._unary[i][y[i]] for i in range(self.num_variables)))
        for factor in self._factors:
            total += factor.log_potential([int(y[v]) for v in factor.variables])
        return total

    def __repr__(self) -> str:
        return f"FactorGraph(variables={self.num_variables}, factors={self.num_factors})"
