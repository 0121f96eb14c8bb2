"""Minimum-Bayes-risk decoding of a linear chain's BIO labels for segment F1.

Segment F1 scores labelled spans, not tokens, so the labelling it rewards most in expectation is not the chain's
MAP.  With ``P(s)`` the exact posterior of a segment ``s = (field, start, last)`` under the chain MRF (an
``I-`` label that does not continue its field opens a segment, the conlleval reading that
:func:`~betheproj.learning.metrics.segment_f1` scores), this decoder returns the non-overlapping segments that
maximise

    sum_{s chosen} (P(s) - lambda),

tokens outside every chosen segment labelled ``O``.  This is the first-order rule for micro F1: adding a segment
of posterior ``p`` to a corpus with ``T`` expected true positives, ``P`` predicted and ``G`` gold segments
changes ``F = 2T / (P + G)`` by about ``2 (p - F/2) / (P + G)``, so a segment is worth predicting when
``p > F/2``; ``lambda`` is that half-F1 (tuned on held-out data).  At ``lambda >= 1/2`` the segments chosen are
simply those with ``P(s) > lambda`` (two overlapping segments are exclusive events, so at most one of them is
more likely than not).  For Proposition 1's MRF ``theta - grad L(mu*)`` (``Solution.potentials``), whose
marginals are ``mu*``, it decodes a non-local model's solution.

``P(s)`` comes from one forward-backward pass for every start and end at once, its sums over labels done as matrix
products in probability space and redone in log space wherever a term may have underflowed, so it is exact to
rounding with ``-inf`` potentials and gaps of any size: ``O(B N C^2 + B F N^2)`` time.  The segments are produced
one end position at a time, and the decoder's dynamic programme takes each such column as it comes, so decoding
holds ``O(B (F + C) N)`` numbers, never the ``B F N^2`` of the whole table (which :func:`segment_log_marginals`
returns, for inspection).  ``python benchmarks/segments.py`` measures it against Viterbi on the citation
experiment's size.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from .._checks import check_real, is_bio_label
from ..oracles.base import PairwisePotentials

__all__ = ["BIOFields", "segment_log_marginals", "decode_segments", "decode_segments_at", "best_segments"]

@dataclass(frozen=True)
class BIOFields:
    """The fields of a BIO label set: ``names`` [F], each field's ``begin`` label and ``inside`` label (``-1``
    where it has none: its segments are one token long; or none opens it: an ``I-`` label opens them), and the
    ``outside`` label ``O``."""

    names: tuple[str, ...]
    begin: tuple[int, ...]
    inside: tuple[int, ...]
    outside: int

    def __post_init__(self) -> None:
        f = len(self.names)
        if not f:
            raise ValueError("names must hold at least one field")
        if len(self.begin) != f or len(self.inside) != f:
            raise ValueError(f"begin and inside must hold one label per field ({f}), got {len(self.begin)} and "
                             f"{len(self.inside)}")
        for name, ids in (("begin", self.begin), ("inside", self.inside)):
            if any(not isinstance(i, int) or isinstance(i, bool) or i < -1 for i in ids):
                raise ValueError(f"{name} must hold label indices (>= 0) or -1 for none, got {list(ids)[:10]}")
        bad = [n for n, b, i in zip(self.names, self.begin, self.inside, strict=True) if b < 0 and i < 0]
        if bad:
            raise ValueError(f"field {bad[0]!r} has neither a begin nor an inside label")
        used = [i for i in (*self.begin, *self.inside) if i >= 0]
        if len(set(used)) != len(used):
            raise ValueError("begin and inside must name every label at most once")
        if not isinstance(self.outside, int) or isinstance(self.outside, bool) or self.outside < 0 \
                or self.outside in used:
            raise ValueError(f"outside must be the O label's index, not one of a field's; got {self.outside!r}")

    @classmethod
    def from_labels(cls, labels: Sequence[str]) -> BIOFields:
        """The fields of label names ``"O"``, ``"B-<field>"``, ``"I-<field>"`` (in any order)."""
        if isinstance(labels, str) or not isinstance(labels, Sequence):
            raise TypeError(f"labels must be a sequence of label names, got {type(labels).__name__}")
        ids: dict[str, int] = {}
        for i, label in enumerate(labels):
            if not is_bio_label(label):
                raise ValueError(f"labels[{i}] = {label!r} is not a BIO label: expected 'O', 'B-<field>' or "
                                 "'I-<field>'")
            if label in ids:
                raise ValueError(f"labels[{i}] = {label!r} repeats labels[{ids[label]}]")
            ids[label] = i
        if "O" not in ids:
            raise ValueError("labels must include 'O' (the label of tokens outside every segment)")
        names = tuple(sorted({label[2:] for label in ids if label != "O"}))
        if not names:
            raise ValueError("labels must include at least one 'B-<field>' or 'I-<field>' label")
        return cls(names, tuple(ids.get("B-" + n, -1) for n in names), tuple(ids.get("I-" + n, -1) for n in names),
                   ids["O"])


def _check(potentials: object, fields: object) -> None:
    if not isinstance(potentials, PairwisePotentials):
        raise TypeError(f"potentials must be a linear chain's PairwisePotentials/ChainPotentials, got "
                        f"{type(potentials).__name__}")
    if not isinstance(fields, BIOFields):
        raise TypeError(f"fields must be a BIOFields (BIOFields.from_labels(names)), got {type(fields).__name__}")
    c = potentials.node.shape[-1]
    top = max(fields.outside, *fields.begin, *fields.inside)
    if top >= c:
        raise ValueError(f"fields name label {top}, but the potentials have {c} labels")


def _lse_product(x: Tensor, m: Tensor) -> Tensor:
    """``log sum_k exp(x[r, k] + m[(r,) k, j])`` [R, J] for ``x`` [R, K] and ``m`` [K, J] or [R, K, J], exact to
    rounding.  A matrix product in probability space, shifted by the rows' and columns' maxima; a term that
    underflowed there is below ``tiny``, so a sum of at least ``K tiny / eps`` has lost nothing beyond rounding, and
    the rows with a smaller (or zero) sum are done again in log space (log-potential gaps beyond ~700 nats in float64,
    ~87 in float32, and forbidden parts: a sum of ``-inf`` terms only)."""
    x_max, m_max = x.amax(-1, keepdim=True), m.amax(-2, keepdim=True)
    # a row of x or a column of m that is all -inf gives exact zeros (-inf), not lost ones
    x_live, m_live = torch.isfinite(x_max), torch.isfinite(m_max)
    x_max, m_max = torch.where(x_live, x_max, 0.0), torch.where(m_live, m_max, 0.0)
    px, pm = torch.exp(x - x_max), torch.exp(m - m_max)
    total = px @ pm if m.dim() == 2 else (px.unsqueeze(-2) @ pm).squeeze(-2)
    out = torch.log(total) + x_max + m_max.squeeze(-2)
    info = torch.finfo(x.dtype)
    small = ~(total >= x.shape[-1] * info.tiny / info.eps) & x_live & m_live.squeeze(-2)
    redo = small.any(-1).nonzero().flatten()
    if redo.numel():
        sub = m if m.dim() == 2 else m[redo]
        out[redo] = torch.logsumexp(x[redo, :, None] + sub, -2)
    return out


def _forward_backward(node: Tensor, edge: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``log alpha`` [B, N, C] (node scores up to and including ``t``), ``log beta`` [B, N, C] (after ``t``; 0 at
    each example's last position and beyond), ``log Z`` [B]; ``edge`` [C, C] or [B, N-1, C, C]."""
    b, n, _ = node.shape
    shared = edge.dim() == 2
    alpha = torch.empty_like(node)
    alpha[:, 0] = node[:, 0]
    for t in range(1, n):
        alpha[:, t] = node[:, t] + _lse_product(alpha[:, t - 1], edge if shared else edge[:, t - 1])
    beta = torch.zeros_like(node)
    for t in range(n - 2, -1, -1):
        nxt = _lse_product(node[:, t + 1] + beta[:, t + 1], (edge if shared else edge[:, t]).transpose(-1, -2))
        beta[:, t] = torch.where((t < lengths - 1)[:, None], nxt, 0.0)
    log_z = torch.logsumexp(alpha[torch.arange(b, device=node.device), lengths - 1], -1)
    return alpha, beta, log_z


