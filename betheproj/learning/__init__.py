"""Learning theta and psi over any oracle: CRF likelihood, the surrogate likelihood (12), Algorithms 2 and 3."""

from .crf import LinearChainCRF, SparseChainCRF, crf_nll, fit_crf, sequence_score, sufficient_statistics
from .losses import LOSSES, loss_and_gradient, resolve_loss, structured_loss
from .metrics import SegmentScores, segment_counts, segment_f1
from .model import NonLocalCRF, surrogate_nll
from .online import OnlineResult, SparseExample, fit_online
from .psi import ConstantPsi, MeanMapPsi, RandomFourierFeatures
from .train import History, character_accuracy, fit_doubly_stochastic, fit_variational_em

__all__ = ["LinearChainCRF", "SparseChainCRF", "crf_nll", "fit_crf", "sequence_score", "sufficient_statistics",
           "NonLocalCRF", "surrogate_nll",
           "ConstantPsi", "MeanMapPsi", "RandomFourierFeatures", "History", "character_accuracy",
           "fit_doubly_stochastic", "fit_variational_em", "LOSSES", "loss_and_gradient", "resolve_loss",
           "structured_loss", "OnlineResult", "SparseExample", "fit_online", "SegmentScores", "segment_f1",
           "segment_counts"]
