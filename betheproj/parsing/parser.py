"""An arc-factored (first-order) dependency parser: hashed McDonald-style features (:mod:`.features`), trained by
Algorithm 1 of Martins et al. (EMNLP 2010, section 5: aggressive online learning, averaged weights) with any loss
``L_{beta,gamma}`` of their Figure 4 (CRF, structured SVM, softmax-margin, ...) over the tree oracles of
:mod:`betheproj.oracles.dependency`: the matrix-tree theorem for marginals and Chu-Liu-Edmonds for MAP
(non-projective, the default), or Eisner's algorithm (``projective=True``).
"""

from __future__ import annotations

import math
import re
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .._checks import check_bool, check_count
from .._files import torch_load, torch_save
from ..data.conllu import Sentence, _head_array, head_cycle
from ..learning.losses import resolve_loss
from ..learning.online import SparseExample, fit_online
from ..oracles.base import Marginals, Oracle, PairwisePotentials
from ..oracles.dependency import _is_tree, check_arc_potentials
from ..oracles.nonprojective import NonProjective
from ..progress import progress_bar
from .features import ArcFeatures, _sentences
from .metrics import _require_scorable, scorable_words, uas

__all__ = ["DependencyParser", "GreedyFirst", "read_model", "tree_error", "check_gold_trees", "is_projective"]

FORMAT = "betheproj-dependency-parser"
VERSION = 1


