"""The pairwise MRF layer: validation of structures and potentials, per-node label sets, and the conversion to
the chain and tree oracles."""


import numpy as np
import pytest
import torch

import betheproj as bp
from betheproj.mrf import (
    LocalMarginals,
    PairwiseMRF,
    exact_map,
    lbp_map,
)
from tests.mrf.models import random_mrf


@pytest.mark.parametrize("labels, edges, err, match", [
    ([2, 0], [], ValueError, r"labels\[1\] must be at least 1"),
    ([2, ["a", "a"]], [], ValueError, r"labels\[1\] repeats"),
    ([2, []], [], ValueError, r"labels\[1\] is empty"),
    ([2, 2.5], [], TypeError, r"labels\[1\] must be an int"),
    ([], [], ValueError, "labels is empty"),
    ("ab", [], TypeError, "labels must be a sequence"),
    ([2, 2], [(0, 0)], ValueError, "self-loop"),
    ([2, 2], [(0, 1), (1, 0)], ValueError, "repeats an edge"),
    ([2, 2], [(0, 2)], ValueError, r"edges\[0\]\[1\] = 2 is not a node"),
    ([2, 2], [(0,)], ValueError, r"edges\[0\] must be a pair"),
    ([2, 2], [(0, 1.0)], TypeError, r"edges\[0\]\[1\] must be an int"),
])
def test_structure_errors(labels, edges, err, match):
    with pytest.raises(err, match=match):
        PairwiseMRF(labels, edges)


def test_potential_errors():
    with pytest.raises(ValueError, match=r"node_potentials\[1\] must have shape \(3,\)"):
        PairwiseMRF([2, 3], [(0, 1)], [np.zeros(2), np.zeros(2)])
    with pytest.raises(ValueError, match=r"node_potentials\[0\] contains NaN"):
        PairwiseMRF([2, 3], [(0, 1)], [np.array([np.nan, 0.0]), np.zeros(3)])
    with pytest.raises(ValueError, match=r"edge_potentials\[0\] must have shape \(2, 3\)"):
        PairwiseMRF([2, 3], [(0, 1)], None, [np.zeros((3, 2))])
    with pytest.raises(ValueError, match="one table per edge"):
        PairwiseMRF([2, 3], [(0, 1)], None, [])
    with pytest.raises(ValueError, match=r"must be finite or -inf"):
        PairwiseMRF([2, 2], [(0, 1)], None, np.full((2, 2), np.inf))
    mrf = PairwiseMRF([2, 3], [(0, 1)])
    with pytest.raises(ValueError, match="labelling has label indices outside"):
        mrf.score([0, 3])
    with pytest.raises(ValueError, match="labelling must hold 2 integer"):
        mrf.score([0.0, 1.0])
    with pytest.raises(TypeError, match="mrf must be a PairwiseMRF"):
        exact_map("not an mrf")
    with pytest.raises(ValueError, match="more than max_configurations=4"):
        exact_map(mrf, max_configurations=4)
    with pytest.raises(ValueError, match="backend must be"):
        lbp_map(mrf, backend="torch")
    with pytest.raises(ValueError, match=r"damping must be a finite number in \[0, 1\)"):
        lbp_map(mrf, damping=1.0)
    with pytest.raises(ValueError, match=r"damping_space must be one of \('probability', 'log'\), got 'prob'"):
        lbp_map(mrf, damping=0.5, damping_space="prob")
    with pytest.raises(ValueError, match="max_iter must be an int >= 1"):
        lbp_map(mrf, max_iter=0)
    forbidden = PairwiseMRF([2, 2], [(0, 1)], None, np.full((2, 2), -np.inf))
    with pytest.raises(ValueError, match="score -inf"):
        exact_map(forbidden)
    with pytest.raises(ValueError, match="zero for every label"):
        lbp_map(forbidden)


def test_per_node_label_sets_and_names():
    mrf = PairwiseMRF([("A", "B"), ("B", "C"), 3], [(0, 1), (1, 2)])
    assert mrf.cardinalities == (2, 2, 3)
    assert mrf.label_names([1, 0, 2]) == ["B", "B", 2]
    assert mrf.label_index(["B", "C", 0]).tolist() == [1, 1, 0]
    assert mrf.neighbors(1) == [0, 2]
    with pytest.raises(ValueError, match=r"names\[0\] = 'C' is not in node 0's label set"):
        mrf.label_index(["C", "C", 0])


