"""Bethe projections: solve problem (2), ``min_{mu in M} -H_B(mu) - <theta, mu> + L(mu)``, with a marginal oracle.

Every method keeps a *dual iterate* ``theta_t = theta + delta_t`` (``delta_t`` finite, so ``-inf`` entries of
``theta`` stay ``-inf``) and calls the oracle at it; the iterate ``mu_t = oracle(theta_t)`` is a point of the
marginal polytope, so the solvers are anytime.  Because ``-H_B(mu) - <theta_t, mu> = -log Z(theta_t)`` at
``mu = oracle(theta_t)``, the objective of every iterate costs no extra work:
``f(mu_t) = -log Z(theta_t) + <delta_t, mu_t> + L(mu_t)``.

* ``"rda"``: Bethe-RDA, Algorithm 1: ``delta_t = -t/(t+beta_t) * mean(grad L(mu_0..mu_{t-1}))``.
* ``"md"``: Bethe mirror descent (COMID), Algorithm 4: ``delta_t = (delta_{t-1} - eta_t grad L(mu_{t-1}))/(1+eta_t)``.
  The method for barrier-like energies (Poisson counts) where the base marginals are tiny (``e^-50`` and
  below under observed counts): its step floor is relative to the gradient, so it climbs out, where Bethe-RDA's
  dual average of such gradients makes no progress.
* ``"accelerated"``: accelerated Bethe-RDA, Algorithm 5, with the prox-function the Bregman divergence of
  ``-H_B`` centred at ``mu_0 = oracle(theta)`` (the prox-centre the algorithm starts from):
  ``nu_t = oracle(theta - g_t / (1 + 4L/(t(t+1))))``, ``mu_t = (1 - c_t) mu_{t-1} + c_t nu_t``.

Step-size control: a candidate whose objective is not finite, or rises by more than a tolerance over the
previous iterate, is rejected and recomputed with a smaller step (``beta_t`` doubled for RDA, ``eta_t``
halved for MD, ``L`` doubled for the accelerated method), up to ``max_backtracks`` times; the solution
reports which examples needed it.  Converged examples drop out of the batch: they stop changing and stop
costing oracle calls.

Edge state is per position ([B, N-1, C, C]) in general.  When the energy reads edge marginals only through
per-example sums over positions (``Energy.edge_totals``), the transitions are shared and the oracle takes one
transition table per example (``LinearChain``), ``"rda"`` and ``"md"`` keep it per example ([B, C, C]: the
sums, the offsets, the gradients), and the oracle gets the offsets as a stride-0 view over the positions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..energies.base import Energy, Gradient
from ..oracles.base import Marginals, Oracle, PairwisePotentials

__all__ = ["Solution", "solve", "objective", "METHODS"]

METHODS = ("rda", "md", "accelerated")
# relative rise of the objective a step may make before it is rejected (RDA and the accelerated
# method are not descent methods; mirror descent with backtracking is)
_MAX_STEP = 1e6
_MIN_STEP = 1e-20   # bounds of the step-size control (eta for MD; 1/beta, 1/L for the others)
_RELAX = {"rda": 1.1, "accelerated": 2.0}   # how fast beta / L return to the user's value after a clean step
_RISE = {"rda": 0.1, "md": 0.0, "accelerated": 1e-2}


@dataclass
class Solution:
    """Result of :func:`solve`.

    Attributes:
        marginals: ``mu*`` (node [B, N, C], edge [B, N-1, C, C], ``log_partition`` of ``potentials``).
        potentials: the dual iterate ``theta~`` whose marginals are ``mu*`` (Proposition 1); decode it for MAP.
        iterations: [B] iterations each example ran (oracle calls beyond the first, retries excluded).
        converged: [B] whether the example met the tolerance within ``max_iter``.
        objective: [B] final value of (2).
        objectives: [B, T+1] the objective at every iteration (the final value repeated once converged).
        safeguarded: [B] whether step-size control had to shrink a step for the example.
        residual: [B] the stationarity residual at the last check (``inf`` if never checked).
        oracle_calls: total oracle calls, summed over examples (retries included).
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


def _masked(x: Tensor | None, mask: Tensor) -> Tensor | None:
    if x is None:
        return None
    return torch.where(mask.reshape(*mask.shape, *([1] * (x.dim() - mask.dim()))), x, torch.zeros((), dtype=x.dtype))


def _inner(a: Tensor | None, b: Tensor) -> Tensor:
    if a is None:
        return b.new_zeros(b.shape[0])
    return (a * b).flatten(1).sum(-1)


