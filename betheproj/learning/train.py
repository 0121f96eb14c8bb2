"""Learning theta and psi: Algorithm 3 (doubly stochastic) and Algorithm 2 (variational EM), with minibatch
optimisers, L2 regularisation, validation-based early stopping and progress bars."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from .._checks import check_bool, check_count, check_nonnegative, check_positive, check_seed
from ..oracles.base import Marginals
from ..progress import progress_bar
from ._checks import check_lengths_like, check_sequences
from .crf import _check_gold_batch, _check_label_range, _needs_full_width, _squared_norm
from .model import NonLocalCRF

__all__ = ["character_accuracy", "History", "fit_doubly_stochastic", "fit_variational_em"]


def character_accuracy(predicted: Tensor, labels: Tensor, lengths: Tensor) -> float:
    """Fraction of valid positions (``< lengths``) where ``predicted`` equals ``labels`` (both [B, N]); an empty
    batch (``B = 0``) is a ``ValueError``."""
    if not isinstance(predicted, Tensor) or not isinstance(labels, Tensor) or predicted.shape != labels.shape:
        raise ValueError(f"predicted and labels must be tensors of the same shape [B, N], got "
                         f"{tuple(getattr(predicted, 'shape', ()))} and {tuple(getattr(labels, 'shape', ()))}")
    if predicted.dim() != 2 or not isinstance(lengths, Tensor) or lengths.shape != labels.shape[:1]:
        raise ValueError(f"predicted and labels must be [B, N] and lengths [B]=({labels.shape[0]},)")
    check_lengths_like(labels, lengths)                  # integers in [1, N]
    if labels.shape[0] == 0:
        raise ValueError("no positions to score (B = 0): an accuracy of an empty batch is undefined")
    n = labels.shape[1]
    valid = torch.arange(n, device=labels.device) < lengths[:, None]
    return int(((predicted == labels) & valid).sum()) / int(valid.sum())      # not a float32 division


@dataclass
class History:
    """What a learner did: the loss of every step (of every M-step pass for :func:`fit_variational_em`), the
    validation metric of every evaluation, the best one."""

    loss: list[float] = field(default_factory=list)
    valid: list[float] = field(default_factory=list)
    best: float | None = None
    best_step: int | None = None
    steps: int = 0
    seconds: float = 0.0
    stopped_early: bool = False


def _optimizer(model: NonLocalCRF, name: str, lr: float, psi_lr: float | None, learn_theta: bool,
               learn_psi: bool) -> torch.optim.Optimizer:
    lr = check_positive("lr", lr)
    psi_lr = None if psi_lr is None else check_positive("psi_lr", psi_lr)
    groups = []
    if learn_theta:
        groups.append({"params": list(model.theta.parameters()), "lr": lr})
    if learn_psi and model.psi is not None:
        groups.append({"params": list(model.psi.parameters()), "lr": lr if psi_lr is None else psi_lr})
    groups = [g for g in groups if g["params"]]
    if not groups:
        raise ValueError("nothing to learn: learn_theta and learn_psi leave no parameters")
    if name == "adam":
        return torch.optim.Adam(groups)
    if name == "sgd":
        return torch.optim.SGD(groups)
    raise ValueError(f"optimizer must be 'adam' or 'sgd', got {name!r}")


def _penalty(module: nn.Module | None, l2: float) -> Tensor | float:
    if module is None or l2 == 0:
        return 0.0
    params = [p for p in module.parameters() if p.requires_grad]
    return 0.5 * l2 * _squared_norm(params) if params else 0.0


def _check_valid_labels(model: NonLocalCRF, features: Tensor, labels: Tensor, lengths: Tensor) -> None:
    """The validation labels in the model's range at every valid position: one out of it only lowered the metric."""
    with torch.no_grad():
        try:
            c = model.potentials(features[:1], lengths[:1]).node.shape[-1]     # the number of labels
        except (ValueError, TypeError) as err:                  # probed on the first example: say whose it is
            raise type(err)(f"valid's features {tuple(features.shape)} do not fit the model (its first example: "
                            f"{err})") from None
    b, n = labels.shape                                         # [B, N]: check_sequences saw to it
    _check_label_range(labels, (b, n), c, lengths, "valid's labels")


