"""First-order arc pruning for second-order parsing: per word the ``top_k`` heads by arc marginal (matrix-tree
theorem), plus the first-order MAP tree (so a tree always survives), plus the gold head when training."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from .._checks import check_bool, check_count, check_real
from ..data.conllu import Sentence
from ..oracles.base import PairwisePotentials
from ..oracles.dependency import _arc_mask
from ..oracles.nonprojective import NonProjective
from ._sparse import take
from .parser import MAX_ARCS, DependencyParser, GreedyFirst, _length_batches, _sentences

__all__ = ["Candidates", "prune"]


@dataclass
class Candidates:
    """Pruned arcs of a list of sentences: for sentence ``i`` the rows ``offsets[i]:offsets[i+1]`` of ``mod``
    (0-based word index ``m - 1``), ``head`` (0 = root) and the first-order feature ids ``ids`` [A, K1] (int32),
    hashed by the features whose ``config()`` is ``features`` (``None``: not recorded)."""

    offsets: np.ndarray
    mod: np.ndarray
    head: np.ndarray
    ids: np.ndarray
    lengths: np.ndarray
    recall: float              # share of gold heads kept (non-punctuation words with a gold head), NaN if none
    features: dict[str, int | bool] | None = None

    def rows(self, i: int) -> slice:
        return slice(int(self.offsets[i]), int(self.offsets[i + 1]))


def _dense(ids: np.ndarray, sent: np.ndarray, mod: np.ndarray, head: np.ndarray, w: Tensor, lengths: Tensor
           ) -> Tensor:
    """Node scores [B, N, N+1] (``-inf`` where no arc is listed) of listed arcs ``w[ids].sum(-1)``."""
    n, device = int(lengths.max()), w.device
    vals = take(w, torch.from_numpy(ids).to(device, torch.long)).sum(-1)           # sparse gradient (training)
    node = torch.full((len(lengths), n, n + 1), -math.inf, dtype=w.dtype, device=device)
    return node.index_put(tuple(torch.from_numpy(a).to(device) for a in (sent, mod, head)), vals)


def prune(first: DependencyParser, w1: Tensor, sentences: Sequence[Sentence], top_k: int = 5,
          min_prob: float = 0.0, gold: bool = False, batch_size: int = 256) -> Candidates:
    """First-order arc pruning: keep, per word, the ``top_k`` heads of highest arc marginal (matrix-tree theorem
    with the scores ``w1 . f(h -> m)``) whose marginal is at least ``min_prob``, plus the arcs of the first-order
    MAP tree (so a tree always survives), plus the gold head if ``gold``.  Returns the kept arcs with their
    first-order feature ids and the pruning recall (gold heads kept, punctuation excluded)."""
    top_k, min_prob = check_count("top_k", top_k), check_real("min_prob", min_prob, 0.0, 1.0, high_open=True)
    gold = check_bool("gold", gold)
    batch_size = check_count("batch_size", batch_size)
    if not isinstance(first, DependencyParser):
        raise TypeError(f"first must be a DependencyParser, got {type(first).__name__}")
    size = first.features.num_features + 1
    if not isinstance(w1, Tensor) or not w1.is_floating_point():
        raise TypeError(f"w1 must be a floating-point weight tensor [{size}], got "
                        f"{w1.dtype if isinstance(w1, Tensor) else type(w1).__name__}")
    if tuple(w1.shape) != (size,):      # weights of a model with other feature bits would index other features
        raise ValueError(f"w1 must hold the {size} weights of first's features (2^bits + 1), got shape "
                         f"{tuple(w1.shape)}")
    if not bool(torch.isfinite(w1).all()):
        raise ValueError("w1 must be finite")
    sentences = _sentences(sentences)
    for i, s in enumerate(sentences):
        if len(s) == 0:
            raise ValueError(f"sentences[{i}] has no words")
        if gold and (s.heads < 0).any():
            raise ValueError(f"sentences[{i}] has a word without a gold HEAD")
        loops = np.nonzero(s.heads == np.arange(1, len(s) + 1))[0]
        if gold and len(loops):                         # kept as a candidate, it would be an arc m -> m
            raise ValueError(f"sentences[{i}]: word {int(loops[0]) + 1} is its own gold HEAD")
        if (s.heads > len(s)).any():                    # would index another sentence's padding, or past it
            raise ValueError(f"sentences[{i}]: gold HEAD {int(s.heads.max())} is not in 0..{len(s)}")
    lengths = np.array([len(s) for s in sentences], dtype=np.int64)
    if not sentences:                                   # nothing to prune (np.concatenate needs an array)
        empty = np.zeros(0, dtype=np.int16)
        return Candidates(np.zeros(1, dtype=np.int64), empty, empty.copy(),
                          np.zeros((0, first.features.num_slots), dtype=np.int32), lengths, float("nan"),
                          first.features.config())
    oracle = NonProjective(single_root=first.single_root)
    decoder = GreedyFirst(oracle)
    kept: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = [None] * len(sentences)  # type: ignore[list-item]
    hit = total = 0
    for idx in _length_batches(lengths.tolist(), batch_size, 1 << 62, MAX_ARCS):
        batch = [sentences[i] for i in idx]
        ids, sent, mod, head = first.features.flat(batch)
        lens = torch.as_tensor(lengths[idx], device=w1.device)
        with torch.no_grad():
            node = _dense(ids, sent, mod - 1, head, w1.to(torch.float64), lens)
            pot = PairwisePotentials(node, node.new_zeros(node.shape[2], node.shape[2]), lens)
            marg = oracle.marginals(pot).node
            best = decoder.map(pot)
        b, n, c = marg.shape
        valid = _arc_mask(lens, c)[:, :, 1:].transpose(1, 2)                     # node layout
        k = min(top_k, c)
        score = torch.where(valid, marg, torch.full((), -1.0, dtype=marg.dtype))
        top = score.topk(k, -1).indices
        keep = torch.zeros_like(valid).scatter_(2, top, True) & valid & (marg >= min_prob)
        word = torch.arange(n, device=lens.device)[None, :] < lens[:, None]
        keep.scatter_(2, best.clamp_min(0)[..., None], word[..., None])
        if gold:
            gh = torch.full((b, n), 0, dtype=torch.long, device=lens.device)
            for j, s in enumerate(batch):
                gh[j, : len(s)] = torch.from_numpy(s.heads)
            keep.scatter_(2, gh[..., None], word[..., None])
        keep = (keep & valid).cpu()                                                # read per sentence below
        arc_start = np.concatenate([[0], np.cumsum(lengths[idx] * (lengths[idx] + 1))[:-1]])
        for j, s in enumerate(batch):
            nj = len(s)
            mm, hh = torch.nonzero(keep[j, :nj]).T.numpy()
            rows = arc_start[j] + mm * (nj + 1) + hh
            kept[idx[j]] = (mm.astype(np.int16), hh.astype(np.int16), ids[rows])
            heads = s.heads
            scored = np.array([u != "PUNCT" for u in s.upos]) & (heads >= 0)
            ok = keep[j, torch.arange(nj), torch.from_numpy(heads.clip(0))].numpy()
            hit += int((ok & scored).sum())
            total += int(scored.sum())
    sizes = np.array([len(k[0]) for k in kept], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    return Candidates(offsets, np.concatenate([k[0] for k in kept]), np.concatenate([k[1] for k in kept]),
                      np.concatenate([k[2] for k in kept]), lengths, hit / total if total else float("nan"),
                      first.features.config())
