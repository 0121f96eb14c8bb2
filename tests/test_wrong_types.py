"""Every public function, and every method of the main classes, called with arguments of the wrong kind raises a
``TypeError`` or ``ValueError`` (or an ``OSError`` for a path), never an ``AttributeError``, ``IndexError`` or
``RuntimeError`` from deep inside.  An energy's ``value`` and ``grad`` are left out: they trust marginals that its
``validate`` accepted (the solvers call it once), so they stay free of checks in the solvers' inner loop."""

from __future__ import annotations

import importlib
import inspect
import itertools
import pkgutil
import warnings

import torch

import betheproj as bp
from betheproj.parsing import DependencyParser

MODULES = sorted(m.name for m in pkgutil.walk_packages(bp.__path__, "betheproj.")
                 if not m.name.endswith((".__main__", ".cli")) and "._" not in m.name)
EXPECTED = (TypeError, ValueError, NotImplementedError, OSError)
TRUSTING = {"value", "grad", "total_grad", "pieces", "remainder", "measurements"}   # energies' inner-loop methods


def _wrong_values() -> list[object]:
    return [None, "x", -1, torch.zeros(2, 3), torch.zeros(2, 3, 4, dtype=torch.float64), [1, 2]]


def _required(fn: object) -> int | None:
    """The number of required positional parameters of ``fn``, ``None`` where it has no signature."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    return sum(p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
               for p in sig.parameters.values())


def _offences(name: str, fn: object, values: list[object], most: int) -> list[str]:
    k = _required(fn)
    if k is None or k > most:
        return []
    out = []
    for args in itertools.product(values, repeat=k):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                fn(*args)
        except EXPECTED:
            pass
        except Exception as err:  # noqa: BLE001 - what the test looks for
            kinds = ", ".join(type(a).__name__ for a in args)
            out.append(f"{name}({kinds}): {type(err).__name__}: {str(err)[:100]}")
    return out


def test_public_functions_name_a_wrong_argument(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)                     # a function that writes to the path "x" writes here
    seen: set[int] = set()
    offences: list[str] = []
    for module in MODULES:
        try:
            mod = importlib.import_module(module)
        except ImportError:                         # an optional dependency (CVXPY, matplotlib) not installed
            continue
        for name in getattr(mod, "__all__", ()):
            obj = getattr(mod, name)
            if not callable(obj) or id(obj) in seen or name == "main":
                continue
            seen.add(id(obj))
            offences += _offences(f"{module}.{name}", obj, _wrong_values(), 3)
    assert len(seen) > 100
    assert not offences, "\n".join(offences)


def _public_classes() -> list[type]:
    out: dict[type, None] = {}
    for module in MODULES:
        try:
            mod = importlib.import_module(module)
        except ImportError:
            continue
        for name in getattr(mod, "__all__", ()):
            obj = getattr(mod, name)
            if inspect.isclass(obj) and not issubclass(obj, BaseException):
                out[obj] = None
    return list(out)


def _instances() -> list[object]:
    """The classes that need particular arguments, then every other public class that one of a few guesses at its
    arguments builds."""
    d = torch.float64
    made = [bp.Tree([-1, 0, 0]), bp.energies.MeanField(torch.tensor([[0, 1]]), torch.ones(1, 4, 4, dtype=d)),
            bp.learning.NonLocalCRF(bp.learning.LinearChainCRF(3, 4)), DependencyParser(bits=8)]
    guesses = [(), (3,), (3, 4), (torch.rand(3, 4, dtype=d),), (torch.rand(3, 4, dtype=d), torch.ones(3, dtype=d))]
    for cls in _public_classes():
        if any(type(obj) is cls for obj in made):
            continue
        for args in guesses:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    made.append(cls(*args))
                break
            except Exception:  # noqa: BLE001, S112 - a guess that does not fit this class
                continue
    return made


def test_methods_name_a_wrong_argument(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    d = torch.float64
    pot = bp.ChainPotentials(torch.zeros(2, 3, 4, dtype=d), torch.zeros(4, 4, dtype=d), torch.tensor([3, 2]))
    values = _wrong_values() + [pot, bp.LinearChain().marginals(pot)]
    offences: list[str] = []
    called = 0
    for obj in _instances():
        module_methods = set(dir(torch.nn.Module)) if isinstance(obj, torch.nn.Module) else set()
        for name, method in inspect.getmembers(obj, predicate=callable):
            if name.startswith("_") or name in TRUSTING or (name in module_methods and name != "forward"):
                continue
            offences += _offences(f"{type(obj).__name__}.{name}", method, values, 2)
            called += 1
    assert called > 80
    assert not offences, "\n".join(offences)

