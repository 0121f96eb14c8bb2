"""The state of one batched :func:`~betheproj.inference.solve` run and its iteration (Algorithms 1, 4 and 5).

:class:`SolverState` holds, per example, the iterate ``mu_t``, the dual offset ``delta_t`` of the last oracle
point, the prox-centre and gradient average of the dual-averaging methods, and the step-size control;
:meth:`SolverState.iterate` runs one iteration for the examples still active: linearise, test stationarity
(Proposition 1), then try candidate steps, shrinking the step of each example whose candidate is rejected.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import overload

import torch
from torch import Tensor

from ..energies.base import Energy, Gradient, check_value_shape
from ..oracles.base import (
    Marginals,
    Oracle,
    PairwisePotentials,
    _log_partition_of,
    _unchecked,
    _whole_batch,
    edge_row_ends,
    has_pairwise_factors,
    tree_parents,
)

_MAX_STEP = 1e6
_MIN_STEP = 1e-20   # bounds of the step-size control (eta for MD; 1/beta, 1/L for the others)
_RELAX_BETA = 1.1   # how fast RDA's beta returns to the user's value after a clean step
# relative rise of the objective a step may make before it is rejected (RDA and the accelerated
# method are not descent methods; mirror descent with backtracking is)
_RISE = {"rda": 0.1, "md": 0.0, "accelerated": 1e-2}
_RESTART_EVERY = 20  # the accelerated method restarts from its best oracle point after this many steps
_STALL_L = 1e6      # the accelerated method hands an example to mirror descent once L exceeds this factor


def _masked(x: Tensor, mask: Tensor) -> Tensor:
    return torch.where(mask.reshape(*mask.shape, *([1] * (x.dim() - mask.dim()))), x, torch.zeros((), dtype=x.dtype))


def _inner(a: Tensor | None, b: Tensor) -> Tensor:
    if a is None:
        return b.new_zeros(b.shape[0])
    return (a * b).flatten(1).sum(-1)


def _clip_move(old: Tensor, new: Tensor, mu: Tensor, trust_region: float | None) -> Tensor:
    """Mirror descent's dual step ``old -> new`` with every entry of a representable mass (``mu > 0``) moved by
    at most half the trust region: a barrier's gradient of 1e132 at a mass of e^-304 would otherwise need a step
    of 1e-132 for every entry at once.  A mass that underflowed to 0 may cross the underflow in one step."""
    if trust_region is None:
        return new
    h = 0.5 * trust_region
    return torch.where(mu > 0, old + (new - old).clamp(-h, h), new)


def _rows(x: Tensor | None, rows: Tensor) -> Tensor | None:
    """``x[rows]`` for reading: ``x`` itself, not a copy, where ``rows`` is the whole batch."""
    return None if x is None else x if _whole_batch(rows, len(x)) else x[rows]


def _take(x: Tensor | None, rows: Tensor) -> Tensor | None:
    """``x[rows]`` (a copy), or ``None`` for a part of the state that is not kept."""
    return None if x is None else x[rows]


def _clone(x: Tensor | None) -> Tensor | None:
    return None if x is None else x.clone()


@overload
def _lerp(x: Tensor, y: Tensor, w: Tensor) -> Tensor: ...
@overload
def _lerp(x: Tensor | None, y: Tensor | None, w: Tensor) -> Tensor | None: ...

def _lerp(x: Tensor | None, y: Tensor | None, w: Tensor) -> Tensor | None:
    """``(1 - w) x + w y`` with a per-row weight ``w`` (``None`` for the edges of a state that keeps none)."""
    if x is None or y is None:
        return None
    out = y - x                     # then in place: one new tensor (edge-sized state), the same rounding
    return out.mul_(w.reshape(-1, *([1] * (x.dim() - 1)))).add_(x)


def _rows_all(x: Tensor) -> Tensor:
    """Per-row ``all`` of a boolean tensor [R, ...]."""
    return x.flatten(1).all(-1)


def _finite_rows(g_n: Tensor, g_e: Tensor | None) -> Tensor:
    """[R]: whether row r of the node gradient (and of the edge gradient, if any) is finite everywhere."""
    finite = _rows_all(torch.isfinite(g_n))
    return finite if g_e is None else finite & _rows_all(torch.isfinite(g_e))


def _check_gradient(energy: Energy, g: Gradient, mu: Marginals, edge_shape: tuple[int, ...]) -> None:
    """The energy's gradient has the marginals' node shape and an edge part [C, C] or of ``edge_shape``'s rank
    that broadcasts to it (a per-example [B, C, C] would broadcast to [B, N-1, C, C] as per-position when
    B = N-1), both in the marginals' dtype."""
    for part, x in (("node", g.node), ("edge", g.edge)):
        if x is not None and x.dtype != mu.node.dtype:
            raise TypeError(f"{type(energy).__name__}.grad returned a {x.dtype} {part} gradient for {mu.node.dtype} "
                            f"marginals: build the energy's tensors in the potentials' dtype")
    if g.node is not None and g.node.shape != mu.node.shape:
        raise ValueError(f"{type(energy).__name__}.grad returned a node gradient of shape {tuple(g.node.shape)}; "
                         f"the marginals are {tuple(mu.node.shape)}")
    if g.edge is not None:
        try:
            fits = g.edge.dim() in (2, len(edge_shape)) and torch.broadcast_shapes(g.edge.shape,
                                                                                  edge_shape) == edge_shape
        except RuntimeError:
            fits = False
        if not fits:
            raise ValueError(f"{type(energy).__name__}.grad returned an edge gradient of shape "
                             f"{tuple(g.edge.shape)}; it must be [C, C] or {len(edge_shape)}-D and broadcast to "
                             f"{edge_shape}")


def _check_value(energy: Energy, value: object, node: Tensor) -> Tensor:
    """``value``, the energy's value at marginals with node marginals ``node``: a tensor [B]
    (:func:`~betheproj.energies.base.check_value_shape`) in their dtype."""
    value = check_value_shape(energy, value, node.shape[0])
    if value.dtype != node.dtype:
        raise TypeError(f"energy.value returned {value.dtype} for {node.dtype} marginals: build the energy's tensors "
                        f"in the potentials' dtype")
    return value


def _masked_gradient(energy: Energy, mu: Marginals) -> Gradient:
    """``grad L`` with padding zeroed and edge gradients broadcast to [B, N-1, C, C]."""
    g = energy.grad(mu)
    b, n, c = mu.node.shape
    _check_gradient(energy, g, mu, (b, n - 1, c, c))
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
    b, _, c = mu.node.shape
    _check_gradient(energy, g, mu, (b, c, c))
    node = _masked(g.node if g.node is not None else torch.zeros_like(mu.node), mu.node_mask())
    return Gradient(node, g.edge)


