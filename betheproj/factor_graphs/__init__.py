"""Factor graphs with soft (Dense) and hard-constraint factors: loopy BP and LP-relaxed MAP.

Implements the machinery of Martins et al., *Turbo Parsers* (EMNLP 2010), sections 2-4 and Table 1:

* :class:`FactorGraph`: discrete variables with per-variable label sets and unary log-potentials;
  :meth:`FactorGraph.pairwise` builds a pairwise MRF in one call;
* factors: :class:`Dense` (any arity, ``-inf`` allowed), the hard-constraint factors of Table 1 on binary
  variables (:class:`XOR`, :class:`OR`, :class:`OROut` with optional negated inputs, and the named negated
  variants :class:`NAND`, :class:`IMPLY`, :class:`XOROut`) and the :class:`TreeFactor` over dependency arcs;
* :func:`belief_propagation`: sum-/max-product loopy BP (parallel or sequential schedule, damping, message
  normalisation) with beliefs, a convergence report and the Bethe free energy; :func:`decode_map`;
* :func:`lp_map`: LP-relaxed MAP over the local polytope with an integrality report.
"""

from .bp import BPResult, belief_propagation, decode_map
from .factors import IMPLY, NAND, OR, XOR, BinaryHardFactor, Dense, Factor, FactorBelief, OROut, XOROut
from .graph import FactorGraph
from .lp import LPBuilder, LPResult, lp_map
from .tree import Tree, TreeFactor

__all__ = ["BPResult", "BinaryHardFactor", "Dense", "Factor", "FactorBelief", "FactorGraph", "IMPLY", "LPBuilder",
           "LPResult", "NAND", "OR", "OROut", "Tree", "TreeFactor", "XOR", "XOROut",
           "belief_propagation", "decode_map", "lp_map"]
