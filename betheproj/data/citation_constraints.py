"""Soft global constraints for citations in the style of Anzaroot et al. (2014), as measurement vectors.

A constraint is ``a_j^T S(y) <= b_j`` with ``a_j`` over label counts (summed over positions: a ``[C]`` row of
a :class:`~betheproj.energies.LinearMeasurements` node table).  Two counts per field ``l`` (a full tag path):
``seg(l)``, its number of segments (tokens labelled ``B-l``), and ``tok(l)``, its number of tokens
(``B-l`` or ``I-l``).  The templates, instantiated where the training citations support them:

* ``at_most_one``: ``seg(l) <= 1`` (a citation has one title, one journal, ...);
* ``at_least_one``: ``seg(l) >= 1`` for fields nearly every citation has;
* ``pair``: ``seg(l1) - seg(l2) <= 0`` (e.g. no more last names than first names) and the same for ``tok``;
* ``exclusive``: ``seg(l1) + seg(l2) <= 1`` for fields that (almost) never occur together (journal, booktitle);
* ``max_len`` / ``min_len`` (with ``length_agreement``): ``tok(l) <= k seg(l)`` and ``tok(l) >= k seg(l)``, a
  field's segments are at most (at least) ``k`` tokens long on average (a title of 3 to 19 tokens), ``k`` the
  tightest integer bound that at least ``length_agreement`` of the training citations with ``l`` satisfy
  (``min_len`` only where that is 2 or more).

A template instance is kept when the field(s) occur in at least ``min_support`` training citations and the
constraint holds in at least ``min_agreement`` of the citations where it could be violated: those with ``l``
(at most one), all (at least one), those with ``l1`` (pairs), and for ``exclusive`` both those with ``l1`` and
those with ``l2`` (a rare field that always comes with a common one is not exclusive of it, however often the
common one occurs alone).  Which of them help, and how much, is learned afterwards (the weights ``c_j`` of
eq. 20).

Order templates (:func:`order_constraints`, for the :class:`~betheproj.energies.Precedence` energy) state that
every token of one field group comes before every token of another (authors before the title, the title before
the venue, a volume before its pages), for the groups at every level of the tag paths (``authors``,
``authors/person``, ``authors/person/person-last``).  Order is not a count: no measurement of label counts can
tell an editor's name after the title from an author's before it, an order template can.  An instance is kept
when both groups occur together in at least ``min_support`` training citations and the order holds in at least
``min_agreement`` of them.

Name-format templates (:func:`bigram_exclusions`, for the :class:`~betheproj.energies.BigramExclusion` energy)
say that two label bigrams touching a person's name (``B-last I-last`` then ``B-first``: the ``Last , First``
format; ``B-first`` then ``B-last``: ``First Last``) do not both occur in one citation: the authors of a citation
share one format.  An instance is kept for bigrams each seen in at least ``min_support`` training citations
that occur together in at most ``max_together`` of the citations with the rarer one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import permutations

import torch
from torch import Tensor

from .._checks import check_count, check_real
from .citations import Citation, bio_segments, check_citations

__all__ = ["BigramExclusions", "Constraints", "OrderConstraints", "bigram_exclusions", "citation_constraints",
           "label_counts", "order_constraints"]


@dataclass
class Constraints:
    """``a`` [J, C] measurement vectors over label counts, bounds ``b`` [J] (``a^T S(y) <= b``), ``names``."""

    a: Tensor
    b: Tensor
    names: list[str]

    def __len__(self) -> int:
        return len(self.names)

    def violations(self, counts: Tensor) -> Tensor:
        """``a^T counts - b`` [B, J] for label counts [B, C] (positive = violated)."""
        if not isinstance(counts, Tensor) or counts.dim() != 2 or counts.shape[1] != self.a.shape[1]:
            got = tuple(counts.shape) if isinstance(counts, Tensor) else type(counts).__name__
            raise ValueError(f"counts must be label counts [B, C={self.a.shape[1]}], got {got}")
        return counts.to(self.a) @ self.a.t() - self.b


def _label_ids(labels: Sequence[str]) -> tuple[dict[str, int], int]:
    """Label -> id, and the id of ``O`` (which labels outside the list count as).  ``labels`` must hold ``O`` and
    only BIO labels (``O``, ``B-<path>``, ``I-<path>``: :func:`~betheproj.data.citations.bio_segments`' check), each
    once (one id, one column of the counts), their paths without empty parts (the groups of the order templates)."""
    if isinstance(labels, str) or not isinstance(labels, Sequence) or "O" not in labels:
        raise ValueError("labels must be a list of labels holding 'O' (labels outside the list count as O)")
    bio_segments(list(labels))
    ids: dict[str, int] = {}
    for i, label in enumerate(labels):
        if label != "O" and "" in label[2:].split("/"):
            raise ValueError(f"labels[{i}] = {label!r} has an empty part in its path: expected 'B-<a>/<b>/...' with "
                             f"non-empty parts")
        if label in ids:
            raise ValueError(f"labels must name each label once: labels[{i}] = {label!r} repeats labels[{ids[label]}]")
        ids[label] = i
    return ids, ids["O"]


def encode_labels(citations: Sequence[Citation], labels: Sequence[str]) -> Tensor:
    """The citations' label ids [D, N] in the list ``labels`` (labels not in it as ``O``), ``-1`` padding."""
    ids, o = _label_ids(labels)
    return torch.nn.utils.rnn.pad_sequence([torch.tensor([ids.get(v, o) for v in cite.labels], dtype=torch.long)
                                            for cite in citations], batch_first=True, padding_value=-1)


def _check_label_ids(label_ids: object, num_labels: int) -> Tensor:
    """``label_ids``, which must be an integer tensor [B, N] of ids in ``0..num_labels - 1`` or ``-1`` (padding)."""
    if not isinstance(label_ids, Tensor) or label_ids.dim() != 2 or label_ids.is_floating_point() \
            or label_ids.is_complex() or label_ids.dtype == torch.bool:
        got = f"{label_ids.dim()}-D {label_ids.dtype}" if isinstance(label_ids, Tensor) else type(label_ids).__name__
        raise TypeError(f"label_ids must be an integer tensor [B, N] (-1 padding), got {got}")
    if label_ids.numel() and (int(label_ids.min()) < -1 or int(label_ids.max()) >= num_labels):
        raise ValueError(f"label_ids must lie in 0..{num_labels - 1} (the C={num_labels} labels) or be -1 (padding), "
                         f"got values in {int(label_ids.min())}..{int(label_ids.max())}")
    return label_ids.long()


def _masses(vectors: Tensor, label_ids: Tensor) -> Tensor:
    """``vectors[k, y_i]`` [B, N, K] of label ids [B, N] (each position's mass on each vector), 0 at padding."""
    label_ids = _check_label_ids(label_ids, vectors.shape[1])
    return vectors.t()[label_ids.clamp_min(0)] * (label_ids >= 0)[..., None].to(vectors)


def label_counts(label_ids: Tensor, num_labels: int) -> Tensor:
    """``S(y)`` summed over positions: [B, C] counts of label ids [B, N] (``-1`` padding ignored)."""
    num_labels = check_count("num_labels", num_labels)
    label_ids = _check_label_ids(label_ids, num_labels)
    valid = label_ids >= 0
    out = torch.zeros(label_ids.shape[0], num_labels, dtype=torch.float64)
    return out.scatter_add_(1, label_ids.clamp_min(0), valid.double())


def citation_constraints(citations: Sequence[Citation], labels: Sequence[str], min_support: int = 10,
                         min_agreement: float = 0.98, presence: float = 0.98,
                         length_agreement: float | None = None) -> Constraints:
    """Instantiate the templates on training ``citations`` for the label list ``labels`` (index = label id);
    ``length_agreement`` ``None`` leaves out the length templates."""
    citations = check_citations(citations, empty=False)
    min_agreement = check_real("min_agreement", min_agreement, 0.0, 1.0, low_open=True)
    presence = check_real("presence", presence, 0.0, 1.0, low_open=True)
    if length_agreement is not None:
        length_agreement = check_real("length_agreement", length_agreement, 0.0, 1.0, low_open=True)
    min_support = check_count("min_support", min_support)
    ids, _ = _label_ids(labels)
    fields = sorted({label[2:] for label in labels if label != "O"})
    c = len(labels)
    seg_rows, tok_rows = {}, {}
    for f in fields:
        seg_row, tok_row = torch.zeros(c, dtype=torch.float64), torch.zeros(c, dtype=torch.float64)
        if f"B-{f}" in ids:
            seg_row[ids[f"B-{f}"]] = 1.0
            tok_row[ids[f"B-{f}"]] = 1.0
        if f"I-{f}" in ids:
            tok_row[ids[f"I-{f}"]] = 1.0
        seg_rows[f], tok_rows[f] = seg_row, tok_row
    counts = label_counts(encode_labels(citations, labels), c)
    seg = {f: counts @ seg_rows[f] for f in fields}
    present = {f: seg[f] > 0 for f in fields}
    frequent = [f for f in fields if int(present[f].sum()) >= min_support]

    rows, bounds, names, relevant = [], [], [], []

    def candidate(row: Tensor, bound: float, name: str, *where: Tensor) -> None:
        rows.append(row)
        bounds.append(bound)
        names.append(name)
        relevant.append(where)

    for f in frequent:
        candidate(seg_rows[f], 1.0, f"at_most_one({f})", present[f])
        if float(present[f].double().mean()) >= presence:
            candidate(-seg_rows[f], -1.0, f"at_least_one({f})", torch.ones_like(present[f]))
    for f1, f2 in permutations(frequent, 2):
        for kind, row in (("seg", seg_rows), ("tok", tok_rows)):
            candidate(row[f1] - row[f2], 0.0, f"{kind}({f1}) <= {kind}({f2})", present[f1])
        if f1 < f2:
            candidate(seg_rows[f1] + seg_rows[f2], 1.0, f"exclusive({f1}, {f2})", present[f1], present[f2])
    if rows:
        held = (counts @ torch.stack(rows).t() <= torch.tensor(bounds, dtype=torch.float64))     # [D, J]
        agree = [min(float(held[w, j].double().mean()) for w in where) for j, where in enumerate(relevant)]
        picked = [j for j, a in enumerate(agree) if a >= min_agreement]
        rows, bounds, names = [rows[j] for j in picked], [bounds[j] for j in picked], [names[j] for j in picked]
    if length_agreement is not None:
        for f in frequent:
            if f"I-{f}" not in ids:                                   # one-token segments only
                continue
            tok = counts @ tok_rows[f]
            mean = (tok / seg[f].clamp_min(1))[present[f]]            # mean segment length where ``f`` occurs
            sizes = range(1, int(mean.max().ceil()) + 1)
            longest = min(k for k in sizes if float((mean <= k).double().mean()) >= length_agreement)
            rows.append(tok_rows[f] - longest * seg_rows[f])
            bounds.append(0.0)
            names.append(f"max_len({f}) <= {longest}")
            shortest = max(k for k in sizes if float((mean >= k).double().mean()) >= length_agreement)
            if shortest >= 2:
                rows.append(shortest * seg_rows[f] - tok_rows[f])
                bounds.append(0.0)
                names.append(f"min_len({f}) >= {shortest}")
    if not rows:
        return Constraints(torch.zeros(0, c, dtype=torch.float64), torch.zeros(0, dtype=torch.float64), [])
    return Constraints(torch.stack(rows), torch.tensor(bounds, dtype=torch.float64), names)


@dataclass
class OrderConstraints:
    """``first`` / ``then`` [J, C] indicator vectors of field groups: "every ``first_j`` token comes before every
    ``then_j`` token", and the templates' ``names``."""

    first: Tensor
    then: Tensor
    names: list[str]

    def __len__(self) -> int:
        return len(self.names)

    def violations(self, label_ids: Tensor) -> Tensor:
        """Order violations [B, J] of label ids [B, N] (``-1`` padding ignored): the number of position pairs
        with a ``then_j`` token before a ``first_j`` token."""
        pf, pt = _masses(self.first, label_ids), _masses(self.then, label_ids)          # [B, N, J]
        return (pf * (pt.cumsum(1) - pt)).sum(1)


def _groups(label: str) -> list[str]:
    """Every prefix of a label's tag path (``B-a/b/c`` -> ``a``, ``a/b``, ``a/b/c``); none for ``O``."""
    if label == "O":
        return []
    path = label[2:].split("/")
    return ["/".join(path[:k]) for k in range(1, len(path) + 1)]


def order_constraints(citations: Sequence[Citation], labels: Sequence[str], min_support: int = 10,
                      min_agreement: float = 0.95) -> OrderConstraints:
    """Instantiate the order templates on training ``citations`` for the label list ``labels`` (module docstring)."""
    citations = check_citations(citations, empty=False)
    min_agreement = check_real("min_agreement", min_agreement, 0.0, 1.0, low_open=True)
    min_support = check_count("min_support", min_support)
    _label_ids(labels)
    c = len(labels)
    groups = sorted({g for label in labels for g in _groups(label)})
    member = torch.tensor([[float(g in _groups(label)) for label in labels] for g in groups],
                          dtype=torch.float64).reshape(len(groups), c)                     # [G, C]
    pairs = [(i, k) for i in range(len(groups)) for k in range(len(groups))
             if i != k and not groups[k].startswith(groups[i] + "/") and not groups[i].startswith(groups[k] + "/")]
    empty = OrderConstraints(torch.zeros(0, c, dtype=torch.float64), torch.zeros(0, c, dtype=torch.float64), [])
    if not pairs:
        return empty
    mass = _masses(member, encode_labels(citations, labels))                # [D, N, G]
    before = mass.cumsum(1) - mass
    violations = torch.einsum("dni,dnk->dik", mass, before)                  # [D, G, G]: k tokens before i ones
    present = mass.sum(1) > 0                                                               # [D, G]
    both = present[:, :, None] & present[:, None, :]
    support = both.sum(0)
    held = ((violations == 0) & both).sum(0)
    keep = [(i, k) for i, k in pairs
            if int(support[i, k]) >= min_support and float(held[i, k]) >= min_agreement * float(support[i, k])]
    if not keep:
        return empty
    return OrderConstraints(member[[i for i, _ in keep]], member[[k for _, k in keep]],
                            [f"order({groups[i]} < {groups[k]})" for i, k in keep])


@dataclass
class BigramExclusions:
    """Bigram patterns ``left`` / ``right`` [P, C] (indicator vectors), the ``pairs`` [J, 2] of patterns that
    should not both occur, and the pairs' ``names``."""

    left: Tensor
    right: Tensor
    pairs: Tensor
    names: list[str]

    def __len__(self) -> int:
        return len(self.names)

    def counts(self, label_ids: Tensor) -> Tensor:
        """Pattern counts [B, P] of label ids [B, N] (``-1`` padding ignored)."""
        pl, pr = _masses(self.left, label_ids), _masses(self.right, label_ids)
        return (pl[:, :-1] * pr[:, 1:]).sum(1)

    def violations(self, label_ids: Tensor) -> Tensor:
        """``S_p S_q`` [B, J]: positive where both patterns of a pair occur."""
        s = self.counts(label_ids)
        return s[:, self.pairs[:, 0]] * s[:, self.pairs[:, 1]]


def bigram_exclusions(citations: Sequence[Citation], labels: Sequence[str], min_support: int = 10,
                      max_together: float = 0.01, within: str = "person") -> BigramExclusions:
    """Instantiate the name-format templates on training ``citations``: label bigrams with a label under a
    ``within`` group, pairs of them that (almost) never share a citation (module docstring)."""
    citations = check_citations(citations, empty=False)
    max_together = check_real("max_together", max_together, 0.0, 1.0, high_open=True)
    min_support = check_count("min_support", min_support)
    if not isinstance(within, str) or not within:
        raise TypeError(f"within must be a group's tag name (a non-empty str such as 'person'), got "
                        f"{type(within).__name__} {within!r}")
    ids, o = _label_ids(labels)
    c = len(labels)
    under = [within in label.removeprefix("B-").removeprefix("I-").split("/") for label in labels]
    seen: dict[tuple[int, int], set[int]] = {}
    for d, cite in enumerate(citations):
        y = [ids.get(v, o) for v in cite.labels]
        for a, b in zip(y[:-1], y[1:], strict=True):
            if under[a] or under[b]:
                seen.setdefault((a, b), set()).add(d)
    frequent = sorted(k for k, docs in seen.items() if len(docs) >= min_support)
    keep = [(i, k) for i in range(len(frequent)) for k in range(i + 1, len(frequent))
            if len(seen[frequent[i]] & seen[frequent[k]])
            <= max_together * min(len(seen[frequent[i]]), len(seen[frequent[k]]))]
    eye = torch.eye(c, dtype=torch.float64)
    left = eye[[a for a, _ in frequent]].reshape(len(frequent), c)
    right = eye[[b for _, b in frequent]].reshape(len(frequent), c)
    pairs = torch.tensor(keep, dtype=torch.long).reshape(len(keep), 2)

    def bigram(p: int) -> str:
        return f"{labels[frequent[p][0]]} {labels[frequent[p][1]]}"

    return BigramExclusions(left, right, pairs, [f"not_both({bigram(i)} ; {bigram(k)})" for i, k in keep])