def _residual(delta: Tensor, grad: Tensor, mu: Tensor, dims: int, allowed: Tensor | None = None,
              kl: bool = False) -> Tensor:
    """Stationarity residual of Proposition 1 for one part (node: ``dims=1``, edge: ``dims=2``) [B].

    At the optimum ``theta~ = theta - grad L(mu*)``, i.e. ``r = delta + grad L`` vanishes up to a constant per
    factor.  Moving the dual iterate by ``-r`` at one factor alone re-weights its marginal to
    ``q ∝ mu * exp(-r)``; the residual is the largest total-variation distance ``||q - mu||_1`` over the
    factors (``kl``: the largest ``KL(q || mu)``, which does not saturate at 2).  Constants drop out, labels
    without mass stay without mass, and a label the energy pulls hard on counts by the mass it would gain, not
    by its current (possibly tiny) mass.  ``allowed`` marks labels that hold mass although it underflowed to
    an exact 0 in ``mu``: they count as holding the smallest normal number, so that a pull on them is seen.
    """
    red = tuple(range(-dims, 0))
    if mu.numel() == 0:                            # no factors of this kind (a chain of length 1 has no edges)
        return mu.new_zeros(mu.shape[0])
    log_mu = torch.log(mu if allowed is None else torch.where((mu == 0) & allowed, torch.finfo(mu.dtype).tiny, mu))
    logits = log_mu - (delta + grad)
    shape = logits.shape
    flat = logits.reshape(*shape[: logits.dim() - dims], -1)
    q = torch.softmax(flat, -1).reshape(shape)
    if kl:
        log_ratio = (flat - torch.logsumexp(flat, -1, keepdim=True)).reshape(shape) - log_mu
        dist = torch.where(q > 0, q * log_ratio, torch.zeros_like(q)).sum(red)
    else:
        dist = (q - mu).abs().sum(red)
    present = mu.sum(red) > 0                      # padding factors hold no mass
    return torch.where(present, dist, torch.zeros_like(dist)).flatten(1).amax(-1)


def _log_change(old: Tensor, new: Tensor, ignore: Tensor | None = None) -> Tensor:
    """Largest change of a log-marginal between two oracle points [B]: a marginal falling to an exact 0 is an
    infinite change; one rising from below the smallest normal number (an underflowed label the energy pulls
    up) is not limited, since its log could not be measured; entries tiny in both are ignored, and so are the
    entries ``ignore`` (rounding-level mass where the structure allows none)."""
    floor = torch.finfo(old.dtype).tiny
    big = old > floor if ignore is None else (old > floor) & ~ignore
    diff = (torch.log(new.clamp_min(floor)) - torch.log(old.clamp_min(floor))).abs()
    diff = torch.where((old > 0) & (new == 0), torch.full_like(diff, float("inf")), diff)
    return torch.where(big, diff, torch.zeros_like(diff)).flatten(1).amax(-1)


def _edge_potentials(theta: PairwisePotentials, need_edges: bool) -> PairwisePotentials:
    """``theta`` with per-position edges when edge offsets will be added to it."""
    if not need_edges or not theta.shared_edge:
        return theta
    out = PairwisePotentials.__new__(PairwisePotentials)
    out.node, out.edge, out.lengths = theta.node, theta.full_edge(), theta.lengths
    return out


def _warm_offsets(warm: PairwisePotentials | None, theta: PairwisePotentials, need_edges: bool,
                  method: str) -> tuple[Tensor | None, Tensor | None]:
    """Dual offsets ``warm - theta`` (finite where theta is, zero where theta is -inf and at padding)."""
    if warm is None:
        return None, None
    if method != "md":
        raise ValueError("warm_start is supported for method='md' only")
    if not isinstance(warm, PairwisePotentials):
        raise TypeError(f"warm_start must be PairwisePotentials (a Solution's potentials), got {type(warm).__name__}")
    if warm.node.shape != theta.node.shape:
        raise ValueError(f"warm_start must have the potentials' node shape {tuple(theta.node.shape)}, got "
                         f"{tuple(warm.node.shape)}")
    if warm.node.dtype != theta.node.dtype:
        raise TypeError(f"warm_start must have the potentials' dtype {theta.node.dtype}, got {warm.node.dtype}")
    if warm.node.device != theta.node.device:
        raise ValueError(f"warm_start is on {warm.node.device} but potentials are on {theta.node.device}")
    if not torch.equal(warm.lengths, theta.lengths):
        raise ValueError("warm_start has other lengths than the potentials: the potentials of other examples (pass "
                         "a Solution of this problem)")
    n = theta.node.shape[1]
    positions = torch.arange(n, device=theta.node.device)
    d_node = _warm_part("node", warm.node, theta.node, positions < theta.lengths[:, None])
    d_edge = None
    if need_edges:
        d_edge = _warm_part("edge", warm.full_edge(), theta.full_edge(), positions[:-1] < theta.lengths[:, None] - 1)
    return d_node, d_edge


def _warm_part(name: str, warm: Tensor, theta: Tensor, valid: Tensor) -> Tensor:
    """``warm - theta`` for one part ([B, N, C] node or [B, N-1, C, C] edge scores, ``valid`` [B, N] or [B, N-1]
    its positions inside each length): zero where theta is -inf and at padding, which no oracle reads.  A warm start
    that forbids (-inf) what theta allows at a valid position would be an infinite offset: a ValueError."""
    finite = torch.isfinite(theta)
    valid = valid.reshape(*valid.shape, *([1] * (theta.dim() - valid.dim())))
    forbids = finite & valid & ~torch.isfinite(warm)
    if forbids.any():
        example = int(forbids.flatten(1).any(-1).nonzero()[0])
        raise ValueError(f"warm_start is -inf where the potentials are finite (example {example}, {name} scores): a "
                         f"warm start must allow every label and transition theta allows (pass the potentials of a "
                         f"Solution of this problem)")
    return torch.where(finite & valid, warm - torch.where(finite, theta, 0.0), 0.0)


def _objective_parts(oracle: Oracle, theta: PairwisePotentials, mu: Marginals) -> Tensor:
    """``-H_B(mu) - <theta, mu>`` at any point of the polytope (``-inf`` potentials where ``mu`` = 0 add 0)."""
    zero = torch.zeros((), dtype=mu.node.dtype)
    lin = torch.where(mu.node > 0, theta.node * mu.node, zero).flatten(1).sum(-1)
    if has_pairwise_factors(oracle):        # otherwise the edge marginals are the oracle's all-zero placeholders
        # a shared table scores each example's edge marginals summed over positions (positive where any is)
        edge = mu.edge_total() if theta.shared_edge else mu.edge
        lin = lin + torch.where(edge > 0, theta.edge * edge, zero).flatten(1).sum(-1)
    return -oracle.entropy(mu) - lin


