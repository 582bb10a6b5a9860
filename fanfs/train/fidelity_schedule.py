"""A fidelity schedule: start a job at a low fidelity and raise it when the training loss stops improving.

In the spirit of *Reducing Data Motion to Accelerate the Training of DNNs* (Zhuang, Malossi, Casas
2020): early epochs read fewer bytes of every image (or, from a store packed with ``--scales``, decode
fewer pixels: a schedule may start at the resolution tiers, ``["1/4", "1/2", 4, "full"]``).  It is :class:`fanfs.tune.plateau.PlateauSchedule`
(the same object that raises the precision of float records) applied to the mount's ``fidelity``; the
levels default to the fidelities at which the store's JPEG records present a quarter, half and three
quarters of their bytes, then full.  The training loop calls it once per epoch (or per window of steps)::

    schedule = fidelity_schedule("/tmp/imagenet", patience=2, min_delta=0.01, relative=True)
    schedule.start()                        # e.g. fidelity 4: a quarter of the bytes
    for epoch in range(epochs):
        schedule.step(train_one_epoch(loader))
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from ..errors import UsageError
from ..records import FULL, parse_level, setting
from ..serve.control import presenter
from ..tune.plateau import PlateauSchedule
from .mount import jpeg_records, mount_status

BYTE_STEPS = (0.25, 0.5, 0.75)
"""Default levels: the smallest fidelities presenting these shares of the full bytes."""
SAMPLE = 1000
"""JPEG records whose sizes the default levels are measured on (from the index: nothing is decoded)."""


def fidelity_levels(mountpoint: str | os.PathLike, fractions: Sequence[float] = BYTE_STEPS, sample: int = SAMPLE,
                    seed: int = 0) -> list[int]:
    """For each fraction, the smallest K whose presented bytes reach that share of full; then FULL.

    Over a seeded sample of the store's JPEG records, bytes summed (what an epoch moves).  A fraction
    that only full reaches adds no level; duplicates collapse.
    """
    if not fractions or any(not 0 < f < 1 for f in fractions) or list(fractions) != sorted(set(fractions)):
        raise UsageError(f"byte fractions must be increasing and in (0, 1), got {list(fractions)!r}")
    with jpeg_records(mountpoint) as (store, records):
        chosen = np.random.default_rng(seed).choice(records, size=min(sample, records.size), replace=False).tolist()
        full = sum(store.size_at(entry) for entry in chosen)
        top = int(store.index.layers[chosen].max())
        shares = [sum(store.size_at(entry, k) for entry in chosen) / full for k in range(1, top)]
    levels: list[int] = []
    for fraction in fractions:
        k = next((k for k, share in enumerate(shares, 1) if share >= fraction), FULL)
        if k != FULL and k not in levels:
            levels.append(k)
    return levels + [FULL]


def fidelity_schedule(mountpoint: str | os.PathLike, levels: Sequence[int | str] | None = None, *, patience: int = 2,
                      min_delta: float = 0.0, relative: bool = False) -> PlateauSchedule:
    """A :class:`PlateauSchedule` that sets the mount's fidelity; ``levels`` default to :func:`fidelity_levels`.

    ``levels`` are values of the fidelity setting, as ints or as written (``["1/4", "1/2", 4, "full"]``: from
    the resolution tiers to scans to the whole file).  ``start()`` sets the first level (before the first
    epoch reads anything); ``step(loss)`` raises it after ``patience`` steps without an improvement of more
    than ``min_delta``.
    """
    mount_status(mountpoint)  # a wrong path is one line now, not at the first switch
    chosen = fidelity_levels(mountpoint) if levels is None else [parse_level("fidelity", level) for level in levels]
    return PlateauSchedule(chosen, patience, min_delta, relative, apply=presenter(os.fspath(mountpoint), "fidelity"),
                           rank=setting("fidelity").rank)