def _columns(potentials: PairwisePotentials, fields: BIOFields) -> Iterator[Tensor]:
    """For each end position ``t = 0 .. W-1`` (``W`` the longest length): ``log P(segment s..t of field f)``
    [B, F, t+1] over the starts ``s = 0 .. t`` (:func:`segment_log_marginals`' column ``t``), ``-inf`` where ``t``
    is past an example's length.  A running sum over the starts carries the ``I-`` scores from one end to the next,
    adding them in the order a segment's own positions come, so each entry is the same sum whatever the layout.
    Without gradients (the recursions write in place): the callers run it under ``torch.no_grad``."""
    node, lengths = potentials.node, potentials.lengths
    b, _, c = node.shape
    n = int(lengths.max()) if b else 0
    if n == 0:
        return
    device, ninf = node.device, -torch.inf
    f = len(fields.names)
    # one more label, of score -inf, stands for a missing begin or inside label
    begin = torch.tensor([i if i >= 0 else c for i in fields.begin], device=device)
    inside = torch.tensor([i if i >= 0 else c for i in fields.inside], device=device)
    node = torch.cat([node[:, :n], node.new_full((b, n, 1), ninf)], -1)
    if potentials.shared_edge:
        edge = potentials.edge.new_full((c + 1, c + 1), ninf)
        edge[:c, :c] = potentials.edge
    else:
        edge = potentials.edge.new_full((b, n - 1, c + 1, c + 1), ninf)
        edge[:, :, :c, :c] = potentials.edge[:, : n - 1]
    c += 1
    shared = edge.dim() == 2
    alpha, beta, log_z = _forward_backward(node, edge, lengths)
    if not bool(torch.isfinite(log_z).all()):
        bad = (~torch.isfinite(log_z)).nonzero().flatten().tolist()
        raise ValueError(f"potentials give examples {bad[:10]} no labelling of finite score")
    ar = torch.arange(f, device=device)
    is_inside = torch.zeros(f, c, dtype=torch.bool, device=device)
    is_inside[ar, inside] = True
    after = (node[:, 1:] + beta[:, 1:]).reshape(b * (n - 1), c)           # [B (N-1), C]
    last = torch.arange(n, device=device)[None, :] == (lengths - 1)[:, None]

    def rows_then_fields(table: Tensor) -> Tensor:
        """[F, C] (shared) or [B, N-1, F, C] as the [C, F] or [B (N-1), C, F] factor of :func:`_lse_product`."""
        return table.t() if shared else table.transpose(-1, -2).reshape(b * (n - 1), c, f)

    def leave(label: Tensor) -> Tensor:
        """[B, F, N]: log of the mass that follows ``label`` at t with any label but the field's I- (relative to
        ``alpha``; 0 at each example's last position)."""
        rows = (edge[label] if shared else edge[:, :, label]).masked_fill(is_inside, ninf)
        out = _lse_product(after, rows_then_fields(rows)).reshape(b, n - 1, f).transpose(1, 2)
        out = torch.cat([out, out.new_zeros(b, f, 1)], -1)
        return torch.where(last[:, None, :], 0.0, out)

    def pair(first: Tensor, second: Tensor) -> Tensor:
        """[B, F, N-1]: the edge scores ``(first_f at t, second_f at t+1)``."""
        if shared:
            return edge[first, second][None, :, None].expand(b, f, n - 1)
        return edge[:, :, first, second].transpose(1, 2)

    node_in = node[:, :, inside].transpose(1, 2)                           # [B, F, N]
    to_in, stay_in = pair(begin, inside), pair(inside, inside)             # B- at t, I- at t+1; I- at both
    open_b = alpha[:, :, begin].transpose(1, 2) - log_z[:, None, None]     # [B, F, N]
    # an I- opens a segment after any label but its field's own two (or at the start)
    own = is_inside.clone()
    own[ar, begin] = True
    cols = (edge[:, inside].t() if shared else edge[:, :, :, inside].transpose(-1, -2)).masked_fill(own, ninf)
    into = _lse_product(alpha[:, :-1].reshape(b * (n - 1), c), rows_then_fields(cols))
    open_i = torch.cat([node.new_zeros(b, f, 1), into.reshape(b, n - 1, f).transpose(1, 2)], -1) + node_in
    open_i = open_i - log_z[:, None, None]
    exit_in = leave(inside)
    single = torch.logaddexp(open_b + leave(begin), open_i + exit_in)     # one-token segments [B, F, N]
    # from the second token on, both ways of opening a segment s..t add the same I- scores: the mass of s..t
    # before its exit, for every start s < t at once
    opened = torch.logaddexp(open_b[..., :-1] + to_in, open_i[..., :-1] + stay_in)     # [B, F, N-1]
    run = node.new_empty(b, f, n)
    for t in range(n):
        column = node.new_empty(b, f, t + 1)
        if t:
            run[..., : t - 1] += stay_in[..., t - 1, None]
            run[..., t - 1] = opened[..., t - 1]
            run[..., :t] += node_in[..., t, None]
            torch.add(run[..., :t], exit_in[..., t, None], out=column[..., :t])
        column[..., t] = single[..., t]
        yield column.masked_fill_((t >= lengths)[:, None, None], ninf)


