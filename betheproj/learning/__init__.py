"""Learning theta and psi over any oracle: CRF likelihood, the surrogate likelihood (12), Algorithms 2 and 3."""

from .crf import LinearChainCRF, SparseChainCRF, crf_nll, fit_crf, sequence_score
from .model import NonLocalCRF, surrogate_nll
from .psi import ConstantPsi, MeanMapPsi, RandomFourierFeatures
from .train import History, character_accuracy, fit_doubly_stochastic, fit_variational_em

__all__ = ["LinearChainCRF", "SparseChainCRF", "crf_nll", "fit_crf", "sequence_score", "NonLocalCRF", "surrogate_nll",
           "ConstantPsi", "MeanMapPsi", "RandomFourierFeatures", "History", "character_accuracy",
           "fit_doubly_stochastic", "fit_variational_em"]
