"""One progress display for long work: a bar on a terminal, a line at least every 10 s in a log.

A pack, stage, verify or fidelity measurement in a batch job writes to a file, not a terminal: there it says
where it is (done/total, the files too when counted, rate, ETA, elapsed) once every 10 s,
so a job's log shows it is alive and when it will end; a command done within that time prints nothing more
(``FANFS_PROGRESS_SECONDS`` sets another period).
"""

from __future__ import annotations

import os
import sys
import time
from types import TracebackType

from tqdm import tqdm

from ..errors import UsageError
from .units import human_rate, human_size, parse_seconds

tqdm.monitor_interval = 0  # no monitor thread: pack forks worker processes
LOG_EVERY = 10.0
"""Seconds between two progress lines in a log, unless ``FANFS_PROGRESS_SECONDS`` says otherwise (0: a line at every
update)."""
VARIABLE = "FANFS_PROGRESS_SECONDS"


def log_every() -> float:
    """Seconds between two progress lines in a log: ``$FANFS_PROGRESS_SECONDS``, else :data:`LOG_EVERY`."""
    text = os.environ.get(VARIABLE, "").strip()
    try:
        return parse_seconds(text, zero=True) if text else LOG_EVERY
    except ValueError as err:
        raise UsageError(f"{VARIABLE}: {err}") from None


def human_duration(seconds: float) -> str:
    """``75`` -> ``"1m15s"``."""
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds // 60 % 60:02d}m"


class Progress:
    """``with Progress(total, "pack", unit="B") as bar: bar.update_to(done, count=files)``.

    ``total`` 0 means unknown (a pipe): no ETA.  ``count`` is a second quantity (files) shown beside ``done``,
    out of ``count_total`` when that is known.
    """

    def __init__(self, total: int, label: str, *, enabled: bool = True, unit: str = "it",
                 count_total: int | None = None, stream: object = None) -> None:
        self._stream = stream or sys.stderr
        tty = enabled and getattr(self._stream, "isatty", lambda: False)()
        self._log = enabled and not tty
        self._every = log_every() if self._log else LOG_EVERY
        self.total, self.label, self.unit, self.count_total = total, label, unit, count_total
        self._done = self._count = 0
        self._started = self._last = time.monotonic()
        self._bar = tqdm(total=total or None, desc=label, unit=unit, unit_scale=True,
                         unit_divisor=1024 if unit == "B" else 1000, disable=not tty, leave=False,
                         dynamic_ncols=True, file=self._stream)

    def update_to(self, done: int, count: int | None = None) -> None:
        self._bar.update(done - self._bar.n)
        self._done = done
        if count is not None:
            self._count = count
            if not self._bar.disable:
                self._bar.set_postfix_str(f"{count:,} files", refresh=False)
        if self._log and time.monotonic() - self._last >= self._every:
            self._last = time.monotonic()
            print(f"fanfs {self.label}: {self.line()}", file=self._stream, flush=True)

    def line(self) -> str:
        """Where the work is: ``1,234/10,000 files, 1.2 GiB of 9.8 GiB (12%), 45.3 MiB/s, ETA 3m12s, 27s elapsed``."""
        elapsed = max(time.monotonic() - self._started, 1e-9)
        size = human_size if self.unit == "B" else (lambda n: f"{int(n):,}")
        parts = []
        if self._count or self.count_total:
            parts.append(f"{self._count:,}/{self.count_total:,} files" if self.count_total else f"{self._count:,} files")
        done = size(self._done)
        if self.total:
            done += f" of {size(self.total)} ({100 * self._done / self.total:.0f}%)"
        parts.append(done)
        rate = self._done / elapsed
        parts.append(human_rate(rate) if self.unit == "B" else f"{rate:,.1f} {self.unit}/s")
        if self.total and self._done and self._done < self.total:
            parts.append(f"ETA {human_duration((self.total - self._done) / rate)}")
        parts.append(f"{human_duration(elapsed)} elapsed")
        return ", ".join(parts)

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        self._bar.close()
