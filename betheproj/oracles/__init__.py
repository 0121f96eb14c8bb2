"""Marginal-inference oracles: tractable base structures behind one protocol."""

from .base import ChainPotentials, Marginals, Oracle, PairwisePotentials, bethe_entropy, log_partition
from .brute_force import BruteForce
from .chain import LinearChain
from .tree import Tree

__all__ = ["BruteForce", "ChainPotentials", "LinearChain", "Marginals", "Oracle", "PairwisePotentials",
           "Tree", "bethe_entropy", "log_partition"]
