"""Seeds are checked alike everywhere: an int in [0, 2**63 - 1], named."""

import numpy as np
import pytest
import torch

from betheproj import LinearChain
from betheproj._checks import SEED_MAX, check_seed
from betheproj.learning import RandomFourierFeatures, fit_online
from betheproj.learning.perceptron import structured_perceptron
from betheproj.mrf.paper import random_grid_dataset


def test_check_seed_bounds():
    assert check_seed("seed", 0) == 0 and check_seed("seed", np.int64(SEED_MAX)) == SEED_MAX
    with pytest.raises(ValueError, match=r"seed must be an int in \[0, 2\*\*63 - 1\], got -1"):
        check_seed("seed", -1)
    with pytest.raises(ValueError, match="seed"):
        check_seed("seed", SEED_MAX + 1)
    with pytest.raises(TypeError, match="seed"):
        check_seed("seed", 1.5)


@pytest.mark.parametrize("call", [
    lambda: RandomFourierFeatures(3, 4, seed=-1),                     # torch wrapped -1 around to 2**64 - 1
    lambda: fit_online(LinearChain(), [], num_features=4, seed=-1),
    lambda: structured_perceptron([(None, [0])], lambda x, w: [0], num_features=2, seed=-1),
    lambda: random_grid_dataset(1, seed=-1),
])
def test_a_negative_seed_is_refused_by_name(call):
    with pytest.raises(ValueError, match=r"^seed must be an int in \[0, "):
        call()


def test_the_largest_seed_is_accepted():
    a = RandomFourierFeatures(3, 4, seed=SEED_MAX).weight
    assert torch.equal(a, RandomFourierFeatures(3, 4, seed=SEED_MAX).weight)


def test_demo_and_ocr_seeds_are_checked():
    from betheproj.demo import migration_instance, tagging_instance
    from betheproj.experiments.ocr import OCRConfig, median_bandwidth

    for call in (lambda: migration_instance(seed=-1), lambda: tagging_instance(seed=-1),
                 lambda: median_bandwidth(torch.zeros(1, 2, 3), torch.tensor([2]), seed=-1),
                 lambda: OCRConfig(seed=SEED_MAX + 1)):
        with pytest.raises(ValueError, match=r"^seed must be an int in \[0, 2\*\*63 - 1\]"):
            call()


@pytest.mark.parametrize("kwargs, message", [
    ({"steps": 0}, "steps must be an int >= 1"),               # was an IndexError
    ({"grid": 0}, "grid must be an int >= 1"),
    ({"population": 0.5}, "population must be a finite number >= 1"),   # was a RuntimeError of multinomial
    ({"population": float("nan")}, "population must be"),
    ({"population": 500.7}, "population must be a whole number"),   # sampled 500, scaled by 500.7
    ({"rate": -1.0}, "rate must be a finite number > 0"),
    ({"dtype": torch.int64}, "dtype must be torch.float32 or torch.float64"),
])
def test_demo_migration_instance_checks_its_arguments(kwargs, message):
    from betheproj.demo import migration_instance

    with pytest.raises((ValueError, TypeError), match=message):
        migration_instance(**kwargs)


@pytest.mark.parametrize("kwargs, message", [({"length": 0}, "length must be an int >= 1"),
                                             ({"labels": 0}, "labels must be an int >= 1"),
                                             ({"batch": 2.5}, "batch must be an int")])
def test_demo_tagging_instance_checks_its_arguments(kwargs, message):
    from betheproj.demo import tagging_instance

    with pytest.raises((ValueError, TypeError), match=message):
        tagging_instance(**kwargs)


def test_iteration_axes_take_numpy_and_tensor_ints_as_python_ints():
    """test_iters=list(np.arange(...)) (NumPy ints) was refused as not "strictly increasing positive iteration
    counts", though every other count of the configs takes NumPy ints."""
    from betheproj._checks import check_increasing_counts

    counts = check_increasing_counts("test_iters", [np.int64(1), torch.tensor(5), 40])
    assert counts == (1, 5, 40) and all(type(t) is int for t in counts)
    assert check_increasing_counts("test_iters", list(np.arange(1, 4))) == (1, 2, 3)
    for bad in ([], (3, 3), [0, 1], [1, 2.0], [True, 2], [np.bool_(True), 2], np.arange(1, 4), "12", [1, None]):
        with pytest.raises(ValueError, match="test_iters must be strictly increasing positive iteration counts"):
            check_increasing_counts("test_iters", bad)


def test_is_bio_label_is_the_one_check_of_the_reader_the_index_and_the_decoder():
    from betheproj._checks import is_bio_label
    from betheproj.inference.segments import BIOFields

    for good in ("O", "B-title", "I-authors/person/person-last", "B-a-b"):
        assert is_bio_label(good)
    for bad in ("", "o", "B-", "I", "B", "X-title", "B_title", " O", None, 3, b"O"):
        assert not is_bio_label(bad)
        with pytest.raises(ValueError, match="is not a BIO label"):
            BIOFields.from_labels(["O", "B-title", bad])
