"""One progress display for long work: a tqdm bar on a terminal, silence elsewhere (logs, CI, tests)."""

from __future__ import annotations

import sys
from types import TracebackType

from tqdm import tqdm

tqdm.monitor_interval = 0  # no monitor thread: pack forks worker processes


class Progress:
    """``with Progress(total, "pack", unit="B") as bar: bar.update_to(done)``."""

    def __init__(self, total: int, label: str, *, enabled: bool = True, unit: str = "it") -> None:
        show = enabled and sys.stderr.isatty()
        self._bar = tqdm(total=total, desc=label, unit=unit, unit_scale=True, unit_divisor=1024 if unit == "B" else 1000,
                         disable=not show, leave=False, dynamic_ncols=True)

    def update_to(self, done: int) -> None:
        self._bar.update(done - self._bar.n)

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        self._bar.close()
