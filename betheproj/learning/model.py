"""A CRF with a non-local energy, ``P_c(y|x)``, and its surrogate likelihood (section 7, eqs. 11-17)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from .._checks import check_count, check_nonnegative
from .._files import torch_load, torch_save
from ..energies.base import Energy
from ..inference.decode import decode
from ..inference.pieces import solve_global
from ..inference.solve import METHODS, Solution, check_oracle, solve
from ..oracles import LinearChain
from ..oracles.base import Marginals, Oracle, PairwisePotentials, has_pairwise_factors, tree_parents
from ._checks import check_lengths_like
from .crf import crf_nll, sequence_score, sufficient_statistics

if TYPE_CHECKING:
    from .train import History

__all__ = ["NonLocalCRF", "surrogate_nll"]


def surrogate_nll(oracle: Oracle, potentials: PairwisePotentials, energy: Energy | None, marginals: Marginals | None,
                  labels: Tensor) -> Tensor:
    """``-log Q(y; mu)`` [B], the negated terms of the surrogate likelihood (12).

    ``Q`` is the MRF with parameters ``rho = theta - grad_mu L_psi(mu)`` (eq. 11) at the fixed marginals ``mu``.
    Its gradient is ``m - S(y)`` in ``theta`` (eq. 13, ``m`` the marginals of ``Q``, equal to ``mu`` when ``mu``
    solves (2)) and ``-(d rho / d psi)^T (S(y) - m)`` in ``psi`` (eqs. 14-15): autograd differentiates
    ``grad_mu L_psi`` in ``psi`` (double backward for energies without a closed form), so any energy whose
    ``psi`` is a tensor that requires grad can be learned.  Without an energy this is the CRF likelihood.
    """
    if energy is not None and not isinstance(energy, Energy):
        raise TypeError(f"energy must be an Energy or None, got {type(energy).__name__}")
    if marginals is not None and not isinstance(marginals, Marginals):
        raise TypeError(f"marginals must be Marginals (a Solution's .marginals) or None, got "
                        f"{type(marginals).__name__}")
    if energy is None:
        return crf_nll(oracle, potentials, labels)
    if marginals is None:
        raise ValueError("marginals (the solution mu of (2)) are required with an energy")
    if marginals.node.dtype != potentials.node.dtype:
        raise TypeError(f"marginals must have the potentials' dtype {potentials.node.dtype}, got "
                        f"{marginals.node.dtype}")
    if marginals.node.shape != potentials.node.shape:
        raise ValueError(f"marginals must have the potentials' node shape [B, N, C]={tuple(potentials.node.shape)}, "
                         f"got {tuple(marginals.node.shape)}")
    if marginals.lengths is not None and not torch.equal(marginals.lengths.to(potentials.lengths.device),
                                                         potentials.lengths):
        raise ValueError("marginals must have the potentials' lengths (solve (2) for the same batch)")
    fixed = Marginals(marginals.node.detach(), lambda: marginals.edge.detach(), None, marginals.lengths)
    energy.validate(fixed)
    with torch.enable_grad():
        g = energy.grad(fixed)
    edge = None if g.edge is None or not has_pairwise_factors(oracle) else -g.edge   # constant without pairs
    rho = potentials.shifted(None if g.node is None else -g.node, edge)
    return crf_nll(oracle, rho, labels)


class NonLocalCRF(nn.Module):
    """``P_c(y|x)``: base potentials ``theta(x)`` plus a non-local energy ``L_psi(x)(mu)``, an estimator with
    :meth:`fit` and :meth:`predict`.

    Args:
        theta: module ``(features [B, N, F], lengths [B]) -> PairwisePotentials`` (e.g. ``LinearChainCRF``).
        energy: ``psi -> Energy``, building the energy for a batch from its weights (``None``: a plain CRF).
        psi: module ``(features, lengths) -> psi`` ([B] or [B, J]); default a learned constant in theta's dtype.
        oracle: the marginal oracle of the base structure (default ``LinearChain()``).
        method, max_iter, tol: passed to :func:`betheproj.solve` for inference.
        search: ``"local"`` runs the solver from the base marginals (a stationary point of (2));
            ``"global"`` uses :func:`betheproj.inference.solve_global` for energies that are a minimum of
            convex pieces (the nearest-prototype energies), which finds the global minimum.
    """

    def __init__(self, theta: nn.Module, energy: Callable[[Tensor], Energy] | None = None,
                 psi: nn.Module | None = None, oracle: Oracle | None = None, method: str = "md",
                 max_iter: int = 100, tol: float | None = None, search: str = "local"):
        super().__init__()
        if not isinstance(theta, nn.Module):
            raise TypeError(f"theta must be a torch.nn.Module, got {type(theta).__name__}")
        if energy is not None and not callable(energy):
            raise TypeError("energy must be a callable psi -> Energy, or None")
        if psi is not None and not isinstance(psi, nn.Module):
            raise TypeError(f"psi must be a torch.nn.Module or None, got {type(psi).__name__}")
        if psi is not None and energy is None:
            raise ValueError("psi weights the non-local energy, but energy is None (a plain CRF): give energy too, "
                             "or no psi")
        if method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {method!r}")
        if search not in ("local", "global"):
            raise ValueError(f"search must be 'local' or 'global', got {search!r}")
        max_iter = check_count("max_iter", max_iter)
        if tol is not None:
            tol = check_nonnegative("tol", tol)
        if oracle is not None:                # an instance: the class LinearChain has the methods too, unbound
            check_oracle(oracle, ("marginals", "map", "entropy"))
        from .psi import ConstantPsi

        self.theta = theta
        self.energy_fn = energy
        if psi is None and energy is not None:           # a learned scalar in theta's dtype, on its device
            weight = next((w for w in theta.parameters() if w.is_floating_point()), None)
            dtype = torch.get_default_dtype() if weight is None else weight.dtype
            psi = ConstantPsi(torch.tensor(1.0, dtype=dtype, device=None if weight is None else weight.device))
        self.psi = psi
        self.oracle = LinearChain() if oracle is None else oracle
        self.method, self.max_iter, self.tol, self.search = method, max_iter, tol, search

    def potentials(self, features: Tensor, lengths: Tensor) -> PairwisePotentials:
        return self.theta(features, lengths)

    def energy(self, features: Tensor, lengths: Tensor) -> Energy | None:
        """The energy of a batch, differentiable in the psi parameters while autograd records."""
        if self.energy_fn is None:
            return None
        assert self.psi is not None                  # __init__ gives psi with every energy
        return self.energy_fn(self.psi(features, lengths))

    @torch.no_grad()
    def infer(self, features: Tensor, lengths: Tensor, max_iter: int | None = None) -> Solution | None:
        """Solve (2) for a batch (``None`` without an energy: the CRF's marginals are then the oracle's)."""
        max_iter = self.max_iter if max_iter is None else check_count("max_iter", max_iter, 0)
        energy = self.energy(features, lengths)
        if energy is None:
            return None
        solver = solve_global if self.search == "global" else solve
        return solver(self.oracle, self.potentials(features, lengths), energy, method=self.method,
                      max_iter=max_iter, tol=self.tol)

    def loss(self, features: Tensor, labels: Tensor, lengths: Tensor, marginals: Marginals | None = None) -> Tensor:
        """Mean surrogate negative log-likelihood (12) of a batch; solves (2) first if ``marginals`` is None."""
        if isinstance(features, Tensor) and features.shape[:1] == (0,):
            raise ValueError("features hold no examples (B = 0): the mean loss of an empty batch is undefined")
        if marginals is None and self.energy_fn is not None:
            solution = self.infer(features, lengths)
            assert solution is not None                  # a Solution: there is an energy
            marginals = solution.marginals
        return surrogate_nll(self.oracle, self.potentials(features, lengths), self.energy(features, lengths),
                             marginals, labels).mean()

    def score(self, features: Tensor, labels: Tensor, lengths: Tensor) -> Tensor:
        """``<theta, S(y)> - L_psi(S(y))`` [B]: the log-probability of the labels under ``P_c(y|x)`` (eq. 8) up to
        its log-normaliser, the energy evaluated on the labelling itself rather than on marginals.  Of two
        labellings of an input the model prefers the one with the higher score; MAP under it (section 4's
        combinatorial problem) is what Proposition 1's decoding approximates.  Without an energy: the CRF's
        ``<theta, S(y)>``.  Labels past each length are ignored."""
        check_lengths_like(features, lengths)
        potentials = self.potentials(features, lengths)
        parents = tree_parents(self.oracle, potentials.node.shape[1])
        pairwise = has_pairwise_factors(self.oracle)
        value = sequence_score(potentials, labels, parents, pairwise_factors=pairwise)
        energy = self.energy(features, lengths)
        if energy is None:
            return value
        statistics = sufficient_statistics(potentials, labels, parents, pairwise_factors=pairwise)
        energy.validate(statistics)
        return value - energy.value(statistics)

    @torch.no_grad()
    def predict(self, features: Tensor, lengths: Tensor, batch_size: int = 2048, max_iter: int | None = None
                ) -> Tensor:
        """Labels [B, N] (``-1`` past each length): Proposition 1's MAP at the solution of (2), in batches.
        An empty batch (``B = 0``) gives an empty [0, N] tensor, as the oracles' ``map`` does."""
        check_count("batch_size", batch_size)
        if not isinstance(features, Tensor) or features.dim() < 2:
            raise ValueError("features must be a [B, N, ...] tensor")
        check_lengths_like(features, lengths)
        if features.shape[0] == 0:
            return torch.empty(0, features.shape[1], dtype=torch.long, device=features.device)
        out = []
        for start in range(0, features.shape[0], batch_size):
            x, n = features[start:start + batch_size], lengths[start:start + batch_size]
            sol = self.infer(x, n, max_iter)
            out.append(self.oracle.map(self.potentials(x, n)) if sol is None else decode(self.oracle, sol))
        width = features.shape[1]
        return torch.cat([nn.functional.pad(y, (0, width - y.shape[1]), value=-1) for y in out])

    def fit(self, features: Tensor, labels: Tensor, lengths: Tensor, algorithm: str = "doubly_stochastic",
            **options: Any) -> NonLocalCRF:
        """Learn theta and psi: ``"doubly_stochastic"`` (Algorithm 3) or ``"em"`` (Algorithm 2); ``options``
        go to :func:`fit_doubly_stochastic` / :func:`fit_variational_em`.  The history is ``self.history_``."""
        from .train import fit_doubly_stochastic, fit_variational_em

        algorithms: dict[str, Callable[..., History]] = {"doubly_stochastic": fit_doubly_stochastic,
                                                         "em": fit_variational_em}
        if algorithm not in algorithms:
            raise ValueError(f"algorithm must be one of {tuple(algorithms)}, got {algorithm!r}")
        self.history_ = algorithms[algorithm](self, features, labels, lengths, **options)
        return self

    def save(self, path: str | Path) -> None:
        """Write the parameters (``state_dict``) to ``path`` (``OSError`` naming it when it cannot be written)."""
        torch_save(self.state_dict(), path)

    def load(self, path: str | Path) -> NonLocalCRF:
        """Read parameters written by :meth:`save` into this model (built with the same structure).

        ``FileNotFoundError`` for a missing file; ``ValueError`` naming ``path`` for a file that is not such a
        checkpoint or one saved from a model of another structure or dtype."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"no checkpoint at {path}")
        state = torch_load(path, "checkpoint written by NonLocalCRF.save", map_location="cpu")   # a GPU one too
        if not isinstance(state, dict) or not all(isinstance(k, str) for k in state):
            raise ValueError(f"{path} is not a checkpoint written by NonLocalCRF.save (it holds a "
                             f"{type(state).__name__}, not a state dict)")
        mine = self.state_dict()
        for name, value in state.items():          # load_state_dict would cast a float64 checkpoint to float32
            if name in mine and isinstance(value, Tensor) and value.dtype != mine[name].dtype:
                raise ValueError(f"{path} was saved from a model in another dtype ({name}: {value.dtype}, this "
                                 f"model's {mine[name].dtype}): build the model in {value.dtype} to load it")
        try:
            self.load_state_dict(state)
        except RuntimeError as err:  # missing, unexpected or differently shaped parameters
            last = (str(err).strip().splitlines() or [""])[-1].strip()     # torch lists the mismatches last
            raise ValueError(f"{path} was saved from a model of another structure ({last})") from None
        return self
