"""Hard EM for the transition model from the observed counts alone (Sheldon et al., 2013): Algorithm 2
specialised to a CGM.

Both steps decrease one function, ``F(w, mu) = -H_B(mu) - <theta(w), mu> + L(mu)`` (problem (2) with the
model's potentials ``theta(w)``): the E-step minimises it in ``mu`` (MAP counts, eq. 23) and the M-step in the
parameters ``w``, where, the transitions being normalised, it is the log-likelihood of the MAP flows,
``<log P_1(w), mu_1> + sum_t <log P_t(w), mu_t>``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from .._checks import check_bool, check_count, check_nonnegative
from ..oracles import ChainPotentials
from ..progress import progress_bar
from .inference import CGMResult, _as_observations, check_observations, map_counts
from .model import TransitionModel

__all__ = ["HardEMHistory", "fit_hard_em", "check_schedule"]

SCHEDULES = ("alternate", "quasi_newton")


@dataclass
class HardEMHistory:
    """Per round: the objective ``F`` after the E-step, and the parameters after the M-step."""

    objective: list[float] = field(default_factory=list)
    parameters: list[dict[str, Tensor]] = field(default_factory=list)
    rounds: int = 0
    converged: bool = False
    seconds: float = 0.0


def _offset(result: CGMResult, potentials: ChainPotentials) -> Tensor:
    """The solution's dual offset ``theta~ - theta`` on the nodes (the energy's pull, ``-grad L(mu*)``)."""
    return result.potentials.node - potentials.node


def _shift(potentials: ChainPotentials, offset: Tensor | None) -> ChainPotentials | None:
    """Warm start for new parameters: their potentials plus the last solution's offset."""
    return None if offset is None else ChainPotentials(potentials.node + offset, potentials.edge)


def _m_step(model: TransitionModel, first: Tensor, flows: Tensor, max_iter: int) -> None:
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.LBFGS(params, max_iter=max_iter, history_size=20, line_search_fn="strong_wolfe",
                            tolerance_grad=1e-10, tolerance_change=1e-14)
    scale = 1.0 / float(first.sum())

    def closure() -> Tensor:
        opt.zero_grad()
        loss = -scale * ((model.log_initial() * first).sum() + (model.log_transitions() * flows).sum())
        loss.backward()
        return loss

    opt.step(closure)


def check_schedule(schedule: object) -> str:
    """``schedule``, which must be one of :data:`SCHEDULES` (see :func:`fit_hard_em`)."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be 'alternate' or 'quasi_newton', got {schedule!r}")
    return schedule


def fit_hard_em(model: TransitionModel, observed: Tensor, rate: float, population: float, rounds: int = 30,
                tol: float = 1e-7, m_iter: int = 100, method: str = "md", schedule: str = "alternate",
                progress: bool = False) -> HardEMHistory:
    """Minimise ``F(w, mu)`` over the parameters ``w`` of ``model`` (updated in place) and the counts ``mu``
    from the observed counts alone; ``observed`` [B, T, L] holds ``B`` independent seasons.

    ``schedule="alternate"``: hard EM proper, MAP counts (E-step) then the maximum-likelihood parameters of
    their flows (M-step, L-BFGS to convergence), for ``rounds`` rounds or until ``F`` changes by less than
    ``tol`` relative.  Like every EM it can crawl when the counts say little about the flows.
    ``schedule="quasi_newton"``: the same fixed points, reached by L-BFGS on ``Phi(w) = min_mu F(w, mu)``,
    whose gradient is the M-step's gradient at the MAP counts (the envelope theorem): each evaluation is one
    E-step (warm-started), with a budget of ``rounds`` evaluations; torch's strong-Wolfe line search may take
    one evaluation past it, so up to ``rounds + 1`` E-steps are run (``history.rounds`` counts them).
    Parameters with ``requires_grad=False`` stay as they are; at least one must be left to learn.
    """
    rounds, m_iter = check_count("rounds", rounds), check_count("m_iter", m_iter)
    tol, progress = check_nonnegative("tol", tol), check_bool("progress", progress)
    if not isinstance(model, TransitionModel):
        raise TypeError(f"model must be a TransitionModel, got {type(model).__name__}")
    if not any(p.requires_grad for p in model.parameters()):
        raise ValueError("model has nothing to learn: every parameter has requires_grad=False (leave one "
                         "trainable, or call map_counts for the counts alone)")
    check_schedule(schedule)
    observed = _as_observations(observed)
    batch = max(observed.shape[0], 1) if observed.dim() == 3 else 1   # other shapes: check_observations says why
    with torch.no_grad():
        observed = check_observations(observed, rate, population, model.potentials(batch))
    history = HardEMHistory()
    bar = progress_bar(rounds, progress, "hard EM", leave=True)
    start = time.perf_counter()
    if schedule == "quasi_newton":
        _quasi_newton(model, observed, rate, population, rounds, tol, method, history, bar)
        rounds = 0
    warm = None
    for _ in range(rounds):
        with torch.no_grad():
            potentials = model.potentials(batch)
        result = map_counts(potentials, observed, rate, population, method=method,
                            warm_start=_shift(potentials, warm))
        warm = _offset(result, potentials) if method == "md" else None
        value = float(result.objective.sum())
        previous = history.objective[-1] if history.objective else None
        history.objective.append(value)
        history.rounds += 1
        bar.update(1)
        bar.set_postfix(objective=f"{value:.6f}")
        if previous is not None and abs(previous - value) <= tol * max(1.0, abs(value)):
            history.converged = True
            break
        mu = result.solution.marginals
        _m_step(model, mu.node[:, 0].sum(0).detach(), mu.edge.sum(0).detach(), m_iter)
        history.parameters.append(model.centred())
    bar.close()
    history.seconds = time.perf_counter() - start
    return history


def _quasi_newton(model: TransitionModel, observed: Tensor, rate: float, population: float, evaluations: int,
                  tol: float, method: str, history: HardEMHistory, bar: Any) -> None:
    batch = observed.shape[0]
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.LBFGS(params, max_iter=evaluations, max_eval=evaluations, history_size=20,
                            line_search_fn="strong_wolfe", tolerance_grad=1e-10, tolerance_change=tol)
    warm: list[Tensor | None] = [None]

    def closure() -> Tensor:
        opt.zero_grad()
        with torch.no_grad():
            potentials = model.potentials(batch)
        result = map_counts(potentials, observed, rate, population, method=method,
                            warm_start=_shift(potentials, warm[0]))
        warm[0] = _offset(result, potentials) if method == "md" else None
        mu = result.solution.marginals
        first, flows = mu.node[:, 0].sum(0).detach(), mu.edge.sum(0).detach()
        # d Phi / dw = dF/dw at the MAP counts = -d/dw (<log P_1, mu_1> + sum_t <log P_t, mu_t>)
        (-(model.log_initial() * first).sum() - (model.log_transitions() * flows).sum()).backward()
        value = float(result.objective.sum())
        history.objective.append(value)
        history.parameters.append(model.centred())
        history.rounds += 1
        bar.update(1)
        bar.set_postfix(objective=f"{value:.6f}")
        return torch.tensor(value, dtype=params[0].dtype)

    opt.step(closure)
    state = opt.state[opt._params[0]]
    history.converged = state.get("func_evals", 0) < evaluations
