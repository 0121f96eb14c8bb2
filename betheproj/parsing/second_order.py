"""Second-order (sibling + grandparent) non-projective dependency parsing, two ways.

The model scores a tree ``y`` (binary arc indicators ``y_hm``) as

    theta . y + sum_{h, m < s} S[h, m, s] y_hm y_hs + sum_{g, h, m} G[g, h, m] y_gh y_hm,

``theta`` arc-factored (the hashed McDonald features of :mod:`.features`, weights ``w1``), ``S`` and ``G`` sums of
hashed second-order part features (:class:`SecondOrderFeatures`, weights ``w2``).  Inference is intractable; it
is approximated

(a) as Turbo Parser #1 (Martins et al., EMNLP 2010, section 4; Smith & Eisner 2008): sum-product loopy BP on the
    factor graph of binary arc variables with one TREE factor and one pairwise factor per sibling / grandparent
    part, :func:`loopy_bp` (vectorised over the batch and every part with dense ``[B, C, C, C]`` message tensors);
(b) as in Vilnis et al. (UAI 2015): the second-order terms become the mean-field energy
    :class:`~betheproj.energies.second_order.SecondOrderArcs` (eq. 9) and problem (2) is solved by Bethe-RDA
    (Algorithm 1) with the matrix-tree oracle, :func:`mean_field_parse`; the tree is Proposition 1's MAP.

Arcs are pruned by a first-order model (top-``k`` heads per word by arc marginal, plus the first-order MAP tree so
that a tree always survives, plus the gold head when training), which keeps the part tensors small.  Training
(:meth:`SecondOrderParser.fit`) is Algorithm 3 of Vilnis et al.: per minibatch, a few Bethe-RDA iterations solve
(2), then one AdaGrad step on ``(w1, w2)`` along the surrogate likelihood (eq. 12,
:func:`betheproj.learning.model.surrogate_nll`; gradients eqs. 13-17).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from ..data.conllu import Sentence
from ..energies.second_order import SecondOrderArcs, second_order_masks
from ..inference.decode import decode
from ..inference.solve import Solution, solve
from ..learning.model import surrogate_nll
from ..oracles.base import PairwisePotentials
from ..oracles.dependency import _arc_mask
from ..oracles.nonprojective import NonProjective, matrix_tree
from ..progress import progress_bar
from .features import _hash_string, _Hasher, _mix
from .metrics import scorable_words, uas
from .parser import DependencyParser, GreedyFirst, check_gold_trees, read_model

__all__ = ["SecondOrderFeatures", "Candidates", "prune", "BPResult", "loopy_bp", "loopy_bp_parse",
           "mean_field_parse", "SecondOrderParser"]

FORMAT = "betheproj-second-order-parser"
VERSION = 1


def _bucket(d: np.ndarray) -> np.ndarray:
    """Distance buckets 1, 2, 3, 4-5, 6-10, > 10 (as 0..5)."""
    d = np.abs(d)
    return np.select([d <= 1, d == 2, d == 3, d <= 5, d <= 10], [0, 1, 2, 3, 4], 5).astype(np.uint64)


# sibling part (h, m, s), m < s both modifiers of h; attributes hp/hw, mp/mw, sp/sw and the configuration
# "side" (both left of h, straddling, both right) x distance bucket of s - m; grandparent part (g, h, m) with the
# directions of g -> h and h -> m ("dirs") and the distance bucket of h -> m
_SIB_TEMPLATES: tuple[tuple[str, ...], ...] = (
    ("side",), ("hp", "mp", "sp"), ("hp", "mp", "sp", "side"), ("mp", "sp"), ("mp", "sp", "side"),
    ("hw", "mp", "sp", "side"), ("hp", "mw", "sp", "side"), ("hp", "mp", "sw", "side"), ("mw", "sw", "side"),
    ("hp", "mp", "sp", "sdist"),
)
_GRAND_TEMPLATES: tuple[tuple[str, ...], ...] = (
    ("dirs",), ("gp", "hp", "mp"), ("gp", "hp", "mp", "dirs"), ("gp", "mp"), ("gp", "mp", "dirs"),
    ("gw", "hp", "mp", "dirs"), ("gp", "hw", "mp", "dirs"), ("gp", "hp", "mw", "dirs"), ("gw", "mw", "dirs"),
    ("gp", "hp", "mp", "dirs", "hdist"),
)
# context templates (``context=True``): the bilexical back-offs of McDonald & Pereira (2006) / Carreras (2007)
# (one word, the other part's tag) and the tags next to the parts' words (``q`` previous, ``n`` next token): the
# token before the later sibling or after the earlier one is where a coordinating conjunction or comma sits
_SIB_CONTEXT: tuple[tuple[str, ...], ...] = (
    ("mw", "sp", "side"), ("mp", "sw", "side"), ("hp", "mp", "sp", "sq", "side"), ("hp", "mp", "sp", "mn", "side"),
)
_GRAND_CONTEXT: tuple[tuple[str, ...], ...] = (
    ("gw", "mp", "dirs"), ("gp", "mw", "dirs"), ("gp", "hp", "mp", "mq", "dirs"), ("gp", "hp", "mp", "mn", "dirs"),
)


class SecondOrderFeatures:
    """Hashed second-order part features into ``2^bits`` weights (templates ``_SIB_TEMPLATES``,
    ``_GRAND_TEMPLATES``: UPOS triples with direction / adjacency configurations, a few with word forms; with
    ``context`` also ``_SIB_CONTEXT``, ``_GRAND_CONTEXT``: word-tag back-offs and neighbouring tags).

    :meth:`tokens` hashes the per-token attributes of a list of sentences once (root token in front of each);
    :meth:`sibling` / :meth:`grandparent` map part index arrays to feature ids ``[P, K]`` (int64), all in NumPy."""

    def __init__(self, bits: int = 20, lowercase: bool = True, context: bool = True):
        if isinstance(bits, bool) or not isinstance(bits, int) or not 8 <= bits <= 28:
            raise ValueError(f"bits must be an int in [8, 28], got {bits!r}")
        self.bits = bits
        self.lowercase = bool(lowercase)
        self.context = bool(context)
        self._hash = _Hasher()
        self._sib = _SIB_TEMPLATES + (_SIB_CONTEXT if self.context else ())
        self._grand = _GRAND_TEMPLATES + (_GRAND_CONTEXT if self.context else ())
        self._sib_seeds = [_hash_string("sib:" + "+".join(t)) for t in self._sib]
        self._grand_seeds = [_hash_string("grand:" + "+".join(t)) for t in self._grand]

    @property
    def num_features(self) -> int:
        return 1 << self.bits

    def config(self) -> dict:
        return {"bits": self.bits, "lowercase": self.lowercase, "context": self.context}

    def tokens(self, sentences: Sequence[Sentence]) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """Hashed forms ``w`` and UPOS ``p`` of all tokens (a root token before each sentence), the UPOS of the
        previous and next token ``q``, ``n`` (the root's ``q`` a constant; a sentence's root before its first word
        and the next sentence's root after its last one: both read as the sentence boundary) and the offset of each
        sentence's root in those arrays."""
        forms, tags = [], []
        for s in sentences:
            forms.append("<root>")
            tags.append("<root>")
            forms.extend(w[1].lower() if self.lowercase else w[1] for w in s.words)
            tags.extend(w[3] for w in s.words)
        sizes = np.array([len(s) + 1 for s in sentences], dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        p = self._hash(["p:" + t for t in tags])
        q = np.roll(p, 1)
        q[starts] = self._hash(["p:<none>"])[0]
        return {"w": self._hash(["w:" + f for f in forms]), "p": p, "q": q, "n": np.roll(p, -1)}, starts

    def _ids(self, seeds: list[int], templates: tuple[tuple[str, ...], ...], attrs: dict[str, np.ndarray]
             ) -> np.ndarray:
        mask = np.uint64(self.num_features - 1)
        out = np.empty((len(next(iter(attrs.values()))), len(templates)), dtype=np.int64)
        for k, (seed, tpl) in enumerate(zip(seeds, templates, strict=True)):
            out[:, k] = (_mix(seed, [attrs[a] for a in tpl]) & mask).astype(np.int64)
        return out

    def sibling(self, tok: dict[str, np.ndarray], root: np.ndarray, h: np.ndarray, m: np.ndarray, s: np.ndarray
                ) -> np.ndarray:
        """Ids [P, K] of sibling parts ``h -> m``, ``h -> s`` (``m < s``; positions local, ``root`` the global
        index of each part's sentence root)."""
        gh, gm, gs = root + h, root + m, root + s
        side = np.where(s < h, 0, np.where(m > h, 2, 1)).astype(np.uint64)
        attrs = {"hp": tok["p"][gh], "hw": tok["w"][gh], "mp": tok["p"][gm], "mw": tok["w"][gm],
                 "sp": tok["p"][gs], "sw": tok["w"][gs], "side": side * np.uint64(8) + _bucket(s - m),
                 "sdist": _bucket(s - m), "sq": tok["q"][gs], "mn": tok["n"][gm]}
        return self._ids(self._sib_seeds, self._sib, attrs)

    def grandparent(self, tok: dict[str, np.ndarray], root: np.ndarray, g: np.ndarray, h: np.ndarray,
                    m: np.ndarray) -> np.ndarray:
        """Ids [P, K] of grandparent parts ``g -> h -> m``."""
        gg, gh, gm = root + g, root + h, root + m
        dirs = ((g < h).astype(np.uint64) << np.uint64(1)) | (h < m).astype(np.uint64)
        dirs = np.where(g == 0, np.uint64(4) + (h < m).astype(np.uint64), dirs)      # root as grandparent
        attrs = {"gp": tok["p"][gg], "gw": tok["w"][gg], "hp": tok["p"][gh], "hw": tok["w"][gh],
                 "mp": tok["p"][gm], "mw": tok["w"][gm], "dirs": dirs, "hdist": _bucket(h - m),
                 "mq": tok["q"][gm], "mn": tok["n"][gm]}
        return self._ids(self._grand_seeds, self._grand, attrs)


# ------------------------------------------------------------------------------------------------ pruning

@dataclass
class Candidates:
    """Pruned arcs of a list of sentences: for sentence ``i`` the rows ``offsets[i]:offsets[i+1]`` of ``mod``
    (0-based word index ``m - 1``), ``head`` (0 = root) and the first-order feature ids ``ids`` [A, K1] (int32)."""

    offsets: np.ndarray
    mod: np.ndarray
    head: np.ndarray
    ids: np.ndarray
    lengths: np.ndarray
    recall: float              # share of gold heads kept (non-punctuation words with a gold head), NaN if none

    def rows(self, i: int) -> slice:
        return slice(int(self.offsets[i]), int(self.offsets[i + 1]))


def _length_batches(lengths: Sequence[int], max_batch: int, budget: int) -> list[list[int]]:
    """Indices grouped in length-sorted batches of at most ``max_batch`` sentences and ``B (N+1)^3 <= budget``."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    out: list[list[int]] = []
    cur: list[int] = []
    for i in order:
        c = lengths[i] + 1
        if cur and (len(cur) >= max_batch or (len(cur) + 1) * c ** 3 > budget):
            out.append(cur)
            cur = []
        cur.append(i)
    if cur:
        out.append(cur)
    return out


def _dense(ids: np.ndarray, sent: np.ndarray, mod: np.ndarray, head: np.ndarray, w: Tensor, lengths: Tensor
           ) -> Tensor:
    """Node scores [B, N, N+1] (``-inf`` where no arc is listed) of listed arcs ``w[ids].sum(-1)``."""
    n = int(lengths.max())
    vals = w[torch.from_numpy(ids).long()].sum(-1)
    node = torch.full((len(lengths), n, n + 1), -math.inf, dtype=w.dtype)
    return node.index_put((torch.from_numpy(sent), torch.from_numpy(mod), torch.from_numpy(head)), vals)


def prune(first: DependencyParser, w1: Tensor, sentences: Sequence[Sentence], top_k: int = 5,
          min_prob: float = 0.0, gold: bool = False, batch_size: int = 256) -> Candidates:
    """First-order arc pruning: keep, per word, the ``top_k`` heads of highest arc marginal (matrix-tree theorem
    with the scores ``w1 . f(h -> m)``) whose marginal is at least ``min_prob``, plus the arcs of the first-order
    MAP tree (so a tree always survives), plus the gold head if ``gold``.  Returns the kept arcs with their
    first-order feature ids and the pruning recall (gold heads kept, punctuation excluded)."""
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise ValueError(f"top_k must be a positive int, got {top_k!r}")
    if not 0.0 <= min_prob < 1.0:
        raise ValueError(f"min_prob must lie in [0, 1), got {min_prob!r}")
    sentences = list(sentences)
    for i, s in enumerate(sentences):
        if len(s) == 0:
            raise ValueError(f"sentence {i} has no words")
        if gold and (s.heads < 0).any():
            raise ValueError(f"sentence {i} has a word without a gold HEAD")
    lengths = np.array([len(s) for s in sentences], dtype=np.int64)
    if not sentences:                                   # nothing to prune (np.concatenate needs an array)
        empty = np.zeros(0, dtype=np.int16)
        return Candidates(np.zeros(1, dtype=np.int64), empty, empty.copy(),
                          np.zeros((0, first.features.num_slots), dtype=np.int32), lengths, float("nan"))
    oracle = NonProjective(single_root=first.single_root)
    decoder = GreedyFirst(oracle)
    kept: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = [None] * len(sentences)  # type: ignore[list-item]
    hit = total = 0
    for idx in _length_batches(lengths.tolist(), batch_size, 1 << 62):
        batch = [sentences[i] for i in idx]
        ids, sent, mod, head = first.features.flat(batch)
        lens = torch.as_tensor(lengths[idx])
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
        word = torch.arange(n)[None, :] < lens[:, None]
        keep.scatter_(2, best.clamp_min(0)[..., None], word[..., None])
        if gold:
            gh = torch.full((b, n), 0, dtype=torch.long)
            for j, s in enumerate(batch):
                gh[j, : len(s)] = torch.from_numpy(s.heads)
            keep.scatter_(2, gh[..., None], word[..., None])
        keep &= valid
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
                      np.concatenate([k[2] for k in kept]), lengths, hit / total if total else float("nan"))


# ------------------------------------------------------------------------------------------------ loopy BP

@dataclass
class BPResult:
    """Output of :func:`loopy_bp`: arc beliefs [B, C, C] head-major (``b(y_hm = 1)``, 0 at absent arcs), their
    log-odds (``-inf`` at absent arcs), the iterations run and the last max message change."""

    beliefs: Tensor
    log_odds: Tensor
    iterations: int
    change: float
    converged: bool


def _pair_message(a: Tensor, w: Tensor) -> Tensor:
    """Log-odds message of a binary pairwise factor ``exp(w x y)`` to ``y`` given ``x``'s cavity log-odds ``a``:
    ``log (1 + e^{a + w}) - log (1 + e^a)`` (exact; ``0`` when ``a = -inf``, ``w`` when ``a = inf``)."""
    zero = torch.zeros((), dtype=a.dtype)
    return torch.where(a == math.inf, w, torch.logaddexp(zero, a + w) - torch.logaddexp(zero, a))


def _damp(new: Tensor, old: Tensor, d: float) -> Tensor:
    """Damping in probability space on normalised binary messages, ``M <- (1 - d) M_new + d M_old`` (as
    :func:`betheproj.factor_graphs.belief_propagation`), in log-odds.  An infinite message (an exact zero, a
    hard constraint's verdict) is kept: mixed in, it would only shrink by ``d`` per iteration, never converge."""
    if d == 0.0:
        return new
    ld, lk = math.log(d), math.log1p(-d)
    ls = torch.nn.functional.logsigmoid
    on = torch.logaddexp(lk + ls(new), ld + ls(old))
    off = torch.logaddexp(lk + ls(-new), ld + ls(-old))
    return torch.where(torch.isinf(new), new, on - off)


def _change(new: Tensor, old: Tensor) -> float:
    """Largest log-odds change, ``0`` where both are the same infinity."""
    if not new.numel():
        return 0.0
    return float(torch.where(new == old, torch.zeros((), dtype=new.dtype), (new - old).abs()).max())


def _structural(arcs: Tensor, lengths: Tensor, single_root: bool) -> tuple[Tensor, Tensor]:
    """The arcs (head-major [B, C, C] mask) in no tree and in every tree made of the arcs in ``arcs``, exactly
    (``NonProjective._structural`` on the node layout)."""
    found = NonProjective(single_root=single_root)._structural(_node_layout(arcs), lengths)
    return tuple(torch.cat([m.new_zeros(m.shape[0], m.shape[2], 1), m.transpose(1, 2)], 2) for m in found)


def _tree_logit(marg: Tensor) -> Tensor:
    """``log p - log(1 - p)`` of head-major arc marginals, with ``1 - p(h -> m) = sum_{h' != h} p(h' -> m)``
    summed without cancellation (exclusive prefix plus suffix sums)."""
    zero = marg.new_zeros(marg.shape[0], 1, marg.shape[2])
    pre = torch.cat([zero, marg.cumsum(1)[:, :-1]], 1)
    suf = torch.cat([marg.flip(1).cumsum(1)[:, :-1].flip(1), zero], 1)
    tiny = torch.finfo(marg.dtype).tiny
    return torch.log(marg.clamp_min(tiny)) - torch.log((pre + suf).clamp_min(tiny))


@torch.no_grad()
def loopy_bp(theta: Tensor, sibling: Tensor | None, grandparent: Tensor | None, lengths: Tensor,
             max_iter: int = 20, damping: float = 0.0, tol: float = 1e-6, single_root: bool = False) -> BPResult:
    """Turbo Parser #1 (Martins et al. 2010, section 4): sum-product loopy BP, parallel schedule, over binary arc
    variables ``y_hm`` with unary log-potentials ``theta[b, h, m]`` (head-major [B, C, C]; ``-inf``: pruned arc,
    no variable), one TREE factor and one pairwise factor ``exp(W y_hm y_hs)`` per sibling pair ``m < s``
    (``W = S[h, m, s] + S[h, s, m]``) and ``exp(G[g, h, m] y_gh y_hm)`` per grandparent part.

    Messages are log-odds (eqs. 4-5 for binary variables): the TREE factor sends ``logit(MARG_a) - l_a``
    (Table 1; ``MARG`` by the matrix-tree theorem on the incoming log-odds ``l``), a pairwise factor sends
    :func:`_pair_message`.  The scores come as dense [B, C, C, C] tensors; the factors that exist (both arcs
    present, non-zero log-potential) are gathered once into flat index vectors, and every iteration updates all
    messages of the batch at once: a few gathers / ``index_add`` over the factors (``O(#parts)``, not
    ``O(B C^3)``: pruning leaves few parts) and one batched matrix-tree call, no Python loop over parts.
    ``damping`` mixes old and new messages in probability space, and then the TREE factor's messages to arcs
    in no tree (every tree) are sent as exact ``-inf`` (``inf``), which damping keeps (:func:`_structural`);
    without damping they are the matrix-tree's rounding-level logits.  BP stops when the largest log-odds change
    is below ``tol`` or after ``max_iter`` iterations.
    """
    if not isinstance(theta, Tensor) or theta.dim() != 3 or theta.shape[1] != theta.shape[2]:
        raise ValueError("theta must be head-major arc scores [B, C, C]")
    if not 0.0 <= damping < 1.0:
        raise ValueError(f"damping must lie in [0, 1), got {damping!r}")
    if isinstance(max_iter, bool) or not isinstance(max_iter, int) or max_iter < 1:
        raise ValueError(f"max_iter must be a positive int, got {max_iter!r}")
    b, c, _ = theta.shape
    for name, t in (("sibling", sibling), ("grandparent", grandparent)):
        if t is not None and (not isinstance(t, Tensor) or t.shape != (b, c, c, c)):
            raise ValueError(f"{name} must be [B, C, C, C]=({b}, {c}, {c}, {c}), got "
                             f"{tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__}")
    dtype = theta.dtype
    ninf = torch.full((), -math.inf, dtype=dtype)
    zero = torch.zeros((), dtype=dtype)
    arcs = _arc_mask(lengths, c) & (theta > -math.inf)
    th = torch.where(arcs, theta, ninf)
    part_mask, _ = second_order_masks(lengths, c)
    # the pairwise factors as flat arc-index pairs (x, y) with log-potential w: exp(w y_x y_y)
    xs, ys, ws = [], [], []
    flat = torch.arange(b * c * c).reshape(b, c, c)
    if sibling is not None:
        upper = torch.ones(c, c, dtype=torch.bool).triu(1)
        w = sibling + sibling.transpose(2, 3)
        bi, h, m, s_ = torch.nonzero(part_mask & arcs[:, :, :, None] & arcs[:, :, None, :] & upper & (w != 0)).T
        xs.append(flat[bi, h, m])
        ys.append(flat[bi, h, s_])
        ws.append(w[bi, h, m, s_])
    if grandparent is not None:
        bi, g, h, m = torch.nonzero(part_mask & arcs[:, :, :, None] & arcs[:, None, :, :] & (grandparent != 0)).T
        xs.append(flat[bi, g, h])
        ys.append(flat[bi, h, m])
        ws.append(grandparent[bi, g, h, m])
    x = torch.cat(xs) if xs else torch.zeros(0, dtype=torch.long)
    y = torch.cat(ys) if ys else torch.zeros(0, dtype=torch.long)
    w = torch.cat(ws).to(dtype) if ws else torch.zeros(0, dtype=dtype)
    tree = torch.zeros_like(th)
    to_x = torch.zeros_like(w)                    # message of each factor to its arc x (log-odds)
    to_y = torch.zeros_like(w)

    if damping > 0.0:
        in_none, in_all = _structural(arcs, lengths, single_root)
        exact = torch.where(in_none, ninf, torch.where(in_all, -ninf, zero))
        structural = in_none | in_all

    def pairwise_in() -> Tensor:
        out = th.new_zeros(b * c * c).index_add_(0, x, to_x).index_add_(0, y, to_y)
        return out.reshape(b, c, c)

    change, it = math.inf, 0
    for it in range(1, max_iter + 1):                                         # noqa: B007
        cavity = th + pairwise_in()                                           # messages into TREE
        total = (cavity + tree).flatten()
        _, marg = matrix_tree(cavity, lengths, single_root)
        new_tree = torch.where(arcs, _tree_logit(marg) - cavity, zero)
        if damping > 0.0:
            new_tree = _damp(torch.where(structural, exact, new_tree), tree, damping)
        # factor -> x from the cavity of y (its total without this factor's message to y), and vice versa
        new_x = _damp(_pair_message(total[y] - to_y, w), to_x, damping)
        new_y = _damp(_pair_message(total[x] - to_x, w), to_y, damping)
        change = max(_change(new, old) for old, new in ((tree, new_tree), (to_x, new_x), (to_y, new_y)))
        tree, to_x, to_y = new_tree, new_x, new_y
        if change < tol:
            break
    log_odds = torch.where(arcs, th + tree + pairwise_in(), ninf)
    beliefs = torch.where(arcs, torch.sigmoid(log_odds), zero)
    return BPResult(beliefs, log_odds, it, change, change < tol)


def _node_layout(head_major: Tensor) -> Tensor:
    return head_major[:, :, 1:].transpose(1, 2).contiguous()


def _head_major(node: Tensor) -> Tensor:
    b, n, c = node.shape
    return torch.cat([torch.full((b, c, 1), -math.inf, dtype=node.dtype), node.transpose(1, 2)], 2)


def loopy_bp_parse(potentials: PairwisePotentials, sibling: Tensor | None, grandparent: Tensor | None,
                   max_iter: int = 20, damping: float = 0.0, tol: float = 1e-6, decode_on: str = "beliefs",
                   single_root: bool = False) -> tuple[Tensor, BPResult]:
    """Heads [B, N] (``-1`` past each length) of Turbo Parser #1: :func:`loopy_bp` then Chu-Liu-Edmonds on the
    beliefs (``decode_on="beliefs"``: the tree of highest expected number of correct arcs under the beliefs) or on
    their log-odds (``"log_odds"``)."""
    if decode_on not in ("beliefs", "log_odds"):
        raise ValueError(f"decode_on must be 'beliefs' or 'log_odds', got {decode_on!r}")
    if not isinstance(potentials, PairwisePotentials):
        raise TypeError(f"potentials must be PairwisePotentials, got {type(potentials).__name__}")
    res = loopy_bp(_head_major(potentials.node), sibling, grandparent, potentials.lengths, max_iter, damping,
                   tol, single_root)
    score = res.beliefs if decode_on == "beliefs" else res.log_odds
    finite = res.log_odds > -math.inf
    node = _node_layout(torch.where(finite, score, torch.full((), -math.inf, dtype=score.dtype)))
    edge = node.new_zeros(node.shape[2], node.shape[2])
    heads = GreedyFirst(NonProjective(single_root)).map(PairwisePotentials(node, edge, potentials.lengths))
    return heads, res


def mean_field_parse(potentials: PairwisePotentials, sibling: Tensor | None, grandparent: Tensor | None,
                     max_iter: int = 30, tol: float | None = None, method: str = "rda",
                     decode_on: str = "map", single_root: bool = False,
                     parts: tuple[Tensor | None, Tensor | None] | None = None) -> tuple[Tensor, Solution]:
    """Heads [B, N] from problem (2) with :class:`SecondOrderArcs` (eq. 9 mean field) solved by Bethe-RDA
    (Algorithm 1, ``method="rda"``) with the matrix-tree oracle, decoded by Proposition 1 (``decode_on="map"``:
    Chu-Liu-Edmonds on ``theta - grad L(mu*)``) or Chu-Liu-Edmonds on ``mu*`` itself (``"marginals"``).
    ``parts``: the part lists of :class:`SecondOrderArcs` (the fast sparse path)."""
    if decode_on not in ("map", "marginals"):
        raise ValueError(f"decode_on must be 'map' or 'marginals', got {decode_on!r}")
    oracle = NonProjective(single_root)
    sol = solve(oracle, potentials, SecondOrderArcs(sibling, grandparent, parts), method=method, max_iter=max_iter,
                tol=tol)
    greedy = GreedyFirst(oracle)
    if decode_on == "map":
        return decode(greedy, sol), sol
    mu = sol.marginals.node
    node = torch.where(potentials.node > -math.inf, mu, torch.full((), -math.inf, dtype=mu.dtype))
    return greedy.map(PairwisePotentials(node, node.new_zeros(node.shape[2], node.shape[2]),
                                         potentials.lengths)), sol


# ------------------------------------------------------------------------------------------------ the parser

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
        self.top_k, self.min_prob = top_k, min_prob
        self.pruner = first.weights.to(torch.float64).clone()          # fixed: the first-order model prunes
        self.w1 = self.pruner.clone()
        self.w2 = torch.zeros(self.features.num_features, dtype=torch.float64)
        self.info: dict = {}

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
            (sb, sh, sm, ss), self.w2[torch.from_numpy(sid)].sum(-1))
        grand = torch.zeros(shape, dtype=self.w2.dtype).index_put(
            (gb, gg, gh, gm), self.w2[torch.from_numpy(gid)].sum(-1))
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
        sentences = list(sentences)
        if not sentences:
            raise ValueError("no training sentences")
        if epochs < 1 or train_iter < 1 or max_batch < 1:
            raise ValueError("epochs, train_iter and max_batch must be >= 1")
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
        groups = [{"params": [self.w2], "lr": lr}] + ([{"params": [self.w1], "lr": lr_first}] if lr_first > 0 else [])
        opt = torch.optim.Adagrad(groups)
        oracle = NonProjective(self.first.single_root)
        batches = _length_batches(cands.lengths.tolist(), max_batch, budget)
        gen = torch.Generator().manual_seed(seed)
        eval_every = eval_every or len(batches)
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
                        score = self.evaluate(dev, method=dev_method, candidates=dev_c, max_iter=dev_iter)
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
                decode_on: str | None = None, progress: bool = False) -> list[np.ndarray]:
        """Heads (int64 arrays) of every sentence: ``method="mean_field"`` (:func:`mean_field_parse`, default 30
        Bethe-RDA iterations) or ``"loopy_bp"`` (:func:`loopy_bp_parse`, default 20 iterations); ``"first_order"``
        decodes the pruned arc-factored part alone (``w1``, no second-order terms)."""
        if method not in ("mean_field", "loopy_bp", "first_order"):
            raise ValueError(f"method must be 'mean_field', 'loopy_bp' or 'first_order', got {method!r}")
        sentences = list(sentences)
        if candidates is None:
            candidates = prune(self.first, self.pruner, sentences, self.top_k, self.min_prob)
        if len(candidates.lengths) != len(sentences):
            raise ValueError("candidates do not belong to these sentences")
        out: list[np.ndarray] = [None] * len(sentences)  # type: ignore[list-item]
        batches = _length_batches(candidates.lengths.tolist(), max_batch, budget)
        bar = progress_bar(len(sentences), progress, f"parse ({method})")
        single = self.first.single_root
        for idx in batches:
            batch = self._batch(sentences, candidates, idx, gold=False)
            if method == "mean_field":
                heads, _ = mean_field_parse(batch.potentials, batch.sibling, batch.grandparent,
                                            max_iter=max_iter or 30, decode_on=decode_on or "map", single_root=single,
                                            parts=batch.parts)
            elif method == "loopy_bp":
                heads, _ = loopy_bp_parse(batch.potentials, batch.sibling, batch.grandparent, max_iter=max_iter or 20,
                                          damping=damping, decode_on=decode_on or "beliefs", single_root=single)
            else:
                heads = GreedyFirst(NonProjective(single)).map(batch.potentials)
            for j, i in enumerate(idx):
                out[i] = heads[j, : len(sentences[i])].numpy().astype(np.int64)
            bar.update(len(idx))
        bar.close()
        return out

    def evaluate(self, sentences: Sequence[Sentence], method: str = "mean_field", punct: bool = False,
                 **options) -> float:
        """UAS in percent (punctuation excluded unless ``punct``), see :func:`.metrics.uas`."""
        return uas(sentences, self.predict(sentences, method, **options), punct=punct)

    # ------------------------------------------------------------------------------------------------ storage
    def save(self, path: str | Path) -> None:
        """Write the first-order configuration, the pruner, ``w1``, ``w2`` and the settings with ``torch.save``."""
        torch.save({"format": FORMAT, "version": VERSION, "first_config": self.first.config(),
                    "features": self.features.config(), "top_k": self.top_k, "min_prob": self.min_prob,
                    "pruner": self.pruner, "w1": self.w1.detach(), "w2": self.w2.detach(), "info": self.info},
                   Path(path))

    @classmethod
    def load(cls, path: str | Path) -> SecondOrderParser:
        """A parser written by :meth:`save`."""
        return cls.from_state(read_model(path, {FORMAT: VERSION}, "second-order parser model"))

    @classmethod
    def from_state(cls, state: dict) -> SecondOrderParser:
        """The parser a state read by :func:`~betheproj.parsing.parser.read_model` describes."""
        first = DependencyParser.from_config(state["first_config"])
        first.weights = state["pruner"].to(torch.float32)
        parser = cls(first, bits=state["features"]["bits"], top_k=state["top_k"], min_prob=state["min_prob"],
                     context=state["features"].get("context", False))
        parser.pruner, parser.w1, parser.w2 = state["pruner"], state["w1"], state["w2"]
        parser.info = state.get("info", {})
        return parser
