"""The structured perceptron (Collins 2002), plain and averaged, over any MAP routine, exact or approximate.

For examples ``(x_i, z_i)`` and a MAP routine ``A_w(x)`` (exact, LP-relaxed, loopy BP, or the chain and tree
oracles), each step predicts ``z = A_w(x_i)`` and, on a mistake (``z != z_i``), updates

    w <- w + eta (Phi(x_i, z_i) - Phi(x_i, z)),

Collins' rule with step ``eta`` (1 in Collins 2002; the paper's update of section 4.2 is ``eta = 1/2`` for the
Figure 3 data, whose feature difference is twice ``x_alpha + x_beta``).  A fractional LP prediction
``z = z_LP`` is a mistake and updates with the expected features ``Phi(x, z_LP)`` (Kulesza & Pereira 2007,
section 5.1, eq. 7), which is what makes Theorem 1 hold: under algorithmic separability with margin ``gamma``
and radius ``R`` the perceptron makes at most ``R^2 / gamma^2`` mistakes.  The averaged perceptron returns
``(1/T) sum_t w_t`` over all ``T`` steps (Collins 2002, section 2.5).

A MAP routine is any callable ``(x, w) -> prediction`` returning label indices (array, list or tensor, an
oracle's ``[1, N]`` output included), a :class:`~betheproj.mrf.LocalMarginals` point or a
:class:`~betheproj.mrf.MAPResult`.  :func:`mrf_map` and :func:`oracle_map` build them for
:class:`~betheproj.mrf.LinearPairwiseMRF` inputs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._checks import check_bool, check_count, check_positive, check_seed
from ..mrf.bounds import lp_margin_bounds, lp_radius_bounds
from ..mrf.linear import LinearPairwiseMRF
from ..mrf.map import exact_map, lbp_map, lp_map
from ..mrf.pairwise import LocalMarginals, MAPResult

__all__ = ["PerceptronResult", "MistakeBound", "structured_perceptron", "mrf_map", "oracle_map", "lp_mistake_bound",
           "predict"]

MapFn = Callable[[Any, np.ndarray], Any]


@dataclass
class PerceptronResult:
    """What :func:`structured_perceptron` returns.

    ``weights``: the returned vector (the average when ``averaged=True``, else the last iterate); ``last`` and
    ``average`` both.  ``path``: ``[T + 1, d]``, ``w`` before the first step and after every step (Figure 4).
    ``mistakes``: mistakes per epoch; ``converged``: an epoch ended without a mistake (the data are separated by
    ``last`` under the MAP routine).  ``update_vectors`` ``[K, d]``: ``Phi(x, z_i) - Phi(x, z)`` of the ``K``
    updates (unscaled), ``update_examples`` their example indices, ``fractional_updates`` how many used a fractional
    prediction."""

    weights: np.ndarray
    last: np.ndarray
    average: np.ndarray
    path: np.ndarray
    mistakes: list[int]
    converged: bool
    epochs: int
    steps: int
    update_vectors: np.ndarray
    update_examples: list[int] = field(default_factory=list)
    fractional_updates: int = 0

    @property
    def total_mistakes(self) -> int:
        return int(sum(self.mistakes))


@dataclass
class MistakeBound:
    """Theorem 1's quantities, bracketed: ``gamma_lower <= gamma <= gamma_upper`` and ``R_lower <= R <= R_upper``,
    so ``R^2 / gamma^2`` lies in ``[bound_lower, bound_upper]`` (see :func:`lp_mistake_bound`).  Without a positive
    margin there is no bound: ``bound_upper`` is ``inf`` when ``gamma_lower <= 0`` and ``bound_lower`` is ``inf`` when
    ``gamma_upper <= 0`` (then ``gamma <= 0``: the data are not separable with a margin by ``w_star``)."""

    gamma_lower: float
    gamma_upper: float
    radius_lower: float
    radius_upper: float

    @property
    def bound_lower(self) -> float:
        ratio = self.radius_lower / self.gamma_upper if self.gamma_upper > 0 else float("inf")
        return ratio * ratio                           # inf, not an OverflowError, beyond the float range

    @property
    def bound_upper(self) -> float:
        ratio = self.radius_upper / self.gamma_lower if self.gamma_lower > 0 else float("inf")
        return ratio * ratio


def _check_examples(examples: object) -> list[tuple[Any, Any]]:
    if not isinstance(examples, Sequence) or isinstance(examples, str):
        raise TypeError(f"examples must be a sequence of (x, gold) pairs, got {type(examples).__name__}")
    if len(examples) == 0:
        raise ValueError("examples is empty")
    out = []
    for k, ex in enumerate(examples):
        if not isinstance(ex, (tuple, list)) or len(ex) != 2:
            raise ValueError(f"examples[{k}] must be an (x, gold) pair, got {type(ex).__name__}")
        out.append((ex[0], ex[1]))
    return out


def _as_array(z: object) -> np.ndarray:
    """``z`` as a NumPy array (a torch tensor copied off its device)."""
    if type(z).__module__.startswith("torch"):
        z = z.detach().cpu().numpy()  # type: ignore[attr-defined]
    return np.asarray(z)


def _as_labels(z: object) -> np.ndarray | None:
    """Integer labels from an integral prediction, ``None`` for a fractional one."""
    if isinstance(z, MAPResult):
        return z.labels if z.integral else None
    if isinstance(z, LocalMarginals):
        return z.argmax() if z.is_integral() else None
    arr = _as_array(z)
    if arr.ndim == 2 and arr.shape[0] == 1:                 # an oracle's [1, N] output
        arr = arr[0]
    if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"a prediction must be integer labels, LocalMarginals or a MAPResult, got {z!r}")
    n = int(np.argmax(arr < 0)) if (arr < 0).any() else arr.size
    if (arr[n:] != -1).any():
        raise ValueError(f"a prediction must hold labels >= 0, followed only by the oracles' -1 padding, got "
                         f"{arr.tolist()}")
    return arr[:n].astype(np.int64)                         # drop the oracles' -1 padding


def _gold_labels(k: int, x: object, gold: object) -> np.ndarray:
    """The gold labelling of ``examples[k] = (x, gold)``: integer labels, all of them >= 0 (no padding to drop),
    and, for a :class:`~betheproj.mrf.LinearPairwiseMRF` input ``x``, one per node inside its label set (checked by
    the MRF's own ``check_labelling``; other inputs do not say their label sets)."""
    if isinstance(gold, (MAPResult, LocalMarginals)):
        labels = _as_labels(gold)
        if labels is None:
            raise ValueError(f"examples[{k}]: the gold labelling must be integral")
    else:
        arr = _as_array(gold)
        if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
            raise TypeError(f"examples[{k}]: the gold labelling must be a 1-D array of integer labels, got {gold!r}")
        if (arr < 0).any():
            raise ValueError(f"examples[{k}]: the gold labelling must hold labels >= 0, got {arr.tolist()}")
        labels = arr.astype(np.int64)
    if isinstance(x, LinearPairwiseMRF):
        labels = x.structure.check_labelling(labels, f"examples[{k}]: the gold labelling")
    return labels


def _default_features(x: Any, z: Any) -> np.ndarray:
    if not hasattr(x, "features"):
        raise TypeError(f"x of type {type(x).__name__} has no features(z) method; pass features=")
    if not isinstance(z, (MAPResult, LocalMarginals)):
        z = _as_labels(z)
    return np.asarray(x.features(z), dtype=np.float64)


def _check_map_fn(map_fn: object) -> None:
    if not callable(map_fn):
        raise TypeError(f"map_fn must be callable (x, w) -> prediction, got {type(map_fn).__name__}")


def structured_perceptron(examples: Sequence[tuple[Any, Any]], map_fn: MapFn, *, epochs: int = 10,
                          averaged: bool = False, step: float = 1.0, initial: np.ndarray | None = None,
                          features: Callable[[Any, Any], np.ndarray] | None = None,
                          num_features: int | None = None, shuffle: bool = False, seed: int | None = None,
                          stop_when_separated: bool = True) -> PerceptronResult:
    """Run the structured perceptron (Collins 2002; see the module docstring) for at most ``epochs`` passes.

    ``examples``: ``(x, gold)`` pairs, ``gold`` label indices.  ``map_fn(x, w)``: the MAP routine.
    ``features(x, z)``: ``Phi`` (default ``x.features(z)``, e.g. :meth:`LinearPairwiseMRF.features`, which gives the
    expected features of a fractional ``z``); a given one is called with the gold labels (an int array) and with
    the prediction exactly as ``map_fn`` returned it.  ``num_features``: ``d`` (default: from ``x.num_features`` or
    ``initial``).  ``shuffle``: visit the examples in a fresh random order each epoch.  ``stop_when_separated``:
    stop after the first epoch without a mistake."""
    data = _check_examples(examples)
    _check_map_fn(map_fn)
    epochs, step = check_count("epochs", epochs), check_positive("step", step)
    averaged, shuffle = check_bool("averaged", averaged), check_bool("shuffle", shuffle)
    stop_when_separated = check_bool("stop_when_separated", stop_when_separated)
    feat = features or _default_features
    if initial is not None:
        try:
            w = np.array(_as_array(initial), dtype=np.float64)
        except (TypeError, ValueError) as err:
            raise TypeError(f"initial must be a 1-D vector of weights, got {type(initial).__name__}") from err
        if w.ndim != 1 or not np.isfinite(w).all():
            raise ValueError(f"initial must be a finite 1-D weight vector, got shape {w.shape}")
        if num_features is not None and w.shape != (check_count("num_features", num_features),):
            raise ValueError(f"initial must have shape ({num_features},), got {w.shape}")
    else:
        if num_features is not None:
            d = check_count("num_features", num_features)
        else:
            found = getattr(data[0][0], "num_features", None)
            if isinstance(found, bool) or not isinstance(found, (int, np.integer)) or found < 1:
                raise ValueError("cannot tell the number of features: pass num_features or initial")
            d = int(found)
        w = np.zeros(d)
    rng = np.random.default_rng(None if seed is None else check_seed("seed", seed))
    golds = [_gold_labels(k, x, g) for k, (x, g) in enumerate(data)]
    path = [w.copy()]
    total = np.zeros_like(w)
    mistakes: list[int] = []
    updates: list[np.ndarray] = []
    update_examples: list[int] = []
    fractional = 0
    converged = False
    steps = 0
    for _epoch in range(int(epochs)):
        order = rng.permutation(len(data)) if shuffle else range(len(data))
        m = 0
        for k in order:
            x, gold = data[k]
            z = map_fn(x, w.copy())
            labels = _as_labels(z)
            wrong = labels is None or labels.shape != golds[k].shape or bool(np.any(labels != golds[k]))
            if wrong:
                phi_gold, phi_z = (np.asarray(feat(x, v), dtype=np.float64) for v in (golds[k], z))
                if not (np.isfinite(phi_gold).all() and np.isfinite(phi_z).all()):
                    raise ValueError(f"features returned non-finite values for examples[{k}]")
                if phi_gold.shape != w.shape or phi_z.shape != w.shape:
                    shape = phi_gold.shape if phi_gold.shape != w.shape else phi_z.shape
                    raise ValueError(f"features returned shape {shape}, the weights have {w.shape}")
                with np.errstate(over="ignore", invalid="ignore"):
                    delta = phi_gold - phi_z
                    w = w + step * delta
                if not np.isfinite(w).all():
                    raise ValueError(f"the weights overflow float64 after an update on examples[{k}]: rescale the "
                                     "features or the step")
                updates.append(delta)
                update_examples.append(int(k))
                fractional += labels is None
                m += 1
            steps += 1
            total += w
            path.append(w.copy())
        mistakes.append(m)
        if m == 0:
            converged = True
            if stop_when_separated:
                break
    average = total / max(steps, 1)
    return PerceptronResult(weights=average if averaged else w, last=w, average=average, path=np.array(path),
                            mistakes=mistakes, converged=converged, epochs=len(mistakes), steps=steps,
                            update_vectors=np.array(updates).reshape(len(updates), w.size),
                            update_examples=update_examples, fractional_updates=int(fractional))


def predict(examples: Sequence[tuple[Any, Any]], map_fn: MapFn, w: np.ndarray) -> list[bool]:
    """Whether ``map_fn(x, w)`` returns exactly the gold labelling, per example (fractional = wrong)."""
    data = _check_examples(examples)
    _check_map_fn(map_fn)
    try:
        w = np.array(_as_array(w), dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise TypeError(f"w must be a vector of weights, got {type(w).__name__}") from err
    out = []
    for k, (x, gold) in enumerate(data):
        labels = _as_labels(map_fn(x, w.copy()))
        g = _gold_labels(k, x, gold)
        out.append(labels is not None and labels.shape == g.shape and bool(np.all(labels == g)))
    return out


def mrf_map(method: str = "exact", **options: Any) -> MapFn:
    """A MAP routine ``(x, w) -> MAPResult`` for :class:`~betheproj.mrf.LinearPairwiseMRF` inputs:
    ``method`` ``"exact"`` (:func:`~betheproj.mrf.exact_map`), ``"lp"`` (:func:`~betheproj.mrf.lp_map`, fractional
    ``mu`` returned as is) or ``"lbp"`` (:func:`~betheproj.mrf.lbp_map`); ``options`` go to that routine."""
    routines: dict[str, Callable[..., MAPResult]] = {"exact": exact_map, "lp": lp_map, "lbp": lbp_map}
    if method not in routines:
        raise ValueError(f"method must be one of {tuple(routines)}, got {method!r}")
    fn = routines[method]

    def run(x: LinearPairwiseMRF, w: np.ndarray) -> MAPResult:
        if not isinstance(x, LinearPairwiseMRF):
            raise TypeError(f"x must be a LinearPairwiseMRF, got {type(x).__name__}")
        return fn(x.potentials(w), **options)

    run.__name__ = f"mrf_map_{method}"
    return run


def oracle_map(oracle: Any, parents: Sequence[int] | None = None) -> MapFn:
    """A MAP routine from a chain or tree oracle's ``map(PairwisePotentials)`` (e.g. :class:`~betheproj.LinearChain`,
    :class:`~betheproj.Tree`) for :class:`~betheproj.mrf.LinearPairwiseMRF` inputs whose graph is that chain or
    tree (``parents``; default: the oracle's own ``parents`` if it has them, else the chain
    ``0 - 1 - ... - N-1``).  Returns label indices."""
    if not callable(getattr(oracle, "map", None)):
        raise TypeError(f"oracle must have a map(PairwisePotentials) method, got {type(oracle).__name__}")
    if parents is None and hasattr(oracle, "parents"):
        parents = [int(p) for p in oracle.parents]
    elif parents is not None and not isinstance(parents, str | np.ndarray):
        parents = list(parents)                             # run() reads it once per example

    def run(x: LinearPairwiseMRF, w: np.ndarray) -> np.ndarray:
        if not isinstance(x, LinearPairwiseMRF):
            raise TypeError(f"x must be a LinearPairwiseMRF, got {type(x).__name__}")
        pot = x.potentials(w).to_pairwise_potentials(parents)
        return oracle.map(pot)[0].cpu().numpy().astype(np.int64)

    run.__name__ = f"oracle_map_{type(oracle).__name__}"
    return run


def lp_mistake_bound(examples: Sequence[tuple[LinearPairwiseMRF, Any]], w_star: np.ndarray) -> MistakeBound:
    """Theorem 1 (Kulesza & Pereira 2007, section 5.1) for LP-relaxed inference: brackets of the margin
    ``gamma = min_i min_{z in Z'(x_i) \\ {z_i}} u . (Phi(x_i, z_i) - Phi(x_i, z))`` with ``u = w_star / ||w_star||``
    and of the radius ``R = max_i max_{z in Z'(x_i)} ||Phi(x_i, z_i) - Phi(x_i, z)||``, from
    :func:`~betheproj.mrf.lp_margin_bounds` and :func:`~betheproj.mrf.lp_radius_bounds` (binary label sets,
    models small enough to enumerate).  The perceptron with LP-relaxed inference makes at most ``R^2/gamma^2``
    mistakes, which lies in ``[bound_lower, bound_upper]``."""
    data = _check_examples(examples)
    g_lo, g_hi, r_lo, r_hi = np.inf, np.inf, 0.0, 0.0
    for x, gold in data:
        lo, hi = lp_margin_bounds(x, gold, w_star)
        g_lo, g_hi = min(g_lo, lo), min(g_hi, hi)
        lo, hi = lp_radius_bounds(x, gold)
        r_lo, r_hi = max(r_lo, lo), max(r_hi, hi)
    return MistakeBound(float(g_lo), float(g_hi), float(r_lo), float(r_hi))