@torch.no_grad()
def _raise_infinite_gradient(rows: Tensor, start_name: str | None, dtype: torch.dtype, nan: bool = False) -> None:
    """A gradient of the energy beyond ``dtype``'s range (or NaN: ``nan``): at the start (``start_name`` says
    which) a ValueError, since the problem does not fit the dtype; later (``None``) a FloatingPointError."""
    bad = rows[:10].tolist()
    if nan:
        why = "it is NaN there (undefined: e.g. 0 * inf or 0 / 0 in the energy's value or gradient)"
    else:
        why = (f"it exceeds what {dtype} can represent (~{torch.finfo(dtype).max:.1e}), e.g. Poisson counts or a "
               f"-log barrier where a marginal is below ~1/{torch.finfo(dtype).max:.0e}")
    if start_name is not None:
        raise ValueError(f"the energy gradient is not finite at {start_name} for examples {bad}: {why}"
                         + ("; solve in float64" if dtype != torch.float64 and not nan else ""))
    raise FloatingPointError(f"the energy gradient is not finite at an accepted iterate for examples {bad}: {why}")


@dataclass
class _Trial:
    """Candidate steps of the examples ``rows`` (a subset of the iteration's active rows, ``pending``)."""

    rows: Tensor
    dn: Tensor                  # dual offsets
    de: Tensor | None
    gn: Tensor                  # gradient averages after the step (RDA, accelerated)
    ge: Tensor | None
    oracle: Marginals           # oracle(theta + offsets)
    node: Tensor                # the candidate iterate (the oracle point, or the accelerated average)
    edge: Tensor | None
    f: Tensor                   # its objective (inf for a step too large to represent)
    f_nu: Tensor | None         # accelerated: the oracle point's own objective
    val: Tensor                 # the energy's value at the candidate
    floor: Tensor               # rounding error of the objective
    change: Tensor              # largest change of a log-marginal
    collapsed: Tensor           # whether a supported marginal fell to an exact 0
    ok: Tensor                  # accepted