class _Validator:
    """Evaluates ``metric`` on the validation set, keeps the best ``state_dict``, counts evaluations since."""

    def __init__(self, model: NonLocalCRF, valid: tuple[Tensor, Tensor, Tensor] | None,
                 metric: Callable[[Tensor, Tensor, Tensor], float], patience: int | None, history: History):
        if patience is not None:
            check_count("patience", patience)
            if valid is None:
                raise ValueError("patience stops training after evaluations on valid without improvement: give valid "
                                 "= (features, labels, lengths) too")
        if not callable(metric):
            raise TypeError(f"metric must be a function (predicted, labels, lengths) -> float, got "
                            f"{type(metric).__name__}")
        if valid is not None:
            if not isinstance(valid, tuple) or len(valid) != 3:
                raise TypeError("valid must be a tuple (features, labels, lengths)")
            check_sequences(*valid)
            if valid[0].shape[0] == 0:
                raise ValueError("valid holds no examples (B = 0)")
            _check_valid_labels(model, *valid)
        self.model, self.valid, self.metric, self.patience, self.history = model, valid, metric, patience, history
        self.best_state: dict[str, Tensor] | None = None
        self.bad = 0

    def __call__(self, step: int) -> bool:
        """Evaluate; return True when training should stop."""
        if self.valid is None:
            return False
        x, y, n = self.valid
        score = self.metric(self.model.predict(x, n), y, n)
        self.history.valid.append(score)
        if self.history.best is None or score > self.history.best:
            self.history.best, self.history.best_step, self.bad = score, step, 0
            self.best_state = copy.deepcopy(self.model.state_dict())
        else:
            self.bad += 1
        return self.patience is not None and self.bad >= self.patience

    def restore(self) -> None:
        if self.best_state is not None:
            self.model.load_state_dict(self.best_state)


class _Average:
    """Polyak-Ruppert averaging: the running mean of the parameters after every optimiser step."""

    def __init__(self, params: list[nn.Parameter]):
        self.params = params
        self.mean = [p.detach().clone() for p in params]
        self.count = 0

    @torch.no_grad()
    def update(self) -> None:
        self.count += 1
        for m, p in zip(self.mean, self.params, strict=True):
            step = p - m
            step[p == m] = 0.0          # an entry that stays -inf (a forbidden transition): not -inf - -inf = NaN
            m.add_(step, alpha=1.0 / self.count)

    @torch.no_grad()
    def _load(self, values: list[Tensor]) -> None:
        for v, p in zip(values, self.params, strict=True):
            p.copy_(v)

    def apply(self) -> None:
        """Replace the parameters by their mean."""
        self._load(self.mean)

    @contextmanager
    def applied(self) -> Iterator[None]:
        """The mean in place of the parameters while the block runs (e.g. to evaluate it), then the iterate."""
        saved = [p.detach().clone() for p in self.params]
        self.apply()
        try:
            yield
        finally:
            self._load(saved)


def _batches(num: int, batch_size: int, generator: torch.Generator) -> Iterator[Tensor]:
    order = torch.randperm(num, generator=generator)
    for start in range(0, num, batch_size):
        yield order[start:start + batch_size]


def _check_model(model: object) -> None:
    if not isinstance(model, NonLocalCRF):
        hint = " (a base CRF such as LinearChainCRF trains with fit_crf)" if isinstance(model, nn.Module) else ""
        raise TypeError(f"model must be a NonLocalCRF, got {type(model).__name__}{hint}")


def _check_gold_labels(model: NonLocalCRF, features: Tensor, labels: Tensor, lengths: Tensor,
                       batch_size: int, full_width: bool) -> None:
    """Every label in range (on dependency oracles, every example's heads a tree) and no gold labelling on a
    forbidden part, before the first step and named by the example's index in the whole batch: a bad label met in
    a later minibatch stopped training with the model half-trained, and named by its row in the minibatch."""
    _check_gold_batch(lambda idx, n: model.potentials(features[idx, :n], lengths[idx]), model.oracle, labels,
                      lengths, batch_size, full_width)