def test_chain_and_tree_oracle_conversion_match_enumeration():
    rng = np.random.default_rng(5)
    chain = random_mrf(rng, (3, 3, 3, 3, 3), [(0, 1), (2, 1), (2, 3), (3, 4)])
    labels = bp.LinearChain().map(chain.to_pairwise_potentials())[0].numpy()
    assert np.array_equal(labels, exact_map(chain).labels)
    parents = [-1, 0, 0, 1, 1, 2]
    tree = random_mrf(rng, (2, 3, 3, 2, 3, 1), [(1, 3), (0, 1), (0, 2), (4, 1), (2, 5)])
    labels = bp.Tree(parents).map(tree.to_pairwise_potentials(parents))[0].numpy()
    assert np.array_equal(labels, exact_map(tree).labels)
    pot = tree.to_pairwise_potentials(v for v in parents)           # a generator, read once (an IndexError)
    assert torch.equal(pot.node, tree.to_pairwise_potentials(parents).node)
    assert torch.equal(pot.edge, tree.to_pairwise_potentials(parents).edge)
    with pytest.raises(ValueError, match="no edge between node 2 and its parent 1"):
        tree.to_pairwise_potentials()
    with pytest.raises(ValueError, match="a tree on 3 nodes has 2"):
        PairwiseMRF([2, 2, 2], [(0, 1), (1, 2), (2, 0)]).to_pairwise_potentials()


def test_potential_and_marginal_arguments_are_named():
    with pytest.raises(TypeError, match="node_potentials must be a sequence of 1-D arrays"):
        PairwiseMRF([2], [], 5)
    with pytest.raises(ValueError, match=r"node_potentials must hold one array per node \(2\), got 1"):
        PairwiseMRF([2, 2], [], [np.zeros(2)])
    with pytest.raises(ValueError, match="one shared 2-D table"):
        PairwiseMRF([2, 2], [(0, 1)], None, np.zeros(2))
    # stacked potentials: a NumPy (n, c) stack was taken, a tensor one a TypeError; an (m, c, c) edge stack a
    # ValueError 'must be a list of 2-D tables or one shared 2-D table'
    node, edge = np.arange(4.0).reshape(2, 2), np.arange(4.0).reshape(1, 2, 2)
    ref = PairwiseMRF([2, 2], [(0, 1)], list(node), list(edge))
    for stack in (lambda a: a, torch.tensor):
        mrf = PairwiseMRF([2, 2], [(0, 1)], stack(node), stack(edge))
        assert np.array_equal(mrf.all_scores(), ref.all_scores())
    with pytest.raises(ValueError, match=r"edge_potentials must hold one table per edge \(1\), got 2"):
        PairwiseMRF([2, 2], [(0, 1)], None, np.zeros((2, 2, 2)))
    for bad in (np.array(1.0), torch.tensor(1.0)):                 # 0-d: was 'len() of unsized object'
        with pytest.raises(TypeError, match="node_potentials must be a sequence of 1-D arrays"):
            PairwiseMRF([2], [], bad)
    with pytest.raises(TypeError, match=r"node_potentials\[0\] must be an array of floats, got str"):
        PairwiseMRF([2], [], ["ab"])
    with pytest.raises(TypeError, match="must be an array of real numbers"):
        PairwiseMRF([2], [], [np.array([1j, 2j])])
    with pytest.raises(ValueError, match=r"node_potentials\[0\] must be 1-D"):
        PairwiseMRF([2], [], [np.zeros((2, 1))])
    with pytest.raises(TypeError, match=r"labels\[0\] must hold hashable label names"):
        PairwiseMRF([[["a"], ["b"]]], [])
    with pytest.raises(TypeError, match="edges must be a sequence of"):
        PairwiseMRF([2], 5)
    mrf = PairwiseMRF([2, 3], [(0, 1)], [torch.tensor([0.0, 1.0]), np.zeros(3)])    # tensors are accepted
    assert mrf.node_potentials[0].tolist() == [0.0, 1.0] and mrf.labels == ((0, 1), (0, 1, 2))
    assert repr(mrf) == "PairwiseMRF(nodes=2, edges=1, cardinalities=(2, 3))"
    with pytest.raises(ValueError, match=r"node = 5 is not a node \(the MRF has 2\)"):
        mrf.neighbors(5)
    with pytest.raises(TypeError, match="marginals must be LocalMarginals"):
        mrf.expected_score(np.zeros(5))
    with pytest.raises(ValueError, match="must hold 2 node and 1 edge marginals"):
        mrf.expected_score(LocalMarginals([np.ones(2)], []))
    with pytest.raises(ValueError, match=r"node\[1\] must have shape \(3,\)"):
        mrf.expected_score(LocalMarginals([np.ones(2), np.ones(2)], [np.ones((2, 3))]))
    with pytest.raises(ValueError, match=r"edge\[0\] must have shape \(2, 3\)"):
        mrf.expected_score(LocalMarginals([np.ones(2), np.ones(3)], [np.ones((3, 2))]))
    for bad, where in ((np.array([np.nan, 1.0]), "node"), (np.array([-3.0, 4.0]), "node"),
                       (np.array([np.inf, 0.0]), "node"), (np.full((2, 3), np.nan), "edge")):
        node = [bad if where == "node" else np.ones(2) / 2, np.ones(3) / 3]
        edge = [bad if where == "edge" else np.ones((2, 3)) / 6]
        with pytest.raises(ValueError, match=rf"marginals\.{where}\[0\] must hold finite marginals >= 0"):
            mrf.expected_score(LocalMarginals(node, edge))          # was a NaN or a made-up score
    lp_noise = LocalMarginals([np.array([1.0 + 1e-9, -1e-9]), np.array([0.0, 1.0, 0.0])],
                              [np.array([[-1e-12, 1.0, 0.0], [0.0, 0.0, 0.0]])])
    assert np.isfinite(mrf.expected_score(lp_noise))                # an LP solver's rounding is accepted
    with pytest.raises(ValueError, match="parents must have length 2"):
        mrf.tree_parents([0, 0])
    for parents in ([-1, 0.9], ["-1", "0"]):                        # were read as [-1, 0] by int()
        with pytest.raises(TypeError, match="parents must be integers"):
            mrf.tree_parents(parents)
    assert mrf.tree_parents(np.array([-1, 0])).tolist() == mrf.tree_parents([-1, 0]).tolist()
    assert mrf.tree_parents(v for v in [-1, 0]).tolist() == [0]              # a generator, read once
    single = PairwiseMRF([3], [], [np.array([0.0, 3.0, 1.0])])
    pot = single.to_pairwise_potentials()                     # one node: a shared all-zero edge table
    assert pot.edge.shape == (3, 3) and not pot.edge.any() and bp.LinearChain().map(pot).tolist() == [[1]]


