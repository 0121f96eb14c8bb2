"""A headless matplotlib figure with one axes, written to a PNG on exit (the experiments' figures)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.axes import Axes


@contextmanager
def figure(path: str, size: tuple[float, float]) -> Iterator[Axes]:
    """Yield the axes of a new ``size`` figure (Agg backend); on exit lay it out, save it to ``path`` at 120 dpi and
    close it."""
    import matplotlib

    from .._files import save_figure

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=size)
    try:
        yield ax
        fig.tight_layout()
        save_figure(fig, path, 120)
    finally:
        plt.close(fig)
