"""The FactorGraph container: construction, the pairwise shorthand, access, scores, and argument errors."""

import numpy as np
import pytest

from betheproj.factor_graphs import XOR, Dense, FactorGraph


def test_pairwise_graph_scores_and_structure():
    g = FactorGraph.pairwise([np.array([0.0, 1.0]), np.array([0.5, 0.0, -np.inf])], [(0, 1)],
                             [np.arange(6.0).reshape(2, 3)])
    assert g.cardinalities == (2, 3) and g.num_factors == 1 and g.is_tree()
    assert g.score([1, 2]) == -np.inf
    assert g.score([1, 1]) == pytest.approx(1.0 + 0.0 + 4.0)
    assert g.neighbors(1) == [(0, 1)] and g.degree(0) == 1
    u = g.unary(0)
    u[0] = 99.0                                           # a copy: the graph is unchanged
    assert g.unary(0)[0] == 0.0
    shared = FactorGraph.pairwise([np.zeros(2)] * 3, [(0, 1), (1, 2), (2, 0)], np.eye(2))
    assert shared.num_factors == 3 and not shared.is_tree()
    assert repr(shared) == "FactorGraph(variables=3, factors=3)"


def test_hard_factors_make_scores_minus_inf_and_add_variables_returns_ids():
    g = FactorGraph()
    assert g.add_variables([2, 2, 2]) == [0, 1, 2]
    g.add_factor(XOR((0, 1, 2)))
    g.add_dense((0, 1), np.zeros((2, 2)))
    assert g.score([1, 0, 0]) == 0.0 and g.score([1, 1, 0]) == -np.inf
    assert g.degree(0) == 2 and not g.is_tree()


def test_a_failed_unary_leaves_the_graph_as_it_was():
    g = FactorGraph([2])
    with pytest.raises(ValueError, match=r"unary must have shape \(3,\) \(the cardinality of variable 1\)"):
        g.add_variable(3, np.zeros(2))                     # wrong length
    assert g.num_variables == 1 and g.cardinalities == (2,)
    assert g.add_variable(3, np.zeros(3)) == 1


@pytest.mark.parametrize("make, err, msg", [
    (lambda: FactorGraph("ab"), TypeError, "cardinalities must be a sequence of ints"),
    (lambda: FactorGraph([2, 0]), ValueError, r"cardinalities\[1\] must be at least 1"),
    (lambda: FactorGraph.pairwise("u", [], []), TypeError, "unary must be a sequence"),
    (lambda: FactorGraph.pairwise([np.zeros(2)], 5, []), TypeError, "edges must be a sequence"),
    (lambda: FactorGraph.pairwise([np.zeros(0)], [], []), ValueError, r"unary\[0\] is empty"),
    (lambda: FactorGraph.pairwise([np.zeros(2)] * 2, [(0, 1)], np.zeros(2)), ValueError,
     "one shared 2-D table"),
    (lambda: FactorGraph.pairwise([np.zeros(2)] * 2, [(0, 1)], []), ValueError, r"one table per edge \(1\)"),
    (lambda: FactorGraph.pairwise([np.zeros(2)] * 2, [(0,)], [np.zeros((2, 2))]), ValueError,
     r"edges\[0\] must be a pair"),
    (lambda: FactorGraph.pairwise([np.zeros(2)] * 2, [(0, 1)], [np.zeros((2, 3))]), ValueError,
     r"tables\[0\] must have shape \(2, 2\)"),
    (lambda: FactorGraph.pairwise([np.zeros(2)] * 2, [(0, 2)], [np.zeros((2, 2))]), ValueError, r"edges\[0\]\[1\]"),
    (lambda: FactorGraph.pairwise([np.zeros(2)] * 2, [(1, 1)], [np.zeros((2, 2))]), ValueError,
     r"edges\[0\] is a self-loop"),
    (lambda: FactorGraph.pairwise([np.zeros(2), np.zeros(3)], [(0, 1)], np.zeros((2, 2))), ValueError,
     r"tables \(shared\) must have shape \(2, 3\)"),
    (lambda: XOR([]), ValueError, "at least 1 variable, got 0"),
    (lambda: FactorGraph([2, 2]).score([0]), ValueError, "assignment must be 2 integer labels"),
    (lambda: FactorGraph([2, 2]).score([0, 2]), ValueError, "outside the variables' ranges"),
    (lambda: FactorGraph([2]).neighbors(3), ValueError, "variable"),
    (lambda: FactorGraph([2]).add_factor(Dense((0, 1), np.zeros((2, 2)))), ValueError,
     r"factor.variables\[1\] = 1 is not a variable of this graph"),
])
def test_bad_arguments(make, err, msg):
    with pytest.raises(err, match=msg):
        make()