def test_oracle_potentials_refuse_finite_scores_beyond_the_dtype():
    # a finite -1e39 became -inf in float32: both labels of node 0 read as forbidden, "no labelling" followed
    mrf = PairwiseMRF([2, 2], [(0, 1)], [np.array([-1e39, -1e39]), np.array([0.0, 1.0])])
    assert bp.LinearChain().map(mrf.to_pairwise_potentials()).tolist() == [[0, 1]]
    with pytest.raises(ValueError, match="node holds finite scores beyond the range of torch.float32"):
        mrf.to_pairwise_potentials(dtype=torch.float32)
    big = PairwiseMRF([2, 2], [(0, 1)], None, [np.array([[0.0, 1e39], [0.0, 0.0]])])
    with pytest.raises(ValueError, match="edge holds finite scores beyond the range of torch.float32"):
        big.to_pairwise_potentials(dtype=torch.float32)
    pot = mrf.with_potentials([np.array([0.0, -np.inf]), np.zeros(2)]).to_pairwise_potentials(dtype=torch.float32)
    assert pot.node.dtype == torch.float32 and pot.node[0, 0, 1] == -np.inf    # -inf stays a forbidden label


def test_agreement_table_by_name_from_sequences_arrays_and_tensors():
    from betheproj.mrf import agreement_table

    want = np.array([[1.0, 0.0], [0.0, 0.0], [0.0, 1.0]])
    assert np.array_equal(agreement_table(["a", "b", "c"], ("a", "c")), want)
    assert np.array_equal(agreement_table(np.array([1, 2, 3]), torch.tensor([1, 3])), want)
    with pytest.raises(ValueError, match=r"^labels_i must be one-dimensional, got shape \(2, 3\)"):
        agreement_table(torch.zeros(2, 3), [0.0])
    with pytest.raises(TypeError, match="^labels_j must be a sequence of label names, got str"):
        agreement_table(["a"], "ab")
