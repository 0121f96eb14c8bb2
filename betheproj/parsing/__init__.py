"""Dependency parsing: hashed McDonald-style arc features, the arc-factored parser trained by Algorithm 1 of
Martins et al. (EMNLP 2010) with the loss family ``L_{beta,gamma}``, second-order (sibling and grandparent)
parsing by loopy BP (Turbo Parser #1) or a mean-field energy solved by Bethe-RDA, attachment scores, and the
``parse`` CLI."""

from .features import ArcFeatures
from .metrics import attachment_counts, uas
from .parser import DependencyParser, GreedyFirst
from .part_features import SecondOrderFeatures
from .second_order import SecondOrderParser
from .second_order_decoding import loopy_bp_parse, mean_field_parse

__all__ = ["ArcFeatures", "DependencyParser", "GreedyFirst", "attachment_counts", "uas", "SecondOrderFeatures",
           "SecondOrderParser", "loopy_bp_parse", "mean_field_parse"]
