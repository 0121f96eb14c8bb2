"""betheproj: structured prediction with non-local energies on marginals (Bethe projections).

Structure (oracle) -> energy -> solver -> decoder::

    import betheproj as bp
    theta = bp.ChainPotentials(node, edge, lengths)
    sol = bp.solve(bp.LinearChain(), theta, bp.energies.Poisson(counts, rate=0.5, scale=100.0))
    labels = bp.decode(bp.LinearChain(), sol)

The public names load on first use (PEP 562), so that ``import betheproj.cli`` (the ``betheproj`` command) does not
import torch before its Ctrl-C handler is in place; ``bp.solve``, ``from betheproj import solve`` and
``dir(betheproj)`` work as with eager imports.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the names, for type checkers and IDEs
    from . import energies
    from .inference import Solution, decode, objective, solve
    from .oracles import (
        BruteForce,
        ChainPotentials,
        LinearChain,
        Marginals,
        NonProjective,
        Oracle,
        PairwisePotentials,
        Projective,
        Tree,
        arc_potentials,
    )

__all__ = ["BruteForce", "ChainPotentials", "LinearChain", "Marginals", "NonProjective", "Oracle", "PairwisePotentials",
           "Projective", "Solution", "Tree", "arc_potentials", "decode", "energies", "objective", "solve"]
__version__ = "0.1.0"

_HOME = {"energies": "energies", **{name: "inference" for name in ("Solution", "decode", "objective", "solve")},
         **{name: "oracles" for name in ("BruteForce", "ChainPotentials", "LinearChain", "Marginals", "NonProjective",
                                         "Oracle", "PairwisePotentials", "Projective", "Tree", "arc_potentials")}}


def __getattr__(name: str) -> object:
    """A public name, imported from its subpackage on first use (then kept in the module's namespace)."""
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = importlib.import_module(f".{home}", __name__)
    value = module if name == home else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
