"""Collective graphical models (section 8.3): migration counts on a grid, approximate MAP of the counts
(eq. 23) with the Bethe solvers, an interior-point baseline, and hard-EM learning of the transitions."""

from .inference import CGMResult, check_observations, map_counts
from .interior_point import IPResult, interior_point
from .learn import HardEMHistory, fit_hard_em
from .model import MigrationInstance, TransitionModel, default_model, simulate

__all__ = ["TransitionModel", "MigrationInstance", "default_model", "simulate", "CGMResult", "check_observations",
           "map_counts", "IPResult", "interior_point", "HardEMHistory", "fit_hard_em"]