def _keeps_width(model: NonLocalCRF, features: Tensor, lengths: Tensor) -> bool:
    """Whether the learners must keep every minibatch at the full width ``N`` (:func:`~.crf._needs_full_width`, with
    theta, psi and the energy of ``model``)."""
    return _needs_full_width(model.oracle, model.potentials, features, lengths, model.energy)


def fit_doubly_stochastic(model: NonLocalCRF, features: Tensor, labels: Tensor, lengths: Tensor, epochs: int = 1,
                          batch_size: int = 32, optimizer: str = "adam", lr: float = 1e-2,
                          psi_lr: float | None = None, l2: float = 0.0, psi_l2: float = 0.0,
                          learn_theta: bool = True, learn_psi: bool = True, train_iter: int | None = None,
                          valid: tuple[Tensor, Tensor, Tensor] | None = None,
                          metric: Callable[[Tensor, Tensor, Tensor], float] = character_accuracy,
                          eval_every: int | None = None, patience: int | None = None, seed: int = 0,
                          average: bool = False, progress: bool = False) -> History:
    """Algorithm 3: for a sampled minibatch, solve (2) for ``mu_i`` (Algorithm 1 / 4 / 5, at most ``train_iter``
    iterations, default the model's ``max_iter``), then take one optimiser step on theta and psi along the
    gradient of the surrogate likelihood (12) at those ``mu_i`` (eqs. 13-17).  ``batch_size=1`` is the paper's
    single-example version; without an energy this is minibatch maximum likelihood for the CRF.

    ``l2`` / ``psi_l2`` add ``l2/2 ||params||^2`` for theta / psi.  With ``valid = (features, labels, lengths)``
    the model is evaluated by ``metric`` (higher is better) every ``eval_every`` steps (default: each epoch) and
    after the last step; the best parameters are restored at the end, and training stops after ``patience``
    evaluations without improvement.

    ``average=True`` returns the mean of the iterates after every step (Polyak-Ruppert averaging) instead of the
    last one, and validation evaluates that mean: with a few noisy steps, e.g. on a psi linear in many random
    features, the last iterate depends on the last minibatches, the mean much less.

    On a chain every minibatch is trimmed to its longest member (less padding), unless the model refuses a
    shorter width (theta, psi or the energy reads ``N`` positions): then minibatches keep the width ``N``.
    """
    _check_model(model)
    check_sequences(features, labels, lengths, training=True)
    batch_size = check_count("batch_size", batch_size)
    learn_theta, learn_psi = check_bool("learn_theta", learn_theta), check_bool("learn_psi", learn_psi)
    average, progress = check_bool("average", average), check_bool("progress", progress)
    full = features.shape[1] if _keeps_width(model, features, lengths) else None
    _check_gold_labels(model, features, labels, lengths, batch_size, full is not None)
    check_count("epochs", epochs)
    seed = check_seed("seed", seed)
    if train_iter is not None:
        train_iter = check_count("train_iter", train_iter, 0)
    l2, psi_l2 = check_nonnegative("l2", l2), check_nonnegative("psi_l2", psi_l2)
    if eval_every is not None:
        check_count("eval_every", eval_every)
    opt = _optimizer(model, optimizer, lr, psi_lr, learn_theta, learn_psi)
    averager = _Average([p for g in opt.param_groups for p in g["params"]]) if average else None
    history = History()
    validator = _Validator(model, valid, metric, patience, history)
    gen = torch.Generator().manual_seed(seed)
    per_epoch = -(-features.shape[0] // batch_size)
    eval_every = eval_every or per_epoch
    bar = progress_bar(epochs * per_epoch, progress, "Algorithm 3")
    start = time.perf_counter()
    for _ in range(epochs):
        for idx in _batches(features.shape[0], batch_size, gen):
            x, y, n = features[idx], labels[idx], lengths[idx]
            width = full or int(n.max())                  # a chain's batch loses its padding (see keeps_width)
            x, y = x[:, :width], y[:, :width]
            sol = model.infer(x, n, train_iter)
            opt.zero_grad()
            loss = model.loss(x, y, n, None if sol is None else sol.marginals)
            (loss + _penalty(model.theta, l2) + _penalty(model.psi, psi_l2)).backward()
            opt.step()
            if averager is not None:
                averager.update()
            history.loss.append(loss.item())
            history.steps += 1
            bar.update(1)
            bar.set_postfix(loss=f"{loss.item():.3f}")
            if history.steps % eval_every == 0:
                with averager.applied() if averager is not None else nullcontext():
                    history.stopped_early = validator(history.steps)
                if history.stopped_early:
                    break
        if history.stopped_early:
            break
    if not history.stopped_early and history.steps % eval_every:     # the steps since the last evaluation count
        with averager.applied() if averager is not None else nullcontext():
            validator(history.steps)
    bar.close()
    if averager is not None:
        averager.apply()
    validator.restore()
    history.seconds = time.perf_counter() - start
    return history


def fit_variational_em(model: NonLocalCRF, features: Tensor, labels: Tensor, lengths: Tensor, rounds: int = 5,
                       m_steps: int = 20, batch_size: int = 256, optimizer: str = "adam", lr: float = 1e-2,
                       psi_lr: float | None = None, l2: float = 0.0, psi_l2: float = 0.0,
                       learn_theta: bool = True, learn_psi: bool = True,
                       valid: tuple[Tensor, Tensor, Tensor] | None = None,
                       metric: Callable[[Tensor, Tensor, Tensor], float] = character_accuracy,
                       patience: int | None = None, progress: bool = False) -> History:
    """Algorithm 2: each round, an E-step solves (2) for every example (fixing ``M = {mu_i}``), then an M-step
    takes ``m_steps`` passes of optimiser steps (one per ``batch_size`` chunk) on theta and psi for the
    surrogate likelihood (12) at the fixed ``M``.  Validation and early stopping as in
    :func:`fit_doubly_stochastic`, evaluated after each round."""
    _check_model(model)
    check_sequences(features, labels, lengths, training=True)
    batch_size = check_count("batch_size", batch_size)
    learn_theta, learn_psi = check_bool("learn_theta", learn_theta), check_bool("learn_psi", learn_psi)
    progress = check_bool("progress", progress)
    _check_gold_labels(model, features, labels, lengths, batch_size, _keeps_width(model, features, lengths))
    check_count("rounds", rounds)
    check_count("m_steps", m_steps)
    l2, psi_l2 = check_nonnegative("l2", l2), check_nonnegative("psi_l2", psi_l2)
    opt = _optimizer(model, optimizer, lr, psi_lr, learn_theta, learn_psi)
    history = History()
    validator = _Validator(model, valid, metric, patience, history)
    chunks = [torch.arange(s, min(s + batch_size, features.shape[0])) for s in range(0, features.shape[0], batch_size)]
    bar = progress_bar(rounds * (len(chunks) + m_steps), progress, "Algorithm 2")
    start = time.perf_counter()
    for _ in range(rounds):
        fixed: list[Marginals | None] = []
        for idx in chunks:                                     # E-step
            sol = model.infer(features[idx], lengths[idx])
            fixed.append(None if sol is None else sol.marginals)
            bar.update(1)
        for _ in range(m_steps):                               # M-step at fixed M
            total = 0.0
            for idx, mu in zip(chunks, fixed, strict=True):
                opt.zero_grad()
                loss = model.loss(features[idx], labels[idx], lengths[idx], mu) if mu is not None else \
                    model.loss(features[idx], labels[idx], lengths[idx])
                (loss + _penalty(model.theta, l2) + _penalty(model.psi, psi_l2)).backward()
                opt.step()
                total += loss.item() * len(idx)
                history.steps += 1
            history.loss.append(total / features.shape[0])
            bar.update(1)
        if validator(history.steps):
            history.stopped_early = True
            break
    bar.close()
    validator.restore()
    history.seconds = time.perf_counter() - start
    return history