def _masked_gradient(energy: Energy, mu: Marginals) -> Gradient:
    """``grad L`` with padding zeroed and edge gradients broadcast to [B, N-1, C, C]."""
    g = energy.grad(mu)
    node = g.node if g.node is not None else torch.zeros_like(mu.node)
    node = _masked(node, mu.node_mask())
    edge = None
    if g.edge is not None:
        b, n, c = mu.node.shape
        edge = _masked(g.edge.expand(b, n - 1, c, c), mu.edge_mask())
    return Gradient(node, edge)


def _total_gradient(energy: Energy, mu: Marginals) -> Gradient:
    """``grad L`` for an energy with ``edge_totals``: node [B, N, C] with padding zeroed, edge [B, C, C] (the
    gradient at every position)."""
    g = energy.total_grad(mu)
    node = _masked(g.node if g.node is not None else torch.zeros_like(mu.node), mu.node_mask())
    return Gradient(node, g.edge)


def _residual(delta: Tensor, grad: Tensor, mu: Tensor, dims: int) -> Tensor:
    """Stationarity residual of Proposition 1 for one part (node: ``dims=1``, edge: ``dims=2``) [B].

    At the optimum ``theta~ = theta - grad L(mu*)``, i.e. ``r = delta + grad L`` vanishes up to a constant per
    factor.  Moving the dual iterate by ``-r`` at one factor alone re-weights its marginal to
    ``q ∝ mu * exp(-r)``; the residual is the largest total-variation distance ``||q - mu||_1`` over the
    factors.  Constants drop out, labels without mass stay without mass, and a label the energy pulls hard
    on counts by the mass it would gain, not by its current (possibly tiny) mass.
    """
    red = tuple(range(-dims, 0))
    if mu.numel() == 0:                            # no factors of this kind (a chain of length 1 has no edges)
        return mu.new_zeros(mu.shape[0])
    logits = torch.log(mu) - (delta + grad)
    shape = logits.shape
    q = torch.softmax(logits.reshape(*shape[: logits.dim() - dims], -1), -1).reshape(shape)
    tv = (q - mu).abs().sum(red)
    present = mu.sum(red) > 0                      # padding factors hold no mass
    return torch.where(present, tv, torch.zeros_like(tv)).flatten(1).amax(-1)


def _log_change(old: Tensor, new: Tensor) -> Tensor:
    """Largest change of a log-marginal between two oracle points [B] (entries tiny in both are ignored)."""
    floor = torch.finfo(old.dtype).tiny
    big = torch.maximum(old, new) > floor
    diff = (torch.log(new.clamp_min(floor)) - torch.log(old.clamp_min(floor))).abs()
    diff = torch.where((old == 0) ^ (new == 0), torch.full_like(diff, float("inf")), diff)
    return torch.where(big, diff, torch.zeros_like(diff)).flatten(1).amax(-1)


def _check_args(oracle, potentials, energy, method, max_iter, tol, max_backtracks, beta, step, lipschitz) -> None:
    for name in ("marginals", "map", "entropy"):
        if not callable(getattr(oracle, name, None)):
            raise TypeError(f"oracle must provide {name}(); got {type(oracle).__name__}")
    if not isinstance(potentials, PairwisePotentials):
        raise TypeError(f"potentials must be PairwisePotentials/ChainPotentials, got {type(potentials).__name__}")
    if not isinstance(energy, Energy):
        raise TypeError(f"energy must be a betheproj.energies.Energy, got {type(energy).__name__}")
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if isinstance(max_iter, bool) or not isinstance(max_iter, int) or max_iter < 0:
        raise ValueError(f"max_iter must be a non-negative int, got {max_iter!r}")
    if isinstance(max_backtracks, bool) or not isinstance(max_backtracks, int) or max_backtracks < 0:
        raise ValueError(f"max_backtracks must be a non-negative int, got {max_backtracks!r}")
    for name, val in (("tol", tol), ("beta", beta), ("step", step), ("lipschitz", lipschitz)):
        if isinstance(val, bool) or not isinstance(val, int | float) or not 0 <= val < float("inf"):
            raise ValueError(f"{name} must be a finite non-negative number, got {val!r}")
    if method == "md" and step <= 0:
        raise ValueError("step must be > 0 for method='md'")


def _edge_potentials(theta: PairwisePotentials, need_edges: bool) -> PairwisePotentials:
    """``theta`` with per-position edges when edge offsets will be added to it."""
    if not need_edges or not theta.shared_edge:
        return theta
    out = PairwisePotentials.__new__(PairwisePotentials)
    out.node, out.edge, out.lengths = theta.node, theta.full_edge(), theta.lengths
    return out


