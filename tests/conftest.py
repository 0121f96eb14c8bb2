import os

import pytest
import torch

NO_CUDA = "no CUDA device"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--accelerator-only", action="store_true",
                     help="run only the tests that need a GPU (the `accelerator` fixture's, and those skipped "
                          f"with '{NO_CUDA}'): the 350 to run on a machine with CUDA")


def needs_accelerator(item: pytest.Item) -> bool:
    """Whether a test compares the CPU with a GPU: it takes ``accelerator`` or is skipped without CUDA."""
    if "accelerator" in getattr(item, "fixturenames", ()):
        return True
    return any(mark.kwargs.get("reason") == NO_CUDA for mark in item.iter_markers("skipif"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--accelerator-only"):
        kept = [item for item in items if needs_accelerator(item)]
        config.hook.pytest_deselected(items=[item for item in items if not needs_accelerator(item)])
        items[:] = kept


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
        pytest.skip(NO_CUDA)
    return torch.device(name)
