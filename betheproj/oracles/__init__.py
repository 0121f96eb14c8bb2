"""Marginal-inference oracles: tractable base structures behind one protocol."""

from .base import (
    ChainPotentials,
    Marginals,
    Oracle,
    PairwisePotentials,
    bethe_entropy,
    edge_row_ends,
    has_pairwise_factors,
    keeps_width,
    log_partition,
    tree_parents,
)
from .brute_force import BruteForce
from .chain import LinearChain
from .dependency import DependencyMarginals, arc_potentials, arcs_to_heads, heads_to_arcs
from .nonprojective import NonProjective, chu_liu_edmonds, log_arc_marginals, matrix_tree
from .projective import Projective, eisner, eisner_map
from .tree import Tree

__all__ = ["BruteForce", "ChainPotentials", "LinearChain", "Marginals", "Oracle", "PairwisePotentials",
           "Tree", "bethe_entropy", "log_partition", "tree_parents", "has_pairwise_factors", "keeps_width",
           "edge_row_ends",
           "DependencyMarginals", "NonProjective", "Projective", "arc_potentials", "arcs_to_heads",
           "chu_liu_edmonds", "eisner", "eisner_map", "heads_to_arcs", "log_arc_marginals", "matrix_tree"]
