"""The loss family ``L_{beta,gamma}`` of Martins et al. (EMNLP 2010, "Turbo Parsers", section 5, Figure 4, eq. 22)
over any oracle (linear chains, trees, dependency trees)::

    L_{beta,gamma}(theta; x, y) = 1/beta log sum_{y'} exp(beta (s(y') - s(y) + gamma cost(y', y)))

with ``s(y) = <theta, S(y)>`` the score of a structure.  Particular cases (the named presets):

=================  ========  =====  ==========================================
preset             beta      gamma  loss
=================  ========  =====  ==========================================
``crf``            1         0      negative log-likelihood ``log Z - s(y)``
``softmax_margin`` 1         1      softmax-margin (Gimpel and Smith, 2010)
``svm``            inf       1      structured hinge ``max_y' s(y') + cost - s(y)``
``perceptron``     inf       0      perceptron loss ``max_y' s(y') - s(y)``
=================  ========  =====  ==========================================

The cost must decompose over the parts: ``cost(y', y) = <p, S(y')> + q`` (footnote 11).  For the Hamming cost
(the number of positions whose label differs) this holds on the node parts with ``p = 1 - onehot(y)`` and
``q = 0`` (the paper's ``p = 1 - 2 mu, q = 1^T mu`` counts every error twice, once per indicator).  Then
(eq. 24 and Prop. 1 of the paper) the loss is a log-partition of the *cost-augmented* potentials::

    L_{beta,gamma} = 1/beta log Z(beta (theta + gamma p)) + gamma q - s(y),
    grad_theta L   = mu_{beta (theta + gamma p)} - S(y),

and for ``beta = inf`` the log-partition becomes cost-augmented MAP: ``L = max_y' (s(y') + gamma cost) - s(y)``
with the subgradient ``S(y_hat) - S(y)``.  For ``beta > 0, gamma >= 0`` the loss is convex in ``theta`` and
nonnegative (``y' = y`` contributes ``exp(0)``); it decreases in ``beta`` towards ``L_{inf,gamma}`` with
``L_{inf,gamma} <= L_{beta,gamma} <= L_{inf,gamma} + log|Y| / beta``, and it increases with ``gamma``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from .._checks import check_bool, check_nonnegative, check_real
from ..oracles.base import (
    Oracle,
    PairwisePotentials,
    _log_partition_of,
    _unchecked,
    check_potentials,
    has_pairwise_factors,
    log_partition,
    tree_parents,
)
from .crf import (
    _check_gold,
    _check_gold_score,
    _check_labels,
    _check_potentials,
    _edge_indicators,
    _node_indicators,
    sequence_score,
)

__all__ = ["LOSSES", "LossGradient", "resolve_loss", "hamming_cost", "cost_augmented", "structured_loss",
           "loss_and_gradient"]

LOSSES: dict[str, tuple[float, float]] = {
    "crf": (1.0, 0.0),
    "softmax_margin": (1.0, 1.0),
    "svm": (math.inf, 1.0),
    "perceptron": (math.inf, 0.0),
}
"""The named members of the family (Figure 4): name -> (beta, gamma)."""

CostFn = Callable[[PairwisePotentials, Tensor], tuple[Tensor, Tensor | None, Tensor | None]]
"""``cost(potentials, gold) -> (p_node [B, N, C], p_edge (like potentials.edge) or None, q [B] or None)``."""


def resolve_loss(loss: str | None = None, beta: float | None = None,
                 gamma: float | None = None) -> tuple[float, float]:
    """``(beta, gamma)`` from a preset name (``crf``, ``svm``, ``softmax_margin``, ``perceptron``) and/or explicit
    values (which override the preset's).  ``beta`` must be ``> 0`` (``math.inf`` allowed), ``gamma >= 0`` finite."""
    if loss is not None:
        if not isinstance(loss, str) or loss not in LOSSES:
            raise ValueError(f"loss must be one of {', '.join(LOSSES)}, got {loss!r}")
        b0, g0 = LOSSES[loss]
        beta = b0 if beta is None else beta
        gamma = g0 if gamma is None else gamma
    if beta is None or gamma is None:
        raise ValueError("give a loss name or both beta and gamma")
    # beta = math.inf is the max-margin / perceptron limit
    return check_real("beta", beta, 0.0, low_open=True, finite=False), check_nonnegative("gamma", gamma)


def hamming_cost(potentials: PairwisePotentials, gold: Tensor) -> tuple[Tensor, None, None]:
    """Hamming cost as ``p = 1 - onehot(gold)`` on the node parts (zero at padding), no edge part, ``q = 0``."""
    check_potentials(potentials)
    y = _check_labels(potentials, gold)
    b, n, c = potentials.node.shape
    valid = torch.arange(n, device=y.device) < potentials.lengths[:, None]
    p = valid[..., None].to(potentials.node.dtype).expand(b, n, c).clone()
    p.scatter_(2, y[..., None], 0.0)
    return p, None, None


_COSTS: dict[str, CostFn] = {"hamming": hamming_cost}


def _cost_fn(cost: str | CostFn) -> CostFn:
    if callable(cost):
        return cost
    if cost not in _COSTS:
        raise ValueError(f"cost must be one of {', '.join(_COSTS)} or a callable, got {cost!r}")
    return _COSTS[cost]


def _check_cost_parts(potentials: PairwisePotentials, p_node: object, p_edge: object, q: object) -> None:
    """A cost's ``(p_node, p_edge, q)``: finite tensors of the potentials' dtype, ``p_node`` shaped like the node
    potentials, ``p_edge`` like the edge potentials or per example [B, N-1, C, C], ``q`` [B]; ``p_edge`` and ``q``
    may be ``None``."""
    b, n, c = potentials.node.shape
    shapes = {"p_node": [potentials.node.shape], "p_edge": [potentials.edge.shape, torch.Size((b, n - 1, c, c))],
              "q": [torch.Size((b,))]}
    for name, part in (("p_node", p_node), ("p_edge", p_edge), ("q", q)):
        if part is None and name != "p_node":
            continue
        if not isinstance(part, Tensor):
            raise TypeError(f"cost returned {name} of type {type(part).__name__}, expected a tensor")
        if part.dtype != potentials.node.dtype:
            raise TypeError(f"cost returned {name} of dtype {part.dtype} for {potentials.node.dtype} potentials")
        if part.shape not in shapes[name]:
            raise ValueError(f"cost returned {name} of shape {tuple(part.shape)}, expected "
                             f"{' or '.join(str(tuple(t)) for t in dict.fromkeys(shapes[name]))}")
        if not bool(torch.isfinite(part.detach()).all()):
            raise ValueError(f"cost returned {name} with NaN or infinite entries")


def cost_augmented(potentials: PairwisePotentials, gold: Tensor, gamma: float, beta: float = 1.0,
                   cost: str | CostFn = "hamming") -> tuple[PairwisePotentials, Tensor | None]:
    """``beta (theta + gamma p)`` (``beta = inf``: ``theta + gamma p``) and ``gamma q`` [B] (or ``None``)."""
    check_potentials(potentials)
    beta, gamma = check_real("beta", beta, 0.0, low_open=True, finite=False), check_nonnegative("gamma", gamma)
    scale = 1.0 if math.isinf(beta) else beta
    cost_fn = _cost_fn(cost)                         # checked even where gamma = 0 makes it unused
    if gamma == 0:
        pot = potentials
        q = None
    else:
        parts = cost_fn(potentials, gold)
        if not isinstance(parts, tuple | list) or len(parts) != 3:
            raise TypeError(f"cost must return the triple (p_node, p_edge, q), got {type(parts).__name__}"
                            + (f" of length {len(parts)}" if isinstance(parts, tuple | list) else ""))
        p_node, p_edge, q = parts
        _check_cost_parts(potentials, p_node, p_edge, q)
        pot = potentials.shifted(gamma * p_node, None if p_edge is None else gamma * p_edge)
        q = None if q is None else gamma * q
    if scale != 1.0:
        pot = _unchecked(PairwisePotentials, pot.node * scale, pot.edge * scale, pot.lengths)
    return pot, q


def structured_loss(oracle: Oracle, potentials: PairwisePotentials, gold: Tensor, beta: float | None = None,
                    gamma: float | None = None, cost: str | CostFn = "hamming", loss: str | None = None) -> Tensor:
    """``L_{beta,gamma}`` [B] of Figure 4 (eq. 22), differentiable in the potentials: autograd gives
    ``mu_{beta(theta + gamma p)} - S(y)`` (eq. 24 / Prop. 1; for ``beta = inf`` the subgradient
    ``S(y_hat) - S(y)`` at the cost-augmented MAP ``y_hat``).

    ``loss`` names a preset (``crf``, ``svm``, ``softmax_margin``, ``perceptron``); explicit ``beta``/``gamma``
    override it.  ``gold`` [B, N] holds labels (for dependency oracles: heads, which must form one of the oracle's
    trees), ignored past ``lengths``; a gold labelling on a forbidden part (a ``-inf`` potential) is a ValueError,
    not an infinite loss.
    """
    if loss is None and beta is None and gamma is None:
        raise ValueError("give a loss name (crf, svm, softmax_margin, perceptron) or beta and gamma")
    beta, gamma = resolve_loss(loss, beta, gamma)
    _check_potentials(potentials)
    parents = tree_parents(oracle, potentials.node.shape[1])
    pairwise = has_pairwise_factors(oracle)
    gold_score = sequence_score(potentials, gold, parents, pairwise_factors=pairwise)
    _check_gold(oracle, potentials.lengths, gold, "gold")
    _check_gold_score(gold_score.detach())
    aug, q = cost_augmented(potentials, gold, gamma, beta, cost)
    if math.isinf(beta):
        y_hat = oracle.map(aug)
        value = sequence_score(aug, y_hat, parents, pairwise_factors=pairwise)
    else:
        value = log_partition(oracle, aug) / beta
    value = value - gold_score
    value = value if q is None else value + q
    _check_finite_loss(value.detach(), beta)
    return value


def _check_finite_loss(value: Tensor, beta: float) -> None:
    """A loss past the dtype's range (a tiny ``beta`` divides the log-partition): refuse it, as the oracles refuse
    potentials whose log-partition overflows, rather than train on ``inf``."""
    if not bool(torch.isfinite(value).all()):
        raise ValueError(f"the loss overflows {value.dtype} for examples "
                         f"{(~torch.isfinite(value)).nonzero().flatten().tolist()[:10]}: beta = {beta!r} divides "
                         f"the log-partition; use a larger beta, or float64 potentials")


@dataclass
class LossGradient:
    """Loss [B] and its (sub)gradient w.r.t. the potentials, without autograd.

    ``node`` [B, N, C] is per example (``mu - onehot(y)``, zero at padding); ``edge`` is per example
    [B, N-1, C, C] for per-example edge potentials and summed over the batch [C, C] for a shared edge table
    (the gradient of the summed loss), or ``None`` when not asked for.  ``prediction`` [B, N] is the
    cost-augmented MAP for ``beta = inf`` (``None`` otherwise)."""

    loss: Tensor
    node: Tensor
    edge: Tensor | None
    prediction: Tensor | None = None


def loss_and_gradient(oracle: Oracle, potentials: PairwisePotentials, gold: Tensor, beta: float | None = None,
                      gamma: float | None = None, cost: str | CostFn = "hamming", loss: str | None = None,
                      edge: bool = True) -> LossGradient:
    """``L_{beta,gamma}`` [B] and its (sub)gradient ``mu_hat - S(y)`` (Algorithm 1, lines 5-6) computed from one
    oracle call (marginals for finite ``beta``, MAP for ``beta = inf``), without building an autograd graph.
    ``edge=False`` skips the edge gradient (for models whose edge potentials are constant); for an oracle without
    pairwise factors (:func:`~betheproj.oracles.base.has_pairwise_factors`: the dependency oracles) it is zero,
    since both its marginals' edges and ``S(y)``'s are."""
    if loss is None and beta is None and gamma is None:
        raise ValueError("give a loss name (crf, svm, softmax_margin, perceptron) or beta and gamma")
    beta, gamma = resolve_loss(loss, beta, gamma)
    edge = check_bool("edge", edge)
    _check_potentials(potentials)
    y = _check_labels(potentials, gold)
    parents = tree_parents(oracle, potentials.node.shape[1])
    pairwise = has_pairwise_factors(oracle)
    with torch.no_grad():
        aug, q = cost_augmented(potentials, gold, gamma, beta, cost)
        gold_score = sequence_score(potentials, y, parents, pairwise_factors=pairwise)
        _check_gold(oracle, potentials.lengths, gold, "gold")
        _check_gold_score(gold_score)
        prediction = None
        if math.isinf(beta):
            prediction = oracle.map(aug)
            value = sequence_score(aug, prediction, parents, pairwise_factors=pairwise) - gold_score
            g_node = _node_indicators(potentials, prediction) - _node_indicators(potentials, y)
            shared = potentials.shared_edge
            g_edge = (_edge_indicators(potentials, prediction, parents, shared, pairwise)
                      - _edge_indicators(potentials, y, parents, shared, pairwise) if edge else None)
        else:
            mu = oracle.marginals(aug)
            value = _log_partition_of(mu) / beta - gold_score
            g_node = mu.node - _node_indicators(potentials, y)
            g_edge = None
            if edge:
                if potentials.shared_edge:
                    ones = torch.ones_like(value)
                    mu_edge = mu.edge_sum(ones) if mu.edge_sum is not None else mu.edge.sum((0, 1))
                else:
                    mu_edge = mu.edge
                g_edge = mu_edge - _edge_indicators(potentials, y, parents, potentials.shared_edge, pairwise)
        if q is not None:
            value = value + q
    _check_finite_loss(value, beta)
    return LossGradient(value, g_node, g_edge, prediction)
