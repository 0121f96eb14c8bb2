"""Learning theta (and, in later parts, psi) over any oracle."""

from .crf import LinearChainCRF, crf_nll, fit_crf, sequence_score

__all__ = ["LinearChainCRF", "crf_nll", "fit_crf", "sequence_score"]