@torch.no_grad()
def solve(oracle: Oracle, potentials: PairwisePotentials, energy: Energy, method: str = "rda",
          max_iter: int = 200, tol: float | None = None, beta: float = 0.0, step: float = 1.0,
          lipschitz: float = 1.0, max_backtracks: int = 40, trust_region: float | None = 10.0,
          warm_start: PairwisePotentials | None = None) -> Solution:
    """Solve problem (2) for a batch by calling ``oracle`` with modified potentials.

    Args:
        oracle: a marginal oracle (``LinearChain``, ``Tree``, ...).
        potentials: ``theta``.
        energy: the non-local energy ``L``; ``L(mu)[b]`` must depend on example ``b`` alone.
        method: ``"rda"`` (Algorithm 1), ``"md"`` (Algorithm 4) or ``"accelerated"`` (Algorithm 5).
        max_iter: iterations per example (the accelerated method hands an example it cannot finish to
            mirror descent, which gets ``max_iter`` more: up to twice as many in all).
        tol: an example has converged when its stationarity residual is at most ``tol``: the total-variation
            change of any node marginal if the dual iterate moved to ``theta - grad L(mu_t)`` at that node
            (Proposition 1's fixed point; see ``_residual``).  Default: 1e-6 in float64, 1e-4 in float32.
            Bethe-RDA's dual average converges like O(1/t), so it meets tight tolerances slowly; mirror
            descent meets them fastest.  Tolerances below about the square root of machine epsilon can be
            out of reach, since the objective cannot tell steps that small apart.
        beta: RDA's ``beta_t`` (constant; raised per example by step-size control, up to
            ``1e20 max(1, max |g + delta|)``, relative like mirror descent's step floor).
        step: mirror descent's initial step ``eta`` (adapted per example: doubled after a successful step,
            halved after a rejected one, down to ``1e-20 / max(1, max |g + delta|)``, a floor relative to the
            largest dual move the step direction asks for, so that gradients as large as ``1e300`` (counts where
            the base marginal is ``e^-700``) still get steps; an example whose step reaches the floor stops;
            with ``max_backtracks=0`` it never grows beyond ``step``, since no rejected step can be taken back).
        lipschitz: the accelerated method's Lipschitz constant ``L`` of ``grad L`` (doubled when a step fails).
        max_backtracks: retries per iteration before the last finite candidate is taken as it is (and the
            example counted as ``safeguarded``).
        trust_region: the most any node marginal may change in one step, in nats of ``log mu`` (``None``:
            no limit).  Steps beyond it are shrunk like steps that raise the objective: this is what keeps
            barrier-like energies (``-log mu``, Poisson with a small scale) from collapsing marginals to zero.
        warm_start: a previous ``Solution.potentials`` to start mirror descent from (``method="md"`` only).
    """
    if tol is None and isinstance(potentials, PairwisePotentials):
        tol = 1e-6 if potentials.node.dtype == torch.float64 else 1e-4
    _check_args(oracle, potentials, energy, method, max_iter, tol, max_backtracks, beta, step, lipschitz)
    if trust_region is not None and not (isinstance(trust_region, int | float) and trust_region > 0):
        raise ValueError(f"trust_region must be a positive number or None, got {trust_region!r}")
    b, n, c = potentials.node.shape
    device, dtype = potentials.node.device, potentials.node.dtype
    lengths = potentials.lengths
    base = oracle.marginals(potentials)
    energy.validate(base)
    # Energies that read edge marginals only through per-example sums over positions (Energy.edge_totals),
    # with shared transitions and an oracle that takes one transition table per example, keep every edge
    # quantity as [B, C, C]: edge "marginals" are those sums, offsets are the same at every position.
    totals = (method != "accelerated" and warm_start is None and n > 1 and potentials.shared_edge
              and energy.edge_totals and getattr(oracle, "per_example_edges", False))
    g0 = (_total_gradient if totals else _masked_gradient)(energy, base)
    need_edges = g0.edge is not None or method == "accelerated"
    totals = totals and need_edges
    theta = potentials if totals else _edge_potentials(potentials, need_edges)
    calls = b
    start_node, start_edge = _warm_offsets(warm_start, theta, need_edges, method)
    mu0 = base if start_node is None else oracle.marginals(theta.shifted(start_node, start_edge))

    def point(node: Tensor, edge: Tensor | None, lens: Tensor) -> Marginals:
        if totals:
            return Marginals(node, None, None, lens, edge_total=edge)
        return Marginals(node, edge, None, lens)

    def shift(pot: PairwisePotentials, dn: Tensor, de: Tensor | None) -> PairwisePotentials:
        """``pot`` with dual offsets (per-example [B, C, C] edge offsets viewed over the positions)."""
        if not totals or de is None:
            return pot.shifted(dn, de)
        out = pot.shifted(dn, None)
        out.edge = (pot.edge + de)[:, None].expand(dn.shape[0], n - 1, c, c)
        return out

    def edge_residual(delta: Tensor, grad: Tensor, mu: Tensor) -> Tensor:
        if not totals:
            return _residual(delta, grad, mu, 2)
        # the residual of the position-averaged edge marginal: zero only if every position's residual is (the
        # offsets are the same at every position), and zero at a stationary point unless the positions' edge
        # supports split into groups that do not overlap
        mass = mu.sum((-1, -2), keepdim=True)
        mean = torch.where(mass > 0, mu / mass.clamp_min(torch.finfo(mu.dtype).tiny), 0.0)
        return _residual(delta[:, None], grad[:, None], mean[:, None], 2)

    # state of every example; rows of converged examples stay frozen
    mu_node = mu0.node.clone()
    mu_edge = (mu0.edge_total() if totals else mu0.edge).clone() if need_edges else None
    zeros_edge = (lambda: torch.zeros_like(mu_edge)) if need_edges else (lambda: None)
    delta_node, delta_edge = torch.zeros_like(mu_node), zeros_edge()     # dual offset of the last oracle point
    if start_node is not None:
        delta_node = start_node.clone()
        if need_edges:
            delta_edge = start_edge.clone()
    anchor_node, anchor_edge = torch.zeros_like(mu_node), zeros_edge()   # prox-centre (RDA, accelerated)
    gbar_node, gbar_edge = torch.zeros_like(mu_node), zeros_edge()       # gradient average since the centre
    since = torch.zeros(b, dtype=torch.long, device=device)              # iterations since the centre
    log_z = mu0.log_partition.clone()
    support = base.node > 0                                               # where theta allows mass
    nu_node, nu_edge = mu_node.clone(), (mu_edge.clone() if need_edges else None)
    f = -log_z + _inner(delta_node, mu_node) + energy.value(point(mu_node, mu_edge, lengths))
    if need_edges:
        f = f + _inner(delta_edge, mu_edge)
    start_name = "the base marginals oracle(theta)" if start_node is None else "the warm start"
    if not torch.isfinite(f).all():
        bad = torch.nonzero(~torch.isfinite(f)).flatten()[:10].tolist()
        raise ValueError(f"the objective is not finite at {start_name} for examples {bad}: the energy is infinite "
                         "where the marginals are 0, because theta allows no mass there (e.g. positive counts on "
                         "a label whose potentials are all -inf) or because that mass underflows to 0 (log-"
                         f"potential gaps beyond what exp can represent in {dtype}, ~745 in float64)")
    if method == "accelerated":
        best_f, best_node, best_edge = f.clone(), mu_node.clone(), mu_edge.clone()
        best_dn, best_de, best_logz = torch.zeros_like(mu_node), torch.zeros_like(mu_edge), log_z.clone()
        nu_f = f.clone()                                   # the objective at nu, the last oracle point
    stall = torch.zeros(b, dtype=torch.bool, device=device)
    at_floor = torch.zeros(b, dtype=torch.bool, device=device)
    user_param = {"rda": beta, "md": step, "accelerated": lipschitz}[method]
    param = torch.full((b,), user_param, dtype=dtype, device=device)
    residual = torch.full((b,), float("inf"), dtype=dtype, device=device)
    rise = _RISE[method]
    noise = 64 * torch.finfo(dtype).eps
    history = [f.clone()]
    iterations = torch.zeros(b, dtype=torch.long, device=device)
    converged = torch.zeros(b, dtype=torch.bool, device=device)
    safeguarded = torch.zeros(b, dtype=torch.bool, device=device)

    def with_rows(rows: Tensor, node: Tensor, edge: Tensor | None) -> Marginals:
        """Full-batch marginals with ``rows`` replaced: energies may hold data for the whole batch."""
        return point(mu_node.index_put((rows,), node), None if edge is None else mu_edge.index_put((rows,), edge),
                     lengths)

    def gradient_rows(rows: Tensor, node: Tensor, edge: Tensor | None) -> tuple[Tensor, Tensor | None]:
        g = (_total_gradient if totals else _masked_gradient)(energy, with_rows(rows, node, edge))
        ge = None
        if need_edges:
            ge = g.edge[rows] if g.edge is not None else torch.zeros_like(edge)
        return g.node[rows], ge

    def lerp(x: Tensor | None, y: Tensor | None, w: Tensor) -> Tensor | None:
        """``(1 - w) x + w y`` with a per-row weight ``w``."""
        if x is None:
            return None
        return x + w.reshape(-1, *([1] * (x.dim() - 1))) * (y - x)

    def candidate(a: Tensor, sub: Tensor, p: Tensor, s1: Tensor, cw: Tensor, g_n: Tensor,
                  g_e: Tensor | None) -> tuple[Tensor, Tensor | None, Tensor, Tensor | None]:
        """Dual offset and new gradient average for rows ``a[sub]`` with step parameters ``p``."""
        rows = a[sub]
        t, w = s1[sub], cw[sub]
        if method == "md":                                                   # Algorithm 4
            eta = p
            dn = lerp(delta_node[rows], -g_n[sub], eta / (1 + eta))
            de = None if g_e is None else lerp(delta_edge[rows], -g_e[sub], eta / (1 + eta))
            return dn, de, g_n[sub], None if g_e is None else g_e[sub]
        if method == "rda":                                                  # Algorithm 1
            gn = lerp(gbar_node[rows], g_n[sub], 1 / t)
            ge = None if g_e is None else lerp(gbar_edge[rows], g_e[sub], 1 / t)
            move = t / (t + p)                                               # 1 - beta_t / (t + beta_t)
        else:                                                                # Algorithm 5
            gn = lerp(gbar_node[rows], g_n[sub], w)
            ge = None if g_e is None else lerp(gbar_edge[rows], g_e[sub], w)
            move = 1 / (1 + 4.0 * p / (t * (t + 1)))
        # the share of the way from the prox-centre to -gbar, not 1 minus the centre's share: that one rounds
        # to 1 for beta beyond 2^53 t and would leave a large beta with no step at all
        dn = lerp(anchor_node[rows], -gn, move)
        de = None if ge is None else lerp(anchor_edge[rows], -ge, move)
        return dn, de, gn, ge

    active = torch.arange(b, device=device)
    for it in range(max_iter):
        if active.numel() == 0:
            break
        a = active
        s1 = (since[a] + 1).to(dtype)                      # the step number within the current run
        cw = 2.0 / (s1 + 1)                                # accelerated weights c_t
        if method == "accelerated":                        # Algorithm 5 linearises at u_t
            g_n, g_e = gradient_rows(a, lerp(mu_node[a], nu_node[a], cw),
                                     lerp(mu_edge[a], nu_edge[a], cw) if need_edges else None)
            point_node, point_edge = nu_node[a], (nu_edge[a] if need_edges else None)
        else:
            g_n, g_e = gradient_rows(a, mu_node[a], mu_edge[a] if need_edges else None)
            point_node, point_edge = mu_node[a], (mu_edge[a] if need_edges else None)
        finite = torch.isfinite(g_n).flatten(1).all(-1)
        if g_e is not None:
            finite &= torch.isfinite(g_e).flatten(1).all(-1)
        if not finite.all():
            _raise_infinite_gradient(a[~finite], start_name if it == 0 else None, dtype)

        # converged: the current point is stationary (Proposition 1); no oracle call is needed.  The accelerated
        # method tests its oracle point nu with the gradient at nu (and returns nu if it passes)
        r_n, r_e = (gradient_rows(a, point_node, point_edge) if method == "accelerated" else (g_n, g_e))
        res = _residual(delta_node[a], r_n, point_node, 1)
        if r_e is not None:
            res = torch.maximum(res, edge_residual(delta_edge[a], r_e, point_edge))
        residual[a] = res
        keep = res > tol
        converged[a[~keep]] = True
        if not keep.all():
            a, s1, cw, g_n = a[keep], s1[keep], cw[keep], g_n[keep]
            g_e = None if g_e is None else g_e[keep]
            if a.numel() == 0:
                break

        p_cur = param[a].clone()
        if method != "accelerated":
            # the step bound is relative to the largest dual move the direction asks for, max |g + delta|:
            # a gradient of 1e21 (counts where the base marginal is 1e-22) needs steps far below 1e-20
            # (mirror descent's eta; for RDA 1/beta on a fresh start, where the move is t/(t + beta) of it)
            reach = (g_n + delta_node[a]).abs().flatten(1).amax(-1)
            if g_e is not None:
                reach = torch.maximum(reach, (g_e + delta_edge[a]).abs().flatten(1).amax(-1))
            min_step = _MIN_STEP / reach.clamp_min(1.0)
        clean = torch.ones(a.numel(), dtype=torch.bool, device=device)
        pending = torch.arange(a.numel(), device=device)
        for attempt in range(max_backtracks + 1):
            rows = a[pending]
            dn, de, gn, ge = candidate(a, pending, p_cur[pending], s1, cw, g_n, g_e)
            # a step too large to represent is a failed step: stay put for the oracle call
            wild = ~torch.isfinite(dn).flatten(1).all(-1)
            if de is not None:
                wild |= ~torch.isfinite(de).flatten(1).all(-1)
            if wild.any():
                dn = torch.where(wild[:, None, None], delta_node[rows], dn)
                if de is not None:
                    de = torch.where(wild.reshape(-1, *([1] * (de.dim() - 1))), delta_edge[rows], de)
            calls += int(rows.numel())
            m = oracle.marginals(shift(theta.index(rows), dn, de))
            if method == "accelerated":
                w = cw[pending]
                cand_node, cand_edge = lerp(mu_node[rows], m.node, w), lerp(mu_edge[rows], m.edge, w)
                lin = _objective_parts(oracle, theta.index(rows), Marginals(cand_node, cand_edge, None, lengths[rows]))
                scale = lin.abs()
            else:
                cand_node, cand_edge = m.node, ((m.edge_total() if totals else m.edge) if need_edges else None)
                inner = _inner(dn, cand_node) + (_inner(de, cand_edge) if de is not None else 0.0)
                lin = -m.log_partition + inner
                scale = m.log_partition.abs() + inner.abs()
            val = energy.value(with_rows(rows, cand_node, cand_edge))[rows]
            fc = lin + val
            if method == "accelerated":       # the oracle point's own objective: restarts resume from the best
                f_nu = (-m.log_partition + _inner(dn, m.node) + _inner(de, m.edge)
                        + energy.value(with_rows(rows, m.node, m.edge))[rows])
            f_prev = f[rows]
            fc = torch.where(wild, torch.full_like(fc, float("inf")), fc)
            floor = noise * (scale + val.abs() + f_prev.abs())       # rounding error of the objective
            ok = torch.isfinite(fc) & (fc <= f_prev + rise * f_prev.abs() + floor)
            if method == "md":
                # where the objective cannot tell the candidate from the iterate, require the stationarity
                # residual to fall instead, so that rounding noise cannot drive an endless random walk
                band = torch.isfinite(fc) & ((fc - f_prev).abs() <= floor)
                if band.any():
                    gb_n, gb_e = gradient_rows(rows[band], cand_node[band], None if de is None else cand_edge[band])
                    res_b = _residual(dn[band], gb_n, cand_node[band], 1)
                    if de is not None and gb_e is not None:
                        res_b = torch.maximum(res_b, edge_residual(de[band], gb_e, cand_edge[band]))
                    ok[band] = res_b < residual[rows[band]]
            # no marginal may collapse to an exact zero (the barrier energies' failure), nor, with a trust
            # region, move by more than ``trust_region`` nats
            change = _log_change(nu_node[rows] if method == "accelerated" else mu_node[rows], m.node)
            collapsed = ((m.node == 0) & support[rows]).flatten(1).any(-1)
            ok &= (change <= (trust_region if trust_region is not None else float("inf"))) & ~collapsed
            forced = None
            if attempt == max_backtracks:      # out of backtracks: take any finite step, but as a failed one
                passed = ok
                ok = torch.isfinite(fc) & torch.isfinite(change) & ~collapsed
                if method == "md":             # except, for a descent method, one that raises the objective
                    ok &= fc <= f_prev + floor
                forced = pending[ok & ~passed]
            if ok.any():
                r = rows[ok]
                f[r], delta_node[r], mu_node[r] = fc[ok], dn[ok], cand_node[ok]
                if need_edges:
                    delta_edge[r], mu_edge[r] = de[ok], cand_edge[ok]
                if method != "md":
                    since[r] += 1
                    gbar_node[r] = gn[ok]
                    if need_edges:
                        gbar_edge[r] = ge[ok]
                if method == "accelerated":
                    nu_node[r] = m.node[ok]
                    nu_f[r] = f_nu[ok]
                    log_z[r] = m.log_partition[ok]
                    better = ok.clone()
                    better[ok] = f_nu[ok] < best_f[r]
                    if better.any():
                        rb = rows[better]
                        best_f[rb], best_node[rb], best_edge[rb] = f_nu[better], m.node[better], m.edge[better]
                        best_dn[rb], best_de[rb], best_logz[rb] = dn[better], de[better], m.log_partition[better]
                    if need_edges:
                        nu_edge[r] = m.edge[ok]
                iterations[r] += 1
            if forced is not None and forced.numel():
                clean[forced] = False              # so the step does not grow after it
                safeguarded[a[forced]] = True
                if method == "md":
                    p_cur[forced] = torch.maximum(p_cur[forced] / 2, min_step[forced])
            failed = pending[~ok]
            if failed.numel() == 0:
                break
            # step-size control: shrink the step; RDA and the accelerated method restart from the current
            # point, which becomes the prox-centre, so that a large beta/L means a small step from here
            clean[failed] = False
            rows = a[failed]
            safeguarded[rows] = True
            if method == "md":
                p_cur[failed] = torch.maximum(p_cur[failed] / 2, min_step[failed])
            elif method == "accelerated":
                # backtracking on L (a larger L keeps nu closer to the prox-centre); a step that leaves the
                # trust region or loses support instead restarts the method at nu, the last oracle point
                wild_step = ~(torch.isfinite(change[~ok]) & (change[~ok] <= (trust_region or float("inf"))))
                p_cur[failed] = torch.clamp(p_cur[failed] * 2, min=1.0, max=1 / _MIN_STEP)
                restart = failed[wild_step & (s1[failed] > 1)]
                if restart.numel():
                    # resume from the best oracle point seen (mu averages them and has no dual iterate)
                    rr = a[restart]
                    delta_node[rr], delta_edge[rr], log_z[rr] = best_dn[rr], best_de[rr], best_logz[rr]
                    anchor_node[rr], anchor_edge[rr] = best_dn[rr], best_de[rr]
                    gbar_node[rr], gbar_edge[rr] = 0.0, 0.0
                    since[rr] = 0
                    s1[restart], cw[restart] = 1.0, 1.0
                    nu_node[rr], nu_edge[rr] = best_node[rr], best_edge[rr]
                    mu_node[rr], mu_edge[rr] = best_node[rr], best_edge[rr]
                    f[rr] = nu_f[rr] = best_f[rr]
                    g_n[restart], g_e[restart] = gradient_rows(rr, best_node[rr], best_edge[rr])
            else:
                # RDA restarts from the current point, which becomes the prox-centre (so a large beta means
                # a small step from here); beta grows only if a fresh start fails too
                fresh = s1[failed] == 1
                # beta's cap is relative, like mirror descent's step floor: 1e20 max |g + delta|
                cap = 1 / min_step[failed]
                p_cur[failed] = torch.where(fresh, torch.minimum(torch.clamp(p_cur[failed] * 2, min=1.0), cap),
                                            p_cur[failed])
                anchor_node[rows] = delta_node[rows]
                gbar_node[rows] = 0.0
                if need_edges:
                    anchor_edge[rows] = delta_edge[rows]
                    gbar_edge[rows] = 0.0
                since[rows] = 0
                s1[failed], cw[failed] = 1.0, 1.0
            pending = failed
        # after a step that needed no shrinking, relax the control towards the user's setting
        if method == "md":
            cap = max(step, _MAX_STEP) if max_backtracks else step
            p_cur = torch.where(clean, torch.clamp(p_cur * 2, max=cap), p_cur)
        else:
            p_cur = torch.where(clean, p_cur / _RELAX[method], p_cur)
            p_cur = torch.where(p_cur < max(user_param, 1.0), torch.full_like(p_cur, user_param), p_cur)
        param[a] = p_cur
        if method == "md":
            # steps shrunk to nothing: the example sits at the floor that rounding allows and stops
            # (``converged`` stays False unless tol was met)
            at_floor[a] |= p_cur <= 1e4 * min_step
        if method == "accelerated":
            stall[a] |= p_cur > _STALL_L * max(user_param, 1.0)
        history.append(f.clone())
        active = active[~converged[active] & ~stall[active] & ~at_floor[active]]

    final = shift(theta, delta_node, delta_edge)
    if method == "accelerated":
        # mu_t averages oracle outputs; the dual iterate is that of the last nu_t, which converged examples
        # return (the point their stationarity was tested at)
        done = converged.nonzero().flatten()
        mu_node[done], mu_edge[done], f[done] = nu_node[done], nu_edge[done], nu_f[done]
        marg = Marginals(mu_node, mu_edge, log_z, lengths)
    else:
        marg = oracle.marginals(final)
        calls += b
    objectives = torch.stack(history, 1)
    if objectives.shape[1] < max_iter + 1:
        pad = objectives[:, -1:].expand(b, max_iter + 1 - objectives.shape[1])
        objectives = torch.cat([objectives, pad], 1)
    sol = Solution(marginals=marg, potentials=final, iterations=iterations, converged=converged, objective=f,
                   objectives=objectives, safeguarded=safeguarded, residual=residual, oracle_calls=calls,
                   method=method)
    if method == "accelerated":
        # last resort: an example whose L had to grow past _STALL_L, or that needed step-size control and
        # did not converge, is finished by backtracked mirror descent from the best oracle point found
        stalled = ((stall | safeguarded) & ~converged).nonzero().flatten()
        if stalled.numel():
            best = theta.shifted(best_dn, best_de)
            rescue = solve(oracle, potentials, energy, method="md", max_iter=max_iter, tol=tol,
                           max_backtracks=max_backtracks, trust_region=trust_region, warm_start=best)
            sol = _merge(sol, rescue, stalled)
    return sol


