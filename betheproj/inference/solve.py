"""Bethe projections: solve problem (2), ``min_{mu in M} -H_B(mu) - <theta, mu> + L(mu)``, with a marginal oracle.

Every method keeps a *dual iterate* ``theta_t = theta + delta_t`` (``delta_t`` finite, so ``-inf`` entries of
``theta`` stay ``-inf``) and calls the oracle at it; the iterate ``mu_t = oracle(theta_t)`` is a point of the
marginal polytope, so the solvers are anytime.  Because ``-H_B(mu) - <theta_t, mu> = -log Z(theta_t)`` at
``mu = oracle(theta_t)``, the objective of every iterate costs no extra work:
``f(mu_t) = -log Z(theta_t) + <delta_t, mu_t> + L(mu_t)``.

* ``"rda"``: Bethe-RDA, Algorithm 1: ``delta_t = -t/(t+beta_t) * mean(grad L(mu_0..mu_{t-1}))``.
* ``"md"`` (the default): Bethe mirror descent (COMID), Algorithm 4:
  ``delta_t = (delta_{t-1} - eta_t grad L(mu_{t-1}))/(1+eta_t)``.
  The method for barrier-like energies (Poisson counts) where the base marginals are tiny (``e^-50`` and
  below under observed counts): its step floor is relative to the gradient, so it climbs out, where Bethe-RDA's
  dual average of such gradients makes no progress.  A label whose base marginal underflows to an exact 0
  although theta allows it (log-potential gaps beyond ~87 nats in float32, ~745 in float64) still counts: the
  stationarity test reads it as holding the smallest normal number, and a step may raise it from 0 (only
  collapses to 0 are refused), so a strong pull on it is neither missed nor blocked.
* ``"accelerated"``: accelerated Bethe-RDA, Algorithm 5, with the prox-function the Bregman divergence of
  ``-H_B`` centred at ``mu_0 = oracle(theta)`` (the prox-centre the algorithm starts from):
  ``nu_t = oracle(theta - g_t / (1 + 4L/(t(t+1))))``, ``mu_t = (1 - c_t) mu_{t-1} + c_t nu_t``.
  Every 20 steps it starts again from its best oracle point, as its new prox-centre (a fixed restart,
  O'Donoghue & Candes 2015): without restarts the residual at ``nu_t`` fell as O(1/t) and the method met
  ``tol=1e-6`` on the demo's migration instance after 603 iterations, with them after 43.
  Its objective at the averages reads their Bethe entropy, which is not linear in the marginals, so it keeps
  the averages' per-position edge marginals, ``O(B N C^2)`` memory and time per step, where the other two methods
  keep one ``[C, C]`` edge offset per example for an energy of node marginals or edge totals on a shared transition
  table: with many labels (a chain over 95) it is many times slower per step than they are
  (``benchmarks/solvers_many_labels.py``).  For an energy of node marginals that is its only edge state: its dual
  offsets, prox-centre and gradient average stay 0 on the edges, and the edge marginals of its last and best
  oracle points are recomputed (one oracle call) where it returns to them, at convergence and at restarts.

Step-size control: a candidate whose objective is not finite, or rises by more than a tolerance over the
previous iterate, is rejected and recomputed with a smaller step (RDA restarts from the current point as its
new prox-centre, and doubles ``beta_t`` when a fresh start fails too; ``eta_t`` halved for MD; ``L`` doubled for
the accelerated method), up to ``max_backtracks`` times; the solution
reports which examples needed it.  Mirror descent asks for sufficient decrease, not only descent: the objective
must fall by at least ``KL(mu_t || mu_{t+1})``, the divergence between the two oracle distributions (the part of
a composite Bregman step's guarantee ``(1 + 1/eta) KL`` that holds for every ``eta``), so that a step which jumps
across a valley is shrunk instead of being taken and doubled.  Between two oracle points the KL cancels, and the
test is decided as ``L(mu_{t+1}) - L(mu_t) + <delta_{t+1}, mu_{t+1} - mu_t> <= 0`` (by its trapezoid estimate
where the energy's values agree to rounding), far below the objective's own rounding error.  Converged examples
drop out of the batch: they stop changing and stop costing oracle calls.

Edge state is per position ([B, N-1, C, C]) in general.  When the energy reads edge marginals only through
per-example sums over positions (``Energy.edge_totals``), the transitions are shared and the oracle takes one
transition table per example (``LinearChain``), ``"rda"`` and ``"md"`` keep it per example ([B, C, C]: the
sums, the offsets, the gradients), and the oracle gets the offsets as a stride-0 view over the positions.

The per-example state and one iteration of every method are :class:`~betheproj.inference.state.SolverState`.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
from torch import Tensor

from .._checks import check_count, check_nonnegative, check_positive
from ..energies.base import Energy
from ..oracles.base import Marginals, Oracle, PairwisePotentials, _log_partition_of
from .state import SolverState, _check_value, _objective_parts

__all__ = ["Solution", "solve", "objective", "METHODS"]

METHODS = ("rda", "md", "accelerated")


@dataclass
class Solution:
    """Result of :func:`solve`.

    Attributes:
        marginals: ``mu*`` (node [B, N, C], edge [B, N-1, C, C], ``log_partition`` of ``potentials``).
        potentials: the dual iterate ``theta~`` whose marginals are ``mu*`` (Proposition 1); decode it for MAP.
            (The accelerated method's ``marginals`` average oracle points; where an example did not converge
            they can differ from ``oracle.marginals(potentials)``, the dual iterate of its last point.)
        iterations: [B] iterations each example ran (oracle calls beyond the first, retries excluded).
        converged: [B] whether the example met the tolerance within ``max_iter``.
        objective: [B] final value of (2) (in the primal form ``-H(mu) - <theta, mu> + L(mu)`` where the dual
            form's two terms cancelled beyond ``sqrt(eps)`` of it: dual offsets far beyond the scores).
        objectives: [B, T+1] the objective at every iteration (the final value repeated once converged), with
            ``T = max_iter``: an example the accelerated method hands to mirror descent keeps its accelerated
            iterations there and its final value in the last column (its ``iterations`` count both phases).
        safeguarded: [B] whether step-size control had to shrink a step for the example, or (the accelerated
            method) mirror descent finished it.
        residual: [B] the stationarity residual of the returned point (mirror descent, RDA, and the
            accelerated method where it converged); where the accelerated method did not converge (and mirror
            descent did not finish the example), of the oracle point its last iteration started from, not of
            the average it returns.
        oracle_calls: total oracle calls, summed over examples (retries included).  The accelerated method's
            objective at its averages reads ``oracle.entropy`` of marginals no oracle call returned; for the
            dependency-tree oracles that entropy solves for their parameters with further marginal inferences
            (a Newton iteration), which are not counted here.
        oracle: the oracle that solved it (``None`` where unknown): :func:`~betheproj.inference.decode` refuses
            a solution of another structure.
    """

    marginals: Marginals
    potentials: PairwisePotentials
    iterations: Tensor
    converged: Tensor
    objective: Tensor
    objectives: Tensor
    safeguarded: Tensor
    residual: Tensor
    oracle_calls: int
    method: str
    oracle: object | None = None


def check_oracle(oracle: object, needs: tuple[str, ...]) -> None:
    """A ``TypeError`` unless ``oracle`` is an oracle instance with the methods ``needs`` (the class itself has them
    too, unbound: it would fail at the first call, missing an argument)."""
    if isinstance(oracle, type):
        raise TypeError(f"oracle must be an instance such as {oracle.__name__}(...), got the class {oracle.__name__}")
    for name in needs:
        if not callable(getattr(oracle, name, None)):
            raise TypeError(f"oracle must provide {name}(); got {type(oracle).__name__}")


def _check_problem(oracle: object, potentials: object, energy: object,
                   needs: tuple[str, ...] = ("marginals", "map", "entropy")) -> None:
    """The oracle provides the methods ``needs``, the potentials and the energy are of their types."""
    check_oracle(oracle, needs)
    if not isinstance(potentials, PairwisePotentials):
        raise TypeError(f"potentials must be PairwisePotentials/ChainPotentials, got {type(potentials).__name__}")
    if not isinstance(energy, Energy):
        raise TypeError(f"energy must be a betheproj.energies.Energy, got {type(energy).__name__}")


def _check_args(oracle: object, potentials: object, energy: object, method: str, max_iter: object, tol: object,
                max_backtracks: object, beta: object, step: object, lipschitz: object, trust_region: object
                ) -> tuple[int, float, int, float, float, float, float | None]:
    _check_problem(oracle, potentials, energy)
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    max_iter, max_backtracks = check_count("max_iter", max_iter, 0), check_count("max_backtracks", max_backtracks, 0)
    tol, beta, lipschitz = (check_nonnegative(name, val) for name, val in (("tol", tol), ("beta", beta),
                                                                            ("lipschitz", lipschitz)))
    step = check_positive("step", step) if method == "md" else check_nonnegative("step", step)
    if trust_region is not None:
        trust_region = check_positive("trust_region", trust_region)
    return max_iter, tol, max_backtracks, beta, step, lipschitz, trust_region


def check_options(oracle: object, potentials: object, energy: object, method: str, options: dict[str, object]) -> None:
    """The arguments of ``solve(oracle, potentials, energy, method, **options)`` checked as :func:`solve` checks
    them (an unknown option is a ``TypeError``), without solving: for callers that may call it on no rows."""
    try:
        bound = inspect.signature(solve).bind(oracle, potentials, energy, method, **options)
    except TypeError as err:
        raise TypeError(f"{err} (an option of betheproj.solve)") from None
    bound.apply_defaults()
    a = bound.arguments
    _check_args(oracle, potentials, energy, method, a["max_iter"], 0.0 if a["tol"] is None else a["tol"],
                a["max_backtracks"], a["beta"], a["step"], a["lipschitz"], a["trust_region"])


@torch.no_grad()
def solve(oracle: Oracle, potentials: PairwisePotentials, energy: Energy, method: str = "md",
          max_iter: int = 200, tol: float | None = None, beta: float = 0.0, step: float = 1.0,
          lipschitz: float = 1.0, max_backtracks: int = 40, trust_region: float | None = 10.0,
          warm_start: PairwisePotentials | None = None) -> Solution:
    """Solve problem (2) for a batch by calling ``oracle`` with modified potentials.

    Runs without autograd (``torch.no_grad``): the returned tensors never require grad, even where ``potentials``
    or the energy's parameters do, so no gradient flows back through the iterations.  To learn theta or psi,
    differentiate the surrogate likelihood at the solution (:func:`betheproj.learning.surrogate_nll`, eqs. 12-15).

    Args:
        oracle: a marginal oracle (``LinearChain``, ``Tree``, ...).
        potentials: ``theta``.
        energy: the non-local energy ``L``; ``L(mu)[b]`` must depend on example ``b`` alone.
        method: ``"md"`` (Algorithm 4, the default: it meets tight tolerances in the fewest iterations), ``"rda"``
            (the paper's Algorithm 1) or ``"accelerated"`` (Algorithm 5).
        max_iter: iterations per example (the accelerated method hands an example it cannot finish to
            mirror descent, which gets ``max_iter`` more: up to twice as many in all; its result is kept
            where it converged or is no higher).
        tol: an example has converged when its stationarity residual is at most ``tol``: the total-variation
            change of any node marginal if the dual iterate moved to ``theta - grad L(mu_t)`` at that node
            (Proposition 1's fixed point; see ``state._residual``), and of any edge marginal where the energy
            has an edge gradient; with one transition table shared by the batch and an energy of the edge
            totals, of each example's position-averaged edge marginal (zero exactly when every position's is,
            but up to ~2x smaller away from it than the largest position's).  Default: 1e-6 in float64, 1e-4
            in float32.
            Bethe-RDA's dual average converges like O(1/t), so it meets tight tolerances slowly; mirror
            descent meets them fastest.  Tolerances below about the square root of machine epsilon can be
            out of reach, since steps that small cannot be told apart.  Mirror descent decides its steps
            below the objective's rounding, so it meets the float32 tolerance on ill-conditioned problems too
            (``benchmarks/solver_float32.py``: 472 of 480 random chains; 1 stopped at its step floor); an example
            it cannot finish reports ``converged`` False.
        beta: RDA's ``beta_t`` (constant; raised per example by step-size control, up to
            ``1e20 max(1, max |g + delta|)``, relative like mirror descent's step floor).
        step: mirror descent's initial step ``eta`` (adapted per example: doubled after a successful step,
            halved after a rejected one, down to ``1e-20 / max(1, max |g + delta|)``, a floor relative to the
            largest dual move the step direction asks for, so that gradients as large as ``1e300`` (counts where
            the base marginal is ``e^-700``) still get steps; an example whose step reaches the floor stops;
            with ``max_backtracks=0`` it never grows beyond ``step``, since no rejected step can be taken back).
        lipschitz: the accelerated method's Lipschitz constant ``L`` of ``grad L`` (doubled when a step fails, never
            lowered again within the solve).
        max_backtracks: retries per iteration before the last finite candidate is taken as it is (and the
            example counted as ``safeguarded``), unless it collapses a marginal to 0 or leaves the trust
            region, or, for mirror descent (a descent method), raises the objective.
        trust_region: the most any node marginal may change in one step, in nats of ``log mu`` (``None``:
            no limit).  Steps beyond it are shrunk like steps that raise the objective: this is what keeps
            barrier-like energies (``-log mu``, Poisson with a small scale) from collapsing marginals to zero.
            A marginal rising from below the smallest normal number is not limited (its log is not known).
        warm_start: a previous ``Solution.potentials`` to start mirror descent from (``method="md"`` only).
    """
    if tol is None and isinstance(potentials, PairwisePotentials):
        tol = 1e-6 if potentials.node.dtype == torch.float64 else 1e-4
    max_iter, tol, max_backtracks, beta, step, lipschitz, trust_region = _check_args(
        oracle, potentials, energy, method, max_iter, tol, max_backtracks, beta, step, lipschitz, trust_region)
    potentials = potentials.detach()          # else a table no step shifts came back as the caller's tensor
    state = SolverState(oracle, potentials, energy, method, tol, beta, step, lipschitz, max_backtracks,
                        trust_region, warm_start)
    for it in range(max_iter):
        if not state.iterate(it):
            break
    state.recheck()

    b = potentials.node.shape[0]
    final = state.shift(state.theta, state.delta_node, state.delta_edge)
    calls = state.calls
    f = state.f
    if method == "accelerated":
        marg = state.averaged_marginals()
    else:
        marg = oracle.marginals(final)
        calls += b
        f = _primal_where_loose(oracle, state, energy, marg)
    objectives = torch.stack(state.history, 1)
    if objectives.shape[1] < max_iter + 1:
        pad = objectives[:, -1:].expand(b, max_iter + 1 - objectives.shape[1])
        objectives = torch.cat([objectives, pad], 1)
    if f is not state.f:
        objectives = objectives.clone()
        objectives[:, -1] = f
    sol = Solution(marginals=marg, potentials=final, iterations=state.iterations, converged=state.converged,
                   objective=f, objectives=objectives, safeguarded=state.safeguarded,
                   residual=state.residual, oracle_calls=calls, method=method, oracle=oracle)
    if method == "accelerated":
        # last resort: an example that did not converge (its L grew past _STALL_L, it needed step-size control,
        # or max_iter ran out) is finished by backtracked mirror descent from the best oracle point found; its
        # result replaces the accelerated one where it converged or is no worse (the average mu_t the
        # accelerated method returns can lie below every oracle point it has seen)
        stalled = (~state.converged).nonzero().flatten()
        if stalled.numel():
            best = state.theta.shifted(state.best_dn, state.best_de)
            rescue = solve(oracle, potentials, energy, method="md", max_iter=max_iter, tol=tol,
                           max_backtracks=max_backtracks, trust_region=trust_region, warm_start=best)
            better = rescue.converged | (rescue.objective <= sol.objective) | ~torch.isfinite(sol.objective)
            sol = _merge(sol, rescue, stalled[better[stalled]])
    return sol



def _primal_where_loose(oracle: Oracle, state: SolverState, energy: Energy, marg: Marginals) -> Tensor:
    """The objectives to report: the iterations' dual form ``-log Z(theta + delta) + <delta, mu> + L``, except
    where its two large terms cancel beyond ``sqrt(eps)`` of the result (dual offsets of 1e9 in float32, as
    Bethe-RDA reaches on energies of huge weight: it reported 0 or -256 for 2.82); there the primal form
    ``-H(mu) - <theta, mu> + L`` at the same marginals (:func:`objective`)."""
    f = state.f
    # the terms' sizes at the last accepted point (marg's: the same point), read off the state: marg's edge
    # marginals stay lazy
    inner = (state.delta_node * state.mu_node).flatten(1).abs().sum(-1)
    if state.delta_edge is not None and state.mu_edge is not None:
        inner = inner + (state.delta_edge * state.mu_edge).flatten(1).abs().sum(-1)
    eps = torch.finfo(f.dtype).eps
    loose = state.noise * (inner + state.log_z.abs()) > eps ** 0.5 * f.abs().clamp_min(1.0)
    if not bool((loose & torch.isfinite(f)).any()):
        return f
    with torch.no_grad():
        primal = _objective_parts(oracle, state.theta, marg) + energy.value(marg)
    return torch.where(loose & torch.isfinite(primal), primal, f)


def _merge(sol: Solution, other: Solution, rows: Tensor) -> Solution:
    """``sol`` with the examples ``rows`` taken from ``other`` (their histories end with ``other``'s value)."""
    def pick(a: Tensor, b: Tensor) -> Tensor:
        return a.index_put((rows,), b[rows])

    def edge() -> Tensor:
        return pick(sol.marginals.edge, other.marginals.edge)

    # edges not yet materialised (a dependency tree's all-zero placeholders) stay lazy
    mu = Marginals(pick(sol.marginals.node, other.marginals.node), edge() if sol.marginals.has_edge else edge,
                   pick(_log_partition_of(sol.marginals), _log_partition_of(other.marginals)), sol.marginals.lengths)
    pot = sol.potentials
    other_edge = other.potentials.full_edge() if pot.edge.dim() == 4 else other.potentials.edge
    merged = pot.shifted(None, None)
    merged.node = pick(pot.node, other.potentials.node)
    merged.edge = pick(pot.edge, other_edge) if pot.edge.dim() == 4 else pot.edge
    objectives = sol.objectives.clone()
    objectives[rows, -1] = other.objective[rows]
    return Solution(marginals=mu, potentials=merged, iterations=pick(sol.iterations, sol.iterations + other.iterations),
                    converged=pick(sol.converged, other.converged), objective=pick(sol.objective, other.objective),
                    objectives=objectives,
                    safeguarded=pick(sol.safeguarded, sol.safeguarded | other.safeguarded | (other.iterations > 0)),
                    residual=pick(sol.residual, other.residual), oracle_calls=sol.oracle_calls + other.oracle_calls,
                    method=sol.method, oracle=sol.oracle)


def objective(oracle: Oracle, potentials: PairwisePotentials, energy: Energy, marginals: Marginals) -> Tensor:
    """Value of (2), ``-H_B(mu) - <theta, mu> + L(mu)`` [B], at any point of the marginal polytope
    (``marginals`` of the same examples as ``potentials``: shapes, lengths and dtype must agree)."""
    _check_problem(oracle, potentials, energy, needs=("entropy",))
    if not isinstance(marginals, Marginals):
        raise TypeError(f"marginals must be Marginals, got {type(marginals).__name__}")
    if marginals.node.dtype != potentials.node.dtype:
        raise TypeError(f"marginals must have the potentials' dtype {potentials.node.dtype}, got "
                        f"{marginals.node.dtype}")
    if marginals.node.shape != potentials.node.shape:
        raise ValueError(f"marginals.node has shape {tuple(marginals.node.shape)}; the potentials' node scores "
                         f"have {tuple(potentials.node.shape)}")
    if not torch.equal(marginals.lengths.to(potentials.lengths.device), potentials.lengths):
        raise ValueError("marginals.lengths differ from potentials.lengths: marginals of other examples")
    energy.validate(marginals)
    return _objective_parts(oracle, potentials, marginals) + _check_value(energy, energy.value(marginals),
                                                                          marginals.node)
