"""Pictures of migration: counts on the grid with the mean move out of each cell."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import Tensor

from .._checks import check_count
from .._files import save_figure
from .model import TransitionModel

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.image import AxesImage

__all__ = ["plot_flows"]


def _panel(ax: Axes, model: TransitionModel, counts: Tensor, flows: Tensor | None, vmax: float) -> AxesImage:
    g = model.grid
    image = ax.imshow(counts.reshape(g, g).cpu().numpy(), origin="lower", cmap="Blues", vmin=0, vmax=vmax)
    if flows is not None:
        out = flows.sum(-1)
        move = (flows[..., None] * model.displacement).sum(1) / out.clamp_min(1e-12)[:, None]   # [L, 2]
        keep = (out > 0.002 * out.sum()).cpu().numpy()
        xy, uv = model.xy.cpu().numpy(), move.detach().cpu().numpy()
        ax.quiver(xy[keep, 1], xy[keep, 0], uv[keep, 1], uv[keep, 0], angles="xy", scale_units="xy", scale=1,
                  color="crimson", width=0.006 if g <= 10 else 0.003)
    ax.set_xticks([])
    ax.set_yticks([])
    return image


def _check_shapes(counts_name: str, flows_name: str, counts: object, flows: object, cells: int) -> None:
    """Counts [T, L] and flows [T-1, L, L] of one season on the model's ``L = cells`` cells."""
    if not isinstance(counts, Tensor):
        raise TypeError(f"{counts_name} must be a tensor, got {type(counts).__name__}")
    if not isinstance(flows, Tensor):
        raise TypeError(f"{flows_name} must be a tensor, got {type(flows).__name__}")
    if counts.dim() != 2 or counts.shape[1] != cells or counts.shape[0] < 1:
        raise ValueError(f"{counts_name} must have shape [T, L] (one season, L = {cells} cells of the model's grid), "
                         f"got {tuple(counts.shape)}")
    expected = (counts.shape[0] - 1, cells, cells)
    if tuple(flows.shape) != expected:
        raise ValueError(f"{flows_name} must have shape [T-1, L, L]={expected} (one season), got {tuple(flows.shape)}")


def plot_flows(model: TransitionModel, counts: Tensor, flows: Tensor, path: str, truth: tuple[Tensor, Tensor] | None
               = None, panels: int = 5) -> None:
    """Counts [T, L] at ``panels`` evenly spaced steps with the mean move out of each cell (arrows, from the
    flows [T-1, L, L]); with ``truth = (counts, flows)`` a first row shows the true ones."""
    panels = check_count("panels", panels)
    if not isinstance(model, TransitionModel):
        raise TypeError(f"model must be a TransitionModel, got {type(model).__name__}")
    _check_shapes("counts", "flows", counts, flows, model.cells)
    if truth is not None:
        if not isinstance(truth, tuple | list) or len(truth) != 2:
            raise TypeError("truth must be a pair (counts [T, L], flows [T-1, L, L])")
        _check_shapes("truth[0]", "truth[1]", truth[0], truth[1], model.cells)
        if truth[0].shape[0] != counts.shape[0]:         # the panels show the same steps of both
            raise ValueError(f"truth must cover the counts' {counts.shape[0]} steps, got {truth[0].shape[0]}")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = counts.shape[0]
    panels = min(panels, steps)
    chosen = sorted({round(i * (steps - 1) / max(panels - 1, 1)) for i in range(panels)})
    rows = [("inferred (MAP)", counts, flows)]
    if truth is not None:
        rows.insert(0, ("true", truth[0], truth[1]))
    vmax = float(max(r[1].max() for r in rows))
    fig, axes = plt.subplots(len(rows), len(chosen), figsize=(2.4 * len(chosen) + 1, 2.5 * len(rows)),
                             squeeze=False)
    try:                                         # closed even when the drawing or the writing fails
        for r, (name, c, f) in enumerate(rows):
            for k, t in enumerate(chosen):
                image = _panel(axes[r, k], model, c[t], f[t] if t < steps - 1 else None, vmax)
                if r == 0:
                    axes[r, k].set_title(f"t = {t + 1}")
            axes[r, 0].set_ylabel(name)
        fig.colorbar(image, ax=axes, shrink=0.8, label="individuals per cell")
        fig.suptitle("Migration: counts per cell and mean move out of each cell (north is up)")
        save_figure(fig, path, 110)
    finally:
        plt.close(fig)