def segment_log_marginals(potentials: PairwisePotentials, fields: BIOFields) -> Tensor:
    """``log P(segment)`` [B, F, N, N] under a linear chain's MRF: entry ``[b, f, s, t]`` is the log-probability
    that positions ``s..t`` (inclusive) form one segment of field ``f``, i.e. ``y_s`` opens it (its ``B-`` label, or
    its ``I-`` label after any label but the field's two), ``y_{s+1..t}`` are its ``I-`` label and ``y_{t+1}`` is
    not (or ``t`` is the last position); ``-inf`` where ``t < s`` or past the example's length.  The whole table
    holds ``B F N^2`` numbers (:func:`decode_segments` never builds it); it carries no gradient."""
    _check(potentials, fields)
    b, n, _ = potentials.node.shape
    with torch.no_grad():
        out = potentials.node.new_full((b, len(fields.names), n, n), -torch.inf)
        for t, column in enumerate(_columns(potentials, fields)):
            out[:, :, : t + 1, t] = column
    return out


def decode_segments(potentials: PairwisePotentials, fields: BIOFields, threshold: float = 0.5) -> Tensor:
    """Labels [B, N] (``-1`` past each length): the non-overlapping segments that maximise
    ``sum (P(segment) - threshold)`` (module docstring), as ``B-``/``I-`` labels, the other tokens ``O``.  A field
    without a ``B-`` label opens its segments with its ``I-`` label (two such segments of a field side by side
    would read as one, so the decoder never chooses them).  ``threshold`` in [0, 1]: a segment is worth
    predicting when it is more probable than that (``1/2``: every segment more likely than not)."""
    return decode_segments_at(potentials, fields, (check_real("threshold", threshold, 0.0, 1.0),))[0]


