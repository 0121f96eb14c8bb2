"""betheproj: structured prediction with non-local energies on marginals (Bethe projections).

Structure (oracle) -> energy -> solver -> decoder::

    import betheproj as bp
    theta = bp.ChainPotentials(node, edge, lengths)
    sol = bp.solve(bp.LinearChain(), theta, bp.energies.Poisson(counts, rate=0.5, scale=100.0))
    labels = bp.decode(bp.LinearChain(), sol)
"""

from . import energies
from .inference import Solution, decode, objective, solve
from .oracles import (
    BruteForce,
    ChainPotentials,
    LinearChain,
    Marginals,
    NonProjective,
    Oracle,
    PairwisePotentials,
    Projective,
    Tree,
    arc_potentials,
)

__all__ = ["BruteForce", "ChainPotentials", "LinearChain", "Marginals", "NonProjective", "Oracle", "PairwisePotentials",
           "Projective", "Solution", "Tree", "arc_potentials", "decode", "energies", "objective", "solve"]
__version__ = "0.1.0"
