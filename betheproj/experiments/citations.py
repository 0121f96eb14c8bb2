"""Citation field extraction with learned soft global constraints (section 8.1, Table 1, Figures 1 and 2).

1. The base: a linear-chain CRF over sparse token features (:mod:`betheproj.data.citation_features`),
   trained on the training split by L-BFGS on the softmax-margin loss (the CRF likelihood with a Hamming
   cost of 3 per wrong label inside the log-partition; ``crf_loss="crf"`` gives plain likelihood).
2. The non-local energy (20): ``sum_j c_j l_h(a_j^T mu - b_j)`` with smoothed hinges over the count
   templates of :mod:`betheproj.data.citation_constraints` (instantiated on the training split), plus the same
   hinges on the order templates there (every token of one field before every token of another, the bilinear
   measurements of :class:`~betheproj.energies.Precedence`) and on the name-format templates (two bigrams of
   name labels that never share a citation, :class:`~betheproj.energies.BigramExclusion`), the weights ``c_j``
   learned on the development split by Algorithm 3 with theta fixed; terms with ``c_j < 0`` are ignored at
   train and test time (``c_j`` enters as ``max(c_j, 0)``).  ``CitationConfig.cross_fit = K`` learns them on dev
   and on the training split's K-fold cross-fitted potentials together (:func:`cross_fit_potentials`).
3. Both rows decode the same base model: Viterbi in ``theta`` for the baseline, Viterbi in
   ``theta - grad L(mu*)`` at the solution of (2) for the non-local row (Proposition 1).  Two more rows decode
   the same two MRFs for segment F1 instead (minimum Bayes risk, :mod:`betheproj.inference.segments`: the
   segments whose exact posterior beats a threshold, chosen on dev for each row).

Scores are segment-level F1 (exact spans, micro-averaged over every tag path a token carries: the leaf fields,
and a group where a token sits directly under it, such as ``authors`` for the "and" between two persons).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, cast

import torch
from torch import Tensor, nn

from .._checks import (
    check_count,
    check_increasing_counts,
    check_int,
    check_log,
    check_nonnegative,
    check_positive,
    check_real,
    check_type,
)
from .._files import check_writable, torch_load, torch_save
from ..data.citation_constraints import (
    BigramExclusions,
    Constraints,
    OrderConstraints,
    bigram_exclusions,
    citation_constraints,
    order_constraints,
)
from ..data.citation_features import FEATURES_VERSION, FeatureIndex, other_feature_version
from ..data.citations import Citation, check_citations, escape_tags, is_tag_name, tokenize_citation
from ..energies import BigramExclusion, Energy, LinearMeasurements, Precedence
from ..energies.linear import Loss
from ..inference import BIOFields, decode, decode_segments_at
from ..inference.segments import check_thresholds
from ..inference.solve import METHODS
from ..learning import ConstantPsi, NonLocalCRF, SparseChainCRF, fit_crf
from ..learning.crf import length_chunks
from ..learning.metrics import segment_f1
from ..learning.train import History, fit_doubly_stochastic
from ..oracles import LinearChain, PairwisePotentials
from ..progress import progress_bar
from ._plot import figure

__all__ = ["PAPER", "CitationConfig", "train_baseline", "templates", "constraint_model", "learn_weights",
           "cross_fit_potentials", "learn_pooled_weights", "viterbi_predictor", "nonlocal_predictor",
           "nonlocal_tagger", "predictions", "f1_of", "mbr_f1", "run", "format_table", "plot_iterations",
           "plot_histogram", "tag_strings", "to_nested_tags", "save_model", "load_model", "load_run", "SavedRun"]

PAPER = {"baseline": 94.47, "non-local": 95.47, "Anzaroot et al. baseline": 94.41, "Soft-DD": 95.39}


@dataclass
class CitationConfig:
    """Hyper-parameters (defaults: the ones the README's table was measured with, tuned on dev)."""

    crf_l2: float = 1e-3            # base CRF: L2 on the mean loss, full-batch L-BFGS in length-sorted chunks
    crf_iter: int = 100
    crf_loss: str = "softmax_margin"   # training loss of the base CRF: "crf" (likelihood) or "softmax_margin"
    crf_gamma: float = 3.0          # softmax-margin: cost of each wrong label
    chunk_size: int = 256
    min_support: int = 10           # constraint templates: support and agreement on the training split
    min_agreement: float = 0.8
    length_agreement: float | None = 0.98   # length templates: agreement on the training split (None: none)
    order_agreement: float | None = 0.95   # order templates: agreement on the training split (None: none)
    format_together: float | None = 0.01   # name-format templates: largest share of citations with both bigrams
    hinge_width: float = 1.0        # smoothed hinge width
    margin: float = 0.0             # offset added to every bound b_j
    psi_init: float = 0.0           # initial c (>= 0: a negative c gets no gradient through max(c, 0))
    psi_lr: float = 0.05            # Algorithm 3 on dev: Adam on c, theta fixed
    batch_size: int = 16
    epochs: int = 5
    train_iter: int = 20
    method: str = "md"
    test_iters: tuple[int, ...] = (1, 2, 5, 10, 20, 40)   # Figure 1's x axis; the last is the row's
    seed: int = 0
    cross_fit: int = 0              # >= 2: c learned on dev and on the training split's cross-fitted potentials
    cross_fit_epochs: int = 3       # Algorithm 3's passes over that pool (dev and training split together)
    # segment MBR decoding (betheproj.inference.segments) of both rows, its threshold chosen on dev from these
    # (empty: no such rows)
    mbr_thresholds: tuple[float, ...] = (0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7)

    def __post_init__(self) -> None:
        """Every field checked here, not minutes into a run under an internal argument's name, and kept as the
        Python value its check returns (a NumPy or 0-d tensor scalar would make the results no JSON and the saved
        model one that ``torch.load(weights_only=True)`` refuses)."""
        for name in ("crf_iter", "chunk_size", "min_support", "batch_size", "epochs", "train_iter", "cross_fit_epochs"):
            setattr(self, name, check_count(name, getattr(self, name)))
        for name in ("crf_l2", "crf_gamma"):
            setattr(self, name, check_nonnegative(name, getattr(self, name)))
        for name in ("hinge_width", "psi_lr"):
            setattr(self, name, check_positive(name, getattr(self, name)))
        self.margin = check_real("margin", self.margin)
        self.psi_init = check_real("psi_init", self.psi_init)
        if self.psi_init < 0:
            raise ValueError(f"psi_init must be >= 0, got {self.psi_init:g}: the weights c enter as max(c, 0), so from "
                             "a negative start they get no gradient and the non-local row stays the baseline")
        self.min_agreement = check_real("min_agreement", self.min_agreement, 0.0, 1.0, low_open=True)
        for name in ("length_agreement", "order_agreement"):
            if getattr(self, name) is not None:
                setattr(self, name, check_real(name, getattr(self, name), 0.0, 1.0, low_open=True))
        if self.format_together is not None:
            self.format_together = check_real("format_together", self.format_together, 0.0, 1.0, high_open=True)
        if self.crf_loss not in ("crf", "softmax_margin"):
            raise ValueError(f"crf_loss must be 'crf' or 'softmax_margin', got {self.crf_loss!r}")
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {', '.join(METHODS)}, got {self.method!r}")
        self.test_iters = check_increasing_counts("test_iters", self.test_iters)
        self.seed = check_int("seed", self.seed, 0)
        self.cross_fit = check_int("cross_fit", self.cross_fit, 0)
        if self.cross_fit == 1:
            raise ValueError("cross_fit must be 0 (c learned on dev alone) or a number of folds >= 2, got 1")
        if isinstance(self.mbr_thresholds, str) or not isinstance(self.mbr_thresholds, Sequence):
            raise TypeError(f"mbr_thresholds must be a sequence of numbers in [0, 1], got "
                            f"{type(self.mbr_thresholds).__name__}")
        self.mbr_thresholds = tuple(check_real(f"mbr_thresholds[{i}]", v, 0.0, 1.0)
                                    for i, v in enumerate(self.mbr_thresholds))


def _progress_log(log: Callable[[str], None] | None, text: str) -> None:
    if log is not None:
        log(text)


def _check_encoded(citations: Sequence[Citation], encoded: tuple[Tensor, Tensor, Tensor]) -> list[Citation]:
    citations = check_citations(citations, empty=False)
    bare = next((i for i, c in enumerate(citations) if not c.tokens), None)
    if bare is not None:
        raise ValueError(f"citations[{bare}] has no tokens: every citation scored must hold one")
    n = encoded[2]
    if n.tolist() != [len(c.tokens) for c in citations]:
        raise ValueError(f"encoded must be index.encode(citations): its lengths {n.tolist()[:5]} are not the "
                         f"citations' token counts {[len(c.tokens) for c in citations][:5]}")
    return citations


def _tag_all(tagger: Callable[[Tensor, Tensor], list[Tensor]], index: FeatureIndex, citations: list[Citation],
             encoded: tuple[Tensor, Tensor, Tensor], chunk_size: int, progress: bool, desc: str
             ) -> list[list[list[str]]]:
    """Label names of the citations under each of the labellings ``tagger(features, lengths)`` returns for a chunk
    ([B, N] label ids each), the citations taken in chunks of similar length."""
    x, _, n = encoded
    pred: list[list[list[str]]] = []
    bar = progress_bar(len(citations), progress, desc)
    try:
        with torch.no_grad():
            for idx, width in length_chunks(n, chunk_size):
                for k, ids in enumerate(tagger(x[idx, :width], n[idx])):
                    if k == len(pred):
                        pred.append([[] for _ in citations])
                    for row, i in enumerate(idx.tolist()):
                        pred[k][i] = [index.labels[int(v)] for v in ids[row, : int(n[i])]]
                bar.update(len(idx))
    finally:
        bar.close()
    return pred


def predictions(tagger: Callable[[Tensor, Tensor], list[Tensor]], index: FeatureIndex, citations: Sequence[Citation],
                encoded: tuple[Tensor, Tensor, Tensor], chunk_size: int = 256, progress: bool = False,
                desc: str = "tagging") -> list[list[list[str]]]:
    """The label names of ``citations`` under each of the labellings ``tagger(features, lengths)`` returns for a
    chunk ([B, N] label ids each: several decodings of one solve, as :func:`nonlocal_tagger` gives)."""
    if not callable(tagger):
        raise TypeError(f"tagger must be a callable (features, lengths) -> [label ids, ...], got "
                        f"{type(tagger).__name__}")
    citations = _check_encoded(citations, encoded)

    def checked(x: Tensor, n: Tensor) -> list[Tensor]:
        out = tagger(x, n)
        if not isinstance(out, (list, tuple)) or not all(isinstance(ids, Tensor) for ids in out):
            raise TypeError(f"tagger must return a list of [B, N] label-id tensors, got {type(out).__name__} (for "
                            "one labelling, f1_of takes a predictor that returns a tensor)")
        return list(out)
    return _tag_all(checked, index, citations, encoded, chunk_size, progress, desc)


def f1_of(model: Callable[[Tensor, Tensor], Tensor], index: FeatureIndex, citations: Sequence[Citation],
          encoded: tuple[Tensor, Tensor, Tensor], chunk_size: int = 256, progress: bool = False,
          desc: str = "tagging") -> tuple[float, list[list[str]]]:
    """Segment F1 (%) of ``model(features, lengths) -> label ids`` on ``citations``, and the predicted labels
    (``progress``: a bar over the citations, labelled ``desc``)."""
    citations = _check_encoded(citations, encoded)
    pred = _tag_all(lambda x, n: [model(x, n)], index, citations, encoded, chunk_size, progress, desc)[0]
    return 100 * segment_f1([c.labels for c in citations], pred).f1, pred


def _scores(citations: Sequence[Citation], pred: Sequence[list[list[str]]]) -> list[float]:
    gold = [c.labels for c in citations]
    return [100 * segment_f1(gold, p).f1 for p in pred]


def mbr_f1(potentials_of: Callable[[Tensor, Tensor], PairwisePotentials], index: FeatureIndex,
           citations: Sequence[Citation], encoded: tuple[Tensor, Tensor, Tensor], thresholds: Sequence[float],
           chunk_size: int = 256, progress: bool = False, desc: str = "segment MBR") -> list[float]:
    """Segment F1 (%) on ``citations`` of :func:`~betheproj.inference.decode_segments` at each of
    ``thresholds``, in the MRF ``potentials_of(features, lengths)`` (the base's ``theta``, or a solution's
    ``theta - grad L(mu*)``); the segment posteriors are computed once for all thresholds."""
    citations = _check_encoded(citations, encoded)
    fields = BIOFields.from_labels(index.labels)
    thresholds = check_thresholds(thresholds)          # before the first chunk's potentials
    pred = _tag_all(lambda x, n: decode_segments_at(potentials_of(x, n), fields, thresholds), index, citations,
                    encoded, chunk_size, progress, desc)
    return _scores(citations, pred)


def train_baseline(index: FeatureIndex, encoded: tuple[Tensor, Tensor, Tensor],
                   config: CitationConfig, progress: bool = False) -> SparseChainCRF:
    """The base chain CRF trained on the (encoded) training split (softmax-margin or likelihood), float64."""
    check_type("index", index, FeatureIndex)
    check_type("config", config, CitationConfig)
    torch.manual_seed(config.seed)
    model = SparseChainCRF(index.num_features, len(index.labels)).double()
    x, y, n = encoded
    gamma = config.crf_gamma if config.crf_loss == "softmax_margin" else None
    fit_crf(model, x, y, n, l2=config.crf_l2, max_iter=config.crf_iter, chunk_size=config.chunk_size,
            loss=config.crf_loss, gamma=gamma, progress=progress)
    return model


def templates(train: Sequence[Citation], labels: Sequence[str], config: CitationConfig
              ) -> tuple[Constraints, OrderConstraints | None, BigramExclusions | None]:
    """The count, order and name-format templates of ``config`` instantiated on the ``train`` citations (a
    family whose setting is ``None`` is left out)."""
    check_type("config", config, CitationConfig)
    constraints = citation_constraints(train, labels, config.min_support, config.min_agreement,
                                       length_agreement=config.length_agreement)
    order = None if config.order_agreement is None else order_constraints(
        train, labels, config.min_support, config.order_agreement)
    formats = None if config.format_together is None else bigram_exclusions(
        train, labels, config.min_support, config.format_together)
    return constraints, order, formats


def constraint_model(base: SparseChainCRF, constraints: Constraints, config: CitationConfig,
                     order: OrderConstraints | None = None, formats: BigramExclusions | None = None) -> NonLocalCRF:
    """The CRF plus energy (20) over the count ``constraints``, the ``order`` and the name-``formats`` templates,
    ``c`` one learned vector (in that order; negative entries ignored)."""
    check_type("base", base, SparseChainCRF)
    check_type("constraints", constraints, Constraints)
    check_type("config", config, CitationConfig)
    check_type("order", order, (OrderConstraints, type(None)), "OrderConstraints or None")
    check_type("formats", formats, (BigramExclusions, type(None)), "BigramExclusions or None")
    a, b = constraints.a.to(base.bias), (constraints.b + config.margin).to(base.bias)
    loss = Loss("smoothed_hinge", config.hinge_width)
    j1 = len(constraints)
    j2 = j1 + len(order or [])
    j3 = j2 + len(formats or [])

    def energy(psi: Tensor) -> Energy:
        psi = psi.clamp_min(0.0)
        total: Energy = LinearMeasurements(node=a, offset=b, loss=loss, psi=psi[..., :j1])
        if order:                                 # j2 > j1
            total = total + Precedence(order.first.to(a), order.then.to(a), loss=loss, psi=psi[..., j1:j2])
        if formats:                               # j3 > j2
            total = total + BigramExclusion(formats.left.to(a), formats.right.to(a), formats.pairs, loss=loss,
                                            psi=psi[..., j2:j3])
        return total

    psi = ConstantPsi(torch.full((j3,), config.psi_init, dtype=torch.float64))
    return NonLocalCRF(base, energy, psi=psi, method=config.method, max_iter=config.test_iters[-1])


def _base(model: NonLocalCRF) -> SparseChainCRF:
    """The base CRF of a :func:`constraint_model` (``NonLocalCRF`` types its theta as any module)."""
    return cast(SparseChainCRF, model.theta)


def _weights(model: NonLocalCRF) -> Tensor:
    """The template weights ``c`` of a :func:`constraint_model` (its psi, a :class:`ConstantPsi`)."""
    return cast(ConstantPsi, model.psi).value


def learn_weights(model: NonLocalCRF, encoded: tuple[Tensor, Tensor, Tensor], config: CitationConfig,
                  epochs: int | None = None, seed: int | None = None, progress: bool = False) -> History:
    """Algorithm 3 with theta fixed: the weights ``c`` of ``model``, reset to ``config.psi_init``, learned on the
    ``encoded`` citations (``config.epochs`` and ``config.seed`` unless given); returns the history."""
    check_type("model", model, NonLocalCRF)
    check_type("config", config, CitationConfig)
    with torch.no_grad():
        _weights(model).fill_(config.psi_init)
    x, y, n = encoded
    return fit_doubly_stochastic(model, x, y, n, epochs=config.epochs if epochs is None else epochs,
                                 batch_size=config.batch_size, lr=config.psi_lr, psi_lr=config.psi_lr,
                                 learn_theta=False, train_iter=config.train_iter,
                                 seed=config.seed if seed is None else seed, progress=progress)


class _Stored(nn.Module):
    """A theta that is given, not learned: stored potentials, node [M, N, C] and edge [M, C, C], looked up by the
    example's number, which its features [B, N', 1] carry (plus one) at every position."""

    node: Tensor                                     # buffers: node [M, N, C] and edge [M, C, C]
    edge: Tensor

    def __init__(self, node: Tensor, edge: Tensor):
        super().__init__()
        self.register_buffer("node", node)
        self.register_buffer("edge", edge)

    def forward(self, features: Tensor, lengths: Tensor) -> PairwisePotentials:
        ids = features[:, 0, 0] - 1
        width = features.shape[1]
        edge = self.edge[ids]
        if bool((edge == edge[:1]).all()):              # one model's transitions: the chain's shared-table path
            edge = edge[0]
        else:                                           # a stride-0 view: the chain's per-example-table path
            edge = edge[:, None].expand(-1, width - 1, -1, -1)
        return PairwisePotentials(self.node[ids, :width], edge, lengths)

    @staticmethod
    def features(count: int, width: int) -> Tensor:
        """Features [count, width, 1] that address the examples ``0 .. count-1``."""
        return torch.arange(1, count + 1)[:, None, None].expand(count, width, 1).contiguous()


def cross_fit_potentials(train: Sequence[Citation], index: FeatureIndex, config: CitationConfig,
                         progress: bool = False, log: Callable[[str], None] | None = None) -> tuple[Tensor, Tensor]:
    """Held-out potentials of the ``train`` citations, node [M, N, C] and transitions [M, C, C]: the split cut
    into ``config.cross_fit`` folds (at random, ``config.seed``), each fold's scored by a base CRF trained on the
    other folds with a feature index of its own (features and lexicon from those folds alone, the labels of
    ``index``), so that they are as wrong as the base's on new citations (dev and test) and not as right as on its
    own training data, where the constraints are met already."""
    check_type("index", index, FeatureIndex)
    check_type("config", config, CitationConfig)
    train = check_citations(train, empty=False)
    folds = check_count("config.cross_fit", config.cross_fit)
    if folds < 2 or folds > len(train):
        raise ValueError(f"config.cross_fit must be between 2 and the {len(train)} training citations, got {folds}")
    order = list(range(len(train)))
    random.Random(config.seed).shuffle(order)
    width = max(len(c.tokens) for c in train)
    node = torch.zeros(len(train), width, len(index.labels), dtype=torch.float64)
    edge = torch.zeros(len(train), len(index.labels), len(index.labels), dtype=torch.float64)
    for k in range(folds):
        held = sorted(order[k::folds])
        out = set(held)
        rest = [c for i, c in enumerate(train) if i not in out]
        _progress_log(log, f"cross-fitting: fold {k + 1} of {folds}, a base CRF on {len(rest)} training citations")
        fold_index = FeatureIndex(rest, labels=index.labels)
        model = train_baseline(fold_index, fold_index.encode(rest), config, progress=progress)
        x, _, n = fold_index.encode([train[i] for i in held])
        with torch.no_grad():
            pot = model(x, n)
        node[held, : x.shape[1]] = pot.node.detach()
        edge[held] = pot.edge.detach()
    return node, edge


def learn_pooled_weights(model: NonLocalCRF, held_out: tuple[Tensor, Tensor], train: tuple[Tensor, Tensor, Tensor],
                         dev: tuple[Tensor, Tensor, Tensor], config: CitationConfig, progress: bool = False
                         ) -> History:
    """Algorithm 3 with theta fixed, as :func:`learn_weights`, on dev (``model``'s own potentials) and the
    training split's ``held_out`` potentials (:func:`cross_fit_potentials`) together, ``config.cross_fit_epochs``
    passes; ``train`` and ``dev`` are the encoded splits (their labels and lengths are read)."""
    with torch.no_grad():
        dev_pot = model.theta(dev[0], dev[2])
    node, edge = held_out
    m, d = node.shape[0], dev[0].shape[0]
    width = max(node.shape[1], dev[0].shape[1])
    c = node.shape[2]
    pool_node = node.new_zeros(m + d, width, c)
    pool_node[:m, : node.shape[1]] = node
    pool_node[m:, : dev[0].shape[1]] = dev_pot.node.detach()
    pool_edge = torch.cat([edge, dev_pot.edge.detach().to(edge).expand(d, c, c)])

    def labels(y: Tensor) -> Tensor:
        return torch.cat([y, y.new_full((y.shape[0], width - y.shape[1]), -1)], 1)

    pooled = NonLocalCRF(_Stored(pool_node, pool_edge), model.energy_fn, psi=model.psi, oracle=model.oracle,
                         method=model.method, max_iter=model.max_iter, tol=model.tol)
    with torch.no_grad():
        _weights(model).fill_(config.psi_init)
    return fit_doubly_stochastic(pooled, _Stored.features(m + d, width), torch.cat([labels(train[1]), labels(dev[1])]),
                                 torch.cat([train[2], dev[2]]), epochs=config.cross_fit_epochs,
                                 batch_size=config.batch_size, lr=config.psi_lr, psi_lr=config.psi_lr,
                                 learn_theta=False, train_iter=config.train_iter, seed=config.seed, progress=progress)


def viterbi_predictor(base: SparseChainCRF) -> Callable[[Tensor, Tensor], Tensor]:
    """``(features, lengths) -> labels``: the baseline row, Viterbi in ``theta``."""
    def predict(x: Tensor, n: Tensor) -> Tensor:
        return LinearChain().map(base(x, n))
    return predict


def nonlocal_predictor(model: NonLocalCRF, max_iter: int, iterations: list[Tensor] | None = None
                       ) -> Callable[[Tensor, Tensor], Tensor]:
    """``(features, lengths) -> labels``: the non-local row, Viterbi in ``theta - grad L(mu*)`` after at most
    ``max_iter`` solver iterations (each batch's iteration counts appended to ``iterations`` if given): the MAP
    labelling of :func:`nonlocal_tagger`."""
    tag = nonlocal_tagger(model, max_iter, iterations=iterations)

    def predict(x: Tensor, n: Tensor) -> Tensor:
        return tag(x, n)[0]
    return predict


def nonlocal_tagger(model: NonLocalCRF, max_iter: int, fields: BIOFields | None = None,
                    thresholds: Sequence[float] = (), iterations: list[Tensor] | None = None, *,
                    map_labels: bool = True) -> Callable[[Tensor, Tensor], list[Tensor]]:
    """``(features, lengths) -> [MAP labels, segment-MBR labels at each threshold]``: one solve (at most
    ``max_iter`` iterations; each batch's iteration counts appended to ``iterations`` if given), its MRF
    ``theta - grad L(mu*)`` decoded by Viterbi (Proposition 1) and, given ``fields``, for segment F1 at each of
    ``thresholds`` (:func:`decode_segments_at`).  ``map_labels=False`` leaves out the MAP labels (and their Viterbi
    pass): the list holds the segment-MBR labels alone."""
    check_type("model", model, NonLocalCRF)
    if model.energy_fn is None:
        raise ValueError("model has no energy: a plain CRF's labels are viterbi_predictor(model.theta)'s")
    if thresholds and fields is None:
        raise ValueError("thresholds need fields: pass BIOFields.from_labels(index.labels)")
    check_type("map_labels", map_labels, bool)
    if not map_labels and not thresholds:
        raise ValueError("map_labels=False needs thresholds: the tagger would decode nothing")

    def tag(x: Tensor, n: Tensor) -> list[Tensor]:
        sol = model.infer(x, n, max_iter)
        assert sol is not None                    # a Solution: the model has an energy (checked above)
        if iterations is not None:
            iterations.append(sol.iterations.clone())
        mbr = decode_segments_at(sol.potentials, fields, thresholds) if fields is not None and thresholds else []
        return [decode(model.oracle, sol), *mbr] if map_labels else mbr
    return tag


@dataclass
class _Row:
    dev: float
    test: float
    extra: dict[str, Any] = field(default_factory=dict)


def run(data: dict[str, list[Citation]], config: CitationConfig | None = None, progress: bool = False,
        log: Callable[[str], None] | None = None, save: str | Path | None = None) -> dict[str, Any]:
    """The whole experiment on the three splits; returns a JSON-ready dict of rows, curves and settings.
    ``save`` writes the trained non-local model there (see :func:`load_model`); a folder, or a path in a folder that
    takes no new file, is a ValueError before anything trains."""
    if config is None:
        config = CitationConfig()
    if not isinstance(config, CitationConfig):
        raise TypeError(f"config must be a CitationConfig or None, got {type(config).__name__} (a dict of settings: "
                        "CitationConfig(**settings))")
    check_log(log)
    if not isinstance(data, dict):
        raise TypeError(f"data must be a dict of splits {{'train': [...], 'dev': [...], 'test': [...]}} (as "
                        f"load_citations returns), got {type(data).__name__}")
    for split in ("train", "dev", "test"):
        if not data.get(split):
            raise ValueError(f"data must hold a non-empty {split!r} split")
        bare = next((i for i, c in enumerate(check_citations(data[split])) if not c.tokens), None)
        if bare is not None:                      # train: a CRF length error; dev, test: after the training
            raise ValueError(f"data[{split!r}][{bare}] has no tokens: every citation must hold one (read_citations "
                             "skips the lines of tags alone)")
    if config.cross_fit > len(data["train"]):
        raise ValueError(f"config.cross_fit must be at most the {len(data['train'])} training citations (one fold "
                         f"each), got {config.cross_fit}")
    if save is not None:                          # before the training, not minutes into it
        if Path(save).is_dir():
            raise ValueError(f"save: {save} is a folder: give the model file's path (e.g. {Path(save) / 'model.pt'})")
        check_writable(Path(save).parent, "save")
    start = time.perf_counter()
    index = FeatureIndex(data["train"])
    enc = {k: index.encode(v) for k, v in data.items()}
    _progress_log(log, f"{index.num_features - 1} features, {len(index.labels)} labels; training the base CRF")
    t = time.perf_counter()
    base = train_baseline(index, enc["train"], config, progress=progress)
    base_seconds = time.perf_counter() - t

    viterbi = viterbi_predictor(base)
    constraints, order, formats = templates(data["train"], index.labels, config)
    model = constraint_model(base, constraints, config, order, formats)
    names = constraints.names + (order.names if order else []) + (formats.names if formats else [])
    dev_f1, test_f1 = (f1_of(viterbi, index, data[s], enc[s])[0] for s in ("dev", "test"))
    rows = {"baseline": _Row(dev_f1, test_f1)}
    _progress_log(log, f"baseline: dev {rows['baseline'].dev:.2f} test {rows['baseline'].test:.2f}; "
                       f"learning {len(names)} constraint weights on dev"
                       f"{f' and the {config.cross_fit}-fold cross-fitted training split' if config.cross_fit else ''}"
                       f" ({len(constraints)} count, "
                       f"{len(order or [])} order, {len(formats or [])} name-format)")
    t = time.perf_counter()
    cross_seconds = 0.0
    if config.cross_fit:
        held_out = cross_fit_potentials(data["train"], index, config, progress=progress, log=log)
        cross_seconds = time.perf_counter() - t
        t = time.perf_counter()
        history = learn_pooled_weights(model, held_out, enc["train"], enc["dev"], config, progress=progress)
    else:
        history = learn_weights(model, enc["dev"], config, progress=progress)
    learn_seconds = time.perf_counter() - t
    c = _weights(model).detach()
    curves: dict[str, list[float]] = {"dev": [], "test": []}
    iterations: list[Tensor] = []
    thresholds = config.mbr_thresholds if "O" in index.labels else ()
    fields = BIOFields.from_labels(index.labels) if thresholds else None
    mbr: dict[str, dict[str, list[float]]] = {"baseline": {}, "non-local": {}}
    for it in config.test_iters[:-1]:
        for split in ("dev", "test"):
            curves[split].append(f1_of(nonlocal_predictor(model, it), index, data[split], enc[split],
                                       progress=progress, desc=f"{split}, at most {it} iterations")[0])
    last = config.test_iters[-1]
    for split in ("dev", "test"):               # the last pass decodes each solution both ways
        tagger = nonlocal_tagger(model, last, fields, thresholds, iterations if split == "test" else None)
        scores = _scores(data[split], _tag_all(tagger, index, data[split], enc[split], 256, progress,
                                               f"{split}, at most {last} iterations"))
        curves[split].append(scores[0])
        mbr["non-local"][split] = scores[1:]
        if thresholds:
            mbr["baseline"][split] = mbr_f1(base, index, data[split], enc[split], thresholds, progress=progress,
                                            desc=f"{split}, segment MBR (baseline)")
    rows["non-local"] = _Row(curves["dev"][-1], curves["test"][-1])
    for key, by in mbr.items() if thresholds else ():
        best = max(range(len(thresholds)), key=lambda k: by["dev"][k])   # the first of ties
        rows[f"{key}, MBR"] = _Row(by["dev"][best], by["test"][best], {"threshold": thresholds[best],
                                                                       "dev_by_threshold": by["dev"],
                                                                       "test_by_threshold": by["test"]})
    active = sorted(((float(v), names[j]) for j, v in enumerate(c.tolist()) if v > 0), reverse=True)
    _progress_log(log, f"non-local: dev {rows['non-local'].dev:.2f} test {rows['non-local'].test:.2f}; "
                       f"{len(active)} of {len(names)} constraints with c_j > 0")
    if save is not None:
        chosen = rows.get("non-local, MBR")
        save_model(save, index, model, constraints, config, order, formats,
                   mbr_threshold=None if chosen is None else chosen.extra["threshold"])
    return {
        "rows": {k: asdict(v) for k, v in rows.items()},
        "paper": PAPER,
        "test_iters": list(config.test_iters),
        "f1_vs_iterations": curves,
        "test_iterations_to_converge": torch.cat(iterations).tolist(),
        "max_iter": config.test_iters[-1],
        "constraints": len(names),
        "order_constraints": len(order or []),
        "format_constraints": len(formats or []),
        "active_constraints": [{"name": name, "c": v} for v, name in active],
        "labels": len(index.labels),
        "features": index.num_features - 1,
        "seconds": {"base": base_seconds, "cross_fit": cross_seconds, "constraints": learn_seconds,
                    "total": time.perf_counter() - start},
        "learning_loss": history.loss,
        "config": asdict(config),
    }


def format_table(results: dict[str, Any]) -> str:
    """Table 1 with the paper's numbers beside ours."""
    check_type("results", results, dict, "the dict run() returns")
    lines = [f"{'segment F1 (%)':<28}{'dev':>8}{'test':>8}{'paper (test)':>14}"]
    for key, label in (("baseline", "Our baseline (chain CRF)"), ("non-local", "Non-local energies")):
        row = results["rows"][key]
        lines.append(f"{label:<28}{row['dev']:>8.2f}{row['test']:>8.2f}{PAPER[key]:>14.2f}")
    mbr = [key for key in ("baseline, MBR", "non-local, MBR") if key in results["rows"]]
    for key in mbr:
        label = {"baseline, MBR": "Baseline, segment MBR", "non-local, MBR": "Non-local, segment MBR"}[key]
        row = results["rows"][key]
        lines.append(f"{label:<28}{row['dev']:>8.2f}{row['test']:>8.2f}{'':>14}")
    for key in ("Anzaroot et al. baseline", "Soft-DD"):
        lines.append(f"{key:<28}{'':>8}{'':>8}{PAPER[key]:>14.2f}")
    gain = results["rows"]["non-local"]["test"] - results["rows"]["baseline"]["test"]
    lines.append(f"gain of the non-local energy on test: {gain:+.2f} (paper: +1.00); "
                 f"{len(results['active_constraints'])} of {results['constraints']} constraints active")
    if len(mbr) == 2:
        rows = [results["rows"][key] for key in mbr]
        lines.append(f"with segment MBR decoding: {rows[1]['test'] - rows[0]['test']:+.2f}; thresholds chosen on dev "
                     f"{rows[0]['extra']['threshold']:g} (baseline), {rows[1]['extra']['threshold']:g} (non-local)")
    folds = results.get("config", {}).get("cross_fit", 0)
    pool = f" and the {folds}-fold cross-fitted training split" if folds else ""
    lines.append(f"constraint weights learned on dev{pool}")
    return "\n".join(lines)


def plot_iterations(results: dict[str, Any], path: str) -> None:
    """Figure 1: test F1 against the maximum number of test-time inference iterations."""
    check_type("results", results, dict, "the dict run() returns")
    with figure(path, (5, 3.5)) as ax:
        ax.plot(results["test_iters"], results["f1_vs_iterations"]["test"], "o-", label="non-local energies")
        ax.axhline(results["rows"]["baseline"]["test"], color="gray", ls="--", label="baseline chain CRF")
        if "non-local, MBR" in results["rows"]:
            ax.axhline(results["rows"]["non-local, MBR"]["test"], color="tab:green", ls=":",
                       label=f"non-local, segment MBR ({results['max_iter']} iterations)")
        ax.set_xscale("log")
        ax.set_xlabel("maximum inference iterations (test time)")
        ax.set_ylabel("test segment F1 (%)")
        ax.set_title("Citation extraction: F1 vs. iterations")
        ax.legend(loc="upper left", bbox_to_anchor=(0.0, 0.93))


def plot_histogram(results: dict[str, Any], path: str) -> None:
    """Figure 2: histogram of the iterations each test citation took to converge (capped at ``max_iter``)."""
    check_type("results", results, dict, "the dict run() returns")
    its = results["test_iterations_to_converge"]
    cap = results["max_iter"]
    if not its:
        raise ValueError("results['test_iterations_to_converge'] is empty: no test citation to draw")
    with figure(path, (5, 3.5)) as ax:
        ax.hist(its, bins=range(0, cap + 2), weights=[100.0 / len(its)] * len(its), color="tab:blue")
        ax.set_xlabel(f"iterations to converge (capped at {cap})")
        ax.set_ylabel("% of test citations")
        mean = sum(its) / len(its)
        done = 100.0 * sum(i < cap for i in its) / len(its)
        ax.set_title(f"mean {mean:.1f} iterations; {done:.1f}% converge within {cap}")


def to_nested_tags(tokens: Sequence[str], labels: Sequence[str]) -> str:
    """Write a tagged citation back in the data's nested-tag format.

    BIO labels over tag paths do not say where a group (a person, the authors) ends, so two rules put the
    groups back: a ``B-`` label at a group's own level after its members continues the group (``and``
    between two persons stays inside ``<authors>``), and a field that already occurred in the innermost open
    group starts a new instance of that group (a second first name, or a last name right after a last name,
    begins a new ``<person>``); a repeated top-level field is a new instance of itself.  A token that would
    read as a tag (``<title>`` in the raw text) is written with ``&lt;`` and ``&gt;`` for its brackets; a label
    whose tag names would not read as tags (``B-my title``, ``B-1st``) or that nests a tag directly in itself
    (``B-a/a``, which the reader counts once) is a ValueError."""
    if isinstance(tokens, str) or isinstance(labels, str):
        raise TypeError("tokens and labels must be sequences of strings, not one string")
    if len(tokens) != len(labels):
        raise ValueError(f"tokens and labels must be as long, got {len(tokens)} and {len(labels)}")
    for i, (tok, label) in enumerate(zip(tokens, labels, strict=True)):
        if not isinstance(tok, str) or not tok or tok != tok.strip() or len(tok.split()) != 1:
            raise ValueError(f"tokens[{i}] must be a non-empty string without spaces, got {tok!r}")
        if not isinstance(label, str) or not (label == "O" or (label[:2] in ("B-", "I-")
                                                                and all(map(is_tag_name, label[2:].split("/"))))):
            raise ValueError(f"labels[{i}] must be 'O' or 'B-'/'I-' and a tag path, got {label!r} (a tag name is an "
                             "ASCII letter, then letters, digits, '_', '.' or '-')")
        names = label[2:].split("/")
        if any(a == b for a, b in zip(names, names[1:], strict=False)):
            raise ValueError(f"labels[{i}] = {label!r} nests a tag directly in itself, which the reader counts "
                             "once: the labels would not read back")
    out: list[str] = []
    open_path: list[str] = []
    seen: list[set[str]] = []                         # the tags opened directly under each open tag
    for tok, label in zip(tokens, labels, strict=True):
        path = [] if label == "O" else label[2:].split("/")
        keep = 0
        while keep < min(len(open_path), len(path)) and open_path[keep] == path[keep]:
            keep += 1
        if label.startswith("B-") and path:
            if keep == len(path) == len(open_path):
                keep -= 1                             # a new instance of the innermost tag
            if keep == len(path) - 1 and keep > 0 and path[keep] in seen[keep - 1]:
                keep -= 1                             # a repeated field: a new instance of its group
        out += [f"</{t}>" for t in reversed(open_path[keep:])]
        del seen[keep:]
        for t in path[keep:]:
            if seen:
                seen[-1].add(t)
            seen.append(set())
            out.append(f"<{t}>")
        open_path = path
        out.append(escape_tags(tok))
    out += [f"</{t}>" for t in reversed(open_path)]
    return " ".join(out)


def _check_index(index: FeatureIndex, model: NonLocalCRF, what: str) -> None:
    """``ValueError`` unless ``model`` has the features and labels of ``index`` (the one it was trained with)."""
    base = _base(model)
    features, labels = base.weights.num_embeddings, base.bias.shape[0]
    if (features, labels) != (index.num_features, len(index.labels)):
        raise ValueError(f"model has {features} features and {labels} labels, index {index.num_features} and "
                         f"{len(index.labels)}: {what} the index the model was trained with")


def save_model(path: str | Path, index: FeatureIndex, model: NonLocalCRF, constraints: Constraints,
               config: CitationConfig, order: OrderConstraints | None = None,
               formats: BigramExclusions | None = None, mbr_threshold: float | None = None) -> None:
    """Write everything :func:`load_model` needs to tag new citations (``OSError`` naming ``path`` when it cannot be
    written).  ``index``, ``constraints``, ``order`` and ``formats`` must be those ``model`` was built with (its
    features, labels and one weight per template), or the file would not load: a ValueError here.
    ``mbr_threshold``: the segment-MBR threshold dev chose for the non-local row (:func:`run` saves it), which
    ``betheproj citations --predict FILE --mbr`` decodes with."""
    _check_index(index, model, "save")
    if mbr_threshold is not None:
        mbr_threshold = check_real("mbr_threshold", mbr_threshold, 0.0, 1.0)
    templates_ = len(constraints) + len(order or []) + len(formats or [])
    weights, labels = _weights(model).shape[-1], _base(model).bias.shape[0]
    if constraints.a.shape[-1] != labels or weights != templates_:
        raise ValueError(f"model has {weights} template weights over {labels} labels; constraints, order and formats "
                         f"give {templates_} over {constraints.a.shape[-1]}: pass the templates the model was built "
                         "with (order and formats too)")
    state = {"index": index.state(), "model": model.state_dict(), "a": constraints.a, "b": constraints.b,
             "names": constraints.names, "config": asdict(config), "mbr_threshold": mbr_threshold}
    if order is not None:
        state["order"] = asdict(order)
    if formats is not None:
        state["formats"] = asdict(formats)
    torch_save(state, path)


class SavedRun(NamedTuple):
    """What :func:`save_model` wrote: the feature index, the non-local model, the settings it was trained with and
    the segment-MBR threshold dev chose (``None``: a file written without one)."""

    index: FeatureIndex  # type: ignore[assignment]   # the field shadows tuple.index, on purpose (a public name)
    model: NonLocalCRF
    config: CitationConfig
    mbr_threshold: float | None


def load_model(path: str | Path) -> tuple[FeatureIndex, NonLocalCRF]:
    """The feature index and the non-local model written by :func:`save_model`."""
    saved = load_run(path)
    return saved.index, saved.model


def load_run(path: str | Path) -> SavedRun:
    """Everything :func:`save_model` wrote (:class:`SavedRun`)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no trained citation model at {path}: run 'betheproj citations --data DIR' first")
    state = torch_load(path, "citation model written by 'betheproj citations'", map_location="cpu")
    if isinstance(state, dict) and isinstance(state.get("index"), dict):
        version = other_feature_version(state["index"])
        if version is not None:
            raise ValueError(f"{path} is a citation model of feature version {version!r}, but this betheproj computes "
                             f"version {FEATURES_VERSION}: its features would not be the ones it was trained on; train "
                             "it again ('betheproj citations --data DIR')")
    try:
        if not isinstance(state, dict):
            raise TypeError(f"it holds a {type(state).__name__}, not a dict")
        index = FeatureIndex.from_state(state["index"])
        config = CitationConfig(**{**state["config"], "test_iters": tuple(state["config"]["test_iters"])})
        base = SparseChainCRF(index.num_features, len(index.labels)).double()
        order = OrderConstraints(**state["order"]) if "order" in state else None
        formats = BigramExclusions(**state["formats"]) if "formats" in state else None
        model = constraint_model(base, Constraints(state["a"], state["b"], state["names"]), config, order, formats)
        model.load_state_dict(state["model"])
        bad = [name for name, value in model.state_dict().items()
               if value.is_floating_point() and not bool(torch.isfinite(value).all())]
        if bad:                                  # tagging would fail naming a solver's argument, not this file
            raise ValueError(f"its weights {', '.join(bad)} hold NaN or infinite values")
        threshold = state.get("mbr_threshold")   # absent from the files of runs before it was saved
        if threshold is not None:
            threshold = check_real("mbr_threshold", threshold, 0.0, 1.0)
    except (RuntimeError, LookupError, TypeError, ValueError, AttributeError) as err:   # Lookup: Key, Index
        first = (str(err).strip().splitlines() or [""])[0]
        raise ValueError(f"{path} is not a citation model written by 'betheproj citations' "
                         f"({type(err).__name__}: {first})") from None
    return SavedRun(index, model, config, threshold)


def tag_strings(lines: Sequence[str], index: FeatureIndex, model: NonLocalCRF, max_iter: int | None = None,
                progress: bool = False, mbr_threshold: float | None = None) -> list[str]:
    """Tag raw citation strings (split by :func:`~betheproj.data.citations.tokenize_citation`, the data's
    convention) with the non-local model; nested-tag output.  ``max_iter`` ``None``: the model's own (the last of
    the ``test_iters`` it was trained with, the iterations its test row was scored with); ``progress``: a bar
    over the citations; ``mbr_threshold``: decode each solution's MRF for segment F1 (the segments more probable
    than it, :func:`~betheproj.inference.decode_segments`; the run's ``non-local, MBR`` row names the threshold dev
    chose) instead of by Proposition 1's MAP (``None``, the default)."""
    if mbr_threshold is not None:
        mbr_threshold = check_real("mbr_threshold", mbr_threshold, 0.0, 1.0)
    if isinstance(lines, str):
        raise TypeError("lines must be a list of citation strings, not one string (wrap it in a list)")
    bad = next((i for i, line in enumerate(lines) if not isinstance(line, str)), None)
    if bad is not None:
        raise TypeError(f"lines[{bad}] must be a str, got {type(lines[bad]).__name__}")
    _check_index(index, model, "tag with")
    words = [tokenize_citation(line) for line in lines]
    cites = [Citation(w, [()] * len(w), ["O"] * len(w)) for w in words]
    keep = [i for i, c in enumerate(cites) if c.tokens]
    out = [""] * len(lines)
    if not keep:
        return out
    enc = index.encode([cites[i] for i in keep])
    max_iter = model.max_iter if max_iter is None else max_iter
    fields, thresholds = (None, ()) if mbr_threshold is None else (BIOFields.from_labels(index.labels),
                                                                    (mbr_threshold,))
    # Proposition 1's MAP, or segment MBR alone where a threshold is given
    tagger = nonlocal_tagger(model, max_iter, fields, thresholds, map_labels=mbr_threshold is None)
    pred = predictions(tagger, index, [cites[i] for i in keep], enc, progress=progress)[0]
    for i, labels in zip(keep, pred, strict=True):
        out[i] = to_nested_tags(cites[i].tokens, labels)
    return out
