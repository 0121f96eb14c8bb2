"""Algorithm 1 of Martins et al. (EMNLP 2010, "Turbo Parsers", section 5): aggressive online learning of a linear
model ``theta = F(x)^T w`` with any loss ``L_{beta,gamma}`` of Figure 4 and no learning rate.

For ``t = 1..T = mK`` (``m`` examples, ``K`` epochs), on example ``(x_t, y_t)``:

* line 5: solve eq. 24 (the oracle's cost-augmented marginals, or MAP for ``beta = inf``) for ``mu_hat`` and ``L``;
* line 6: ``g = F(x_t) (mu_hat - mu(y_t))``, the gradient in the weights;
* line 7: ``eta_t = min(1 / (lambda m), L / ||g||^2)``;
* line 8: ``w <- w - eta_t g``;

and the averaged weights ``(1/T) sum_t w_{t+1}`` are returned (line 10 prints ``(1/T) sum_t theta_t``, which
starts at ``theta_1 = 0`` and stops before the last update; averaging the weights after every step, as averaged
perceptrons do, differs from it by ``(w_{T+1} - w_1) / T``).  The features are sparse and hashed: every
node part ``(n, c)`` of an example (position ``n`` with label ``c``; for a dependency tree, modifier ``n + 1``
with head ``c``) carries ``K`` feature ids, so ``theta.node[n, c] = sum_k w[ids[n, c, k]]``, and ``F(x) v`` is a
scatter-add of ``v`` over those ids.  Optionally a dense ``[C, C]`` block of the weight vector holds shared
transition scores (``theta.edge``); otherwise the edge table is all zero (the convention of the dependency
oracles).  Averaging uses the usual lazy trick: with ``W = sum_s d_s`` and ``U = sum_s s d_s`` (``d_s`` the
update of step ``s``), ``(1/T) sum_t w_{t+1} = ((T + 1) W - U) / T``, so every step costs only its sparse update.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from .._checks import check_bool, check_count, check_float_dtype, check_positive, check_seed
from ..inference.solve import check_oracle
from ..oracles.base import Oracle, PairwisePotentials
from ..progress import progress_bar
from .losses import CostFn, loss_and_gradient, resolve_loss

__all__ = ["SparseExample", "OnlineResult", "sparse_potentials", "fit_online"]


@dataclass
class SparseExample:
    """One example for a sparse linear model.

    ``ids`` [N, C, K] (int32 or int64): the feature ids of every node part; the value ``num_features`` marks an
    unused slot (its weight is pinned to zero).  ``gold`` [N] (long): the labels.  ``allowed`` [N, C] (bool, optional):
    ``False`` parts get a ``-inf`` potential (e.g. a word heading itself).

    Compact form (``table`` given, see :meth:`compact`): ``table`` [U] holds the distinct feature ids of the
    example, strictly increasing (so the unused slot, if present, is last), and ``ids`` indexes into it.  A step
    then touches the big weight vector only at those ``U`` entries (the other passes run over a small local
    array), which matters when the weight vector is much larger than the caches."""

    ids: Tensor
    gold: Tensor
    allowed: Tensor | None = None
    table: Tensor | None = None

    def compact(self) -> SparseExample:
        """The same example in compact form (``table`` = its distinct ids, ``ids`` local)."""
        if self.table is not None:
            return self
        table, inv = torch.unique(self.ids, sorted=True, return_inverse=True)
        return SparseExample(inv.to(torch.int32), self.gold, self.allowed, table)

    def global_ids(self) -> Tensor:
        """Feature ids [N, C, K] in the weight vector (whatever the form)."""
        return self.ids if self.table is None else self.table[self.ids.long()]

    def __post_init__(self) -> None:
        if not isinstance(self.ids, Tensor) or self.ids.dim() != 3 or self.ids.dtype not in _ID_DTYPES:
            raise TypeError(f"ids must be an int32 or int64 tensor [N, C, K], got "
                            f"{_described(self.ids)}")
        n, c, _ = self.ids.shape
        if not isinstance(self.gold, Tensor) or self.gold.shape != (n,) or self.gold.is_floating_point() \
                or self.gold.dtype == torch.bool:
            raise ValueError(f"gold must be an integer tensor [N]=({n},)")
        if self.allowed is not None and (self.allowed.shape != (n, c) or self.allowed.dtype != torch.bool):
            raise ValueError(f"allowed must be a bool tensor [N, C]=({n}, {c})")
        if self.table is not None and (not isinstance(self.table, Tensor) or self.table.dim() != 1
                                       or self.table.dtype not in _ID_DTYPES):
            raise TypeError(f"table must be an int32 or int64 tensor [U], got {_described(self.table)}")
        if self.table is not None and not bool((self.table[1:] > self.table[:-1]).all()):
            raise ValueError("table must be strictly increasing (distinct ids, sorted; the unused slot last), "
                             "e.g. from torch.unique")


_ID_DTYPES = (torch.int32, torch.int64)     # uint8 would index as a boolean mask, int8/int16 overflow


def _described(t: object) -> str:
    return f"{t.dtype} of shape {tuple(t.shape)}" if isinstance(t, Tensor) else type(t).__name__


@dataclass
class OnlineResult:
    """What Algorithm 1 returns: the averaged weights (line 10, over the weights after each step), the last
    iterate, per-epoch mean loss, the step sizes ``eta_t`` (when recorded) and the wall-clock time."""

    weights: Tensor
    last: Tensor
    losses: list[float] = field(default_factory=list)
    etas: list[float] = field(default_factory=list)
    steps: int = 0
    updates: int = 0
    seconds: float = 0.0


def _averaged(w: Tensor, u: Tensor, t: int) -> Tensor:
    """Line 10's average of the weights after each of ``t`` steps, ``((t + 1) w - u) / t`` with ``u = sum_s s d_s``,
    in one new vector (the dense vectors alive at once are training's peak memory)."""
    return w.mul(t + 1).sub_(u).div_(t) if t else w.clone()


def _check_ids(ex: SparseExample, num_features: int) -> None:
    ids = ex.ids if ex.table is None else ex.table
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) > num_features):
        raise ValueError(f"feature ids must lie in [0, num_features]=[0, {num_features}] "
                         f"(num_features marks an unused slot)")
    if ex.table is not None and ex.ids.numel() and (int(ex.ids.min()) < 0 or int(ex.ids.max()) >= len(ex.table)):
        raise ValueError(f"compact ids must index the table (0..{len(ex.table) - 1})")