def check_thresholds(thresholds: object) -> list[float]:
    """``thresholds`` as a list of floats, or a ``ValueError`` unless it is a non-empty sequence of numbers in
    [0, 1]."""
    if isinstance(thresholds, str) or not isinstance(thresholds, Sequence) or not thresholds:
        raise ValueError(f"thresholds must be a non-empty sequence of numbers in [0, 1], got {thresholds!r}")
    return [check_real(f"thresholds[{i}]", t, 0.0, 1.0) for i, t in enumerate(thresholds)]


def decode_segments_at(potentials: PairwisePotentials, fields: BIOFields, thresholds: Sequence[float]
                       ) -> list[Tensor]:
    """:func:`decode_segments` at each of ``thresholds`` (one labelling [B, N] each), from one pass of segment
    posteriors: to choose a threshold on held-out data at the cost of one."""
    thresholds = check_thresholds(thresholds)
    _check(potentials, fields)
    b, n, _ = potentials.node.shape
    with torch.no_grad():
        decoders = [_Decoder(b, n, fields, t, potentials.node) for t in thresholds]
        with_begin = _with_begin(fields, potentials.node.device)
        for column in _columns(potentials, fields):
            parts = _column_parts(column, with_begin)
            for decoder in decoders:
                decoder.step(column, parts)
        return [decoder.labels(potentials.lengths) for decoder in decoders]


