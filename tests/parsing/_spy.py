"""Spies shared by the parsing tests."""

from betheproj.parsing.features import ArcFeatures


def arcs_per_batch(monkeypatch) -> list[int]:
    """The number of arcs, ``sum n (n + 1)``, of every batch whose features :meth:`ArcFeatures.flat` extracts from
    now on, appended as they come."""
    arcs: list[int] = []
    flat = ArcFeatures.flat

    def spy(self, batch):
        arcs.append(sum(len(s) * (len(s) + 1) for s in batch))
        return flat(self, batch)

    monkeypatch.setattr(ArcFeatures, "flat", spy)
    return arcs
