"""Non-local energies ``L_psi(mu)``: write ``value`` and autograd supplies the gradient."""

from .base import Energy, EnergySum, FunctionEnergy, Gradient, Scaled, autograd_gradient
from .bigram import BigramExclusion
from .linear import LOSSES, LinearMeasurements, Loss, smoothed_abs, smoothed_hinge, squared, squared_hinge
from .mean_field import MeanField
from .poisson import Poisson
from .precedence import Precedence
from .prototype import NearestPrototype, PrototypeDistance
from .second_order import SecondOrderArcs

__all__ = ["BigramExclusion", "Energy", "EnergySum", "FunctionEnergy", "Gradient", "LOSSES", "LinearMeasurements",
           "Loss",
           "MeanField", "NearestPrototype", "Poisson", "Precedence", "PrototypeDistance", "Scaled", "SecondOrderArcs",
           "autograd_gradient",
           "smoothed_abs", "smoothed_hinge", "squared", "squared_hinge"]
