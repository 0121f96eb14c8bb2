"""Second-order (sibling + grandparent) non-projective dependency parsing, two ways.

The model scores a tree ``y`` (binary arc indicators ``y_hm``) as

    theta . y + sum_{h, m < s} S[h, m, s] y_hm y_hs + sum_{g, h, m} G[g, h, m] y_gh y_hm,

``theta`` arc-factored (the hashed McDonald features of :mod:`.features`, weights ``w1``), ``S`` and ``G`` sums
of hashed second-order part features (:mod:`.part_features`, weights ``w2``).  Inference is intractable; it is
approximated (:mod:`.second_order_decoding`)

(a) as Turbo Parser #1 (Martins et al., EMNLP 2010, section 4; Smith & Eisner 2008): sum-product loopy BP on the
    factor graph of binary arc variables with one TREE factor and one pairwise factor per sibling / grandparent
    part, ``loopy_bp`` (vectorised over the batch and every part with dense ``[B, C, C, C]`` message tensors);
(b) as in Vilnis et al. (UAI 2015): the second-order terms become the mean-field energy
    :class:`~betheproj.energies.second_order.SecondOrderArcs` (eq. 9) and problem (2) is solved by Bethe-RDA
    (Algorithm 1) with the matrix-tree oracle, ``mean_field_parse``; the tree is Proposition 1's MAP.

Arcs are pruned by a first-order model (:mod:`.pruning`: top-``k`` heads per word by arc marginal, plus the
first-order MAP tree so that a tree always survives, plus the gold head when training), which keeps the part
tensors small.  Training (:meth:`SecondOrderParser.fit`) is Algorithm 3 of Vilnis et al.: per minibatch, a few
Bethe-RDA iterations solve (2), then one AdaGrad step on ``(w1, w2)`` along the surrogate likelihood (eq. 12,
:func:`betheproj.learning.model.surrogate_nll`; gradients eqs. 13-17).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .._checks import check_count, check_damping_space, check_nonnegative, check_positive, check_real, check_seed
from .._files import torch_save
from ..data.conllu import Sentence
from ..energies.second_order import SecondOrderArcs
from ..inference.solve import solve
from ..learning.model import surrogate_nll
from ..oracles.base import PairwisePotentials
from ..oracles.nonprojective import NonProjective
from ..progress import progress_bar
from ._sparse import AdaGrad, take
from .metrics import _require_scorable, scorable_words, uas
from .parser import (
    DependencyParser,
    GreedyFirst,
    _check_saved_weights,
    _length_batches,
    _sentences,
    _what_failed,
    check_gold_trees,
    read_model,
)
from .part_features import SecondOrderFeatures
from .pruning import Candidates, _dense, prune
from .second_order_decoding import loopy_bp_parse, mean_field_parse

__all__ = ["SecondOrderParser"]

METHODS = ("mean_field", "loopy_bp", "first_order")   # decoders of SecondOrderParser.predict


def _check_method(name: str, method: object) -> None:
    if method not in METHODS:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, METHODS))}, got {method!r}")

FORMAT = "betheproj-second-order-parser"
VERSION = 1


@dataclass
class _Batch:
    potentials: PairwisePotentials
    sibling: Tensor
    grandparent: Tensor
    parts: tuple[Tensor, Tensor]
    heads: Tensor | None
    idx: list[int]


class SecondOrderParser:
    """First-order weights ``w1`` (over :class:`~.features.ArcFeatures` of a :class:`DependencyParser`, copied from
    it) plus second-order weights ``w2`` (over :class:`SecondOrderFeatures`); see the module docstring.

    ``first``: a trained :class:`DependencyParser` (its features, its weights as the starting ``w1`` and as the
    pruner); ``bits``: ``2^bits`` second-order weights; ``top_k``/``min_prob``: pruning (:func:`prune`).
    """

    def __init__(self, first: DependencyParser, bits: int = 22, top_k: int = 5, min_prob: float = 1e-4,
                 context: bool = True):
        if not isinstance(first, DependencyParser):
            raise TypeError(f"first must be a DependencyParser, got {type(first).__name__}")
        if first.weights is None:
            raise ValueError("the first-order parser is not trained")
        if first.projective:
            raise ValueError("second-order parsing here is non-projective: give a non-projective first-order parser")
        self.first = first
        self.features = SecondOrderFeatures(bits, first.features.lowercase, context)
        self.top_k = check_count("top_k", top_k)
        self.min_prob = check_real("min_prob", min_prob, 0.0, 1.0, high_open=True)
        self.pruner = first.weights.to(torch.float64).clone()          # fixed: the first-order model prunes
        self.w1 = self.pruner.clone()
        self.w2 = torch.zeros(self.features.num_features, dtype=torch.float64)
        self.info: dict[str, Any] = {}

    # ------------------------------------------------------------------------------------------------ batches
    def _batch(self, sentences: Sequence[Sentence], cands: Candidates, idx: list[int], gold: bool) -> _Batch:
        lens = torch.as_tensor(cands.lengths[idx])
        n = int(lens.max())
        c = n + 1
        rows = [cands.rows(i) for i in idx]
        sent = np.concatenate([np.full(r.stop - r.start, j, dtype=np.int64) for j, r in enumerate(rows)])
        mod = np.concatenate([cands.mod[r] for r in rows]).astype(np.int64)
        head = np.concatenate([cands.head[r] for r in rows]).astype(np.int64)
        ids = np.concatenate([cands.ids[r] for r in rows])
        node = _dense(ids, sent, mod, head, self.w1, lens)
        pot = PairwisePotentials(node, node.new_zeros(c, c), lens)
        cand = torch.zeros(len(idx), c, c, dtype=torch.bool)
        cand[torch.from_numpy(sent), torch.from_numpy(head), torch.from_numpy(mod + 1)] = True
        tok, starts = self.features.tokens([sentences[i] for i in idx])
        # sibling parts: (h, m), (h, s) both candidates, m < s; grandparent: (g, h), (h, m), g != m
        upper = torch.ones(c, c, dtype=torch.bool).triu(1)
        sb, sh, sm, ss = torch.nonzero(cand[:, :, :, None] & cand[:, :, None, :] & upper).T
        notm = ~torch.eye(c, dtype=torch.bool)
        gb, gg, gh, gm = torch.nonzero(cand[:, :, :, None] & cand[:, None, :, :] & notm[:, None, :]).T
        sid = self.features.sibling(tok, starts[sb.numpy()], sh.numpy(), sm.numpy(), ss.numpy())
        gid = self.features.grandparent(tok, starts[gb.numpy()], gg.numpy(), gh.numpy(), gm.numpy())
        shape = (len(idx), c, c, c)
        sib = torch.zeros(shape, dtype=self.w2.dtype).index_put(
            (sb, sh, sm, ss), take(self.w2, torch.from_numpy(sid)).sum(-1))
        grand = torch.zeros(shape, dtype=self.w2.dtype).index_put(
            (gb, gg, gh, gm), take(self.w2, torch.from_numpy(gid)).sum(-1))
        heads = None
        if gold:
            heads = torch.zeros(len(idx), n, dtype=torch.long)
            for j, i in enumerate(idx):
                heads[j, : len(sentences[i])] = torch.from_numpy(sentences[i].heads)
        return _Batch(pot, sib, grand, (torch.stack([sb, sh, sm, ss]), torch.stack([gb, gg, gh, gm])), heads, idx)

    # ------------------------------------------------------------------------------------------------ training
    def fit(self, sentences: Sequence[Sentence], epochs: int = 3, lr: float = 0.05, lr_first: float = 0.01,
            train_iter: int = 5, max_batch: int = 32, budget: int = 2_000_000, l2: float = 0.0, seed: int = 0,
            dev: Sequence[Sentence] | None = None, dev_method: str = "mean_field", dev_iter: int = 10,
            eval_every: int | None = None,
            progress: bool = False, log: Callable[[str], None] | None = None,
            max_seconds: float | None = None) -> SecondOrderParser:
        """Algorithm 3 (Vilnis et al.): for each minibatch, ``train_iter`` Bethe-RDA iterations solve (2) with the
        current weights, then one AdaGrad step (rates ``lr`` for ``w2``, ``lr_first`` for ``w1``, smaller: it
        starts trained; 0 freezes ``w1``) on the mean surrogate negative log-likelihood (eq. 12) plus
        ``l2/2 ||w2||^2``.  With ``dev`` the dev UAS (``dev_method`` with ``dev_iter`` iterations) is measured every
        ``eval_every`` steps (default: each epoch) and after the last step, and the best weights are kept.
        ``max_seconds`` stops training early (the cut is reported in ``info``)."""
        sentences = _sentences(sentences)
        dev = None if dev is None else _sentences(dev, "dev")
        if not sentences:
            raise ValueError("no training sentences")
        epochs, train_iter = check_count("epochs", epochs), check_count("train_iter", train_iter)
        max_batch, budget = check_count("max_batch", max_batch), check_count("budget", budget)
        lr, lr_first = check_positive("lr", lr), check_nonnegative("lr_first", lr_first)
        l2, seed = check_nonnegative("l2", l2), check_seed("seed", seed)
        _check_method("dev_method", dev_method)
        dev_iter = check_count("dev_iter", dev_iter, 0)
        if dev_iter == 0 and dev_method == "loopy_bp":          # mean field's 0 is no iterations; BP runs at least one
            raise ValueError(f"dev_iter must be an int >= 1 with dev_method='loopy_bp', got {dev_iter}")
        if eval_every is not None:
            eval_every = check_count("eval_every", eval_every)
        if max_seconds is not None:
            max_seconds = check_positive("max_seconds", max_seconds)
        check_gold_trees(sentences, self.first.single_root)
        if dev is not None and not scorable_words(dev):
            raise ValueError("dev has no words with a gold HEAD to score (punctuation excluded)")
        start = time.perf_counter()
        cands = prune(self.first, self.pruner, sentences, self.top_k, self.min_prob, gold=True)
        prune_seconds = time.perf_counter() - start
        if log is not None:
            log(f"pruning: {len(cands.mod)} arcs kept for {int(cands.lengths.sum())} words "
                f"({len(cands.mod) / cands.lengths.sum():.2f} per word) in {prune_seconds:.1f}s")
        dev_c = None if dev is None else prune(self.first, self.pruner, dev, self.top_k, self.min_prob)
        self.w1.requires_grad_(lr_first > 0)
        self.w2.requires_grad_(True)
        # AdaGrad over the entries each step reads (sparse gradients: the same steps as a dense AdaGrad's, at a
        # small part of its cost with 2^22 + 2^24 weights)
        opt = AdaGrad([(self.w2, lr)] + ([(self.w1, lr_first)] if lr_first > 0 else []))
        oracle = NonProjective(self.first.single_root)
        batches = _length_batches(cands.lengths.tolist(), max_batch, budget)
        gen = torch.Generator().manual_seed(seed)
        eval_every = len(batches) if eval_every is None else eval_every
        bar = progress_bar(epochs * len(batches), progress, "second-order (Algorithm 3)")
        best, best_state, history, steps, stopped = None, None, [], 0, False
        losses: list[float] = []
        pad1 = self.first.features.num_features
        try:
            for _ in range(epochs):
                for bi in torch.randperm(len(batches), generator=gen).tolist():
                    batch = self._batch(sentences, cands, batches[bi], gold=True)
                    energy = SecondOrderArcs(batch.sibling, batch.grandparent, batch.parts)
                    with torch.no_grad():
                        sol = solve(oracle, PairwisePotentials(batch.potentials.node.detach(),
                                                               batch.potentials.edge, batch.potentials.lengths),
                                    SecondOrderArcs(batch.sibling.detach(), batch.grandparent.detach(), batch.parts),
                                    method="rda", max_iter=train_iter)
                    opt.zero_grad()
                    assert batch.heads is not None                 # a gold=True batch
                    loss = surrogate_nll(oracle, batch.potentials, energy, sol.marginals, batch.heads).mean()
                    total = loss + (0.5 * l2 * (self.w2 * self.w2).sum() if l2 > 0 else 0.0)
                    total.backward()
                    opt.step()
                    with torch.no_grad():
                        self.w1[pad1] = 0.0
                    losses.append(loss.item())
                    steps += 1
                    bar.update(1)
                    bar.set_postfix(loss=f"{np.mean(losses[-50:]):.3f}")
                    timeout = max_seconds is not None and time.perf_counter() - start > max_seconds
                    last = timeout or steps == epochs * len(batches)          # the final weights are a candidate too
                    if dev is not None and (steps % eval_every == 0 or last):
                        score = self.evaluate(dev, method=dev_method, candidates=dev_c,
                                              max_iter=None if dev_method == "first_order" else dev_iter)
                        history.append((steps, score))
                        if log is not None:
                            log(f"step {steps}: loss {np.mean(losses[-eval_every:]):.4f}, dev UAS {score:.2f}")
                        if not math.isnan(score) and (best is None or score > best):   # NaN: nothing scored
                            best, best_state = score, (self.w1.detach().clone(), self.w2.detach().clone())
                    if timeout:
                        stopped = True
                        break
                if stopped:
                    break
        finally:
            bar.close()
            self.w1.requires_grad_(False)
            self.w2.requires_grad_(False)
        if best_state is not None:
            self.w1, self.w2 = best_state
        self.info = {"epochs": epochs, "lr": lr, "lr_first": lr_first, "train_iter": train_iter, "l2": l2,
                     "max_batch": max_batch, "steps": steps, "stopped_early": stopped,
                     "train_seconds": time.perf_counter() - start, "prune_seconds": prune_seconds,
                     "train_sentences": len(sentences), "train_recall": cands.recall, "dev_history": history,
                     "best_dev": best, "mean_loss_last_epoch": float(np.mean(losses[-len(batches):]))}
        return self

    # ------------------------------------------------------------------------------------------------ parsing
    @torch.no_grad()
    def predict(self, sentences: Sequence[Sentence], method: str = "mean_field", candidates: Candidates | None = None,
                max_batch: int = 64, budget: int = 4_000_000, max_iter: int | None = None, damping: float = 0.0,
                decode_on: str | None = None, progress: bool = False, damping_space: str = "probability"
                ) -> list[np.ndarray]:
        """Heads (int64 arrays) of every sentence: ``method="mean_field"`` (:func:`mean_field_parse`, default 30
        Bethe-RDA iterations) or ``"loopy_bp"`` (:func:`loopy_bp_parse`, default 20 iterations); ``"first_order"``
        decodes the pruned arc-factored part alone (``w1``, no second-order terms).  ``max_iter`` applies to the
        first two, ``damping`` (in [0, 1)) and ``damping_space`` (``"probability"`` or ``"log"``: where damping
        mixes the messages, :func:`~betheproj.parsing.second_order_decoding.loopy_bp`) to loopy BP, ``decode_on``
        to mean field (``"map"``, the default, or ``"marginals"``) and loopy BP (``"beliefs"``, the default, or
        ``"log_odds"``); an option the method does not use is an error rather than ignored."""
        _check_method("method", method)
        max_batch, budget = check_count("max_batch", max_batch), check_count("budget", budget)
        if max_iter is not None:
            if method == "first_order":
                raise ValueError("max_iter applies to method='mean_field' or 'loopy_bp', not 'first_order'")
            max_iter = check_count("max_iter", max_iter, 0)
            if max_iter == 0 and method == "loopy_bp":      # mean field's 0 is no iterations; BP runs at least one
                raise ValueError("max_iter must be an int >= 1 with method='loopy_bp', got 0")
        if damping != 0.0 and method != "loopy_bp":
            raise ValueError(f"damping applies to method='loopy_bp' only, got damping={damping!r} with {method!r}")
        damping = check_real("damping", damping, 0.0, 1.0, high_open=True)    # as loopy_bp, before any pruning
        damping_space = check_damping_space(damping_space)
        if damping_space != "probability" and method != "loopy_bp":
            raise ValueError(f"damping_space applies to method='loopy_bp' only, got {damping_space!r} with {method!r}")
        choices = {"mean_field": ("map", "marginals"), "loopy_bp": ("beliefs", "log_odds"), "first_order": ()}[method]
        if decode_on is not None and decode_on not in choices:
            raise ValueError(f"decode_on must be one of {choices} for method={method!r}, got {decode_on!r}"
                             if choices else "decode_on applies to method='mean_field' or 'loopy_bp', not "
                                             "'first_order'")
        sentences = _sentences(sentences)
        if candidates is None:
            candidates = prune(self.first, self.pruner, sentences, self.top_k, self.min_prob)
        if not isinstance(candidates, Candidates):
            raise TypeError(f"candidates must be Candidates (from prune), got {type(candidates).__name__}")
        mine = self.first.features.config()
        if candidates.features is not None and candidates.features != mine:
            def show(cfg: dict[str, int | bool]) -> str:
                return ", ".join(f"{k}={v}" for k, v in cfg.items())

            raise ValueError(f"candidates were pruned with other first-order features ({show(candidates.features)}; "
                             f"this model's {show(mine)}): their feature ids index other weights")
        if len(candidates.lengths) != len(sentences) or any(
                int(n) != len(s) for n, s in zip(candidates.lengths, sentences, strict=True)):
            raise ValueError(f"candidates do not belong to these sentences (they were pruned for "
                             f"{len(candidates.lengths)} sentences of other lengths or number; prune these)")
        out: list[np.ndarray] = [None] * len(sentences)  # type: ignore[list-item]
        batches = _length_batches(candidates.lengths.tolist(), max_batch, budget)
        bar = progress_bar(len(sentences), progress, f"parse ({method})")
        single = self.first.single_root
        for idx in batches:
            batch = self._batch(sentences, candidates, idx, gold=False)
            if method == "mean_field":
                heads, _ = mean_field_parse(batch.potentials, batch.sibling, batch.grandparent,
                                            max_iter=30 if max_iter is None else max_iter, decode_on=decode_on or "map",
                                            single_root=single,
                                            parts=batch.parts)
            elif method == "loopy_bp":
                heads, _ = loopy_bp_parse(batch.potentials, batch.sibling, batch.grandparent,
                                          max_iter=20 if max_iter is None else max_iter,
                                          damping=damping, decode_on=decode_on or "beliefs", single_root=single,
                                          damping_space=damping_space)
            else:
                heads = GreedyFirst(NonProjective(single)).map(batch.potentials)
            for j, i in enumerate(idx):
                out[i] = heads[j, : len(sentences[i])].numpy().astype(np.int64)
            bar.update(len(idx))
        bar.close()
        return out

    def evaluate(self, sentences: Sequence[Sentence], method: str = "mean_field", punct: bool = False,
                 **options: Any) -> float:
        """UAS in percent (punctuation excluded unless ``punct``), see :func:`.metrics.uas`; ``ValueError``
        before any parsing when no word would be scored."""
        sentences = _sentences(sentences)                # a generator would be used up by the check
        _require_scorable(sentences, punct)
        return uas(sentences, self.predict(sentences, method, **options), punct=punct)

    # ------------------------------------------------------------------------------------------------ storage
    def save(self, path: str | Path) -> None:
        """Write the first-order configuration, the pruner, ``w1``, ``w2`` and the settings with ``torch.save``
        (``OSError`` naming ``path`` when it cannot be written)."""
        torch_save({"format": FORMAT, "version": VERSION, "first_config": self.first.config(),
                    "features": self.features.config(), "top_k": self.top_k, "min_prob": self.min_prob,
                    "pruner": self.pruner, "w1": self.w1.detach(), "w2": self.w2.detach(), "info": self.info},
                   Path(path))

    @classmethod
    def load(cls, path: str | Path) -> SecondOrderParser:
        """A parser written by :meth:`save`."""
        return cls.from_state(read_model(path, {FORMAT: VERSION}, "second-order parser model"), path)

    @classmethod
    def from_state(cls, state: dict[str, Any], path: str | Path = "the model") -> SecondOrderParser:
        """The parser a state read by :func:`~betheproj.parsing.parser.read_model` describes (``path`` names it
        in errors)."""
        try:
            first = DependencyParser.from_config(state["first_config"])
            pruner, w1, w2 = state["pruner"], state["w1"], state["w2"]
            if not all(isinstance(w, Tensor) for w in (pruner, w1, w2)):
                raise TypeError("pruner, w1 and w2 must be tensors")
            first.weights = pruner.to(torch.float32)
            parser = cls(first, bits=state["features"]["bits"], top_k=state["top_k"], min_prob=state["min_prob"],
                         context=state["features"].get("context", False))
        except (KeyError, TypeError, AttributeError, ValueError) as err:
            raise ValueError(f"{path}: a malformed second-order parser model ({_what_failed(err)})") from None
        sizes = {"pruner": first.features.num_features + 1, "w1": first.features.num_features + 1,
                 "w2": parser.features.num_features}
        for name, w in (("pruner", pruner), ("w1", w1), ("w2", w2)):
            if w.shape != (sizes[name],):
                raise ValueError(f"{path}: {name} has shape {tuple(w.shape)}, not ({sizes[name]},) as the model's "
                                 "bits ask")
            _check_saved_weights(path, name, w)
        parser.pruner, parser.w1, parser.w2 = pruner, w1, w2
        parser.info = state.get("info", {})
        return parser
