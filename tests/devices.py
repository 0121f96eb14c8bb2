"""Shared by the CUDA agreement tests (``tests/*/test_cuda.py``): move inputs to a device, compare outputs."""

from __future__ import annotations

import pytest
import torch


def to_device(x, device):
    """``x`` (a tensor, or a tuple / list / dict of them, nested) on ``device``; anything else as it is."""
    if isinstance(x, torch.Tensor):
        return x.to(device)
    if isinstance(x, (tuple, list)):
        return type(x)(to_device(v, device) for v in x)
    if isinstance(x, dict):
        return {k: to_device(v, device) for k, v in x.items()}
    return x


def agree(cpu, dev, device: torch.device, atol: float = 1e-9, rtol: float = 1e-11, name: str = "out") -> None:
    """``dev`` (the accelerator's result) lies on ``device``'s type and equals the CPU's ``cpu``: floating tensors
    and Python floats to ``atol`` / ``rtol`` (their infinities and NaN at the same places, exactly), everything
    else exactly; dicts, tuples and lists entry by entry."""
    if isinstance(cpu, dict):
        assert isinstance(dev, dict) and cpu.keys() == dev.keys(), name
        for k in cpu:
            agree(cpu[k], dev[k], device, atol, rtol, f"{name}.{k}")
    elif isinstance(cpu, (tuple, list)):
        assert isinstance(dev, (tuple, list)) and len(cpu) == len(dev), name
        for i, (a, b) in enumerate(zip(cpu, dev, strict=True)):
            agree(a, b, device, atol, rtol, f"{name}[{i}]")
    elif isinstance(cpu, torch.Tensor):
        assert isinstance(dev, torch.Tensor), f"{name}: {type(dev).__name__}"
        assert dev.device.type == device.type, f"{name} is on {dev.device}"
        assert dev.dtype == cpu.dtype and dev.shape == cpu.shape, name
        dev, cpu = dev.detach().cpu(), cpu.detach()
        if cpu.is_floating_point():
            fin = torch.isfinite(cpu)
            assert torch.equal(fin, torch.isfinite(dev)), f"{name}: infinities or NaN at other places"
            assert torch.equal(cpu[~fin].nan_to_num(0.0), dev[~fin].nan_to_num(0.0)), name
            assert torch.allclose(cpu[fin], dev[fin], atol=atol, rtol=rtol), \
                f"{name}: max difference {(cpu[fin] - dev[fin]).abs().max().item():.3g}"
        else:
            assert torch.equal(cpu, dev), name
    elif isinstance(cpu, float):
        assert dev == pytest.approx(cpu, rel=rtol, abs=atol, nan_ok=True), f"{name}: {cpu} != {dev}"
    else:
        assert cpu == dev, f"{name}: {cpu} != {dev}"
