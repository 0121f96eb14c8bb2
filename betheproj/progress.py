"""Progress bars: a tqdm bar when one is asked for and tqdm is installed, else a bar that does nothing, so that
loops call ``update`` / ``set_postfix`` / ``close`` without checking."""

from __future__ import annotations

from typing import Any

from ._checks import check_bool, check_int, check_type

__all__ = ["progress_bar", "close_bars"]


class _Silent:
    """The do-nothing bar."""

    def update(self, n: float = 1) -> None:
        pass

    def set_postfix(self, *args: Any, **kwargs: Any) -> None:
        pass

    def close(self) -> None:
        pass


def progress_bar(total: int, enabled: bool, desc: str, leave: bool = False) -> Any:
    """A tqdm bar over ``total`` steps labelled ``desc`` if ``enabled`` (and tqdm is importable: progress bars are
    a nicety, not a dependency), else a silent bar with the same ``update``/``set_postfix``/``close``.
    ``enabled`` is named ``progress`` in errors: the argument of every caller that passes it on."""
    enabled = check_bool("progress", enabled)
    total = check_int("total", total, 0)
    check_type("desc", desc, str)
    if enabled:
        try:
            from tqdm.auto import tqdm
        except ImportError:
            pass
        else:
            return tqdm(total=total, desc=desc, leave=leave, dynamic_ncols=True)
    return _Silent()


def close_bars() -> None:
    """Close every open tqdm bar (each clears its line), so that a message written next (an error, "interrupted")
    starts a line of its own instead of following a bar's."""
    try:
        from tqdm import tqdm
    except ImportError:
        return
    for bar in list(getattr(tqdm, "_instances", ())):
        bar.close()
