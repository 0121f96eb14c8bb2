"""Segment posteriors and minimum-Bayes-risk segment decoding against enumeration of every labelling."""

import itertools

import pytest
import torch

from betheproj import ChainPotentials, LinearChain
from betheproj.data.citations import bio_segments
from betheproj.inference.segments import BIOFields, decode_segments, segment_log_marginals

LABELS = ["O", "B-a", "I-a", "B-b", "I-b", "I-c", "B-d"]    # c has no B- label, d no I- label


def _potentials(seed: int, shared: bool = False, scale: float = 2.0, dtype=torch.float64) -> ChainPotentials:
    g = torch.Generator().manual_seed(seed)
    b, n, c = 4, 5, len(LABELS)
    node = torch.randn(b, n, c, generator=g, dtype=dtype) * scale
    edge = torch.randn(*(() if shared else (b, n - 1)), c, c, generator=g, dtype=dtype) * scale
    edge[..., 0, 4] = -torch.inf                               # O -> I-b forbidden
    node[1, 2, 2] = -torch.inf                                 # I-a forbidden at one position of one example
    return ChainPotentials(node, edge, torch.tensor([5, 3, 1, 4]))


def _enumerate(pot: ChainPotentials, fields: BIOFields):
    """Per example: every labelling with its probability and its segments (field index, start, last)."""
    index = {name: k for k, name in enumerate(fields.names)}
    out = []
    for i, n in enumerate(pot.lengths.tolist()):
        node, edge = pot.node[i], pot.full_edge()[i]
        rows, scores = [], []
        for y in itertools.product(range(len(LABELS)), repeat=n):
            s = node[0, y[0]] + sum(node[t, y[t]] + edge[t - 1, y[t - 1], y[t]] for t in range(1, n))
            segs = [(index[k], a, e - 1) for k, a, e in bio_segments([LABELS[v] for v in y])]
            rows.append((y, segs))
            scores.append(s)
        p = torch.softmax(torch.stack(scores), 0)
        out.append([(y, segs, float(q)) for (y, segs), q in zip(rows, p, strict=True)])
    return out


def _segment_table(table) -> torch.Tensor:
    """[F, N, N]: each segment's probability, summed over the enumerated labellings that hold it."""
    want = torch.zeros(4, 5, 5, dtype=torch.float64)
    for _, segs, q in table:
        for k, s, t in segs:
            want[k, s, t] += q
    return want


@pytest.mark.parametrize("shared", [False, True])
def test_segment_marginals_match_enumeration(shared):
    pot = _potentials(0, shared)
    fields = BIOFields.from_labels(LABELS)
    log_p = segment_log_marginals(pot, fields)
    assert log_p.shape == (4, 4, 5, 5)
    for i, table in enumerate(_enumerate(pot, fields)):
        torch.testing.assert_close(log_p[i].exp(), _segment_table(table), rtol=1e-12, atol=1e-14)
        n = int(pot.lengths[i])
        assert bool(torch.isneginf(log_p[i, :, n:]).all()) and bool(torch.isneginf(log_p[i, :, :, n:]).all())


