"""matplotlib for ``--plot``: an extra (``fanfs[plots]``), never needed to pack, mount or serve."""

from __future__ import annotations

from types import ModuleType

from ..errors import UsageError

EXTRA = "pip install 'matplotlib>=3.7' (fanfs's plots extra; from its checkout: .venv/bin/pip install -e '.[plots]')"
"""How to get it: fanfs is installed from its checkout, not from a package index that an extra's name would be
looked up in."""


def pyplot() -> ModuleType:
    """``matplotlib.pyplot``, drawing to files; one line naming the extra if matplotlib is not installed.

    Called before a measurement starts too, so that a missing matplotlib is said at once, not after it.
    """
    try:
        import matplotlib
    except ImportError:
        raise UsageError(f"--plot needs matplotlib, which is not installed: {EXTRA}") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt
