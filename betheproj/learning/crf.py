"""Training the base CRF: maximum likelihood (``log Z(theta(x)) - <theta(x), S(y)>``) or softmax-margin."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, cast

import torch
from torch import Tensor, nn

from .._checks import check_bool, check_count, check_integer_vector, check_nonnegative, check_real
from ..inference.solve import check_oracle
from ..oracles import LinearChain
from ..oracles.base import (
    Marginals,
    Oracle,
    PairwisePotentials,
    _check_lengths,
    edge_row_ends,
    has_pairwise_factors,
    keeps_width,
    log_partition,
    tree_parents,
)
from ..oracles.tree import check_parents
from ..progress import progress_bar
from ._checks import check_sequences

if TYPE_CHECKING:
    from ..energies.base import Energy

__all__ = ["LinearChainCRF", "SparseChainCRF", "sequence_score", "sufficient_statistics", "crf_nll", "fit_crf",
           "length_chunks"]


def _check_labels(potentials: PairwisePotentials, labels: Tensor) -> Tensor:
    b, n, c = potentials.node.shape
    return _check_label_range(labels, (b, n), c, potentials.lengths)


def _check_label_range(labels: object, shape: tuple[int, int], c: int, lengths: Tensor,
                       name: str = "labels") -> Tensor:
    """Integer ``labels`` of ``shape`` [B, N] in ``[0, c)`` before ``lengths``, clamped there (for gathers);
    ``name`` is the argument the errors name."""
    if not isinstance(labels, Tensor) or labels.is_floating_point() or labels.is_complex() \
            or labels.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer tensor [B, N], got "
                        f"{labels.dtype if isinstance(labels, Tensor) else type(labels).__name__}")
    b, n = shape
    if labels.shape != (b, n):
        raise ValueError(f"{name} must have shape [B, N]=({b}, {n}), got {tuple(labels.shape)}")
    valid = torch.arange(n, device=labels.device) < lengths[:, None]
    bad = (valid & ((labels < 0) | (labels >= c))).any(1).nonzero().flatten().tolist()
    if bad:
        raise ValueError(f"{name} must lie in [0, {c}) at every position before the lengths (C={c} labels), "
                         f"got others in examples {bad[:10]}")
    return labels.long().clamp(0, c - 1)


def _check_potentials(potentials: object) -> None:
    if not isinstance(potentials, PairwisePotentials):
        raise TypeError(f"potentials must be PairwisePotentials, got {type(potentials).__name__}")


def _check_parents(parents: Sequence[int] | Tensor | None, n: int) -> Tensor | None:
    """``parents`` as a long tensor (a valid parent array of ``n`` nodes), or ``None`` for a chain."""
    if parents is None:
        return None
    parents = check_parents(parents)
    if len(parents) != n:
        raise ValueError(f"parents must have N={n} entries, got {len(parents)}")
    return parents


def sequence_score(potentials: PairwisePotentials, labels: Tensor, parents: Sequence[int] | Tensor | None = None,
                   *, pairwise_factors: bool = True) -> Tensor:
    """``<theta, S(y)>`` [B]: node scores of the labels plus the edge scores of the label pairs each edge couples:
    consecutive positions on a chain (``parents=None``), ``(parents[k+1], k+1)`` for edge ``k`` on a tree (see
    :func:`~betheproj.oracles.base.tree_parents`).  ``pairwise_factors=False`` (a structure without them, see
    :func:`~betheproj.oracles.base.has_pairwise_factors`) leaves the edge scores out: the score does not depend
    on them (its gradient there is zero)."""
    _check_potentials(potentials)
    y = _check_labels(potentials, labels)
    pairwise_factors = check_bool("pairwise_factors", pairwise_factors)
    b, n, _ = potentials.node.shape
    parents = _check_parents(parents, n)
    pos = torch.arange(n, device=y.device)
    valid = pos < potentials.lengths[:, None]
    node = potentials.node.gather(2, y[..., None]).squeeze(-1)
    score = torch.where(valid, node, torch.zeros((), dtype=node.dtype)).sum(-1)
    if n > 1:
        rows = edge_row_ends(y, parents)
        if potentials.shared_edge:        # index the [C, C] matrix itself: its gradient stays [C, C]
            pair = potentials.edge[rows, y[:, 1:]]
        else:
            pair = potentials.edge[torch.arange(b, device=y.device)[:, None], pos[None, : n - 1], rows, y[:, 1:]]
        # edge k is valid when its child k+1 is (parents precede children, so its parent is too), and counts
        # only where the structure has pairwise factors (masked, not skipped: the edge stays in the graph)
        counts = valid[:, 1:] & pairwise_factors
        score = score + torch.where(counts, pair, torch.zeros((), dtype=pair.dtype)).sum(-1)
    return score


def _node_indicators(potentials: PairwisePotentials, y: Tensor) -> Tensor:
    """``S(y)`` on the node parts: one-hot labels [B, N, C], zero past each length."""
    b, n, c = potentials.node.shape
    valid = torch.arange(n, device=y.device) < potentials.lengths[:, None]
    out = torch.zeros_like(potentials.node)
    out.scatter_(2, y.clamp_min(0)[..., None], valid[..., None].to(out.dtype))
    return out


def _edge_indicators(potentials: PairwisePotentials, y: Tensor, parents: Tensor | None,
                     total: bool = False, pairwise_factors: bool = True) -> Tensor:
    """``S(y)`` on the edge parts: [B, N-1, C, C] indicators of the label pair each edge couples, zero past each
    length, and everywhere for a structure without pairwise factors (``total``: their sum over the batch,
    [C, C])."""
    b, n, c = potentials.node.shape
    y = y.clamp_min(0)
    valid = (torch.arange(n - 1, device=y.device) < (potentials.lengths[:, None] - 1)) & pairwise_factors
    valid = valid.to(potentials.node.dtype)
    flat = edge_row_ends(y, parents) * c + y[:, 1:]                        # [B, N-1]
    if total:
        out = potentials.node.new_zeros(c * c)
        out.index_add_(0, flat.reshape(-1), valid.reshape(-1))
        return out.reshape(c, c)
    out = potentials.node.new_zeros(b, max(n - 1, 0), c * c)
    out.scatter_(2, flat[..., None], valid[..., None])
    return out.reshape(b, max(n - 1, 0), c, c)


def sufficient_statistics(potentials: PairwisePotentials, labels: Tensor,
                          parents: Sequence[int] | Tensor | None = None, *, pairwise_factors: bool = True
                          ) -> Marginals:
    """``S(y)``, a labelling's sufficient statistics, as (integral) marginals: one-hot node [B, N, C] and edge
    [B, N-1, C, C] indicators (edge ``k`` pairs the labels of nodes ``parents[k+1]`` and ``k+1``; consecutive
    positions when ``parents`` is None), zero past each length, no ``log_partition``.  An energy evaluated on
    them is ``L(S(y))``, the energy of the labelling itself.

    Pass the oracle's structure: ``parents=tree_parents(oracle, N)`` and
    ``pairwise_factors=has_pairwise_factors(oracle)``; the latter is ``False`` for the dependency oracles, whose
    marginals' edges are all-zero placeholders (there are no pairwise factors), and then the edge indicators are
    all zero too, so that an energy reading edge marginals sees the same statistics on ``S(y)`` as on ``mu``."""
    _check_potentials(potentials)
    y = _check_labels(potentials, labels)
    parents = _check_parents(parents, potentials.node.shape[1])
    pairwise_factors = check_bool("pairwise_factors", pairwise_factors)
    return Marginals(_node_indicators(potentials, y),
                     lambda: _edge_indicators(potentials, y, parents, pairwise_factors=pairwise_factors), None,
                     potentials.lengths)


def _check_gold(oracle: Oracle, lengths: Tensor, labels: Tensor, name: str) -> None:
    """Gold labels that are no configuration of ``oracle`` (dependency heads that are not a tree): refuse them."""
    check = getattr(oracle, "check_labels", None)
    if check is not None:
        check(labels, lengths, name)


def _check_gold_score(gold_score: Tensor) -> None:
    """A gold labelling on a forbidden part (a ``-inf`` potential) has an infinite loss: refuse it."""
    bad = torch.isneginf(gold_score).nonzero().flatten().tolist()
    if bad:
        raise ValueError(f"gold labels lie on forbidden parts (-inf potentials) for examples {bad[:10]}: "
                         f"the loss would be infinite")


def _check_gold_batch(potentials_of: Callable[[Tensor, int], PairwisePotentials], oracle: Oracle, labels: Tensor,
                      lengths: Tensor, chunk_size: int | None, full_width: bool | None = None) -> None:
    """Before training on a batch: every gold labelling in range, a configuration of ``oracle`` and on no forbidden
    part, the examples named by their index in the whole batch (the loss of a length-sorted chunk or a minibatch
    names its own rows).  ``potentials_of(idx, width)`` gives the potentials of the examples ``idx`` trimmed to
    ``width`` (the full width where ``full_width``, by default where :func:`keeps_width`); they are taken without
    autograd, ``chunk_size`` examples at a time."""
    full_width = keeps_width(oracle, labels.shape[1]) if full_width is None else full_width
    width = labels.shape[1] if full_width else None
    parents, pairwise = tree_parents(oracle, labels.shape[1]), has_pairwise_factors(oracle)
    scores = torch.zeros(len(lengths), dtype=torch.float64, device=lengths.device)
    with torch.no_grad():
        for idx, n in length_chunks(lengths, chunk_size):
            n = width or n
            score = sequence_score(potentials_of(idx, n), labels[idx, :n], parents, pairwise_factors=pairwise)
            scores[idx] = score.to(scores)
    _check_gold(oracle, lengths, labels, "labels")
    _check_gold_score(scores)


def crf_nll(oracle: Oracle, potentials: PairwisePotentials, labels: Tensor) -> Tensor:
    """Negative log-likelihood [B], differentiable in the potentials (its gradient is ``mu - S(y)``). Labels on a
    forbidden part (a ``-inf`` potential) are a ``ValueError``, as in :func:`~.losses.structured_loss`.  ``log Z``
    is the oracle's ``log_partition`` where it has one, else its marginals' (the :class:`Oracle` protocol needs
    no ``log_partition``)."""
    _check_potentials(potentials)
    score = sequence_score(potentials, labels, tree_parents(oracle, potentials.node.shape[1]),
                           pairwise_factors=has_pairwise_factors(oracle))
    _check_gold(oracle, potentials.lengths, labels, "labels")
    _check_gold_score(score.detach())
    own = getattr(oracle, "log_partition", None)
    return (own(potentials) if callable(own) else log_partition(oracle, potentials)) - score


class LinearChainCRF(nn.Module):
    """``theta(x)``: node scores linear in per-position features (with a bias), one shared transition matrix."""

    def __init__(self, num_features: int, num_labels: int):
        super().__init__()
        num_features, num_labels = check_count("num_features", num_features), check_count("num_labels", num_labels)
        self.node = nn.Linear(num_features, num_labels)
        self.transitions = nn.Parameter(torch.zeros(num_labels, num_labels))
        nn.init.zeros_(self.node.weight)
        nn.init.zeros_(self.node.bias)

    def forward(self, features: Tensor, lengths: Tensor | None = None) -> PairwisePotentials:
        """Potentials for features [B, N, F]."""
        if not isinstance(features, Tensor):
            raise TypeError(f"features must be a tensor [B, N, F], got {type(features).__name__}")
        if features.dim() != 3 or features.shape[-1] != self.node.in_features:
            raise ValueError(f"features must be [B, N, {self.node.in_features}], got {tuple(features.shape)}")
        x = features.to(self.node.weight.dtype)
        b, n, _ = x.shape
        lengths = _check_lengths(lengths, b, n, x.device)             # None: every position valid
        valid = torch.arange(n, device=x.device) < lengths[:, None]
        # padding may hold anything: zeroed before the layer, since NaN * 0 in its weight gradient is NaN
        node = self.node(torch.where(valid[..., None], x, torch.zeros((), dtype=x.dtype, device=x.device)))
        if not bool(torch.isfinite(node[valid]).all()):
            raise ValueError("features give NaN or infinite node scores at valid positions")
        node = torch.where(valid[..., None], node, torch.zeros((), dtype=node.dtype, device=node.device))
        return PairwisePotentials(node, self.transitions, lengths)


class SparseChainCRF(nn.Module):
    """``theta(x)`` for sparse features: each position's node scores are the sum of the weight rows of its
    feature indices (``EmbeddingBag``, index 0 = padding) plus a bias; one shared transition matrix."""

    def __init__(self, num_features: int, num_labels: int):
        super().__init__()
        check_count("num_features", num_features)
        check_count("num_labels", num_labels)
        self.weights = nn.EmbeddingBag(num_features, num_labels, mode="sum", padding_idx=0)
        nn.init.zeros_(self.weights.weight)
        self.bias = nn.Parameter(torch.zeros(num_labels))
        self.transitions = nn.Parameter(torch.zeros(num_labels, num_labels))

    def forward(self, features: Tensor, lengths: Tensor) -> PairwisePotentials:
        """Potentials for feature indices [B, N, K] (long)."""
        if not isinstance(features, Tensor):
            raise TypeError(f"features must be a tensor of long indices [B, N, K], got {type(features).__name__}")
        if features.dim() != 3 or features.dtype != torch.long:
            raise ValueError(f"features must be long indices [B, N, K], got {features.dtype} {tuple(features.shape)}")
        size = self.weights.num_embeddings
        if features.numel() and (int(features.min()) < 0 or int(features.max()) >= size):
            raise ValueError(f"features must be indices in [0, {size}) (0: padding), got values in "
                             f"[{int(features.min())}, {int(features.max())}]")
        b, n, k = features.shape
        if k == 0:                          # no feature at any position: the bias alone (EmbeddingBag needs k > 0)
            node = self.bias.expand(b, n, -1)
        else:                               # the label count, not -1: an empty batch has no size to infer it from
            node = self.weights(features.reshape(b * n, k)).reshape(b, n, self.bias.shape[0]) + self.bias
        return PairwisePotentials(node, self.transitions, lengths)


def _squared_norm(params: Sequence[Tensor]) -> Tensor:
    """``||params||^2`` over their finite entries: a ``-inf`` entry (a forbidden transition) has no penalty and a
    zero gradient, so it stays ``-inf``, rather than making the L2 penalty infinite (``NaN`` at ``l2 = 0``) and the
    parameters ``NaN`` after one step.  ``params`` must not be empty (``sum`` would give the int 0)."""
    return cast(Tensor, sum((q * q).sum() for q in (torch.where(torch.isfinite(p), p, 0.0) for p in params)))


def _needs_full_width(oracle: Oracle, potentials_of: Callable[[Tensor, Tensor], PairwisePotentials], features: Tensor,
                     lengths: Tensor, energy_of: Callable[[Tensor, Tensor], Energy | None] | None = None) -> bool:
    """Whether training must keep every chunk or minibatch at the full width ``N`` rather than trim it to its
    longest member: the oracle's structure needs it (:func:`~betheproj.oracles.base.keeps_width`), or the model does
    (``potentials_of(features, lengths)``, or the energy ``energy_of(features, lengths)``, reads ``N`` positions,
    e.g. a linear layer over the flattened positions or per-position measurement vectors), probed once on the
    shortest example trimmed to its length: a model that refuses it would stop training at the first chunk without
    a full-length example."""
    n = features.shape[1]
    if keeps_width(oracle, n):
        return True
    i = int(torch.argmin(lengths))
    short = int(lengths[i])
    if short == n:
        return False
    x, m = features[i:i + 1, :short], lengths[i:i + 1]
    with torch.no_grad():
        try:
            mu = oracle.marginals(potentials_of(x, m))
            energy = None if energy_of is None else energy_of(x, m)
            if energy is not None:
                energy.validate(mu)
                energy.value(mu)
        except Exception:           # keeping the full width costs only time; training raises the real error, if any
            return True
    return False


def length_chunks(lengths: Tensor, chunk_size: int | None) -> list[tuple[Tensor, int]]:
    """Split a batch into chunks of similar length: ``(indices, max length)`` pairs, sorted by length, so
    padding (and memory) stays small.  ``None`` keeps the whole batch as one chunk."""
    check_integer_vector("lengths", lengths)
    if chunk_size is not None:
        chunk_size = check_count("chunk_size", chunk_size)
    order = torch.argsort(lengths, stable=True)
    size = len(order) if chunk_size is None else chunk_size
    return [(idx, int(lengths[idx].max())) for idx in torch.split(order, max(size, 1))]


def fit_crf(model: nn.Module, features: Tensor, labels: Tensor, lengths: Tensor, oracle: Oracle | None = None,
            l2: float = 1e-3, max_iter: int = 100, tolerance: float = 1e-7, chunk_size: int | None = None,
            loss: str = "crf", gamma: float | None = None, progress: bool = False) -> list[float]:
    """Full-batch L-BFGS on ``mean NLL + l2/2 ||params||^2``; returns the objective after each evaluation.

    ``loss="softmax_margin"`` trains on the softmax-margin loss instead (Gimpel and Smith, 2010; ``beta = 1``
    in the family of :mod:`betheproj.learning.losses`): the log-partition of the potentials raised by
    ``gamma`` (default 1) at every wrong label, so the model keeps a margin that grows with the Hamming
    distance.  The model is still a CRF (decode and take marginals in the plain potentials).

    ``chunk_size`` evaluates the (same) objective over length-sorted chunks of that many sequences, each
    trimmed to its longest member (on a chain; a tree's and a dependency tree's keep the full width, and so do those
    of a model that refuses a shorter one, see :func:`_needs_full_width`), accumulating gradients: the memory of one
    chunk, little padding.
    ``progress`` shows a bar over the objective evaluations (L-BFGS's budget of ``1.25 max_iter``; torch checks it
    between line searches, so the last line search can run a few evaluations past it)."""
    from .losses import resolve_loss, structured_loss  # losses builds on this module
    from .model import NonLocalCRF

    if isinstance(model, NonLocalCRF) or not isinstance(model, nn.Module):
        hint = (" (train a NonLocalCRF with its fit, or its base potentials with fit_crf(model.theta, ...))"
                if isinstance(model, NonLocalCRF) else "")
        raise TypeError(f"model must be a torch.nn.Module (features, lengths) -> PairwisePotentials such as "
                        f"LinearChainCRF, got {type(model).__name__}{hint}")
    l2 = check_nonnegative("l2", l2)
    max_iter = check_count("max_iter", max_iter)
    tolerance = check_nonnegative("tolerance", tolerance)
    progress = check_bool("progress", progress)
    check_sequences(features, labels, lengths, features_dim=None, training=True)
    if loss not in ("crf", "softmax_margin"):
        raise ValueError(f"loss must be 'crf' or 'softmax_margin' (L-BFGS needs a smooth loss), got {loss!r}")
    if loss == "crf" and gamma is not None and check_real("gamma", gamma) != 0:
        raise ValueError(f"gamma applies to loss='softmax_margin' only, got gamma={gamma} with loss='crf'")
    _, gamma = resolve_loss(loss, gamma=gamma)        # the preset's gamma (1) by default; checks it
    oracle = LinearChain() if oracle is None else oracle
    check_oracle(oracle, ("marginals",))
    full = features.shape[1] if _needs_full_width(oracle, model, features, lengths) else None
    _check_gold_batch(lambda idx, n: model(features[idx, :n], lengths[idx]), oracle, labels, lengths, chunk_size,
                      full is not None)

    def objective(potentials: PairwisePotentials, gold: Tensor) -> Tensor:
        if loss == "crf":
            return crf_nll(oracle, potentials, gold)
        return structured_loss(oracle, potentials, gold, beta=1.0, gamma=gamma)

    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.LBFGS(params, max_iter=max_iter, tolerance_grad=tolerance, tolerance_change=tolerance * tolerance,
                            history_size=20, line_search_fn="strong_wolfe")
    chunks = length_chunks(lengths, chunk_size)
    total = len(lengths)
    history: list[float] = []
    bar = progress_bar(opt.defaults["max_eval"], progress, "L-BFGS evaluations")

    def closure() -> Tensor:
        opt.zero_grad()
        value = 0.0
        for idx, n in chunks:
            n = full or n
            part = objective(model(features[idx, :n], lengths[idx]), labels[idx, :n]).sum() / total
            part.backward()
            value += part.item()
        penalty = 0.5 * l2 * _squared_norm(params)
        penalty.backward()
        history.append(value + penalty.item())
        bar.update()
        bar.set_postfix(objective=f"{history[-1]:.5g}")
        return torch.tensor(history[-1], dtype=torch.float64)

    try:
        opt.step(closure)
    finally:
        bar.close()
    return history