def best_segments(log_marginals: Tensor, lengths: Tensor, fields: BIOFields, threshold: float = 0.5) -> Tensor:
    """:func:`decode_segments` from segment posteriors already computed (``segment_log_marginals``' [B, F, N, N]
    and the potentials' ``lengths`` [B])."""
    threshold = check_real("threshold", threshold, 0.0, 1.0)
    if not isinstance(fields, BIOFields):
        raise TypeError(f"fields must be a BIOFields (BIOFields.from_labels(names)), got {type(fields).__name__}")
    if not isinstance(log_marginals, Tensor) or log_marginals.dim() != 4 \
            or log_marginals.shape[1] != len(fields.names) or log_marginals.shape[2] != log_marginals.shape[3]:
        raise ValueError(f"log_marginals must be segment_log_marginals' [B, F={len(fields.names)}, N, N], got "
                         f"{tuple(log_marginals.shape) if isinstance(log_marginals, Tensor) else type(log_marginals)}")
    b, f, n, _ = log_marginals.shape
    if not isinstance(lengths, Tensor) or lengths.shape != (b,) or (b and (int(lengths.min()) < 1
                                                                            or int(lengths.max()) > n)):
        raise ValueError(f"lengths must be the potentials' lengths [B={b}] in [1, {n}]")
    with torch.no_grad():
        decoder = _Decoder(b, n, fields, threshold, log_marginals)
        with_begin = _with_begin(fields, log_marginals.device)
        for t in range(n):
            column = log_marginals[:, :, : t + 1, t]
            decoder.step(column, _column_parts(column, with_begin))
        return decoder.labels(lengths)


def _with_begin(fields: BIOFields, device: torch.device) -> Tensor | None:
    """The indices of the fields with a ``B-`` label (``None``: every field has one), made once per decoding."""
    ids = [k for k in range(len(fields.names)) if fields.begin[k] >= 0]
    return None if len(ids) == len(fields.names) else torch.tensor(ids, dtype=torch.long, device=device)


def _column_parts(column: Tensor, with_begin: Tensor | None) -> tuple[Tensor, Tensor] | None:
    """The threshold-free part of a step of :class:`_Decoder`: the most probable field with a ``B-`` label of each
    segment of ``column`` [B, F, t+1], as ``(log P, field)`` [B, t+1] (``None`` if no field has one)."""
    if with_begin is None:
        gain, field = column.max(1)
        return gain, field
    if not with_begin.numel():
        return None
    gain, field = column[:, with_begin].max(1)
    return gain, with_begin[field]