def test_segments_opened_by_b_sum_to_the_node_marginal():
    pot = _potentials(1, scale=30.0)                           # large magnitudes: log space throughout
    fields = BIOFields.from_labels(LABELS)
    log_p = segment_log_marginals(pot, fields)
    assert not bool(torch.isnan(log_p).any())
    mu = LinearChain().marginals(pot).node
    # B-a opens every a segment (an I-a after B-b, say, opens one too: that mass is not B-a's)
    k = fields.names.index("a")
    opened_by_b = mu[:, :, fields.begin[k]]
    total = log_p[:, k].exp().sum(-1)
    assert bool((total >= opened_by_b - 1e-12).all())
    d = fields.names.index("d")                                # no I- label: a segment is B-d alone
    torch.testing.assert_close(log_p[:, d].exp().sum(-1), mu[:, :, fields.begin[d]], rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("threshold", [0.0, 0.2, 0.45, 0.5, 0.8])
def test_decoder_maximises_expected_gain(threshold):
    pot = _potentials(2)
    fields = BIOFields.from_labels(LABELS)
    p = segment_log_marginals(pot, fields).exp()
    labels = decode_segments(pot, fields, threshold)
    index = {name: k for k, name in enumerate(fields.names)}
    for i, table in enumerate(_enumerate(pot, fields)):
        n = int(pot.lengths[i])
        assert bool((labels[i, n:] == -1).all())

        def value(segs, i=i):
            return sum(float(p[i, k, s, t]) - threshold for k, s, t in segs)

        got = [(index[k], a, e - 1) for k, a, e in bio_segments([LABELS[v] for v in labels[i, :n].tolist()])]
        assert value(got) == pytest.approx(max(value(segs) for _, segs, _ in table) if table else 0.0, abs=1e-12)
        if threshold >= 0.5:                                   # the segments more likely than the threshold
            want = {(k, s, t) for k in range(len(fields.names)) for s in range(n) for t in range(n)
                    if float(p[i, k, s, t]) > threshold}
            assert set(got) == want


def test_field_without_b_label_keeps_adjacent_segments_apart():
    # I-c I-c is forbidden, so c's likely segments are one token long, and two side by side would gain most; but
    # written as I-c I-c they read as one segment, of probability 0
    labels = ["O", "I-c"]
    fields = BIOFields.from_labels(labels)
    pot = ChainPotentials(torch.zeros(1, 2, 2, dtype=torch.float64),
                          torch.tensor([[0.0, 0.0], [0.0, -torch.inf]], dtype=torch.float64))
    p = segment_log_marginals(pot, fields).exp()[0, 0]
    torch.testing.assert_close(p, torch.tensor([[1 / 3, 0.0], [0.0, 1 / 3]], dtype=torch.float64))
    assert decode_segments(pot, fields, 0.1)[0].tolist() in ([1, 0], [0, 1])


def test_float32_agrees_with_float64():
    pot = _potentials(3)
    pot32 = ChainPotentials(pot.node.float(), pot.edge.float(), pot.lengths)
    fields = BIOFields.from_labels(LABELS)
    torch.testing.assert_close(segment_log_marginals(pot32, fields).exp().double(),
                               segment_log_marginals(pot, fields).exp(), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("labels", [LABELS, ["O", "B-a", "I-a", "B-b", "I-b"], ["O", "I-c", "I-e"]])
def test_decoding_streams_the_table_it_would_decode(monkeypatch, labels):
    # decode_segments takes the segment posteriors one end position at a time and never builds the [B, F, N, N]
    # table; best_segments decodes that table: the same labels
    import betheproj.inference.segments as segments

    g = torch.Generator().manual_seed(7)
    c = len(labels)
    pot = ChainPotentials(torch.randn(5, 9, c, generator=g, dtype=torch.float64),
                          torch.randn(5, 8, c, c, generator=g, dtype=torch.float64), torch.tensor([9, 4, 1, 7, 9]))
    fields = BIOFields.from_labels(labels)
    table = segment_log_marginals(pot, fields)
    monkeypatch.setattr(segments, "segment_log_marginals", None)
    for threshold in (0.0, 0.2, 0.5, 0.8):
        assert torch.equal(decode_segments(pot, fields, threshold),
                           segments.best_segments(table, pot.lengths, fields, threshold))


def test_potentials_that_require_grad_decode_without_a_graph():
    # the decoder and the table run without gradients (their recursions write in place); a model's potentials
    # that carry a graph decode as their values do
    pot = _potentials(8)
    fields = BIOFields.from_labels(LABELS)
    node = pot.node.clone().requires_grad_(True)
    with_grad = ChainPotentials(node * 1.0, pot.edge, pot.lengths)
    table = segment_log_marginals(with_grad, fields)
    assert not table.requires_grad
    torch.testing.assert_close(table, segment_log_marginals(pot, fields), rtol=0, atol=0)
    assert torch.equal(decode_segments(with_grad, fields, 0.4), decode_segments(pot, fields, 0.4))


def test_bad_arguments_are_named():
    pot = _potentials(0)
    fields = BIOFields.from_labels(LABELS)
    with pytest.raises(ValueError, match="threshold"):
        decode_segments(pot, fields, 1.5)
    with pytest.raises(TypeError, match="fields"):
        decode_segments(pot, LABELS)
    with pytest.raises(TypeError, match="potentials"):
        segment_log_marginals(pot.node, fields)
    with pytest.raises(ValueError, match="labels"):
        segment_log_marginals(pot, BIOFields(("x",), (9,), (-1,), 0))
    with pytest.raises(ValueError, match="'O'"):
        BIOFields.from_labels(["B-a", "I-a"])
    with pytest.raises(ValueError, match=r"labels\[1\]"):
        BIOFields.from_labels(["O", "X-a"])
    with pytest.raises(ValueError, match="repeats"):
        BIOFields.from_labels(["O", "B-a", "B-a"])
    with pytest.raises(ValueError, match="outside"):
        BIOFields(("a",), (1,), (-1,), 1)
    dead = ChainPotentials(torch.full((1, 2, 7), -torch.inf, dtype=torch.float64), torch.zeros(7, 7,
                                                                                               dtype=torch.float64))
    with pytest.raises(ValueError, match="no labelling"):
        segment_log_marginals(dead, fields)


@pytest.mark.parametrize(("args", "match"), [
    (((), (), (), 0), "names must hold at least one field"),
    ((("a", "b"), (1,), (2, 3), 0), r"begin and inside must hold one label per field \(2\), got 1 and 2"),
    ((("a",), (-2,), (1,), 0), r"begin must hold label indices \(>= 0\) or -1 for none, got \[-2\]"),
    ((("a",), (True,), (2,), 0), "begin must hold label indices"),
    ((("a",), (1,), (1.0,), 0), "inside must hold label indices"),
    ((("a", "b"), (1, -1), (2, -1), 0), "field 'b' has neither a begin nor an inside label"),
    ((("a", "b"), (1, 2), (2, 3), 0), "begin and inside must name every label at most once"),
    ((("a",), (1,), (2,), True), "outside must be the O label's index"),
])
def test_bio_fields_built_by_hand_are_checked(args, match):
    with pytest.raises(ValueError, match=match):
        BIOFields(*args)


def test_bio_fields_from_labels_and_best_segments_name_bad_arguments():
    with pytest.raises(TypeError, match="labels must be a sequence of label names, got str"):
        BIOFields.from_labels("O B-a I-a")
    with pytest.raises(ValueError, match="at least one 'B-<field>' or 'I-<field>' label"):
        BIOFields.from_labels(["O"])
    from betheproj.inference.segments import best_segments

    pot = _potentials(0)
    fields = BIOFields.from_labels(LABELS)
    table = segment_log_marginals(pot, fields)
    assert torch.equal(best_segments(table, pot.lengths, fields, 0.5), decode_segments(pot, fields, 0.5))
    with pytest.raises(TypeError, match="fields must be a BIOFields"):
        best_segments(table, pot.lengths, LABELS)
    with pytest.raises(ValueError, match=r"log_marginals must be segment_log_marginals' \[B, F="):
        best_segments(table[:, :1], pot.lengths, fields)
    with pytest.raises(ValueError, match=r"lengths must be the potentials' lengths \[B="):
        best_segments(table, pot.lengths + table.shape[-1], fields)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_accelerator_agrees_with_the_cpu(accelerator, dtype):
    """Segment posteriors and decodings on the accelerator (skipped without CUDA; ``BETHEPROJ_TEST_DEVICE=cpu``
    runs it on the CPU)."""
    from tests.devices import agree

    pot = _potentials(5, dtype=dtype)
    fields = BIOFields.from_labels(LABELS)
    dev_pot = ChainPotentials(pot.node.to(accelerator), pot.edge.to(accelerator), pot.lengths.to(accelerator))
    tol = {"atol": 1e-12, "rtol": 1e-10} if dtype == torch.float64 else {"atol": 1e-5, "rtol": 1e-5}
    agree(segment_log_marginals(pot, fields), segment_log_marginals(dev_pot, fields), accelerator, **tol)
    for threshold in (0.2, 0.5):
        agree(decode_segments(pot, fields, threshold), decode_segments(dev_pot, fields, threshold), accelerator)


def test_log_space_products_are_exact_where_terms_underflow():
    from betheproj.inference.segments import _lse_product

    # the largest term of x meets a forbidden entry; the one left is e^-1000 below it: a plain product loses it
    x = torch.tensor([[0.0, -1000.0]], dtype=torch.float64)
    m = torch.tensor([[-torch.inf, 1.0], [0.0, 2.0]], dtype=torch.float64)
    torch.testing.assert_close(_lse_product(x, m), torch.tensor([[-1000.0, 1.0]], dtype=torch.float64))
    g = torch.Generator().manual_seed(0)
    for dtype, scale in ((torch.float64, 400.0), (torch.float32, 60.0)):
        x = torch.randn(50, 7, generator=g, dtype=torch.float64) * scale
        m = torch.randn(7, 5, generator=g, dtype=torch.float64) * scale
        m[torch.rand(7, 5, generator=g) < 0.4] = -torch.inf
        x[3] = -torch.inf                                      # a row of -inf: exact -inf out
        mb = torch.randn(50, 7, 5, generator=g, dtype=torch.float64) * scale
        for table in (m, mb):
            want = torch.logsumexp(x[:, :, None] + table, -2)
            got = _lse_product(x.to(dtype), table.to(dtype)).double()
            assert torch.equal(torch.isinf(got), torch.isinf(want))
            fin = torch.isfinite(want)
            torch.testing.assert_close(got[fin], want[fin], rtol=1e-12 if dtype == torch.float64 else 1e-5,
                                       atol=0.0)


def test_segment_marginals_with_huge_gaps_match_enumeration():
    pot = _potentials(6, scale=300.0)                          # gaps of hundreds of nats: exp underflows
    fields = BIOFields.from_labels(LABELS)
    log_p = segment_log_marginals(pot, fields)
    for i, table in enumerate(_enumerate(pot, fields)):
        torch.testing.assert_close(log_p[i].exp(), _segment_table(table), rtol=1e-9, atol=1e-300)


def test_chains_of_one_token():
    pot = ChainPotentials(torch.randn(3, 1, len(LABELS), dtype=torch.float64), torch.zeros(len(LABELS), len(LABELS),
                                                                                          dtype=torch.float64))
    fields = BIOFields.from_labels(LABELS)
    p = segment_log_marginals(pot, fields).exp()[:, :, 0, 0]
    mu = torch.softmax(pot.node[:, 0], -1)
    for k in range(len(fields.names)):                         # the token opens a segment with its B- or its I-
        want = sum(mu[:, i] for i in (fields.begin[k], fields.inside[k]) if i >= 0)
        torch.testing.assert_close(p[:, k], want)
    assert decode_segments(pot, fields, 0.5).shape == (3, 1)


def test_decode_segments_at_several_thresholds_is_decode_segments_at_each():
    """One pass of segment posteriors decodes every threshold (the experiment chooses one on dev this way)."""
    from betheproj.inference.segments import decode_segments_at

    torch.manual_seed(3)
    fields = BIOFields.from_labels(["O", "B-a", "I-a", "B-b", "I-b"])
    pot = ChainPotentials(torch.randn(4, 6, 5, dtype=torch.float64), torch.randn(5, 5, dtype=torch.float64),
                          torch.tensor([6, 3, 1, 5]))
    thresholds = (0.1, 0.5, 0.9)
    for got, threshold in zip(decode_segments_at(pot, fields, thresholds), thresholds, strict=True):
        assert torch.equal(got, decode_segments(pot, fields, threshold))
    for bad in ((), 0.5, "0.5"):
        with pytest.raises(ValueError, match="thresholds must be a non-empty sequence"):
            decode_segments_at(pot, fields, bad)
    with pytest.raises(ValueError, match=r"thresholds\[1\]"):
        decode_segments_at(pot, fields, (0.5, 1.5))