def _check_gold(ex: SparseExample, i: int) -> None:
    """Gold labels in ``[0, C)`` and on allowed parts (a forbidden gold part scores ``-inf``: an infinite loss)."""
    n, c, _ = ex.ids.shape
    if n == 0 or c == 0:
        raise ValueError(f"examples[{i}] is empty (N = {n} positions, C = {c} labels): it has nothing to learn from")
    if int(ex.gold.min()) < 0 or int(ex.gold.max()) >= c:
        raise ValueError(f"examples[{i}]: gold labels must lie in [0, {c})")
    if ex.allowed is not None:
        bad = (~ex.allowed[torch.arange(n), ex.gold.long()]).nonzero().flatten().tolist()
        if bad:
            raise ValueError(f"examples[{i}]: gold labels lie on forbidden parts (allowed is False) at positions "
                             f"{bad[:10]}: the loss would be infinite")


def sparse_potentials(weights: Tensor, examples: Sequence[SparseExample], num_features: int,
                      transitions: int | None = None) -> PairwisePotentials:
    """``theta = F(x)^T w`` for a batch: node [B, N_max, C_max] (labels past an example's ``C`` and forbidden parts
    get ``-inf``, positions past its length 0) and a shared edge table: the transition block ``[C, C]`` of ``w``
    when ``transitions = C``, else all zeros ``[C_max, C_max]``.  ``weights`` [num_features + 1 (+ C^2)], as
    :func:`fit_online` returns them."""
    if isinstance(examples, str) or not isinstance(examples, Sequence):
        raise TypeError(f"examples must be a sequence of SparseExample, got {type(examples).__name__}")
    if not examples:
        raise ValueError("no examples")
    num_features = check_count("num_features", num_features)
    if not isinstance(weights, Tensor) or weights.dim() != 1 or not weights.is_floating_point():
        got = f"a {weights.dim()}-D {weights.dtype} tensor" if isinstance(weights, Tensor) else type(weights).__name__
        raise TypeError(f"weights must be a 1-D floating-point tensor, got {got}")
    need = num_features + 1 + (0 if transitions is None else check_count("transitions", transitions) ** 2)
    if len(weights) < need or (transitions is not None and len(weights) != need):
        what = "at least num_features + 1" if transitions is None else "num_features + 1 + transitions^2"
        raise ValueError(f"weights must have {what} = {need} entries, got {len(weights)}")
    for i, ex in enumerate(examples):
        if not isinstance(ex, SparseExample):
            raise TypeError(f"examples must be SparseExample, got {type(ex).__name__} at examples[{i}]")
        _check_ids(ex, num_features)
    return _sparse_potentials(weights, examples, num_features, transitions)