class _Decoder:
    """The dynamic programme of :func:`decode_segments` at one threshold, fed the segment posteriors one end
    position at a time (:func:`_columns`).  Its states at a boundary ``e`` (after token ``e-1``): 0 "free" (the
    last token ``O`` or in a segment of a field with a ``B-`` label), ``1 + g`` "in a segment of the ``g``-th field
    without one", which that field's next segment must not touch (they would read as one)."""

    def __init__(self, b: int, n: int, fields: BIOFields, threshold: float, like: Tensor):
        self.fields, self.threshold = fields, threshold
        self.bare = [k for k in range(len(fields.names)) if fields.begin[k] < 0]
        states = 1 + len(self.bare)
        device = like.device
        self.rows = torch.arange(b, device=device)
        self.best = like.new_full((b, n + 1, states), -torch.inf)
        self.best[:, 0, 0] = 0.0
        self.start_at = torch.full((b, n + 1, states), -1, dtype=torch.long, device=device)   # -1: token e-1 is O
        self.field_of = torch.zeros_like(self.start_at)
        self.prev_of = torch.zeros_like(self.start_at)
        # the best state at each boundary, and for each bare field the best but its own: a boundary's scores are
        # final once written, so each is taken once, not at every later end
        self.into = like.new_empty(b, n + 1, states)
        self.into_state = torch.zeros_like(self.start_at)
        self.e = 0
        self._close()

    def _close(self) -> None:
        """Boundary ``self.e`` is final: the best state there, overall and without each bare field's own."""
        e, best = self.e, self.best[:, self.e]
        self.into[:, e, 0], self.into_state[:, e, 0] = best.max(-1)
        for g in range(len(self.bare)):
            others = best.clone()
            others[:, 1 + g] = -torch.inf
            self.into[:, e, 1 + g], self.into_state[:, e, 1 + g] = others.max(-1)

    def step(self, column: Tensor, parts: tuple[Tensor, Tensor] | None) -> None:
        """Boundary ``e + 1`` from the segments that end at token ``e`` (``column`` [B, F, e+1] of log posteriors,
        ``parts`` its :func:`_column_parts`)."""
        e = self.e + 1
        best, threshold = self.best, self.threshold
        value, prev = self.into[:, e - 1, 0], self.into_state[:, e - 1, 0]        # token e-1 is O
        best[:, e, 0], self.prev_of[:, e, 0] = value, prev
        if parts is not None:
            gain, field = parts
            cand, s = (self.into[:, :e, 0] + (gain.exp() - threshold)).max(1)
            take = cand > value
            best[:, e, 0] = torch.where(take, cand, value)
            self.start_at[:, e, 0] = torch.where(take, s, -1)
            self.field_of[:, e, 0] = field[self.rows, s]
            self.prev_of[:, e, 0] = torch.where(take, self.into_state[self.rows, s, 0], prev)
        for g, k in enumerate(self.bare):
            cand, s = (self.into[:, :e, 1 + g] + (column[:, k].exp() - threshold)).max(1)
            best[:, e, 1 + g] = cand
            self.start_at[:, e, 1 + g], self.field_of[:, e, 1 + g] = s, k
            self.prev_of[:, e, 1 + g] = self.into_state[self.rows, s, 1 + g]
        self.e = e
        self._close()

    def labels(self, lengths: Tensor) -> Tensor:
        """The decoded labels [B, N], ``-1`` past each length (every boundary up to each length fed)."""
        fields = self.fields
        b, n, states = self.best.shape[0], self.best.shape[1] - 1, self.best.shape[2]
        begin, inside = fields.begin, fields.inside
        # flat lists: a nested tolist() of [B, N+1, 1] is a hundred times slower than a flat one
        start_at, field_of, prev_of = (x.flatten().tolist() for x in (self.start_at, self.field_of, self.prev_of))
        ends = lengths.tolist()
        final = self.best[self.rows, lengths].argmax(-1).tolist() if b else []
        rows = []
        for i, (e, state) in enumerate(zip(ends, final, strict=True)):
            row = [fields.outside] * e + [-1] * (n - e)
            while e > 0:
                at = (i * (n + 1) + e) * states + state
                s, prev = start_at[at], prev_of[at]
                if s < 0:
                    e, state = e - 1, prev
                    continue
                k = field_of[at]
                row[s] = begin[k] if begin[k] >= 0 else inside[k]
                row[s + 1:e] = [inside[k]] * (e - 1 - s)
                e, state = s, prev
            rows.append(row)
        return torch.tensor(rows, dtype=torch.long, device=self.best.device).reshape(b, n)