def read_model(path: str | Path, formats: dict[str, int], what: str) -> dict[str, Any]:
    """The ``torch.save``d state at ``path``, checked to carry one of the headers ``formats`` (format name ->
    version); ``what`` names the kind of file in the errors."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"expected a {what} (written by 'parse train --model') at {p}, found none")
    state = torch_load(p, what, map_location="cpu")
    if not isinstance(state, dict) or state.get("format") not in formats:
        raise ValueError(f"{p} is not a {what} (no {' or '.join(repr(f) for f in formats)} header)")
    if state.get("version") != formats[state["format"]]:
        raise ValueError(f"{p}: unsupported model version {state.get('version')!r} "
                         f"(expected {formats[state['format']]})")
    return state


def _what_failed(err: Exception) -> str:
    """A model field that is missing (``KeyError``), out of range (``ValueError``) or of the wrong kind, in a few
    words."""
    if isinstance(err, KeyError):
        return f"no field {err.args[0]!r}"
    return f"a field out of range: {err}" if isinstance(err, ValueError) else f"a field of the wrong kind: {err}"


def _check_saved_weights(path: str | Path, name: str, weights: Tensor) -> None:
    """``ValueError`` naming ``path`` unless the saved ``weights`` (the field ``name``) are float32 or float64 and
    finite, as the parsers save them (other numbers would fail later, in the decoders, without naming the file)."""
    if weights.layout != torch.strided or weights.device.type == "meta":
        raise ValueError(f"{path}: {name} must be a dense tensor with values, got layout {weights.layout} on "
                         f"{weights.device}")
    if weights.dtype not in (torch.float32, torch.float64):
        raise ValueError(f"{path}: {name} must be float32 or float64, got {weights.dtype}")
    if not bool(torch.isfinite(weights).all()):
        raise ValueError(f"{path}: {name} hold NaN or infinite values")


def tree_error(heads: Sequence[int] | np.ndarray, single_root: bool = False) -> str | None:
    """Why ``heads`` (the HEAD of words ``1..n``, 0 = root; integers) is not a dependency tree rooted at 0 (with
    ``single_root``: with exactly one word attached to 0), or ``None`` if it is one."""
    heads = _head_array(heads)
    n = len(heads)
    if n == 0:
        return "no words"
    if (heads < 0).any():
        return f"a word without a gold HEAD (word {int(np.argmax(heads < 0)) + 1})"
    if (heads > n).any():
        k = int(np.argmax(heads > n))
        return f"HEAD {int(heads[k])} of word {k + 1} is not in 0..{n}"
    loops = np.nonzero(heads == np.arange(1, n + 1))[0]
    if len(loops):
        return f"gold heads are not a tree: word {loops[0] + 1} is its own HEAD"
    roots = int((heads == 0).sum())
    if roots == 0:
        return "gold heads are not a tree: no word is attached to the root 0"
    if single_root and roots > 1:
        return f"gold heads are not a tree with a single root: {roots} words are attached to the root 0"
    cycle = head_cycle(heads)
    if cycle is not None:
        return f"gold heads are not a tree: words {', '.join(map(str, cycle))} form a cycle"
    return None


def is_projective(heads: Sequence[int] | np.ndarray) -> bool:
    """Whether the tree ``heads`` (the HEAD of words ``1..n``, 0 = root) has no crossing arcs: no two arcs
    ``h -> m`` whose spans ``[min(h, m), max(h, m)]`` overlap without one containing the other (the root arcs
    included, so every word lies under its root arc's span or outside it).  ``ValueError`` for a head outside
    ``0..n``."""
    heads = _head_array(heads, bounded=True)
    words = np.arange(1, len(heads) + 1)
    lo, hi = np.minimum(heads, words), np.maximum(heads, words)
    # arcs a, b cross iff lo_a < lo_b < hi_a < hi_b
    cross = (lo[:, None] < lo[None, :]) & (lo[None, :] < hi[:, None]) & (hi[:, None] < hi[None, :])
    return not bool(cross.any())


def check_gold_trees(sentences: Sequence[Sentence], single_root: bool = False, what: str = "training",
                     name: str | None = None) -> None:
    """Raise ``ValueError`` naming the first sentence whose gold heads are not a tree (:func:`tree_error`):
    ``{what} sentence {i}`` (counted from 1), prefixed with ``{name}:{line}`` when the file ``name`` is given."""
    for i, s in enumerate(_sentences(sentences)):
        problem = tree_error(s.heads, single_root)
        if problem is not None:
            where = f"{name}:{s.line}: " if name is not None and s.line else (f"{name}: " if name else "")
            raise ValueError(f"{where}{what} sentence {i + 1}: {problem}")


MAX_ARCS = 1 << 19
"""Most arcs (padded, ``B N (N + 1)``) whose features one batch of :meth:`DependencyParser.predict` or :func:`prune`
extracts at once: :meth:`ArcFeatures.flat` peaks at ~700 bytes an arc (0.73 GB for the 256 longest EWT training
sentences in one batch), so a batch of long sentences is cut to stay under ~0.4 GB."""


def _length_batches(lengths: Sequence[int], max_batch: int, budget: int, max_arcs: int | None = None
                    ) -> list[list[int]]:
    """Indices grouped in length-sorted batches of at most ``max_batch`` sentences with ``B (N+1)^3 <= budget`` and,
    given ``max_arcs``, ``B N (N+1) <= max_arcs`` (``N`` the batch's longest; a sentence over a budget alone)."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    out: list[list[int]] = []
    cur: list[int] = []
    for i in order:
        c = lengths[i] + 1
        over = (len(cur) + 1) * c ** 3 > budget or (max_arcs is not None and (len(cur) + 1) * c * (c - 1) > max_arcs)
        if cur and (len(cur) >= max_batch or over):
            out.append(cur)
            cur = []
        cur.append(i)
    if cur:
        out.append(cur)
    return out


class GreedyFirst:
    """MAP through another oracle, skipping it where the per-word best heads already form a tree.

    The score of a tree is a sum over words of the score of each word's head, so when every word's best head
    (``argmax_h theta(h -> m)``) together makes an arborescence rooted at 0 (no cycle; one root child with
    ``single_root``), that is the MAP: it is the first step of Chu-Liu-Edmonds, which stops there.  The check
    is batched (pointer doubling on the head array, as the oracles' ``check_labels``) and exact; sentences whose
    greedy heads have a cycle go to the wrapped oracle.  Only valid for non-projective decoding (a greedy tree
    need not be projective), so the wrapped oracle must be :class:`NonProjective`.  Marginals and everything
    else are delegated."""

    def __init__(self, oracle: NonProjective):
        if not isinstance(oracle, NonProjective):
            raise TypeError(f"oracle must be NonProjective (the greedy heads need not form a projective tree), got "
                            f"{type(oracle).__name__}")
        self.oracle = oracle

    def __getattr__(self, name: str) -> Any:
        if name == "oracle" or name.startswith("__"):        # copy and pickle look these up before __init__ ran
            raise AttributeError(name)
        return getattr(self.oracle, name)

    def marginals(self, potentials: PairwisePotentials) -> Marginals:
        return self.oracle.marginals(potentials)

    def map(self, potentials: PairwisePotentials) -> Tensor:
        check_arc_potentials(potentials)                     # as the oracle's (types, shapes, a zero edge table)
        node, lengths = potentials.node, potentials.lengths
        b, n, c = node.shape
        device = node.device
        h = torch.arange(c, device=device)[None, None, :]
        mods = torch.arange(1, n + 1, device=device)
        usable = (h <= lengths[:, None, None]) & (h != mods[None, :, None])
        masked = node.masked_fill(~usable, -math.inf)
        best, heads = masked.max(-1)                                      # [B, N]
        word = mods[None, :] <= lengths[:, None]
        tree = _is_tree(heads, word, self.oracle.single_root) & (torch.isfinite(best) | ~word).all(1)
        out = torch.where(word, heads, -1)
        rest = torch.nonzero(~tree).flatten()
        if rest.numel():
            try:
                out[rest] = self.oracle.map(potentials.index(rest))
            except ValueError as err:                        # name the example in this batch, not in ``rest``
                raise ValueError(re.sub(r"^example (\d+):", lambda m: f"example {int(rest[int(m.group(1))])}:",
                                        str(err))) from None
        return out


class DependencyParser:
    """First-order dependency parser ``y_hat = argmax_y sum_m w^T phi(x, y_m -> m)``.

    ``bits``: the hashed weight vector has ``2^bits`` entries; ``projective``: decode (and train) over projective
    trees with Eisner's algorithm instead of all trees with Chu-Liu-Edmonds; ``single_root``: exactly one word
    attaches to the root (UD's convention; costs a factor ``n`` in Chu-Liu-Edmonds decoding); ``xpos``: add
    feature templates over the XPOS column; ``context``: the context templates (neighbouring words and three-tag
    back-offs, see :mod:`.features`).
    """

    def __init__(self, bits: int = 22, projective: bool = False, single_root: bool = False,
                 lowercase: bool = True, xpos: bool = False, context: bool = True):
        self.features = ArcFeatures(bits, lowercase, xpos, context)
        self.projective = check_bool("projective", projective)
        self.single_root = check_bool("single_root", single_root)
        self.weights: Tensor | None = None
        self.info: dict[str, Any] = {}

    # ------------------------------------------------------------------------------------------------ config
    @property
    def oracle(self) -> Oracle:
        """The tree oracle: ``NonProjective`` (matrix-tree / Chu-Liu-Edmonds, behind :class:`GreedyFirst`) or
        ``Projective`` (Eisner)."""
        if self.projective:
            from ..oracles.projective import Projective
            return Projective(single_root=self.single_root)
        return GreedyFirst(NonProjective(single_root=self.single_root))

    def config(self) -> dict[str, int | bool]:
        return {**self.features.config(), "projective": self.projective, "single_root": self.single_root}

    @classmethod
    def from_config(cls, cfg: dict[str, Any]) -> DependencyParser:
        """An untrained parser with the configuration :meth:`config` returned."""
        if not isinstance(cfg, dict):
            raise TypeError(f"cfg must be the dict that config() returned, got {type(cfg).__name__}")
        return cls(bits=cfg["bits"], projective=cfg["projective"], single_root=cfg["single_root"],
                   lowercase=cfg["lowercase"], xpos=cfg.get("xpos", False),
                   context=cfg.get("context", False))          # models saved before the context templates

    def __repr__(self) -> str:
        state = "trained" if self.weights is not None else "untrained"
        return (f"DependencyParser(bits={self.features.bits}, projective={self.projective}, "
                f"single_root={self.single_root}, {state})")

    # ------------------------------------------------------------------------------------------------ training
    def fit(self, sentences: Sequence[Sentence], loss: str | None = "crf", epochs: int = 10, lam: float = 1e-4,
            beta: float | None = None, gamma: float | None = None, seed: int = 0,
            dev: Sequence[Sentence] | None = None, progress: bool = False,
            log: Callable[[str], None] | None = None) -> DependencyParser:
        """Train with Algorithm 1 (``epochs`` passes, step cap ``1 / (lam m)``, averaged weights) on the loss
        ``L_{beta,gamma}`` (a preset name: ``crf``, ``svm``, ``softmax_margin``, or explicit ``beta``/``gamma``; not
        the perceptron loss, ``beta = inf, gamma = 0``, which makes no step from the zero start: a ``ValueError``)
        with the Hamming cost (the number of words with a wrong head).  With ``dev``, the UAS (punctuation excluded)
        of the averaged weights is measured after every epoch and reported to ``log`` (the weights kept are those of
        the last epoch).  Returns the parser, like ``SecondOrderParser.fit``; the learner's report (per-epoch losses,
        ...) is ``self.result_``."""
        beta, gamma = resolve_loss(loss, beta, gamma)
        if math.isinf(beta) and gamma == 0:
            raise ValueError("the perceptron loss (beta = inf, gamma = 0) makes no step from the zero weights "
                             "Algorithm 1 starts at (every tree ties, so the loss and the step are 0): use svm, crf "
                             "or softmax_margin")
        sentences = _sentences(sentences)
        dev = None if dev is None else _sentences(dev, "dev")
        if not sentences:
            raise ValueError("no training sentences")
        check_gold_trees(sentences, self.single_root)
        if self.projective:
            crossing = sum(not is_projective(s.heads) for s in sentences)
            if crossing:
                warnings.warn(f"{crossing} of {len(sentences)} training sentences have a non-projective gold tree, "
                              "which a projective parser cannot produce: they are trained on as given (their arcs "
                              "still inform the weights; their loss can fall below 0 and then makes no step)",
                              UserWarning, stacklevel=2)
        if dev is not None and not scorable_words(dev):
            raise ValueError("dev has no words with a gold HEAD to score (punctuation excluded)")
        for i, s in enumerate(dev or []):                    # predict would refuse it after the first epoch
            if not len(s):
                raise ValueError(f"dev[{i}] has no words")
        start = time.perf_counter()
        examples = []
        bar = progress_bar(len(sentences), progress, "features")
        try:
            for first in range(0, len(sentences), 512):      # in slices: a bar that moves, global ids freed early
                part = sentences[first:first + 512]
                for s, ids in zip(part, self.features.batch(part), strict=True):   # compact: distinct ids + indices
                    table, inv = np.unique(ids, return_inverse=True)
                    examples.append(SparseExample(
                        torch.from_numpy(inv.reshape(len(s), len(s) + 1, -1).astype(np.int32)),
                        torch.from_numpy(s.heads), table=torch.from_numpy(table.astype(np.int32))))
                bar.update(len(part))
        finally:
            bar.close()
        feature_seconds = time.perf_counter() - start
        if log is not None:
            # every example is compact: each has a table
            size = sum(ex.ids.numel() * 4 + ex.table.numel() * 4 for ex in examples if ex.table is not None)
            log(f"features: {len(sentences)} sentences, {sum(len(s) * (len(s) + 1) for s in sentences)} arcs, "
                f"{size / 2**20:.0f} MiB (compact) in {feature_seconds:.1f}s")
        dev_scores: list[float] = []

        def on_epoch(epoch: int, weights: Tensor, mean_loss: float) -> None:
            message = f"epoch {epoch + 1}/{epochs}: mean loss {mean_loss:.4f}"
            if dev is not None:
                self.weights = None                        # the last epoch's copy is not kept beside the new one
                self.weights = weights.to(torch.float32)
                dev_scores.append(self.evaluate(dev))
                message += f", dev UAS {dev_scores[-1]:.2f}"
            if log is not None:
                log(message)

        result = fit_online(self.oracle, examples, self.features.num_features, loss=None, beta=beta, gamma=gamma,
                            lam=lam, epochs=epochs, seed=seed, progress=progress, callback=on_epoch,
                            desc=f"train ({loss or f'beta={beta}, gamma={gamma}'})")
        self.weights = result.weights.to(torch.float32)
        self.info = {"loss": loss, "beta": beta, "gamma": gamma, "epochs": epochs, "lam": lam, "seed": seed,
                     "train_sentences": len(sentences), "train_seconds": time.perf_counter() - start,
                     "feature_seconds": feature_seconds, "epoch_losses": result.losses, "dev_uas": dev_scores}
        self.result_ = result
        return self

    # ------------------------------------------------------------------------------------------------ parsing
    def _require_weights(self) -> Tensor:
        if self.weights is None:
            raise ValueError("the parser is not trained: call fit() or load() first")
        return self.weights

    def arc_scores(self, sentences: Sequence[Sentence]) -> list[Tensor]:
        """Arc scores ``[N, N+1]`` per sentence (row ``m-1``, column ``h``: score of ``h -> m``; ``-inf`` at
        ``h = m``, in no tree)."""
        w = self._require_weights()
        out = []
        for x in self.features.batch(_sentences(sentences)):
            n = x.shape[0]
            scores = torch.nn.functional.embedding_bag(torch.from_numpy(x.reshape(-1, x.shape[-1])), w[:, None],
                                                       mode="sum").reshape(n, n + 1)
            scores.diagonal(1).fill_(-math.inf)                # h = m: the padding weight's 0 otherwise
            out.append(scores)
        return out

    def predict(self, sentences: Sequence[Sentence], batch_size: int = 256, progress: bool = False) -> list[np.ndarray]:
        """Predicted heads (int64 arrays, 0 = root) of every sentence, decoded in length-sorted batches of at most
        ``batch_size`` sentences and :data:`MAX_ARCS` arcs."""
        w = self._require_weights()
        sentences = _sentences(sentences)
        batch_size = check_count("batch_size", batch_size)
        for i, s in enumerate(sentences):
            if len(s) == 0:
                raise ValueError(f"sentences[{i}] has no words")
        out: list[np.ndarray | None] = [None] * len(sentences)
        oracle = self.oracle
        bar = progress_bar(len(sentences), progress, "parse")
        for idx in _length_batches([len(s) for s in sentences], batch_size, 1 << 62, MAX_ARCS):
            ids, sent, mod, head = self.features.flat([sentences[i] for i in idx])
            # all arcs of the batch at once; embedding_bag's fused gather-sum is ~2x faster than w[ids].sum(-1)
            scores = torch.nn.functional.embedding_bag(torch.from_numpy(ids), w[:, None], mode="sum")[:, 0]
            lengths = torch.tensor([len(sentences[i]) for i in idx], dtype=torch.long)
            n_max = int(lengths.max())
            node = torch.zeros(len(idx), n_max, n_max + 1, dtype=w.dtype)   # heads past a length are ignored
            node[torch.from_numpy(sent), torch.from_numpy(mod - 1), torch.from_numpy(head)] = scores
            heads = oracle.map(PairwisePotentials(node, node.new_zeros(n_max + 1, n_max + 1), lengths))
            for b, i in enumerate(idx):
                out[i] = heads[b, : len(sentences[i])].numpy().astype(np.int64)
            bar.update(len(idx))
        bar.close()
        return out  # type: ignore[return-value]

    def parse(self, sentences: Sequence[Sentence], batch_size: int = 256, progress: bool = False) -> list[Sentence]:
        """Copies of the sentences with the predicted HEAD column."""
        sentences = _sentences(sentences)                # a generator would be used up by predict
        heads = self.predict(sentences, batch_size, progress)
        return [s.with_heads(h) for s, h in zip(sentences, heads, strict=True)]

    def evaluate(self, sentences: Sequence[Sentence], punct: bool = False, batch_size: int = 256) -> float:
        """UAS in percent against the gold heads (punctuation, gold UPOS ``PUNCT``, excluded unless ``punct``);
        ``ValueError`` before any parsing when no word would be scored."""
        sentences = _sentences(sentences)                # a generator would be used up by the check
        _require_scorable(sentences, punct)
        return uas(sentences, self.predict(sentences, batch_size), punct=punct)

    # ------------------------------------------------------------------------------------------------ storage
    def save(self, path: str | Path) -> None:
        """Write the configuration and weights (float32) with ``torch.save`` (``OSError`` naming ``path`` when it
        cannot be written)."""
        w = self._require_weights()
        torch_save({"format": FORMAT, "version": VERSION, "config": self.config(), "info": self.info,
                    "weights": w}, Path(path))

    @classmethod
    def load(cls, path: str | Path) -> DependencyParser:
        """A parser written by :meth:`save`."""
        return cls.from_state(read_model(path, {FORMAT: VERSION}, "parser model file"), path)

    @classmethod
    def from_state(cls, state: dict[str, Any], path: str | Path) -> DependencyParser:
        """The parser a state read by :func:`read_model` describes (``path`` names it in errors)."""
        if not isinstance(state, dict):
            raise ValueError(f"{path}: a malformed parser model (a {type(state).__name__}, not a dict of fields)")
        try:
            cfg = state["config"]
            parser = cls.from_config(cfg)
            weights = state["weights"]
        except (KeyError, TypeError, AttributeError, ValueError) as err:
            raise ValueError(f"{path}: a malformed parser model ({_what_failed(err)})") from None
        if not isinstance(weights, Tensor) or weights.shape != (parser.features.num_features + 1,):
            raise ValueError(f"{path}: weights do not match bits={cfg['bits']}")
        _check_saved_weights(path, "weights", weights)
        parser.weights = weights
        parser.info = state.get("info", {})
        return parser