def _raise_infinite_gradient(rows: Tensor, start_name: str | None, dtype: torch.dtype) -> None:
    """A gradient of the energy beyond ``dtype``'s range: at the start (``start_name`` says which) a ValueError,
    since the problem does not fit the dtype; later (``None``) a FloatingPointError."""
    bad = rows[:10].tolist()
    why = (f"it exceeds what {dtype} can represent (~{torch.finfo(dtype).max:.1e}), e.g. Poisson counts or a "
           f"-log barrier where a marginal is below ~1/{torch.finfo(dtype).max:.0e}")
    if start_name is not None:
        raise ValueError(f"the energy gradient is not finite at {start_name} for examples {bad}: {why}"
                         + ("; solve in float64" if dtype != torch.float64 else ""))
    raise FloatingPointError(f"the energy gradient is not finite at an accepted iterate for examples {bad}: {why}")


_STALL_L = 1e6      # the accelerated method hands an example to mirror descent once L exceeds this factor


def _warm_offsets(warm: PairwisePotentials | None, theta: PairwisePotentials, need_edges: bool, method: str):
    """Dual offsets ``warm - theta`` (finite where theta is, zero where theta is -inf)."""
    if warm is None:
        return None, None
    if method != "md":
        raise ValueError("warm_start is supported for method='md' only")
    if not isinstance(warm, PairwisePotentials) or warm.node.shape != theta.node.shape:
        raise ValueError("warm_start must be PairwisePotentials of the same shape as potentials")
    finite = torch.isfinite(theta.node)
    d_node = torch.where(finite, warm.node - torch.where(finite, theta.node, 0.0), 0.0)
    d_edge = None
    if need_edges:
        fe = torch.isfinite(theta.full_edge())
        d_edge = torch.where(fe, warm.full_edge() - torch.where(fe, theta.full_edge(), 0.0), 0.0)
    return d_node, d_edge