def _sparse_potentials(weights: Tensor, examples: Sequence[SparseExample], num_features: int,
                       transitions: int | None) -> PairwisePotentials:
    """:func:`sparse_potentials` without its checks: ``fit_online`` checks its examples once, and hands a compact
    example's local weights."""
    n_max = max(ex.ids.shape[0] for ex in examples)
    c_max = max(ex.ids.shape[1] for ex in examples)
    node = weights.new_zeros(len(examples), n_max, c_max)
    for b, ex in enumerate(examples):
        n, c, _ = ex.ids.shape
        scores = weights[ex.ids].sum(-1) if ex.table is None else weights[ex.table][ex.ids].sum(-1)
        if ex.allowed is not None:
            scores = scores.masked_fill(~ex.allowed, -math.inf)
        node[b, :n, :c] = scores
        if c < c_max:
            node[b, :n, c:] = -math.inf
    lengths = torch.tensor([ex.ids.shape[0] for ex in examples], dtype=torch.long)
    return PairwisePotentials(node, _edge(weights, num_features, transitions, c_max), lengths)


def _edge(weights: Tensor, num_features: int, transitions: int | None, c: int) -> Tensor:
    if transitions is None:
        return weights.new_zeros(c, c)
    if transitions != c:
        raise ValueError(f"examples have C={c} labels but transitions={transitions}")
    return weights[num_features + 1:].reshape(c, c)


