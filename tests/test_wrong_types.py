"""Every public function, and every method of the main classes, called with arguments of the wrong kind raises a
``TypeError`` or ``ValueError`` (or an ``OSError`` for a path), never an ``AttributeError``, ``IndexError`` or
``RuntimeError`` from deep inside.  An energy's ``value`` and ``grad`` check only that they are given Marginals (a
test of its own below): they trust the shapes that its ``validate`` accepted (the solvers call it once), so they stay
free of shape checks in the solvers' inner loop."""

from __future__ import annotations

import importlib
import inspect
import itertools
import pkgutil
import warnings

import pytest
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


def _public() -> list[tuple[str, object]]:
    """``(module.name, object)`` of every name in a public module's ``__all__``, each object once."""
    out: dict[int, tuple[str, object]] = {}
    for module in MODULES:
        try:
            mod = importlib.import_module(module)
        except ImportError:                         # an optional dependency (CVXPY, matplotlib) not installed
            continue
        for name in getattr(mod, "__all__", ()):
            obj = getattr(mod, name)
            out.setdefault(id(obj), (f"{module}.{name}", obj))
    return list(out.values())


def test_public_functions_name_a_wrong_argument(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)                     # a function that writes to the path "x" writes here
    called = [(name, obj) for name, obj in _public() if callable(obj) and not name.endswith(".main")]
    offences = [o for name, obj in called for o in _offences(name, obj, _wrong_values(), 3)]
    assert len(called) > 100
    assert not offences, "\n".join(offences)


def _public_classes() -> list[type]:
    return [obj for _, obj in _public() if inspect.isclass(obj) and not issubclass(obj, BaseException)]


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


def test_energies_take_marginals_only():
    """Every energy's ``value``, ``grad`` and ``total_grad`` (a user's subclass's too) given something other than
    Marginals raise a TypeError that names it; before, most were an AttributeError on ``.node``."""

    class Mine(bp.energies.Energy):
        def value(self, marginals):
            return marginals.node.sum((1, 2))

    e, d = bp.energies, torch.float64
    one_hot = torch.eye(4, dtype=d)[:2]
    made = [e.Poisson(torch.ones(2, 3, 4, dtype=d)), e.FunctionEnergy(lambda m: m.node.sum((1, 2))),
            e.Precedence(one_hot[:1], one_hot[1:]), e.BigramExclusion(one_hot, one_hot, torch.tensor([[0, 1]])),
            e.SecondOrderArcs(torch.zeros(1, 3, 3, 3, dtype=d), None), Mine(), 2.0 * Mine(), Mine() + Mine()]
    energies = [obj for obj in _instances() if isinstance(obj, e.Energy) and type(obj) is not e.Energy] + made
    assert len(energies) >= 13
    for energy in energies:
        for name in ("value", "grad", "total_grad"):
            for wrong in _wrong_values():
                with pytest.raises(TypeError, match="marginals must be Marginals"):
                    getattr(energy, name)(wrong)



def _keyword_cases() -> list[tuple[str, object, dict]]:
    """(name, a call taking one keyword, the keywords to try): the main entry points with valid positional
    arguments, so that each keyword's own check is what a wrong value meets."""
    from betheproj.data.conllu import parse_conllu
    from betheproj.experiments.citations import CitationConfig
    from betheproj.experiments.ocr import OCRConfig
    from betheproj.learning import (
        ConstantPsi,
        LinearChainCRF,
        NonLocalCRF,
        fit_crf,
        fit_doubly_stochastic,
        fit_online,
        fit_variational_em,
    )

    d = torch.float64
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(4, 3, 5, dtype=d, generator=gen), torch.randint(0, 4, (4, 3), generator=gen)
    n = torch.tensor([3, 2, 3, 1])
    pot = bp.ChainPotentials(torch.randn(2, 3, 4, dtype=d, generator=gen), torch.randn(4, 4, dtype=d, generator=gen),
                             torch.tensor([3, 2]))
    energy = bp.energies.LinearMeasurements(torch.ones(2, 4, dtype=d))
    sentences = parse_conllu("1\tw1\tw1\tNOUN\t_\t_\t2\t_\t_\t_\n2\tw2\tw2\tVERB\t_\t_\t0\t_\t_\t_\n\n")

    def model() -> NonLocalCRF:
        return NonLocalCRF(LinearChainCRF(5, 4).double(),
                           lambda psi: bp.energies.LinearMeasurements(torch.ones(2, 4, dtype=d), psi=psi),
                           psi=ConstantPsi(torch.ones(1, dtype=d)))

    def trained() -> DependencyParser:
        parser = DependencyParser(bits=8)
        parser.fit(sentences, epochs=1)
        return parser

    fields = bp.inference.BIOFields.from_labels(["O", "B-a", "I-a", "B-b"])
    cases = [(f"solve[{m}]", lambda m=m, **k: bp.solve(bp.LinearChain(), pot, energy, **{"method": m, **k}), bp.solve)
             for m in ("md", "rda", "accelerated")]
    cases += [
        ("fit_crf", lambda **k: fit_crf(LinearChainCRF(5, 4).double(), x, y, n, **k), fit_crf),
        ("fit_doubly_stochastic", lambda **k: fit_doubly_stochastic(model(), x, y, n, **k), fit_doubly_stochastic),
        ("fit_variational_em", lambda **k: fit_variational_em(model(), x, y, n, **k), fit_variational_em),
        ("NonLocalCRF.predict", lambda **k: model().predict(x, n, **k), NonLocalCRF.predict),
        ("DependencyParser.fit", lambda **k: DependencyParser(bits=8).fit(sentences, **k), DependencyParser.fit),
        ("DependencyParser.parse", lambda **k: trained().parse(sentences, **k), DependencyParser.parse),
        ("fit_online", lambda **k: fit_online(bp.LinearChain(), [], num_features=4, **k), fit_online),
        ("decode_segments", lambda **k: bp.inference.decode_segments(pot, fields, **k), bp.inference.decode_segments),
        ("CitationConfig", lambda **k: CitationConfig(**k), CitationConfig),
        ("OCRConfig", lambda **k: OCRConfig(**k), OCRConfig),
    ]
    out = []
    for name, call, target in cases:
        keywords = [p.name for p in inspect.signature(target).parameters.values()
                    if p.default is not p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        out.append((name, call, keywords))
    return out


def test_keywords_name_a_wrong_value(tmp_path, monkeypatch):
    """Each keyword of the main entry points, given a value of the wrong kind or out of range, is a TypeError or
    ValueError (or is taken: 0 iterations, say); a solve that takes it still returns finite marginals."""
    monkeypatch.chdir(tmp_path)
    values = [None, "x", -1, 0, float("nan"), float("inf"), 1e308, True, torch.zeros(2), [1]]
    offences: list[str] = []
    tried = 0
    for name, call, keywords in _keyword_cases():
        for keyword in keywords:
            if name.startswith("solve") and keyword == "method":
                continue
            for value in values:
                tried += 1
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        out = call(**{keyword: value})
                except (TypeError, ValueError):
                    continue
                except Exception as err:  # noqa: BLE001 - what the test looks for
                    offences.append(f"{name}({keyword}={value!r}): {type(err).__name__}: {str(err)[:100]}")
                    continue
                if name.startswith("solve") and not bool(torch.isfinite(out.marginals.node).all()):
                    offences.append(f"{name}({keyword}={value!r}): non-finite marginals")
    assert tried > 500
    assert not offences, "\n".join(offences)