def _merge(sol: Solution, other: Solution, rows: Tensor) -> Solution:
    """``sol`` with the examples ``rows`` taken from ``other`` (their histories end with ``other``'s value)."""
    def pick(a: Tensor, b: Tensor) -> Tensor:
        return a.index_put((rows,), b[rows])

    mu = Marginals(pick(sol.marginals.node, other.marginals.node), pick(sol.marginals.edge, other.marginals.edge),
                   pick(sol.marginals.log_partition, other.marginals.log_partition), sol.marginals.lengths)
    pot = sol.potentials
    other_edge = other.potentials.full_edge() if pot.edge.dim() == 4 else other.potentials.edge
    merged = pot.shifted(None, None)
    merged.node = pick(pot.node, other.potentials.node)
    merged.edge = pick(pot.edge, other_edge) if pot.edge.dim() == 4 else pot.edge
    objectives = sol.objectives.clone()
    objectives[rows, -1] = other.objective[rows]
    return Solution(marginals=mu, potentials=merged, iterations=pick(sol.iterations, sol.iterations + other.iterations),
                    converged=pick(sol.converged, other.converged), objective=pick(sol.objective, other.objective),
                    objectives=objectives, safeguarded=pick(sol.safeguarded, torch.ones_like(other.safeguarded)),
                    residual=pick(sol.residual, other.residual), oracle_calls=sol.oracle_calls + other.oracle_calls,
                    method=sol.method)


def _objective_parts(oracle: Oracle, theta: PairwisePotentials, mu: Marginals) -> Tensor:
    """``-H_B(mu) - <theta, mu>`` at any point of the polytope (``-inf`` potentials where ``mu`` = 0 add 0)."""
    zero = torch.zeros((), dtype=mu.node.dtype)
    lin = torch.where(mu.node > 0, theta.node * mu.node, zero).flatten(1).sum(-1)
    lin = lin + torch.where(mu.edge > 0, theta.full_edge() * mu.edge, zero).flatten(1).sum(-1)
    return -oracle.entropy(mu) - lin


def objective(oracle: Oracle, potentials: PairwisePotentials, energy: Energy, marginals: Marginals) -> Tensor:
    """Value of (2), ``-H_B(mu) - <theta, mu> + L(mu)`` [B], at any point of the marginal polytope."""
    return _objective_parts(oracle, potentials, marginals) + energy.value(marginals)