class SolverState:
    """Per-example state of a batched solve of (2); rows of converged examples stay frozen.

    Per example: the iterate ``mu`` (``mu_node``, ``mu_edge``) and its objective ``f``; the dual offset
    ``delta`` of the last oracle point (``theta + delta`` is the dual iterate); for Bethe-RDA and the accelerated
    method the prox-centre ``anchor`` and the gradient average ``gbar`` since it (``since`` steps); the accelerated
    method's last oracle point ``nu`` and the best oracle point seen (``best_*``); the step parameter ``param``
    (``eta``, ``beta`` or ``L``); and the report: ``iterations``, ``converged``, ``safeguarded``, ``residual``,
    ``history`` and ``calls``.  ``active`` holds the examples still iterating.  ``totals``: edge quantities are
    per-example sums [B, C, C] instead of per position (see :mod:`.solve`).  ``need_edges``: the iterate's edge
    marginals are kept; ``edge_offsets``: so are edge offsets, gradients and the oracle points' edges (only for an
    energy that reads edges: the accelerated method keeps its averages' edges for their entropy alone).
    """

    def __init__(self, oracle: Oracle, potentials: PairwisePotentials, energy: Energy, method: str, tol: float,
                 beta: float, step: float, lipschitz: float, max_backtracks: int, trust_region: float | None,
                 warm_start: PairwisePotentials | None):
        b, n, c = potentials.node.shape
        self.oracle, self.energy, self.method, self.tol = oracle, energy, method, tol
        self.pairwise = has_pairwise_factors(oracle)
        self.max_backtracks, self.trust_region = max_backtracks, trust_region
        self.n, self.c = n, c
        device, dtype = potentials.node.device, potentials.node.dtype
        self.dtype, self.device = dtype, device
        self.lengths = lengths = potentials.lengths
        base = oracle.marginals(potentials)
        energy.validate(base)
        # Energies that read edge marginals only through per-example sums over positions (Energy.edge_totals),
        # with shared transitions and an oracle that takes one transition table per example, keep every edge
        # quantity as [B, C, C]: edge "marginals" are those sums, offsets are the same at every position.
        totals = (method != "accelerated" and warm_start is None and n > 1 and potentials.shared_edge
                  and energy.edge_totals and getattr(oracle, "per_example_edges", False))
        self.totals = totals
        g0 = self._gradient(base)
        # the accelerated method's objective at its averages reads the Bethe entropy, hence the edge marginals
        # (of structures that have pairwise factors: a dependency tree's are the oracle's all-zero placeholders)
        self.need_edges = need_edges = g0.edge is not None or (method == "accelerated" and self.pairwise)
        # edge offsets (and edge gradients, gradient averages, prox-centres) only for an energy that reads the edge
        # marginals: for one that does not they stay exactly 0, so the accelerated method keeps only its average's
        # edge marginals (for the entropy) and recomputes an oracle point's where it returns to one
        self.edge_offsets = edge_offsets = g0.edge is not None
        self.totals = totals = totals and need_edges
        self.theta = theta = potentials if totals else _edge_potentials(potentials, edge_offsets)
        self.calls = b
        start_node, start_edge = _warm_offsets(warm_start, theta, edge_offsets, method)
        mu0 = base if start_node is None else oracle.marginals(theta.shifted(start_node, start_edge))
        if start_node is not None:
            self.calls += b                                 # the warm start's own oracle call

        self.mu_node = mu_node = mu0.node.clone()
        self.mu_edge = mu_edge = (mu0.edge_total() if totals else mu0.edge).clone() if need_edges else None
        offset_edge = mu_edge if edge_offsets else None     # the edges that offsets, gradients and centres cover

        def zeros_edge() -> Tensor | None:
            return None if offset_edge is None else torch.zeros_like(offset_edge)

        # dual offset of the last oracle point
        self.delta_node, self.delta_edge = torch.zeros_like(mu_node), zeros_edge()
        if start_node is not None:
            self.delta_node = start_node.clone()
            self.delta_edge = _clone(start_edge)             # the warm start's edge offsets where they are kept
        self.anchor_node, self.anchor_edge = torch.zeros_like(mu_node), zeros_edge()   # prox-centre
        self.gbar_node, self.gbar_edge = torch.zeros_like(mu_node), zeros_edge()       # gradient average since it
        self.since = torch.zeros(b, dtype=torch.long, device=device)              # iterations since the centre
        self.log_z = _log_partition_of(mu0).clone()
        self.support = base.node > 0                                               # where theta allows mass
        self.allowed_node, self.allowed_edge = self._underflowed(oracle, potentials, base)
        self.rounding_only = None   # entries whose marginals are rounding: no configuration theta allows uses them
        structural = getattr(oracle, "support", None)
        if callable(structural):
            can = structural(potentials)
            self.rounding_only = self.support & ~can
            self.support &= can
            if self.allowed_node is not None:
                self.allowed_node = self.allowed_node & can
        # a label that loses every bit of its mass during the solve (float32 RDA drove one through subnormals to 0)
        # must still show the energy's pull in the residual: where theta allows mass, an exact 0 counts as tiny
        if self.allowed_node is None:
            self.allowed_node = self.support
            self.allowed_edge = None if not edge_offsets else (base.edge_total() if totals else base.edge) > 0
        self.nu_node, self.nu_edge = mu_node.clone(), _clone(offset_edge)
        self.val = _check_value(energy, energy.value(self._energy_point(mu_node, mu_edge, lengths)), mu_node)
        f = -self.log_z + _inner(self.delta_node, mu_node) + self.val
        if offset_edge is not None:
            f = f + _inner(self.delta_edge, offset_edge)
        self.f = f
        self.start_name = "the base marginals oracle(theta)" if start_node is None else "the warm start"
        if torch.isnan(self.val).any():
            bad = torch.nonzero(torch.isnan(self.val)).flatten()[:10].tolist()
            raise ValueError(f"the energy is NaN at {self.start_name} for examples {bad}")
        if not torch.isfinite(f).all():
            bad = torch.nonzero(~torch.isfinite(f)).flatten()[:10].tolist()
            raise ValueError(f"the objective is not finite at {self.start_name} for examples {bad}: the energy is "
                             "infinite where the marginals are 0, because theta allows no mass there (e.g. positive "
                             "counts on a label whose potentials are all -inf) or because that mass underflows to 0 "
                             f"(log-potential gaps beyond what exp can represent in {dtype}, ~745 in float64)")
        if method == "accelerated":      # the best oracle point seen, where a restart resumes
            self.best_f, self.best_node, self.best_edge = f.clone(), mu_node.clone(), _clone(self.nu_edge)
            self.best_dn, self.best_de = torch.zeros_like(mu_node), zeros_edge()
            self.best_logz = self.log_z.clone()
            self.nu_f = f.clone()                                   # the objective at nu, the last oracle point
        self.stall = torch.zeros(b, dtype=torch.bool, device=device)
        self.at_floor = torch.zeros(b, dtype=torch.bool, device=device)
        self.user_param = {"rda": beta, "md": step, "accelerated": lipschitz}[method]
        self.param = torch.full((b,), self.user_param, dtype=dtype, device=device)
        self.residual = torch.full((b,), float("inf"), dtype=dtype, device=device)
        self.rise = _RISE[method]
        self.noise = 64 * torch.finfo(dtype).eps
        self.history = [f.clone()]
        self.iterations = torch.zeros(b, dtype=torch.long, device=device)
        self.converged = torch.zeros(b, dtype=torch.bool, device=device)
        self.safeguarded = torch.zeros(b, dtype=torch.bool, device=device)
        self.active = torch.arange(b, device=device)

    def _underflowed(self, oracle: Oracle, potentials: PairwisePotentials, base: Marginals
                     ) -> tuple[Tensor | None, Tensor | None]:
        """Where the potentials allow mass (node [B, N, C], edge like ``mu_edge``), if some of it underflowed
        to an exact 0 in the base marginals (log-potential gaps beyond ~87 nats in float32, ~745 in float64);
        ``(None, None)`` if none did.  Feasibility is read off the marginals of the potentials with every finite
        entry set to 0 (the uniform distribution over the configurations theta allows), in float64."""
        valid = base.node_mask()[..., None]
        if not bool(((base.node == 0) & torch.isfinite(potentials.node) & valid).any()) \
                and not self._edge_underflowed(oracle, potentials, base):
            return None, None
        def flat(x: Tensor) -> Tensor:
            return torch.where(torch.isfinite(x), 0.0, -torch.inf).to(torch.float64)

        uniform = oracle.marginals(_unchecked(PairwisePotentials, flat(potentials.node), flat(potentials.edge),
                                              potentials.lengths))
        self.calls += potentials.node.shape[0]
        node = (base.node > 0) | (uniform.node > 0)
        if not self.edge_offsets:
            return node, None
        if self.totals:
            return node, (base.edge_total() > 0) | (uniform.edge_total() > 0)
        return node, (base.edge > 0) | (uniform.edge > 0)

    def _edge_underflowed(self, oracle: Oracle, potentials: PairwisePotentials, base: Marginals) -> bool:
        """Whether an edge entry with a finite potential between two labels of positive marginal has an exact 0
        edge marginal (positive in exact arithmetic, so underflow), at a position whose edge marginals carry
        mass (the dependency oracles' edges are all-zero placeholders)."""
        n = potentials.node.shape[1]
        if not self.edge_offsets or n < 2:
            return False
        pos = base.node > 0
        rows = edge_row_ends(pos, tree_parents(oracle, n))
        possible = rows[..., :, None] & pos[:, 1:, None, :] & torch.isfinite(potentials.full_edge())
        if self.totals:
            edge = base.edge_total()
            return bool((possible.any(1) & (edge == 0) & (edge.sum((-1, -2)) > 0)[:, None, None]).any())
        edge = base.edge
        return bool((possible & (edge == 0) & (edge.sum((-1, -2)) > 0)[..., None, None]).any())

    def averaged_marginals(self) -> Marginals:
        """The accelerated method's result: the average ``mu_t`` with the log-partition of the last dual iterate
        (converged examples hold ``nu_t``, whose dual iterate and log Z these are)."""
        m = self._point(self.mu_node, self.mu_edge, self.lengths)
        m.log_partition = self.log_z
        return m

    # -- views of the state --------------------------------------------------------------------------------
    def _point(self, node: Tensor, edge: Tensor | None, lens: Tensor,
               near: PairwisePotentials | None = None) -> Marginals:
        if self.totals:
            return Marginals(node, None, None, lens, edge_total=edge, near=near)
        if edge is None and not self.pairwise:                   # untracked: the oracle's all-zero placeholders
            b, n, c = node.shape
            return Marginals(node, lambda: node.new_zeros(b, max(n - 1, 0), c, c), None, lens, near=near)
        return Marginals(node, edge, None, lens, near=near)

    def _energy_point(self, node: Tensor, edge: Tensor | None, lens: Tensor) -> Marginals:
        """The marginals the energy reads: without edges where it reads none (no copy of the edge state)."""
        return self._point(node, edge if self.edge_offsets else None, lens)

    def _oracle_edges(self, rows: Tensor, dn: Tensor) -> Tensor:
        """The edge marginals of the oracle points ``theta + dn`` of ``rows`` (not kept where the energy reads no
        edges: the accelerated method returns to an oracle point only on convergence and at restarts)."""
        self.calls += int(rows.numel())
        return self.oracle.marginals(self.shift(self.theta.index(rows), dn, None)).edge

    def shift(self, pot: PairwisePotentials, dn: Tensor, de: Tensor | None) -> PairwisePotentials:
        """``pot`` with dual offsets (per-example [B, C, C] edge offsets viewed over the positions)."""
        if not self.totals or de is None:
            return pot.shifted(dn, de)
        out = pot.shifted(dn, None)
        out.edge = (pot.edge + de)[:, None].expand(dn.shape[0], self.n - 1, self.c, self.c)
        return out

    def _gradient(self, mu: Marginals) -> Gradient:
        g = (_total_gradient if self.totals else _masked_gradient)(self.energy, mu)
        if not self.pairwise:
            # no pairwise factors (dependency trees): the edge marginals are fixed at zero, so an energy's edge
            # terms are constant on the polytope and their gradient is no direction the iterates can move in
            g.edge = None
        return g

    def _with_rows(self, rows: Tensor, node: Tensor, edge: Tensor | None) -> Marginals:
        """Full-batch marginals with ``rows`` replaced, as the energy reads them: energies may hold data for the
        whole batch."""
        state_edge = self.mu_edge if self.edge_offsets else None         # kept wherever edge_offsets is set
        edge = None if edge is None or state_edge is None else state_edge.index_put((rows,), edge)
        return self._energy_point(self.mu_node.index_put((rows,), node), edge, self.lengths)

    def _gradient_rows(self, rows: Tensor, node: Tensor, edge: Tensor | None) -> tuple[Tensor, Tensor | None]:
        g = self._gradient(self._with_rows(rows, node, edge))
        assert g.node is not None                       # filled by _masked_gradient and _total_gradient
        ge = None
        if self.edge_offsets:
            assert edge is not None                     # passed wherever edge offsets are kept
            ge = g.edge[rows] if g.edge is not None else torch.zeros_like(edge)
        return g.node[rows], ge

    def _stationarity(self, rows: Tensor, delta_n: Tensor, delta_e: Tensor | None, g_n: Tensor,
                      g_e: Tensor | None, node: Tensor, edge: Tensor | None, kl: bool = False) -> Tensor:
        """The stationarity residual of ``rows`` with offsets ``delta``, gradients ``g`` at marginals ``node,
        edge`` (``kl``: measured by KL divergence, see :func:`_residual`)."""
        allowed_n = None if self.allowed_node is None else self.allowed_node[rows]
        allowed_e = None if self.allowed_edge is None else self.allowed_edge[rows]
        res = _residual(delta_n, g_n, node, 1, allowed_n, kl)
        if g_e is None or delta_e is None:
            return res
        assert edge is not None                         # the edge marginals come with their offsets
        if not self.totals:
            return torch.maximum(res, _residual(delta_e, g_e, edge, 2, allowed_e, kl))
        # the residual of the position-averaged edge marginal: zero only if every position's residual is (the
        # offsets are the same at every position), and zero at a stationary point unless the positions' edge
        # supports split into groups that do not overlap
        mass = edge.sum((-1, -2), keepdim=True)
        mean = torch.where(mass > 0, edge / mass.clamp_min(torch.finfo(edge.dtype).tiny), 0.0)
        return torch.maximum(res, _residual(delta_e[:, None], g_e[:, None], mean[:, None], 2,
                                            None if allowed_e is None else allowed_e[:, None], kl))

    # -- one iteration -------------------------------------------------------------------------------------
    def iterate(self, it: int) -> bool:
        """One iteration of the active examples; ``False`` when none was left to iterate."""
        a = self.active
        if a.numel() == 0:
            return False
        s1 = (self.since[a] + 1).to(self.dtype)             # the step number within the current run
        cw = 2.0 / (s1 + 1)                                 # accelerated weights c_t
        if self.method == "accelerated":                    # Algorithm 5 linearises at u_t
            u_edge = _lerp(_take(self.mu_edge, a), _take(self.nu_edge, a), cw) if self.edge_offsets else None
            g_n, g_e = self._gradient_rows(a, _lerp(self.mu_node[a], self.nu_node[a], cw), u_edge)
            point_node, point_edge = self.nu_node[a], _take(self.nu_edge, a)
        else:
            g_n, g_e = self._gradient_rows(a, self.mu_node[a], _take(self.mu_edge, a))
            point_node, point_edge = self.mu_node[a], _take(self.mu_edge, a)
        finite = _finite_rows(g_n, g_e)
        if not finite.all():
            nan = bool(torch.isnan(g_n).any()) or (g_e is not None and bool(torch.isnan(g_e).any()))
            _raise_infinite_gradient(a[~finite], self.start_name if it == 0 else None, self.dtype, nan)

        # converged: the current point is stationary (Proposition 1); no oracle call is needed.  The accelerated
        # method tests its oracle point nu with the gradient at nu (and returns nu if it passes)
        r_n, r_e = (self._gradient_rows(a, point_node, point_edge) if self.method == "accelerated" else (g_n, g_e))
        res = self._stationarity(a, self.delta_node[a], _take(self.delta_edge, a), r_n, r_e, point_node, point_edge)
        self.residual[a] = res
        keep = res > self.tol
        done = a[~keep]
        self.converged[done] = True
        if self.method == "accelerated" and done.numel():
            # they return nu, the point their stationarity was tested at (so its objective ends the history)
            self.mu_node[done], self.f[done] = self.nu_node[done], self.nu_f[done]
            if self.mu_edge is not None:            # need_edges; the oracle point's edges are kept with edge offsets
                self.mu_edge[done] = (self.nu_edge[done] if self.nu_edge is not None
                                      else self._oracle_edges(done, self.delta_node[done]))
        if not keep.all():
            a, s1, cw, g_n = a[keep], s1[keep], cw[keep], g_n[keep]
            g_e = None if g_e is None else g_e[keep]
            if a.numel() == 0:
                if self.method == "accelerated":     # the examples that stopped here moved to nu
                    self.history.append(self.f.clone())
                return False

        p_cur = self.param[a].clone()
        min_step = None
        if self.method != "accelerated":
            # the step bound is relative to the largest dual move the direction asks for, max |g + delta|:
            # a gradient of 1e21 (counts where the base marginal is 1e-22) needs steps far below 1e-20
            # (mirror descent's eta; for RDA 1/beta on a fresh start, where the move is t/(t + beta) of it)
            reach = (g_n + self.delta_node[a]).abs().flatten(1).amax(-1)
            if g_e is not None and g_e[0].numel():          # a chain of length 1 has no edges
                assert self.delta_edge is not None          # kept with the edge gradients
                reach = torch.maximum(reach, (g_e + self.delta_edge[a]).abs().flatten(1).amax(-1))
            min_step = _MIN_STEP / reach.clamp_min(1.0)
        clean = torch.ones(a.numel(), dtype=torch.bool, device=self.device)
        pending = torch.arange(a.numel(), device=self.device)
        for attempt in range(self.max_backtracks + 1):
            trial = self._trial(a, pending, p_cur[pending], s1, cw, g_n, g_e)
            forced = self._force(trial, pending) if attempt == self.max_backtracks else None
            self._accept(trial)
            if forced is not None and forced.numel():
                clean[forced] = False              # so the step does not grow after it
                self.safeguarded[a[forced]] = True
                if self.method == "md":
                    assert min_step is not None
                    p_cur[forced] = torch.maximum(p_cur[forced] / 2, min_step[forced])
            failed = pending[~trial.ok]
            if failed.numel() == 0:
                break
            clean[failed] = False
            self.safeguarded[a[failed]] = True
            self._shrink(a, failed, trial, p_cur, s1, cw, g_n, g_e, min_step)
            pending = failed
        self._relax(a, p_cur, clean, min_step)
        if self.method == "accelerated":
            # fixed restarts (O'Donoghue & Candes 2015): with the entropy's strong convexity they turn the O(1/t^2)
            # of the objective into a linear rate, and the residual at nu, which fell as O(1/t), falls with it
            due = self.since[a] >= _RESTART_EVERY
            if due.any():
                self._restart(a[due])
        self.history.append(self.f.clone())
        active = self.active
        self.active = active[~self.converged[active] & ~self.stall[active] & ~self.at_floor[active]]
        return True

    def recheck(self) -> None:
        """After the last iteration: the residual of the examples that did not converge at the point they stop
        at (an iteration checks the point it starts from, not the one its step moves to), and whether that
        point meets the tolerance.  The accelerated method returns an average it never checks: left as is."""
        rows = (~self.converged).nonzero().flatten()
        if rows.numel() == 0 or self.method == "accelerated":
            return
        edge = _take(self.mu_edge, rows)
        g_n, g_e = self._gradient_rows(rows, self.mu_node[rows], edge)
        finite = _finite_rows(g_n, g_e)
        res = self._stationarity(rows, self.delta_node[rows], _take(self.delta_edge, rows), g_n, g_e,
                                 self.mu_node[rows], edge)
        rows, res = rows[finite], res[finite]
        self.residual[rows] = res
        self.converged[rows] = res <= self.tol

    def _candidate(self, a: Tensor, sub: Tensor, p: Tensor, s1: Tensor, cw: Tensor, g_n: Tensor,
                   g_e: Tensor | None) -> tuple[Tensor, Tensor | None, Tensor, Tensor | None]:
        """Dual offset and new gradient average for rows ``a[sub]`` with step parameters ``p``."""
        rows = a[sub]
        t, w = s1[sub], cw[sub]
        if self.method == "md":                                              # Algorithm 4
            eta = p
            dn = _clip_move(self.delta_node[rows], _lerp(self.delta_node[rows], -g_n[sub], eta / (1 + eta)),
                            self.mu_node[rows], self.trust_region)
            de = ge = None
            if g_e is not None:
                assert self.delta_edge is not None and self.mu_edge is not None     # kept with the edge gradients
                de = _clip_move(self.delta_edge[rows], _lerp(self.delta_edge[rows], -g_e[sub], eta / (1 + eta)),
                                self.mu_edge[rows], self.trust_region)
                ge = g_e[sub]
            return dn, de, g_n[sub], ge
        if self.method == "rda":                                             # Algorithm 1
            gn = _lerp(self.gbar_node[rows], g_n[sub], 1 / t)
            ge = None if g_e is None else _lerp(_take(self.gbar_edge, rows), g_e[sub], 1 / t)
            move = t / (t + p)                                               # 1 - beta_t / (t + beta_t)
        else:                                                                # Algorithm 5
            gn = _lerp(self.gbar_node[rows], g_n[sub], w)
            ge = None if g_e is None else _lerp(_take(self.gbar_edge, rows), g_e[sub], w)
            move = 1 / (1 + 4.0 * p / (t * (t + 1)))
        # the share of the way from the prox-centre to -gbar, not 1 minus the centre's share: that one rounds
        # to 1 for beta beyond 2^53 t and would leave a large beta with no step at all
        dn = _lerp(self.anchor_node[rows], -gn, move)
        de = None if ge is None else _lerp(_take(self.anchor_edge, rows), -ge, move)
        return dn, de, gn, ge

    def _trial(self, a: Tensor, pending: Tensor, p: Tensor, s1: Tensor, cw: Tensor, g_n: Tensor,
               g_e: Tensor | None) -> _Trial:
        """Candidate steps of the rows ``a[pending]``, their oracle points and objectives, and which pass."""
        rows = a[pending]
        dn, de, gn, ge = self._candidate(a, pending, p, s1, cw, g_n, g_e)
        # a step too large to represent is a failed step: stay put for the oracle call
        wild = ~_rows_all(torch.isfinite(dn))
        if de is not None:
            wild |= ~_rows_all(torch.isfinite(de))
        if wild.any():
            dn = torch.where(wild[:, None, None], self.delta_node[rows], dn)
            if de is not None:
                assert self.delta_edge is not None                  # kept with the edge offsets
                de = torch.where(wild.reshape(-1, *([1] * (de.dim() - 1))), self.delta_edge[rows], de)
        self.calls += int(rows.numel())
        pot = self.shift(self.theta.index(rows), dn, de)
        m = self.oracle.marginals(pot)
        log_z = _log_partition_of(m)
        if self.method == "accelerated":
            w = cw[pending]
            m_edge = m.edge if self.need_edges else None
            node, edge = _lerp(self.mu_node[rows], m.node, w), _lerp(_rows(self.mu_edge, rows), m_edge, w)
            # the oracle point's potentials: a close start for an entropy solved by iteration (the average
            # moves towards the latest point, and the points converge)
            lin = _objective_parts(self.oracle, self.theta.index(rows),
                                   self._point(node, edge, self.lengths[rows], near=pot))
            scale = lin.abs()
        else:
            node, edge = m.node, ((m.edge_total() if self.totals else m.edge) if self.need_edges else None)
            inner = _inner(dn, node) + (_inner(de, edge) if de is not None and edge is not None else 0.0)
            lin = -log_z + inner
            scale = log_z.abs() + inner.abs()
        val = self.energy.value(self._with_rows(rows, node, edge))[rows]
        fc = lin + val
        f_nu = None
        if self.method == "accelerated":       # the oracle point's own objective: restarts resume from the best
            f_nu = (-log_z + _inner(dn, m.node) + (_inner(de, m_edge) if de is not None and m_edge is not None else 0.0)
                    + self.energy.value(self._with_rows(rows, m.node, m_edge))[rows])
        f_prev = self.f[rows]
        fc = torch.where(wild, torch.full_like(fc, float("inf")), fc)
        floor = self.noise * (scale + val.abs() + f_prev.abs())       # rounding error of the objective
        ok = torch.isfinite(fc) & (fc <= f_prev + self.rise * f_prev.abs() + floor)
        if self.method == "md":
            # sufficient decrease, not only descent: a step too long for the energy's curvature can lower the
            # objective by almost nothing while it jumps across a valley, and the step doubling after each such
            # step made the method zigzag for hundreds of iterations (mirror descent on dependency trees).  Within
            # the energy's relative smoothness a composite Bregman step guarantees F(mu') <= F(mu) - (1 + 1/eta)
            # KL(mu || mu') (its three-point property); the test asks for the part that holds for every eta,
            # F(mu') <= F(mu) - KL(mu || mu') (1/eta would ask too much of the tiny steps barrier energies take).
            # Both points are oracle points, mu = oracle(theta + delta), so -H(mu) - <theta, mu> = <delta, mu>
            # - log Z(theta + delta), and the KL cancels: the test is exactly
            #     D = L(mu') - L(mu) + <delta', mu' - mu> <= 0,
            # which reads no log-partition, so its rounding error (that of the energy's values and of the marginals,
            # relative to the marginals, not to their change) is below the objective's (in float32 the objective's
            # rounding hid the progress of ill-conditioned problems 1e-2 above their optimum)
            mu_n = self.mu_node[rows]
            dmu, both = node - mu_n, node + mu_n              # the change, and the scale of its rounding
            d = val - self.val[rows] + _inner(dn, dmu)
            err = _inner(dn.abs(), both)
            if de is not None:
                assert edge is not None and self.mu_edge is not None        # kept with the edge offsets
                mu_e = self.mu_edge[rows]
                dmu_e, both_e = edge - mu_e, edge + mu_e
                d = d + _inner(de, dmu_e)
                err = err + _inner(de.abs(), both_e)
            err = self.noise * (err + val.abs() + self.val[rows].abs())
            band = ok & (d.abs() <= err)
            ok &= d <= err
            # where D is within its rounding error (the energy's values agree to their last digits), estimate it
            # by the trapezoid rule, L(mu') - L(mu) ~ <(g + g') / 2, mu' - mu> (exact for a quadratic energy,
            # third order in the step otherwise): D ~ <(g + g') / 2 + delta', mu' - mu>, where the slope is small
            # near a stationary point, so its rounding error is small too.  Where even that one is within two
            # rounding units of the marginals (a wrong call there moves the objective by rounding alone; one unit
            # let the NumPy cgm path and this one part ways), require the stationarity residual to fall, so that
            # rounding noise cannot drive an endless random walk
            if band.any():
                rb, nb, db, sb = rows[band], node[band], dn[band], pending[band]
                eb, deb = _take(edge, band), _take(de, band)
                gb_n, gb_e = self._gradient_rows(rb, nb, eb)
                slope = 0.5 * (g_n[sb] + gb_n) + db
                trap, trap_err = _inner(slope, dmu[band]), _inner(slope.abs(), both[band])
                if deb is not None:
                    assert g_e is not None and gb_e is not None         # edge gradients come with edge offsets
                    slope_e = 0.5 * (g_e[sb] + gb_e) + deb
                    trap = trap + _inner(slope_e, dmu_e[band])
                    trap_err = trap_err + _inner(slope_e.abs(), both_e[band])
                decided = torch.isfinite(trap) & (trap.abs() > 2 * torch.finfo(self.dtype).eps * trap_err)
                ok[band] = decided & (trap <= 0)
                undecided = band.clone()
                undecided[band] = ~decided
                if undecided.any():
                    u = ~decided
                    self._residual_falls(ok, undecided, rows, pending, node, edge, dn, de, g_n, g_e, gb_n[u],
                                         _take(gb_e, u))
        # no marginal may collapse to an exact zero (the barrier energies' failure), nor, with a trust
        # region, move by more than ``trust_region`` nats
        old = self.nu_node[rows] if self.method == "accelerated" else self.mu_node[rows]
        change = _log_change(old, m.node, None if self.rounding_only is None else self.rounding_only[rows])
        # a mass already below the smallest normal number may round to 0: its log could not be measured either
        collapsed = ((m.node == 0) & self.support[rows] & (old >= torch.finfo(old.dtype).tiny)).flatten(1).any(-1)
        ok &= (change <= (self.trust_region if self.trust_region is not None else float("inf"))) & ~collapsed
        return _Trial(rows, dn, de, gn, ge, m, node, edge, fc, f_nu, val, floor, change, collapsed, ok)

    def _residual_falls(self, ok: Tensor, where: Tensor, rows: Tensor, pending: Tensor, node: Tensor,
                        edge: Tensor | None, dn: Tensor, de: Tensor | None, g_n: Tensor, g_e: Tensor | None,
                        gb_n: Tensor, gb_e: Tensor | None) -> None:
        """Mirror descent's test where rounding hides the change of the objective: ``ok[where]`` set to whether
        the candidate's stationarity residual (with the gradients ``gb`` at the candidates ``where``) is below the
        iterate's (with ``g``)."""
        rb, nb, db = rows[where], node[where], dn[where]
        eb, deb = _take(edge, where), _take(de, where)
        res_b = self._stationarity(rb, db, deb, gb_n, gb_e, nb, eb)
        ok[where] = res_b < self.residual[rb]
        # a residual saturated at its maximum, 2 (a label the energy pulls hard holds almost no mass, before and
        # after a step the trust region keeps short): compare KL divergences, which do not saturate
        t = res_b == self.residual[rb]
        if t.any():
            rt, sub_t = rb[t], pending[where][t]
            new = self._stationarity(rt, db[t], _take(deb, t), gb_n[t], _take(gb_e, t), nb[t], _take(eb, t), kl=True)
            cur = self._stationarity(rt, self.delta_node[rt], _take(self.delta_edge, rt), g_n[sub_t],
                                     _take(g_e, sub_t), self.mu_node[rt], _take(self.mu_edge, rt), kl=True)
            tied = where.clone()
            tied[where] = t
            ok[tied] = new < cur

    def _force(self, trial: _Trial, pending: Tensor) -> Tensor:
        """Out of backtracks: take any finite step inside the trust region, but as a failed one (for a descent
        method, not one that raises the objective); returns the positions in ``pending`` taken that way."""
        passed = trial.ok
        ok = torch.isfinite(trial.f) & torch.isfinite(trial.change) & ~trial.collapsed
        if self.trust_region is not None:
            ok &= trial.change <= self.trust_region
        if self.method == "md":
            ok &= trial.f <= self.f[trial.rows] + trial.floor
        trial.ok = ok
        return pending[ok & ~passed]

    def _accept(self, trial: _Trial) -> None:
        """Move the rows whose candidate passed to it."""
        ok = trial.ok
        if not ok.any():
            return
        r = trial.rows[ok]
        m = trial.oracle
        self.f[r], self.delta_node[r], self.mu_node[r] = trial.f[ok], trial.dn[ok], trial.node[ok]
        self.val[r] = trial.val[ok]
        if self.need_edges:
            assert self.mu_edge is not None and trial.edge is not None
            if self.method == "accelerated" and _whole_batch(r, len(self.mu_edge)):
                self.mu_edge = trial.edge               # its averages are the state's own new tensors: no copy
            else:
                self.mu_edge[r] = trial.edge if len(r) == len(ok) else trial.edge[ok]
        if self.edge_offsets:
            assert self.delta_edge is not None and trial.de is not None
            self.delta_edge[r] = trial.de[ok]
        if self.method != "md":
            self.since[r] += 1
            self.gbar_node[r] = trial.gn[ok]
            if self.edge_offsets:
                assert self.gbar_edge is not None and trial.ge is not None
                self.gbar_edge[r] = trial.ge[ok]
        log_z = _log_partition_of(m)
        self.log_z[r] = log_z[ok]                   # log Z at the last accepted oracle point
        if self.method == "accelerated":
            assert trial.f_nu is not None
            self.nu_node[r] = m.node[ok]
            self.nu_f[r] = trial.f_nu[ok]
            better = ok.clone()
            better[ok] = trial.f_nu[ok] < self.best_f[r]
            if better.any():
                rb = trial.rows[better]
                self.best_f[rb], self.best_node[rb] = trial.f_nu[better], m.node[better]
                self.best_dn[rb] = trial.dn[better]
                if self.edge_offsets:
                    assert self.best_edge is not None and self.best_de is not None and trial.de is not None
                    self.best_edge[rb], self.best_de[rb] = m.edge[better], trial.de[better]
                self.best_logz[rb] = log_z[better]
            if self.edge_offsets:
                assert self.nu_edge is not None
                self.nu_edge[r] = m.edge[ok]
        self.iterations[r] += 1

    def _shrink(self, a: Tensor, failed: Tensor, trial: _Trial, p_cur: Tensor, s1: Tensor, cw: Tensor,
                g_n: Tensor, g_e: Tensor | None, min_step: Tensor | None) -> None:
        """Step-size control for the rows ``a[failed]``: shrink the step; RDA and the accelerated method restart
        from the current point, which becomes the prox-centre, so that a large beta/L means a small step from
        here.  Updates ``p_cur``, ``s1``, ``cw`` and the gradients in place."""
        rows = a[failed]
        if self.method == "md":
            assert min_step is not None
            p_cur[failed] = torch.maximum(p_cur[failed] / 2, min_step[failed])
        elif self.method == "accelerated":
            # backtracking on L (a larger L keeps nu closer to the prox-centre); a step that leaves the
            # trust region or loses support instead restarts the method at nu, the last oracle point
            change = trial.change[~trial.ok]
            wild_step = ~(torch.isfinite(change) & (change <= (self.trust_region or float("inf"))))
            p_cur[failed] = torch.clamp(p_cur[failed] * 2, min=1.0, max=1 / _MIN_STEP)
            restart = failed[wild_step & (s1[failed] > 1)]
            if restart.numel():
                # resume from the best oracle point seen (mu averages them and has no dual iterate)
                rr = a[restart]
                self._restart(rr)
                s1[restart], cw[restart] = 1.0, 1.0
                g_n[restart], ge = self._gradient_rows(rr, self.best_node[rr], _rows(self.best_edge, rr))
                if g_e is not None and ge is not None:
                    g_e[restart] = ge
        else:
            # RDA restarts from the current point, which becomes the prox-centre (so a large beta means
            # a small step from here); beta grows only if a fresh start fails too
            fresh = s1[failed] == 1
            # beta's cap is relative, like mirror descent's step floor: 1e20 max |g + delta|
            assert min_step is not None
            cap = 1 / min_step[failed]
            p_cur[failed] = torch.where(fresh, torch.minimum(torch.clamp(p_cur[failed] * 2, min=1.0), cap),
                                        p_cur[failed])
            self.anchor_node[rows] = self.delta_node[rows]
            self.gbar_node[rows] = 0.0
            if self.edge_offsets:
                assert self.anchor_edge is not None and self.delta_edge is not None and self.gbar_edge is not None
                self.anchor_edge[rows] = self.delta_edge[rows]
                self.gbar_edge[rows] = 0.0
            self.since[rows] = 0
            s1[failed], cw[failed] = 1.0, 1.0

    def _restart(self, rr: Tensor) -> None:
        """The accelerated method starts again at the best oracle point of the examples ``rr``: it becomes the
        prox-centre, the gradient average and the step count are reset (``L`` is kept)."""
        self.delta_node[rr] = self.anchor_node[rr] = self.best_dn[rr]
        self.log_z[rr] = self.best_logz[rr]
        self.gbar_node[rr] = 0.0
        self.since[rr] = 0
        self.nu_node[rr] = self.mu_node[rr] = self.best_node[rr]
        if self.edge_offsets:
            assert (self.delta_edge is not None and self.anchor_edge is not None and self.best_de is not None
                    and self.gbar_edge is not None and self.nu_edge is not None and self.mu_edge is not None
                    and self.best_edge is not None)
            self.delta_edge[rr] = self.anchor_edge[rr] = self.best_de[rr]
            self.gbar_edge[rr] = 0.0
            self.nu_edge[rr] = self.mu_edge[rr] = self.best_edge[rr]
        elif self.mu_edge is not None:              # need_edges
            self.mu_edge[rr] = self._oracle_edges(rr, self.best_dn[rr])
        self.f[rr] = self.nu_f[rr] = self.best_f[rr]

    def _relax(self, a: Tensor, p_cur: Tensor, clean: Tensor, min_step: Tensor | None) -> None:
        """After a step that needed no shrinking, relax the control towards the user's setting; mark the
        examples whose step fell to the floor (mirror descent) or whose L grew too large (accelerated)."""
        if self.method == "md":
            eta = self.user_param
            cap = max(eta, _MAX_STEP) if self.max_backtracks else eta
            p_cur = torch.where(clean, torch.clamp(p_cur * 2, max=cap), p_cur)
        elif self.method == "rda":
            p_cur = torch.where(clean, p_cur / _RELAX_BETA, p_cur)
            p_cur = torch.where(p_cur < max(self.user_param, 1.0), torch.full_like(p_cur, self.user_param), p_cur)
        # the accelerated method's L never goes back down within a solve: halving it after every clean step made
        # the next step fail and double it again, and on 60 x 8 random chains (benchmarks/solver_float32.py) cost
        # 51,467 / 60,376 oracle calls (float32 / float64) against 39,255 / 48,147
        self.param[a] = p_cur
        if self.method == "md":
            # steps shrunk to nothing: the example sits at the floor that rounding allows and stops
            # (``converged`` stays False unless tol was met)
            assert min_step is not None
            self.at_floor[a] |= p_cur <= 1e4 * min_step
        if self.method == "accelerated":
            self.stall[a] |= p_cur > _STALL_L * max(self.user_param, 1.0)
