"""A recording stand-in for a module's helper, for tests that an expensive pass is skipped (no timing involved)."""

from types import ModuleType


def record_shapes(monkeypatch, module: ModuleType, name: str) -> list[tuple[int, ...]]:
    """Replace ``module.name`` for the test by a wrapper that calls it and records the shape of its first argument;
    returns the list the shapes go to."""
    shapes: list[tuple[int, ...]] = []
    original = getattr(module, name)

    def recorded(*args, **kwargs):
        shapes.append(tuple(args[0].shape))
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, recorded)
    return shapes
