"""The errors fanfs reports to a user: each carries one line that says what happened and what to do.

The command line prints ``fanfs: error: <message>`` for any of them and exits 1.  They import nothing,
so every layer can raise them and the command line can catch them before anything heavy is loaded.
"""

from __future__ import annotations

import errno
import sys


class FanfsError(Exception):
    """Something fanfs cannot do as asked; the message is one line for the user."""

    said_elsewhere = False
    """True where another process of the same job prints this very message (a job's rank 0): this one
    only exits 1, so the user reads the line once."""


class StoreError(FanfsError):
    """A store that cannot be used as asked (missing, foreign, corrupt, incomplete)."""


class NotHeld(StoreError):
    """A shard source does not hold these bytes by design (another node does): not a fault, not logged."""


class DataError(OSError):
    """No good copy of some bytes could be had: the read fails with EIO (the reason is logged once)."""

    def __init__(self, message: str) -> None:
        super().__init__(errno.EIO, message)


class UsageError(FanfsError, ValueError):
    """A bad option value or combination (the command line maps it to exit status 1)."""


class WouldWait(Exception):
    """Bytes asked for without waiting are not in memory: reading them would wait on a disk (or a peer).  Not a
    fault: the serving loop hands the read to a thread that may wait (:mod:`fanfs.store.resident`)."""


def shadowing_folder() -> str | None:
    """Why ``import fanfs`` found a directory named fanfs (a checkout, a data folder beside a script, a clone in the
    current directory) before the installed package, or None if it did not: the modules of fanfs that an editable
    install still finds would fail on names of the package, with a traceback that names none of this."""
    package = sys.modules.get("fanfs")
    if package is None or getattr(package, "__file__", None) is not None:
        return None
    where = ", ".join(dict.fromkeys(getattr(package, "__path__", None) or ["?"]))
    return (f"the directory {where} shadows the installed fanfs package ('import fanfs' finds a folder named fanfs "
            "there first: beside the script, or in the current directory): rename that folder, or run from another "
            "directory")


def refuse_a_shadowed_package() -> None:
    """Raise an ImportError that says :func:`shadowing_folder`'s line.  Run first by the modules a program imports from
    outside (the fsspec entry point, :mod:`fanfs.train`); the command line prints the same line as its error."""
    problem = shadowing_folder()
    if problem is not None:
        raise ImportError(f"fanfs: {problem}")
