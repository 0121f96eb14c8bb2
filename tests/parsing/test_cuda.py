"""Parsing on the accelerator agrees with the CPU: first-order decoding of a parser's arc scores (greedy / Chu-Liu-
Edmonds, Eisner), arc pruning with device weights, Turbo Parser #1 loopy BP and mean-field second-order parsing.

The parsers themselves (features, ``fit``, ``predict``) run on the CPU only: they take no device.  Skipped without
CUDA; ``BETHEPROJ_TEST_DEVICE=cpu`` runs them on the CPU (see ``tests/conftest.py``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from betheproj.data.conllu import parse_conllu
from betheproj.energies.second_order import second_order_masks
from betheproj.oracles.base import PairwisePotentials
from betheproj.oracles.nonprojective import NonProjective
from betheproj.parsing import DependencyParser, GreedyFirst, loopy_bp_parse, mean_field_parse, uas
from betheproj.parsing.pruning import prune
from betheproj.parsing.second_order_decoding import loopy_bp

from .test_parser import _treebank

F64 = torch.float64


def _on(accelerator, *tensors):
    return [t.to(accelerator) for t in tensors]


def _problem(lengths, seed, dtype=F64, prune_p=0.3):
    """Head-major arc scores [B, C, C] (``-inf`` at pruned arcs, the chain 0 -> 1 -> 2 ... kept), sibling and
    grandparent scores [B, C, C, C] and the lengths."""
    gen = torch.Generator().manual_seed(seed)
    b, c = len(lengths), max(lengths) + 1
    theta = torch.randn(b, c, c, generator=gen, dtype=F64)
    chain = torch.zeros(c, c, dtype=torch.bool)
    chain[torch.arange(c - 1), torch.arange(1, c)] = True
    theta = theta.masked_fill((torch.rand(b, c, c, generator=gen) < prune_p) & ~chain, -torch.inf)
    s, g = (0.7 * torch.randn(b, c, c, c, generator=gen, dtype=F64) for _ in range(2))
    return theta.to(dtype), s.to(dtype), g.to(dtype), torch.tensor(lengths)


def _potentials(theta, lengths):
    """Node-layout potentials [B, N, N+1] of head-major scores."""
    node = theta[:, :, 1:].transpose(1, 2).contiguous()
    return PairwisePotentials(node, node.new_zeros(node.shape[2], node.shape[2]), lengths)


def _check_heads(heads, ref, accelerator):
    assert heads.device.type == accelerator.type and heads.dtype == ref.dtype
    assert torch.equal(heads.cpu(), ref)


@pytest.fixture(scope="module")
def sentences():
    return parse_conllu(_treebank(10, seed=3))


@pytest.fixture(scope="module")
def weights():
    """Random first-order weights over 2^12 hashed features (the padding weight 0): no ties between arcs."""
    w = torch.randn((1 << 12) + 1, generator=torch.Generator().manual_seed(1))
    w[-1] = 0.0
    return w


@pytest.mark.parametrize("single_root", [False, True])
@pytest.mark.parametrize("dtype", [F64, torch.float32])
def test_greedy_first_map(accelerator, single_root, dtype):
    theta, _, _, lengths = _problem([7, 3, 5, 1], 0, dtype)
    decoder = GreedyFirst(NonProjective(single_root=single_root))
    ref = decoder.map(_potentials(theta, lengths))
    _check_heads(decoder.map(_potentials(*_on(accelerator, theta, lengths))), ref, accelerator)


@pytest.mark.parametrize("projective", [False, True])
def test_first_order_parser_scores_decode_on_device(accelerator, sentences, weights, projective):
    """A parser's arc scores decoded on the device give its CPU ``predict`` heads, and the device heads score the
    same UAS."""
    parser = DependencyParser(bits=12, projective=projective)
    parser.weights = weights
    ref = parser.predict(sentences)
    scores = parser.arc_scores(sentences)                               # [N, N+1] each, on the CPU
    n = max(len(s) for s in sentences)
    node = torch.full((len(sentences), n, n + 1), -torch.inf)
    for b, x in enumerate(scores):
        node[b, : x.shape[0], : x.shape[1]] = x
    lengths = torch.tensor([len(s) for s in sentences])
    node, lengths = _on(accelerator, node, lengths)
    heads = parser.oracle.map(PairwisePotentials(node, node.new_zeros(n + 1, n + 1), lengths))
    assert heads.device.type == accelerator.type
    rows = [heads[b, : len(s)] for b, s in enumerate(sentences)]
    assert [r.cpu().tolist() for r in rows] == [h.tolist() for h in ref]
    assert uas(sentences, rows) == uas(sentences, ref)


@pytest.mark.parametrize(("gold", "single_root"), [(False, False), (True, False), (True, True)])
def test_prune_with_device_weights(accelerator, sentences, weights, gold, single_root):
    first = DependencyParser(bits=12, single_root=single_root)
    first.weights = weights
    ref = prune(first, weights, sentences, top_k=2, min_prob=1e-3, gold=gold)
    out = prune(first, weights.to(accelerator), sentences, top_k=2, min_prob=1e-3, gold=gold)
    for name in ("offsets", "mod", "head", "ids", "lengths"):
        a, b = getattr(out, name), getattr(ref, name)
        assert isinstance(a, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b), name
    assert out.recall == ref.recall or (np.isnan(out.recall) and np.isnan(ref.recall))


@pytest.mark.parametrize("factors", ["both", "sibling", "none"])
@pytest.mark.parametrize("damping", [0.0, 0.5])
@pytest.mark.parametrize("dtype", [F64, torch.float32])
def test_loopy_bp(accelerator, factors, damping, dtype):
    theta, s, g, lengths = _problem([5, 3, 4], 1, dtype)
    s, g = (s if factors != "none" else None), (g if factors == "both" else None)
    opts = {"max_iter": 8, "damping": damping, "tol": 0.0}              # tol 0: the same number of iterations
    ref = loopy_bp(theta, s, g, lengths, **opts)
    res = loopy_bp(*[None if t is None else t.to(accelerator) for t in (theta, s, g, lengths)], **opts)
    atol = 1e-9 if dtype == F64 else 1e-4
    for name in ("beliefs", "log_odds"):
        out = getattr(res, name)
        assert out.device.type == accelerator.type and out.dtype == dtype
        torch.testing.assert_close(out.cpu(), getattr(ref, name), atol=atol, rtol=atol)   # -inf where ref is
    assert res.iterations == ref.iterations == 8
    assert res.change == pytest.approx(ref.change, abs=atol)


@pytest.mark.parametrize("single_root", [False, True])
@pytest.mark.parametrize(("decoder", "decode_on"), [("loopy_bp", "beliefs"), ("loopy_bp", "log_odds"),
                                                    ("mean_field", "map"), ("mean_field", "marginals"),
                                                    ("mean_field", "parts")])
def test_second_order_decoding(accelerator, decoder, decode_on, single_root):
    theta, s, g, lengths = _problem([6, 4, 5, 2], 2)

    def parse(theta, s, g, lengths):
        pot = _potentials(theta, lengths)
        if decoder == "loopy_bp":
            heads, res = loopy_bp_parse(pot, s, g, max_iter=10, damping=0.3, decode_on=decode_on,
                                        single_root=single_root)
            return heads, res.beliefs
        parts = None
        if decode_on == "parts":                                         # the sparse path: every part listed
            parts = tuple(torch.nonzero(m).T for m in second_order_masks(lengths, theta.shape[1]))
        heads, sol = mean_field_parse(pot, s, g, max_iter=15, tol=0.0, decode_on="marginals" if decode_on == "marginals"
                                      else "map", single_root=single_root, parts=parts)
        return heads, sol.marginals.node

    ref_heads, ref_marg = parse(theta, s, g, lengths)
    heads, marg = parse(*_on(accelerator, theta, s, g, lengths))
    _check_heads(heads, ref_heads, accelerator)
    assert marg.device.type == accelerator.type
    torch.testing.assert_close(marg.cpu(), ref_marg, atol=1e-9, rtol=1e-9)
