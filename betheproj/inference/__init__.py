"""Solvers for problem (2) and decoding; they know nothing about which oracle or energy they drive (the segment
decoder of :mod:`.segments` reads a linear chain's potentials with BIO labels)."""

from .decode import decode
from .pieces import solve_global
from .segments import BIOFields, best_segments, decode_segments, decode_segments_at, segment_log_marginals
from .solve import METHODS, Solution, objective, solve

__all__ = ["METHODS", "BIOFields", "Solution", "best_segments", "decode", "decode_segments", "decode_segments_at",
           "objective", "segment_log_marginals", "solve", "solve_global"]
