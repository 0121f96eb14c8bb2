"""Pairwise MRFs with per-node label sets: exact, LP-relaxed and loopy-BP MAP, and the constructions of
Kulesza & Pereira, *Structured Learning with Approximate Inference* (NIPS 2007)."""

from .bounds import LocalPolytope, lp_margin_bounds, lp_radius_bounds
from .linear import LinearPairwiseMRF
from .map import exact_map, lbp_map, lp_map
from .pairwise import LocalMarginals, MAPResult, PairwiseMRF, agreement_table, grid_edges
from .paper import (
    TRIANGLE_INPUTS,
    figure2_mrf,
    figure3_dataset,
    lbp_decision_boundary,
    lbp_exponents,
    lbp_gamma,
    random_grid_dataset,
    triangle_correct,
    triangle_model,
)

__all__ = ["TRIANGLE_INPUTS", "LinearPairwiseMRF", "LocalMarginals", "LocalPolytope", "MAPResult", "PairwiseMRF",
           "agreement_table", "exact_map", "figure2_mrf", "figure3_dataset", "grid_edges", "lbp_decision_boundary",
           "lbp_exponents", "lbp_gamma", "lbp_map", "lp_map", "lp_margin_bounds", "lp_radius_bounds",
           "random_grid_dataset", "triangle_correct", "triangle_model"]
