import os

import pytest
import torch


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture
def accelerator() -> torch.device:
    """The device the CUDA agreement tests run on: CUDA where present, else the test skips (as in CI).

    ``BETHEPROJ_TEST_DEVICE=cpu`` runs them on the CPU instead, which checks the tests themselves on a machine
    without a GPU (the device comparisons then hold trivially).
    """
    name = os.environ.get("BETHEPROJ_TEST_DEVICE", "cuda")
    if name.startswith("cuda") and not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    return torch.device(name)