def fit_online(oracle: Oracle, examples: Iterable[SparseExample], num_features: int, loss: str | None = "crf",
               beta: float | None = None, gamma: float | None = None, lam: float = 1.0, epochs: int = 10,
               seed: int = 0, transitions: int | None = None, cost: str | CostFn = "hamming",
               dtype: torch.dtype = torch.float64, record_steps: bool = False, progress: bool = False,
               callback: Callable[[int, Tensor, float], None] | None = None, desc: str = "Algorithm 1") -> OnlineResult:
    """Algorithm 1 (aggressive online learning) with the loss ``L_{beta,gamma}`` (preset ``loss`` and/or
    ``beta``/``gamma``, see :mod:`betheproj.learning.losses`), regularisation ``lam`` (``lambda``: the step size is
    capped at ``1 / (lambda m)``), ``epochs`` passes (``K``) over ``examples`` in a fresh random order each
    (``seed``).  The weight vector has ``num_features + 1`` entries (the last one, the unused slot, stays 0)
    plus ``transitions^2`` for a shared transition block.  ``callback(epoch, averaged_weights, mean_loss)`` runs after
    every epoch (e.g. to evaluate on held-out data).  Returns the averaged weights (line 10, over the weights after
    each step: see the module docstring); the weights live on the device of the examples' ``ids``."""
    beta, gamma = resolve_loss(loss, beta, gamma)
    check_oracle(oracle, ("map",) if math.isinf(beta) else ("marginals",))
    num_features = check_count("num_features", num_features)
    check_float_dtype("dtype", dtype)
    if callback is not None and not callable(callback):
        raise TypeError(f"callback must be a function (epoch, averaged_weights, mean_loss) -> None, got "
                        f"{type(callback).__name__}")
    epochs = check_count("epochs", epochs)
    lam = check_positive("lam (lambda)", lam)
    seed = check_seed("seed", seed)
    record_steps, progress = check_bool("record_steps", record_steps), check_bool("progress", progress)
    if isinstance(examples, SparseExample) or not isinstance(examples, Iterable):
        raise TypeError(f"examples must be a sequence of SparseExample, got {type(examples).__name__}")
    examples = list(examples)                               # read once (a generator), shuffled every epoch
    m = len(examples)
    if m == 0:
        raise ValueError("no training examples")
    for i, ex in enumerate(examples):
        if not isinstance(ex, SparseExample):
            raise TypeError(f"examples must be SparseExample, got {type(ex).__name__}")
        _check_ids(ex, num_features)
        _check_gold(ex, i)
        if transitions is not None and ex.ids.shape[1] != transitions:
            raise ValueError(f"examples[{i}] has C={ex.ids.shape[1]} labels but transitions={transitions}")
    check = getattr(oracle, "check_labels", None)            # dependency heads must be a tree: before any step
    if check is not None:
        gold = torch.nn.utils.rnn.pad_sequence([ex.gold for ex in examples], batch_first=True)
        check(gold, torch.tensor([len(ex.gold) for ex in examples], device=gold.device), "examples[{i}].gold")
    size = num_features + 1 + (transitions or 0) ** 2
    pad = num_features
    device = examples[0].ids.device                         # the weights live with the examples
    w = torch.zeros(size, dtype=dtype, device=device)
    u = torch.zeros(size, dtype=dtype, device=device)       # sum_s s d_s, for the averaged weights
    # accumulates g = F(x) v, reset each step, for examples without a compact table (the parser's all have one)
    scratch = (torch.zeros(num_features + 1, dtype=dtype, device=device)
               if any(ex.table is None for ex in examples) else None)
    cap = 1.0 / (lam * m)
    sparse_grad = math.isinf(beta)                          # g = S(y_hat) - S(y): at most 2N non-zero parts
    gen = torch.Generator().manual_seed(seed)
    result = OnlineResult(w, w)
    bar = progress_bar(epochs * m, progress, desc)
    start = time.perf_counter()
    t = 0

    for epoch in range(epochs):
        total = 0.0
        for i in torch.randperm(m, generator=gen).tolist():
            t += 1
            ex = examples[i]
            if ex.table is None:
                pot = _sparse_potentials(w, [ex], num_features, transitions)
            else:
                local_w = w[ex.table]                         # the only gather from the big vector
                pot = _sparse_potentials(local_w, [SparseExample(ex.ids, ex.gold, ex.allowed)], num_features,
                                         None)
                if transitions is not None:
                    pot = PairwisePotentials(pot.node, _edge(w, num_features, transitions, transitions), pot.lengths)
            lg = loss_and_gradient(oracle, pot, ex.gold[None], beta, gamma, cost, edge=transitions is not None)
            value = float(lg.loss[0])
            total += value
            g = lg.node[0]                                    # [N, C]
            if sparse_grad:
                nz = g.nonzero(as_tuple=True)
                ids, vals = ex.ids[nz], g[nz]                 # [P, K], [P]
            else:
                ids, vals = ex.ids, g
            flat = ids.reshape(-1)
            v = vals[..., None].expand(ids.shape).reshape(-1)
            if scratch is not None and ex.table is None:
                # ||F(x) v||^2 = sum_j acc_j^2 = sum_i v_i acc[flat_i], acc = F(x) v accumulated in the scratch
                scratch.index_add_(0, flat, v)
                scratch[pad] = 0.0
                norm2 = float(torch.dot(v, scratch[flat]))
                scratch[flat] = 0.0
                where, grad = flat, v
            else:
                grad = torch.zeros(len(ex.table), dtype=dtype, device=device).index_add_(0, flat, v)
                if int(ex.table[-1]) == pad:
                    grad[-1] = 0.0
                norm2 = float(torch.dot(grad, grad))
                where = ex.table
                if sparse_grad:
                    keep = grad != 0
                    where, grad = where[keep], grad[keep]
            g_edge = lg.edge
            if g_edge is not None:
                norm2 += float((g_edge * g_edge).sum())
            eta = min(cap, value / norm2) if value > 0 and norm2 > 0 else 0.0
            if record_steps:
                result.etas.append(eta)
            if eta > 0:
                result.updates += 1
                w.index_add_(0, where, grad, alpha=-eta)
                u.index_add_(0, where, grad, alpha=-eta * t)
                w[pad] = u[pad] = 0.0
                if g_edge is not None:
                    w[num_features + 1:] -= eta * g_edge.reshape(-1)
                    u[num_features + 1:] -= (eta * t) * g_edge.reshape(-1)
            bar.update(1)
            if t % 100 == 0:
                bar.set_postfix(loss=f"{total / (t - epoch * m):.3f}")
        result.losses.append(total / m)
        if callback is not None:
            callback(epoch, _averaged(w, u, t), result.losses[-1])
    bar.close()
    del scratch                                             # the peak memory is the dense vectors alive at once
    result.steps = t
    result.weights = _averaged(w, u, t)
    del u
    result.last = w                                         # no step changes it any more
    result.seconds = time.perf_counter() - start
    return result
