"""Solvers for problem (2) and decoding; they know nothing about which oracle or energy they drive."""

from .decode import decode
from .pieces import solve_global
from .solve import METHODS, Solution, objective, solve

__all__ = ["METHODS", "Solution", "decode", "objective", "solve", "solve_global"]
