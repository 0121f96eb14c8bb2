"""Migration on a grid: a log-linear transition model and a simulator of synthetic CGM instances."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn

from .._checks import check_count, check_float_dtype, check_int, check_nonnegative, check_positive, check_real
from ..oracles import ChainPotentials

__all__ = ["TransitionModel", "MigrationInstance", "default_model", "simulate"]

_POISSON_LAM_MAX = np.iinfo(np.int64).max - 10 * np.sqrt(np.iinfo(np.int64).max)   # numpy's Poisson sampler's limit
_SEED_MAX = 2 ** 63 - 1                      # torch's seeds; numpy's int64 counts


class TransitionModel(nn.Module):
    """Individuals move on a ``grid x grid`` map for ``steps`` time steps (Sheldon et al., 2013, section 6):

    ``log P_t(j | i) = distance * (-||x_j - x_i||^2) + drift * <x_j - x_i, u_t> + attraction_j - log Z_t(i)``,
    ``log P_1(i) = log softmax(initial)_i``,

    with ``x`` the cell's (row, column) in cell units and ``u_t`` the seasonal drift direction at step ``t``,
    turning from north (+row) through east to south over the season.  As a chain MRF over the ``L = grid^2``
    cells: node potentials ``log P_1`` at ``t = 1`` (zero after), edge potentials ``log P_t``; log Z = 0.
    """

    # buffers: cell coordinates [L, 2], ``-||x_j - x_i||^2`` [L, L], ``x_j - x_i`` [L, L, 2], ``u_t`` [T-1, 2]
    xy: Tensor
    neg_sq_distance: Tensor
    displacement: Tensor
    directions: Tensor

    def __init__(self, grid: int, steps: int, distance: float = 1.0, drift: float = 1.5,
                 attraction: Tensor | None = None, initial: Tensor | None = None,
                 dtype: torch.dtype = torch.float64):
        super().__init__()
        grid, steps = check_count("grid", grid), check_count("steps", steps, 2)
        dtype = check_float_dtype("dtype", dtype)
        cells = grid * grid
        self.grid, self.steps = grid, steps
        # the model lives where the tensors it is given live (the CPU if none), buffers included
        devices = {t.device for t in (attraction, initial) if isinstance(t, Tensor)}
        if len(devices) > 1:
            raise ValueError(f"attraction and initial must be on one device, got {sorted(map(str, devices))}")
        device = devices.pop() if devices else torch.device("cpu")
        self.distance = nn.Parameter(self._scalar("distance", distance, dtype, device))
        self.drift = nn.Parameter(self._scalar("drift", drift, dtype, device))
        self.attraction = nn.Parameter(self._cells("attraction", attraction, cells, dtype, device))
        self.initial = nn.Parameter(self._cells("initial", initial, cells, dtype, device))
        rows, cols = torch.meshgrid(torch.arange(grid, device=device), torch.arange(grid, device=device),
                                    indexing="ij")
        xy = torch.stack([rows.flatten(), cols.flatten()], -1).to(dtype)
        disp = xy[None, :, :] - xy[:, None, :]                                 # [L, L, 2]: x_j - x_i
        angle = math.pi * torch.arange(steps - 1, dtype=dtype, device=device) / max(steps - 2, 1)
        self.register_buffer("xy", xy)
        self.register_buffer("neg_sq_distance", -(disp ** 2).sum(-1))
        self.register_buffer("displacement", disp)
        self.register_buffer("directions", torch.stack([torch.cos(angle), torch.sin(angle)], -1))   # [T-1, 2]
        with torch.no_grad():
            if bool(torch.isnan(self.log_transitions()).any()):     # a score of +inf (or inf - inf): overflow
                raise ValueError(f"distance, drift and attraction overflow the transition scores in {dtype} "
                                 f"(distance {distance!r}, drift {drift!r}): use smaller magnitudes")

    @staticmethod
    def _scalar(name: str, value: float, dtype: torch.dtype, device: torch.device) -> Tensor:
        """``value`` as a 0-d tensor of ``dtype``, finite there too (1e39 is finite in float64, not float32)."""
        out = torch.tensor(check_real(name, value), dtype=dtype, device=device)
        if not bool(torch.isfinite(out)):
            raise ValueError(f"{name} must be finite in {dtype}, got {value!r}")
        return out

    @staticmethod
    def _cells(name: str, value: Tensor | None, cells: int, dtype: torch.dtype, device: torch.device) -> Tensor:
        if value is None:
            return torch.zeros(cells, dtype=dtype, device=device)
        if not isinstance(value, Tensor):
            try:
                value = torch.as_tensor(value)
            except (TypeError, ValueError, RuntimeError):
                raise TypeError(f"{name} must be a tensor or array of one real value per cell, got "
                                f"{type(value).__name__}") from None
        if value.dtype == torch.bool or value.is_complex():
            raise TypeError(f"{name} must hold real numbers, got dtype {value.dtype}")
        value = value.to(dtype=dtype, device=device)
        if value.shape != (cells,):
            raise ValueError(f"{name} must have one value per cell, shape ({cells},), got {tuple(value.shape)}")
        if not bool(torch.isfinite(value).all()):
            raise ValueError(f"{name} must be finite")
        return value.clone()

    @property
    def cells(self) -> int:
        return self.grid * self.grid

    def log_initial(self) -> Tensor:
        return torch.log_softmax(self.initial, -1)

    def log_transitions(self) -> Tensor:
        """``log P_t(j | i)`` [T-1, L, L], each row normalised."""
        drift = torch.einsum("ijk,tk->tij", self.displacement, self.directions)
        scores = self.distance * self.neg_sq_distance + self.drift * drift + self.attraction
        return torch.log_softmax(scores, -1)

    def potentials(self, batch: int = 1) -> ChainPotentials:
        """The chain MRF of ``batch`` independent populations (seasons) following this model."""
        batch = check_count("batch", batch)
        node = torch.zeros(batch, self.steps, self.cells, dtype=self.initial.dtype, device=self.initial.device)
        node[:, 0] = self.log_initial()
        edge = self.log_transitions()[None].expand(batch, -1, -1, -1)
        return ChainPotentials(node, edge)

    def centred(self) -> dict[str, Tensor]:
        """The identifiable parameters: ``distance``, ``drift``, and ``attraction`` / ``initial`` centred
        (the softmaxes do not see their means)."""
        with torch.no_grad():
            return {"distance": self.distance.clone(), "drift": self.drift.clone(),
                    "attraction": self.attraction - self.attraction.mean(),
                    "initial": self.initial - self.initial.mean()}


@dataclass
class MigrationInstance:
    """Synthetic data: ``potentials`` (the true chain MRF, [B, T, L]), the true ``counts`` [B, T, L] and
    ``flows`` [B, T-1, L, L] of ``population`` individuals per season, the ``observed`` counts
    ``~ Poisson(rate * counts)`` [B, T, L], and the ``model`` that generated them."""

    potentials: ChainPotentials
    counts: Tensor
    flows: Tensor
    observed: Tensor
    rate: float
    population: int
    model: TransitionModel


def default_model(grid: int, steps: int, seed: int = 0, dtype: torch.dtype = torch.float64) -> TransitionModel:
    """Short moves with a seasonal drift, random cell attractiveness, a population starting in the south."""
    grid, dtype = check_count("grid", grid), check_float_dtype("dtype", dtype)
    gen = torch.Generator().manual_seed(check_int("seed", seed, 0, _SEED_MAX))
    cells = grid * grid
    attraction = 0.5 * torch.randn(cells, generator=gen, dtype=dtype)
    rows = torch.arange(grid, dtype=dtype).repeat_interleave(grid)
    initial = -4.0 * rows / max(grid - 1, 1) + 0.5 * torch.randn(cells, generator=gen, dtype=dtype)
    return TransitionModel(grid, steps, 1.0, 1.5, attraction, initial, dtype)


@torch.no_grad()
def simulate(model: TransitionModel, population: int = 10_000, rate: float = 0.5, seasons: int = 1,
             noise: float = 0.0, seed: int = 0) -> MigrationInstance:
    """Draw ``seasons`` independent seasons of ``population`` paths from ``model`` (its transition
    log-potentials perturbed once by Gaussian ``noise``, the part no model of the family explains) and
    observe each cell's count with ``Poisson(rate * count)``."""
    if not isinstance(model, TransitionModel):
        raise TypeError(f"model must be a TransitionModel, got {type(model).__name__}")
    population = check_int("population", population, 1, _SEED_MAX)        # numpy's multinomial takes int64
    number = check_positive("rate", rate)
    if number * population > _POISSON_LAM_MAX:
        raise ValueError(f"rate * population must be at most {_POISSON_LAM_MAX:.3g} (numpy's Poisson sampler), "
                         f"got {rate!r} * {population!r}")
    rate = number
    seasons = check_count("seasons", seasons)
    noise = check_nonnegative("noise", noise)
    seed = check_int("seed", seed, 0, _SEED_MAX)
    rng = np.random.default_rng(seed)
    log_p = model.log_transitions()
    if noise > 0:
        gen = torch.Generator().manual_seed((seed + 1) % (_SEED_MAX + 1))
        shift = torch.randn(log_p.shape, generator=gen, dtype=log_p.dtype).to(log_p.device)   # the CPU's draw
        log_p = log_p + noise * shift
        if not bool(torch.isfinite(log_p).all()):
            raise ValueError(f"noise {noise!r} times the N(0, 1) draws overflows the model's {log_p.dtype} in the "
                             "transition log-potentials: use a smaller noise")
        log_p = torch.log_softmax(log_p, -1)
    init = model.log_initial().exp().cpu().numpy().astype(np.float64)
    trans = log_p.exp().cpu().numpy().astype(np.float64)
    trans /= trans.sum(-1, keepdims=True)
    t, cells = model.steps, model.cells
    counts = np.zeros((seasons, t, cells), dtype=np.int64)
    flows = np.zeros((seasons, t - 1, cells, cells), dtype=np.int64)
    for b in range(seasons):
        counts[b, 0] = rng.multinomial(population, init / init.sum())
        for s in range(t - 1):
            flows[b, s] = rng.multinomial(counts[b, s], trans[s])
            counts[b, s + 1] = flows[b, s].sum(0)
    observed = rng.poisson(rate * counts)
    dtype, device = model.initial.dtype, model.initial.device
    bits = round(-math.log2(torch.finfo(dtype).eps)) + 1   # every integer up to 2**bits is exact in dtype
    exact = 2 ** bits
    largest = max(population, int(observed.max(initial=0)))
    if largest > exact:
        remedy = "a smaller population" if largest == population else "a smaller population or rate"
        if dtype != torch.float64:
            remedy = f"a float64 model (exact up to 2**53) or {remedy}"
        raise ValueError(f"a {dtype} model holds counts exactly only up to 2**{bits} = "
                         f"{exact}, and this draw has a count of {largest} (population {population}); use "
                         f"{remedy}")
    node = torch.zeros(seasons, t, cells, dtype=dtype, device=device)
    node[:, 0] = model.log_initial()
    potentials = ChainPotentials(node, log_p.to(device)[None].expand(seasons, -1, -1, -1))
    as_tensor = lambda a: torch.from_numpy(a).to(device=device, dtype=dtype)  # noqa: E731
    return MigrationInstance(potentials, as_tensor(counts), as_tensor(flows), as_tensor(observed), float(rate),
                             population, model)
