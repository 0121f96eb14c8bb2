"""The handwriting-recognition experiment of section 8.2 (Table 3): 10 folds, train on 9, test on 1.

Rows, each scored by character accuracy on the test fold:

- ``2-gram``: the base linear-chain CRF (pixels and a bias on the nodes, one transition matrix), maximum
  likelihood by L-BFGS;
- ``L^u`` / ``L^u (MM)``: the CRF plus the unigram nearest-prototype energy (21), ``psi`` a learned constant /
  linear in the random-Fourier mean map of the word's images; solved to its global minimum like the word
  rows (``OCRConfig.unigram_search``, ``"global"``; ``"local"`` runs Bethe-RDA from the base marginals);
- ``L^w`` / ``L^w (MM)``: the same with the word energy (22), solved to its global minimum over the
  prototypes (:func:`betheproj.inference.solve_global`);
- ``55-class``: logistic regression over the training words on the mean-map features, each word choosing
  only among the training words of its length.

Prototypes are the distinct words of the training folds.  The energy rows start from the 2-gram CRF and learn
theta and psi jointly with Algorithm 3.  Nothing of the test fold is used before it is scored.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from .._checks import (
    check_bool,
    check_count,
    check_device,
    check_increasing_counts,
    check_int,
    check_log,
    check_nonnegative,
    check_positive,
    check_real,
    check_seed,
    check_type,
)
from ..data.ocr import OCRData
from ..energies import NearestPrototype
from ..inference import Solution, decode
from ..learning import ConstantPsi, LinearChainCRF, MeanMapPsi, NonLocalCRF, character_accuracy, fit_crf
from ..learning.psi import RandomFourierFeatures
from ..progress import progress_bar
from ._plot import figure

__all__ = ["ROWS", "PAPER", "YARDSTICKS", "OCRConfig", "word_prototypes", "unigram_prototypes",
           "median_bandwidth", "check_folds", "WordClassifier", "energy_model", "run_fold", "run", "format_table",
           "plot_iterations", "plot_histogram"]

NUM_LABELS = 26
ROWS = {"2gram": "2-gram", "Lu": "L^u", "Lu-mm": "L^u (MM)", "Lw": "L^w", "Lw-mm": "L^w (MM)",
        "55class": "55-class"}
PAPER = {"2gram": 84.93, "Lu": 94.01, "Lu-mm": 94.96, "Lw": 98.26, "Lw-mm": 98.83, "55class": 86.06,
         "cascades": 98.54}
YARDSTICKS = {"CRFsuite (2-gram)": 87.16, "hard snap of CRFsuite marginals": 99.45}
ENERGY_ROWS = ("Lu", "Lu-mm", "Lw", "Lw-mm")


@dataclass
class OCRConfig:
    """Hyper-parameters of every row (defaults: the ones the README's table was measured with)."""

    crf_l2: float = 1e-4             # base CRF: L2 on the mean NLL, full-batch L-BFGS
    crf_iter: int = 150
    psi_init: float = 5.0            # initial psi (constant, or the mean map's bias)
    rff_features: int = 1000         # random Fourier features of the mean map
    bandwidth: float | None = None   # RBF bandwidth of every mean map; None: a scale x the median letter distance
    bandwidth_scale: float = 1.0     # ... for psi(x) of the MM rows
    classifier_bandwidth_scale: float = 0.5   # ... for the 55-class classifier
    word_batch: int = 256            # Algorithm 3 for L^w: minibatch, Adam rates, solver iterations
    word_lr: float = 3e-3
    word_psi_lr: float = 0.1
    word_train_iter: int = 10
    word_average: bool = True        # return the mean of Algorithm 3's iterates (chosen by nested validation)
    unigram_batch: int = 64          # Algorithm 3 for L^u
    unigram_lr: float = 2e-3
    unigram_psi_lr: float = 0.05
    unigram_train_iter: int = 10
    unigram_search: str = "global"   # "global": every same-length prototype's piece; "local": from the base
    epochs: int = 1
    test_iters: tuple[int, ...] = (1, 2, 5, 10, 20, 50, 100)   # Figure 1's x axis; the last is the row's
    classifier_l2: float = 1e-6
    classifier_iter: int = 500
    seed: int = 0

    def __post_init__(self) -> None:
        """Every field checked here, not minutes into a fold under an internal argument's name, and kept as the
        Python value its check returns (a NumPy or 0-d tensor scalar would make the results no JSON)."""
        for name in ("crf_iter", "rff_features", "word_batch", "word_train_iter", "unigram_batch",
                     "unigram_train_iter", "epochs", "classifier_iter"):
            setattr(self, name, check_count(name, getattr(self, name)))
        for name in ("crf_l2", "classifier_l2"):
            setattr(self, name, check_nonnegative(name, getattr(self, name)))
        for name in ("bandwidth_scale", "classifier_bandwidth_scale", "word_lr", "word_psi_lr", "unigram_lr",
                     "unigram_psi_lr"):
            setattr(self, name, check_positive(name, getattr(self, name)))
        self.psi_init = check_real("psi_init", self.psi_init)
        if self.bandwidth is not None:
            self.bandwidth = check_positive("bandwidth", self.bandwidth)
        self.word_average = check_bool("word_average", self.word_average)
        self.seed = check_seed("seed", self.seed)
        if self.unigram_search not in ("global", "local"):
            raise ValueError(f"unigram_search must be 'global' or 'local', got {self.unigram_search!r}")
        self.test_iters = check_increasing_counts("test_iters", self.test_iters)


def word_prototypes(labels: Tensor, lengths: Tensor, num_labels: int = NUM_LABELS) -> tuple[Tensor, Tensor]:
    """The distinct words of a labelled set as one-hot prototypes ``[P, N, C]`` and their lengths ``[P]``."""
    num_labels = check_count("num_labels", num_labels)
    check_type("labels", labels, Tensor, "a tensor [W, N]")
    check_type("lengths", lengths, Tensor, "a tensor [W]")
    if labels.dim() != 2 or lengths.shape != labels.shape[:1]:
        raise ValueError(f"labels [W, N] and lengths [W] must agree: labels have shape {tuple(labels.shape)}, "
                         f"lengths must have shape ({labels.shape[0] if labels.dim() else 0},), got "
                         f"{tuple(lengths.shape)}")
    if lengths.numel() == 0:
        raise ValueError("labels hold no words: prototypes are the distinct words of a non-empty set")
    if int(lengths.min()) < 1 or int(lengths.max()) > labels.shape[1]:
        raise ValueError(f"lengths must lie in [1, {labels.shape[1]}] (the labels' width), got values in "
                         f"{int(lengths.min())}..{int(lengths.max())}")
    inside = labels[torch.arange(labels.shape[1], device=lengths.device) < lengths[:, None]]
    if int(inside.min()) < 0 or int(inside.max()) >= num_labels:       # -1: padding inside a word's length
        raise ValueError(f"labels must lie in 0..{num_labels - 1} inside each word's length, got values in "
                         f"{int(inside.min())}..{int(inside.max())}")
    distinct = {tuple(y[:n].tolist()) for y, n in zip(labels, lengths.tolist(), strict=True)}
    words = sorted(distinct, key=lambda w: (len(w), w))
    width = max(len(w) for w in words)
    protos = torch.zeros(len(words), width, num_labels)
    for i, w in enumerate(words):
        protos[i, torch.arange(len(w)), torch.tensor(w)] = 1.0
    return protos.to(labels.device), torch.tensor([len(w) for w in words], device=labels.device)


def unigram_prototypes(labels: Tensor, lengths: Tensor, num_labels: int = NUM_LABELS) -> Tensor:
    """The distinct label-count vectors ``U(y)`` of a labelled set, ``[P, C]``."""
    protos, _ = word_prototypes(labels, lengths, num_labels)
    return torch.unique(protos.sum(1), dim=0)


def median_bandwidth(pixels: Tensor, lengths: Tensor, sample: int = 2000, seed: int = 0) -> float:
    """The median heuristic: the median Euclidean distance between letter images sampled from the set."""
    sample = check_count("sample", sample, 2)               # a median distance needs two letters
    check_type("pixels", pixels, Tensor, "a tensor [W, N, D]")
    check_type("lengths", lengths, Tensor, "a tensor [W]")
    if pixels.dim() != 3 or lengths.shape != pixels.shape[:1]:
        raise ValueError(f"pixels [W, N, D] and lengths [W] must agree, got shapes {tuple(pixels.shape)} and "
                         f"{tuple(lengths.shape)}")
    mask = torch.arange(pixels.shape[1], device=lengths.device) < lengths[:, None]
    letters = pixels[mask]
    gen = torch.Generator().manual_seed(check_seed("seed", seed))
    letters = letters[torch.randperm(letters.shape[0], generator=gen)[:sample].to(letters.device)].double()
    dist = torch.cdist(letters, letters)
    return float(dist[torch.triu(torch.ones_like(dist, dtype=torch.bool), 1)].median())


class WordClassifier(nn.Module):
    """The constrained 55-class baseline: softmax regression from the mean map to the training words, each
    input choosing only among the words of its own length."""

    prototypes: Tensor                               # buffers: one-hot words [P, N, C] and their lengths [P]
    prototype_lengths: Tensor

    def __init__(self, features: RandomFourierFeatures, prototypes: Tensor, prototype_lengths: Tensor):
        super().__init__()
        check_type("features", features, RandomFourierFeatures)
        check_type("prototypes", prototypes, Tensor, "a tensor")
        check_type("prototype_lengths", prototype_lengths, Tensor, "a tensor")
        if prototypes.dim() != 3 or prototypes.shape[2] != NUM_LABELS:
            raise ValueError(f"prototypes must be one-hot words [P, N, {NUM_LABELS}], got {tuple(prototypes.shape)}")
        if prototype_lengths.shape != prototypes.shape[:1]:
            raise ValueError(f"prototype_lengths must have shape ({prototypes.shape[0]},), got "
                             f"{tuple(prototype_lengths.shape)}")
        self.features = features
        self.register_buffer("prototypes", prototypes)
        self.register_buffer("prototype_lengths", prototype_lengths)
        self.linear = nn.Linear(features.weight.shape[1], prototypes.shape[0])
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def mean_map(self, pixels: Tensor, lengths: Tensor) -> Tensor:
        mask = (torch.arange(pixels.shape[1], device=lengths.device) < lengths[:, None]).to(pixels.dtype)
        return (self.features(pixels) * mask[..., None]).sum(1) / lengths.clamp(min=1)[:, None].to(pixels.dtype)

    def logits(self, pixels: Tensor, lengths: Tensor, mean_map: Tensor | None = None) -> Tensor:
        scores = self.linear(self.mean_map(pixels, lengths) if mean_map is None else mean_map)
        allowed = self.prototype_lengths[None, :] == lengths[:, None]
        unmatched = (~allowed.any(-1)).nonzero().flatten().tolist()
        if unmatched:
            raise ValueError(f"lengths: no prototype word has the length of words {unmatched[:10]} "
                             f"(lengths {sorted(set(lengths[unmatched].tolist()))[:10]})")
        return scores.masked_fill(~allowed, float("-inf"))

    def fit(self, pixels: Tensor, labels: Tensor, lengths: Tensor, l2: float = 1e-3, max_iter: int = 200
            ) -> WordClassifier:
        n = max(self.prototypes.shape[1], labels.shape[1])
        onehot = torch.zeros(labels.shape[0], n, NUM_LABELS, device=labels.device)
        valid = torch.arange(labels.shape[1], device=lengths.device) < lengths[:, None]
        onehot[:, :labels.shape[1]][valid] = nn.functional.one_hot(labels[valid], NUM_LABELS).float()
        protos = nn.functional.pad(self.prototypes, (0, 0, 0, n - self.prototypes.shape[1]))
        matches = (onehot[:, None] == protos[None]).all(-1).all(-1)
        unmatched = (~matches.any(-1)).nonzero().flatten().tolist()
        if unmatched:
            raise ValueError(f"labels: training words {unmatched[:10]} are none of the prototypes (the classifier "
                             "chooses among the prototype words; build them from the training words)")
        target = matches.float().argmax(-1)
        opt = torch.optim.LBFGS(list(self.linear.parameters()), max_iter=max_iter, history_size=20,
                                line_search_fn="strong_wolfe")
        z = self.mean_map(pixels, lengths)

        def closure() -> Tensor:
            opt.zero_grad()
            loss = nn.functional.cross_entropy(self.logits(pixels, lengths, z), target)
            loss = loss + 0.5 * l2 * (self.linear.weight ** 2).sum()
            loss.backward()
            return loss

        opt.step(closure)
        return self

    @torch.no_grad()
    def predict(self, pixels: Tensor, lengths: Tensor) -> Tensor:
        words = self.prototypes[self.logits(pixels, lengths).argmax(-1)].argmax(-1)
        valid = torch.arange(words.shape[1], device=lengths.device) < lengths[:, None]
        words = torch.where(valid, words, torch.full_like(words, -1))
        return nn.functional.pad(words, (0, max(0, pixels.shape[1] - words.shape[1])), value=-1)[:, :pixels.shape[1]]


@dataclass
class FoldResult:
    """One test fold: accuracy (%) and seconds (training and testing) per row; for the energy rows, the
    accuracy at each maximum number of test iterations and the iterations each test word took."""

    fold: int
    accuracy: dict[str, float] = field(default_factory=dict)
    train_seconds: dict[str, float] = field(default_factory=dict)
    test_seconds: dict[str, float] = field(default_factory=dict)
    curve: dict[str, list[float]] = field(default_factory=dict)
    iterations: dict[str, list[int]] = field(default_factory=dict)
    psi: dict[str, float] = field(default_factory=dict)
    bandwidth: float = 0.0


def energy_model(key: str, base: LinearChainCRF, protos: Tensor, proto_lengths: Tensor, unigrams: Tensor,
                 config: OCRConfig, bandwidth: float) -> tuple[NonLocalCRF, dict[str, Any]]:
    """The non-local model of row ``key`` (``Lu``, ``Lu-mm``, ``Lw``, ``Lw-mm``) on a copy of ``base``, and the
    options of Algorithm 3 (:func:`~betheproj.learning.train.fit_doubly_stochastic`) that train it."""
    if key not in ENERGY_ROWS:
        raise ValueError(f"key must be one of {ENERGY_ROWS}, got {key!r}")
    word = key.startswith("Lw")
    if word:
        def energy(psi: Tensor) -> NearestPrototype:
            return NearestPrototype(protos, psi, "word", proto_lengths)
    else:
        unigram_lengths = unigrams.sum(-1).round().long() if config.unigram_search == "global" else None

        def energy(psi: Tensor) -> NearestPrototype:
            return NearestPrototype(unigrams, psi, "unigram", unigram_lengths)
    psi: MeanMapPsi | ConstantPsi
    if key.endswith("mm"):
        psi = MeanMapPsi(base.node.in_features, config.rff_features, bandwidth, config.psi_init, seed=config.seed)
    else:
        psi = ConstantPsi(config.psi_init)
    model = NonLocalCRF(copy.deepcopy(base), energy, psi, method="rda", max_iter=config.test_iters[-1],
                        search="global" if word else config.unigram_search)
    if word:
        options = dict(batch_size=config.word_batch, lr=config.word_lr, psi_lr=config.word_psi_lr,
                       train_iter=config.word_train_iter, average=config.word_average)
    else:
        options = dict(batch_size=config.unigram_batch, lr=config.unigram_lr, psi_lr=config.unigram_psi_lr,
                       train_iter=config.unigram_train_iter)
    return model, options


def _check_config(config: object) -> OCRConfig:
    """``config``, an :class:`OCRConfig` (``None``: the defaults); a dict of settings is ``OCRConfig(**settings)``."""
    if config is None:
        return OCRConfig()
    if not isinstance(config, OCRConfig):
        raise TypeError(f"config must be an OCRConfig or None, got {type(config).__name__} (a dict of settings: "
                        "OCRConfig(**settings))")
    return config


def _mean_psi(model: NonLocalCRF, pixels: Tensor, lengths: Tensor) -> float:
    assert model.psi is not None                 # an energy row's model: its psi comes with the energy
    with torch.no_grad():
        return float(model.psi(pixels, lengths).mean())


def _solve(model: NonLocalCRF, pixels: Tensor, lengths: Tensor, max_iter: int) -> Solution:
    """``model.infer``, never None for an energy row's model (it has an energy)."""
    sol = model.infer(pixels, lengths, max_iter)
    assert sol is not None
    return sol


def _check_rows(rows: object) -> list[str]:
    """``rows``, which must be a sequence of row names of :data:`ROWS`, at least one, each once."""
    if isinstance(rows, str) or not isinstance(rows, Sequence):
        raise TypeError(f"rows must be a sequence of row names among {tuple(ROWS)} (e.g. ['2gram']), got "
                        f"{type(rows).__name__} {rows!r}")
    unknown = [r for r in rows if not isinstance(r, str) or r not in ROWS]
    if unknown:
        raise ValueError(f"rows must be among {tuple(ROWS)}, got {unknown}")
    if not rows:
        raise ValueError("rows must name at least one row (with none, each fold trained its base CRF for nothing)")
    if len(set(rows)) != len(rows):
        raise ValueError(f"rows must name each row once (a repeated row would be listed twice in the table), got "
                         f"{list(rows)}")
    return list(rows)


def _check_data(data: object) -> None:
    if not isinstance(data, OCRData):
        raise TypeError(f"data must be an OCRData (as load_ocr returns), got {type(data).__name__}")


def run_fold(data: OCRData, fold: int, rows: Sequence[str] = tuple(ROWS), config: OCRConfig | None = None,
             progress: bool = False, log: Callable[[str], None] | None = None,
             device: str | torch.device = "cpu") -> FoldResult:
    """Train every row on the folds other than ``fold`` and score it on ``fold``, on ``device`` (e.g. ``"cuda"``:
    the same random draws, which come from seeded CPU generators; the figures differ in rounding)."""
    config = _check_config(config)
    device = check_device("device", device)
    fold = check_int("fold", fold)
    rows = _check_rows(rows)
    check_log(log)
    _check_data(data)
    if not bool((data.folds == fold).any()):
        raise ValueError(f"fold {fold} has no words (folds present: {sorted(set(data.folds.tolist()))})")
    check_folds(data, [fold], rows)              # the 55-class row's lengths, before the fold's first row trains
    torch.manual_seed(config.seed)
    train, test = data.subset(data.folds != fold), data.subset(data.folds == fold)
    x, y, n = (t.to(device) for t in (train.pixels, train.labels, train.lengths))
    tx, ty, tn = (t.to(device) for t in (test.pixels, test.labels, test.lengths))
    result = FoldResult(fold)
    median = median_bandwidth(x, n, seed=config.seed)
    fixed = config.bandwidth                     # None: a scale x the median distance
    kernel_rows = ("Lu-mm", "Lw-mm", "55class")
    if fixed is None and not median > 0 and any(r in rows for r in kernel_rows):     # 0, or NaN for one letter
        raise ValueError(f"fold {fold}: the training letters are mostly identical or fewer than two (their median "
                         f"distance, which scales the RBF bandwidth of the {', '.join(kernel_rows[:-1])} and "
                         f"{kernel_rows[-1]} rows, is {median}): leave those rows out")
    result.bandwidth = config.bandwidth_scale * median if fixed is None else fixed
    classifier_bandwidth = config.classifier_bandwidth_scale * median if fixed is None else fixed

    start = time.perf_counter()
    base = LinearChainCRF(x.shape[-1], NUM_LABELS).to(device)
    fit_crf(base, x, y, n, l2=config.crf_l2, max_iter=config.crf_iter, progress=progress)
    base_seconds = time.perf_counter() - start
    if "2gram" in rows:
        start = time.perf_counter()
        base_model = NonLocalCRF(base)
        result.accuracy["2gram"] = 100 * character_accuracy(base_model.predict(tx, tn), ty, tn)
        result.train_seconds["2gram"], result.test_seconds["2gram"] = base_seconds, time.perf_counter() - start
        if log:
            log(f"fold {fold} 2-gram: {result.accuracy['2gram']:.2f}%")

    protos, proto_lengths = word_prototypes(y, n)
    unigrams = unigram_prototypes(y, n)
    for key in (r for r in ENERGY_ROWS if r in rows):
        model, options = energy_model(key, base, protos, proto_lengths, unigrams, config, result.bandwidth)
        model.to(device)
        start = time.perf_counter()
        model.fit(x, y, n, epochs=config.epochs, seed=config.seed, progress=progress, **options)
        result.train_seconds[key] = base_seconds + time.perf_counter() - start
        start = time.perf_counter()
        curve = []
        for iters in config.test_iters:
            sol = _solve(model, tx, tn, iters)
            curve.append(100 * character_accuracy(decode(model.oracle, sol), ty, tn))
        result.test_seconds[key] = time.perf_counter() - start
        result.curve[key], result.accuracy[key] = curve, curve[-1]
        result.iterations[key] = sol.iterations.tolist()
        result.psi[key] = _mean_psi(model, tx, tn)
        if log:
            log(f"fold {fold} {ROWS[key]}: {curve[-1]:.2f}% (mean psi {result.psi[key]:.2f})")

    if "55class" in rows:
        start = time.perf_counter()
        rff = RandomFourierFeatures(x.shape[-1], config.rff_features, classifier_bandwidth, config.seed)
        clf = WordClassifier(rff, protos, proto_lengths).to(device)
        clf.fit(x, y, n, config.classifier_l2, config.classifier_iter)
        result.train_seconds["55class"] = time.perf_counter() - start
        start = time.perf_counter()
        result.accuracy["55class"] = 100 * character_accuracy(clf.predict(tx, tn), ty, tn)
        result.test_seconds["55class"] = time.perf_counter() - start
        if log:
            log(f"fold {fold} 55-class: {result.accuracy['55class']:.2f}%")
    return result


def check_folds(data: OCRData, folds: Sequence[int], rows: Sequence[str] = ()) -> None:
    """``ValueError`` unless ``folds`` names at least one fold, each once, and every one of them holds words and
    leaves some to train on; with the 55-class row among ``rows``, unless each fold's words have lengths its training
    words have (its classes are the training words: a test word of another length has none, an error only met after
    the other rows)."""
    _check_data(data)
    if isinstance(folds, str) or not isinstance(folds, Sequence):
        raise TypeError(f"folds must be a sequence of fold numbers (e.g. [0, 1]), got {type(folds).__name__} {folds!r}")
    folds = [check_int(f"folds[{i}]", f) for i, f in enumerate(folds)]
    if not folds:
        raise ValueError("folds must name at least one fold")
    if len(set(folds)) != len(folds):
        raise ValueError(f"folds must name each fold once (a repeated fold would count twice in the means), got "
                         f"{list(folds)}")
    present = set(data.folds.tolist())
    missing = [f for f in folds if f not in present]
    if missing:
        raise ValueError(f"folds {missing} have no words (folds present: {sorted(present)})")
    if len(present) == 1:                        # a fold trains on the others
        raise ValueError(f"fold {folds[0]} holds every word of the data: no word is left to train on (folds present: "
                         f"{sorted(present)})")
    if "55class" in rows:
        for fold in folds:
            test = data.folds == fold
            unseen = set(data.lengths[test].tolist()) - set(data.lengths[~test].tolist())
            if unseen:
                raise ValueError(f"fold {fold} has words of lengths {sorted(unseen)} that no word of the other folds "
                                 f"has: the 55-class row has no class for them (leave the row out)")


def run(data: OCRData, folds: Sequence[int] = tuple(range(10)), rows: Sequence[str] = tuple(ROWS),
        config: OCRConfig | None = None, progress: bool = False,
        log: Callable[[str], None] | None = None, device: str | torch.device = "cpu") -> dict[str, Any]:
    """Every requested fold (on ``device``); returns a JSON-ready dict with the per-fold results and the means."""
    config = _check_config(config)
    device = check_device("device", device)
    rows = _check_rows(rows)
    check_log(log)
    check_folds(data, folds, rows)               # before any training, not after the folds before it
    start = time.perf_counter()
    results = []
    bar = progress_bar(len(folds), progress, "OCR folds", leave=True)
    for fold in folds:
        results.append(run_fold(data, fold, rows, config, progress, log, device))
        bar.update(1)
    bar.close()
    mean = {r: sum(f.accuracy[r] for f in results) / len(results) for r in rows}
    return {"folds": [asdict(f) for f in results], "mean": mean, "rows": list(rows), "config": asdict(config),
            "paper": PAPER, "yardsticks": YARDSTICKS, "seconds": time.perf_counter() - start,
            "threads": torch.get_num_threads(), "device": str(device)}


def format_table(results: dict[str, Any]) -> str:
    """Table 3's layout: each row's mean accuracy over the folds beside the paper's and the yardsticks."""
    check_type("results", results, dict, "the dict run() returns")
    folds = results["folds"]
    lines = [f"Character accuracy (%), {len(folds)} fold(s) (train on the others, test on one)",
             f"{'model':<34}{'ours':>8}{'min':>8}{'max':>8}{'paper':>8}{'train s':>9}",
             "-" * 75]
    for key in results["rows"]:
        accs = [f["accuracy"][key] for f in folds]
        secs = sum(f["train_seconds"][key] for f in folds) / len(folds)
        lines.append(f"{ROWS[key]:<34}{results['mean'][key]:>8.2f}{min(accs):>8.2f}{max(accs):>8.2f}"
                     f"{PAPER[key]:>8.2f}{secs:>9.1f}")
    lines.append(f"{'cascades (6-gram), paper only':<34}{'':>8}{'':>8}{'':>8}{PAPER['cascades']:>8.2f}")
    for name, value in YARDSTICKS.items():
        lines.append(f"{'yardstick: ' + name:<34}{'':>24}{value:>8.2f}")
    lines.append(f"total {results['seconds']:.0f} s on {results['threads']} thread(s)")
    return "\n".join(lines)


def plot_iterations(results: dict[str, Any], path: str) -> None:
    """Figure 1: test accuracy against the maximum number of test-time inference iterations."""
    check_type("results", results, dict, "the dict run() returns")
    iters = results["config"]["test_iters"]
    with figure(path, (5.5, 3.8)) as ax:
        for key in (r for r in ENERGY_ROWS if r in results["rows"]):
            curves = torch.tensor([f["curve"][key] for f in results["folds"]])
            ax.plot(iters, curves.mean(0).tolist(), marker="o", label=ROWS[key])
        if "2gram" in results["rows"]:
            ax.axhline(results["mean"]["2gram"], color="gray", ls="--", label="2-gram")
        ax.set_xscale("log")
        ax.set_xlabel("maximum test-time iterations (per prototype for L^w)")
        ax.set_ylabel("character accuracy (%)")
        ax.set_title("OCR: accuracy against inference iterations")
        ax.grid(alpha=0.3)
        ax.legend()


def plot_histogram(results: dict[str, Any], path: str) -> None:
    """Figure 2: histogram of the iterations each test word took to converge."""
    check_type("results", results, dict, "the dict run() returns")
    keys = [r for r in ENERGY_ROWS if r in results["rows"]]
    with figure(path, (5.5, 3.8)) as ax:
        top = results["config"]["test_iters"][-1]
        bins = torch.logspace(0, torch.log10(torch.tensor(float(top + 1))), 20).tolist()
        for key in keys:
            its = [i for f in results["folds"] for i in f["iterations"][key]]
            ax.hist([max(i, 1) for i in its], bins=bins, histtype="step", lw=1.5, label=ROWS[key])
        ax.set_xscale("log")
        ax.set_xlabel("iterations to converge (max over prototypes for L^w)")
        ax.set_ylabel("test words")
        ax.set_title("OCR: iterations to converge")
        ax.legend()
