"""Raising a mount's presentation while a job trains: start coarse, refine when the loss stops improving.

The idea of *Reducing Data Motion to Accelerate the Training of DNNs* (Zhuang, Malossi, Casas, 2020):
early in training the data need not be precise, so read fewer bytes until precision is needed.  With
fanfs that is a mount setting (``precision`` of float records, ``fidelity`` of JPEG records) that a
:class:`PlateauSchedule` raises level by level when the training loss plateaus.

The schedule knows nothing of mounts: it calls ``apply(level)`` whenever the level changes, so a test
can pass a list's ``append`` and a job passes :func:`fanfs.serve.control.presenter` (which sends the
setting to the mount's control socket).  Files opened after a change get the new level, so an
unmodified ``Dataset`` and its ``DataLoader`` workers (persistent ones too) need nothing::

    schedule = PlateauSchedule([8, 16, 24, FULL], patience=2, min_delta=1e-3,
                               apply=presenter("/tmp/models", "precision"))
    schedule.start()                      # the mount presents precision 8
    for epoch in range(epochs):
        loss = train_one_epoch(loader)
        schedule.step(loss)               # 16, 24, then full as the loss stops improving
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import UsageError


class PlateauSchedule:
    """Levels in increasing order; move to the next after ``patience`` steps without a loss improvement.

    An improvement is a loss below the best seen at this level by more than ``min_delta`` (relative to
    the best's magnitude when ``relative``).  After a raise the best restarts from the next loss: a new
    level is judged on its own.  ``history`` lists (step, level) of every change.
    """

    def __init__(self, levels: Sequence[int], patience: int = 2, min_delta: float = 0.0, relative: bool = False,
                 apply: Callable[[int], Any] | None = None, rank: Callable[[int], Any] = int) -> None:
        """``rank``: the setting's order of its values (:attr:`fanfs.records.Setting.rank`; fidelity 1/4 < 1/2 < 1)."""
        if not levels or any(rank(b) <= rank(a) for a, b in zip(levels, levels[1:])):
            raise UsageError(f"schedule levels must be increasing, got {list(levels)!r}")
        if patience < 1 or not min_delta >= 0:
            raise UsageError("patience must be at least 1 and min_delta at least 0")
        self.levels = list(levels)
        self.patience, self.min_delta, self.relative = patience, min_delta, relative
        self.apply = apply
        self.position = 0
        self.best = math.inf
        self.waited = 0
        self.steps = 0
        self.history: list[tuple[int, int]] = []

    @property
    def level(self) -> int:
        return self.levels[self.position]

    @property
    def done(self) -> bool:
        """At the last level: further steps change nothing."""
        return self.position == len(self.levels) - 1

    def start(self) -> int:
        """Apply the first level (before the first epoch reads anything); returns it."""
        self._set(0)
        return self.level

    def step(self, loss: float) -> int | None:
        """Record one loss (an epoch's, or a window's mean); returns the new level if it changed, else None."""
        if not math.isfinite(loss):
            raise ValueError(f"loss {loss!r} is not a finite number")
        self.steps += 1
        margin = self.min_delta * abs(self.best) if self.relative and math.isfinite(self.best) else self.min_delta
        if loss < self.best - margin:
            self.best, self.waited = loss, 0
            return None
        self.waited += 1
        if self.waited < self.patience or self.done:
            return None
        self._set(self.position + 1)
        return self.level

    def _set(self, position: int) -> None:
        self.position, self.best, self.waited = position, math.inf, 0
        self.history.append((self.steps, self.level))
        if self.apply is not None:
            self.apply(self.level)

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint needs to resume the schedule where it was."""
        return {"position": self.position, "best": self.best, "waited": self.waited, "steps": self.steps,
                "history": list(self.history)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict` and apply the level it had reached."""
        self.position, self.best, self.waited, self.steps = (state["position"], state["best"], state["waited"],
                                                             state["steps"])
        self.history = [tuple(h) for h in state["history"]]  # type: ignore[misc]
        if self.apply is not None:
            self.apply(self.level)
