"""Arc-factored dependency parsing: hashed McDonald-style arc features, the parser trained by Algorithm 1 of
Martins et al. (EMNLP 2010) with the loss family ``L_{beta,gamma}``, attachment scores, and the ``parse`` CLI."""

from .features import ArcFeatures
from .metrics import attachment_counts, uas
from .parser import DependencyParser, GreedyFirst

__all__ = ["ArcFeatures", "DependencyParser", "GreedyFirst", "attachment_counts", "uas"]
