"""A daemon's log: lines on stderr (a detached daemon's stderr is its log file, beside its control socket), and a
bound on its size.

Whatever the reads do, a log holds at most :data:`LOG_LIMIT` bytes: past that, one last line says it is full and
nothing more is written until the mount ends (``fanfs stats`` still counts reads and errors).  The store logs a
failing read once per cause, not once per file (:mod:`fanfs.store.reader`), so the bound is met only by a mount
with many different faults; it is there so that no fault, however many files it touches, fills a node's disk.
A detached daemon's log file is measured itself (its serving processes write to it too); any other stderr (a
job's node, a foreground mount) by what this process wrote to it.
"""

from __future__ import annotations

import fcntl
import logging
import os
import stat
import sys

from ..util.runtime import create_private
from ..util.units import human_size

LOG_LIMIT = 1 << 20
"""Bytes a log may hold, its last line included."""
LAST_LINE = 256
"""Bytes kept for the line that says the log is full."""


class _Bounded(logging.StreamHandler):
    """A handler that writes until its stream holds ``limit`` bytes (of this process's, or of the file's own size when
    ``measured``: the processes writing to it then take turns), then one last line saying so (a line that does not
    fit is cut), then nothing."""

    def __init__(self, limit: int, measured: bool) -> None:
        super().__init__(sys.stderr)
        self.limit = limit
        self._fd = sys.stderr.fileno() if measured and _regular(sys.stderr) else -1
        self._written = 0

    def _size(self) -> int:
        if self._fd >= 0:
            try:
                return os.fstat(self._fd).st_size
            except OSError:
                pass
        return self._written

    def emit(self, record: logging.LogRecord) -> None:
        try:
            if self._fd >= 0:  # one process at a time measures and writes (a record lock: per process, not inherited)
                fcntl.lockf(self._fd, fcntl.LOCK_EX)
            try:
                self._write(record)
            finally:
                if self._fd >= 0:
                    fcntl.lockf(self._fd, fcntl.LOCK_UN)
        except Exception:
            self.handleError(record)

    def _write(self, record: logging.LogRecord) -> None:
        room = self.limit - LAST_LINE - self._size()
        if room <= 0:
            return  # full: the last line was written
        line = self.format(record) + self.terminator
        if len(line.encode(errors="replace")) > room:  # the last line this log takes
            line = line.encode(errors="replace")[:room].decode(errors="ignore").rstrip("\n") + "\n" \
                + self.format(_full(record, self.limit)) + self.terminator
        self.stream.write(line)
        self.flush()
        self._written += len(line.encode(errors="replace"))


def _regular(stream: object) -> bool:
    try:
        return stat.S_ISREG(os.fstat(stream.fileno()).st_mode)  # type: ignore[attr-defined]
    except (OSError, ValueError, AttributeError):
        return False


def _full(record: logging.LogRecord, limit: int) -> logging.LogRecord:
    return logging.makeLogRecord({"name": record.name, "levelno": logging.WARNING, "levelname": "WARNING",
                                  "msg": f"this log reached {human_size(limit)}: nothing more is logged until the mount "
                                         "ends ('fanfs stats' counts its reads and errors)"})


class WarningCount(logging.Handler):
    """Counts log records of WARNING and above (a run without any removes its log)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1


def setup_logging(debug: bool, tag: str | None = None, *, own_file: bool = False) -> WarningCount:
    """Log to stderr, within :data:`LOG_LIMIT` bytes, lines tagged with ``tag`` (the caller's name for this process,
    e.g. a job's node) or else the pid.  ``own_file``: stderr is this daemon's own log file (:func:`detach`), shared by
    its serving processes: its size is what is bounded."""
    handler = _Bounded(LOG_LIMIT, own_file)
    tag = tag or str(os.getpid())
    handler.setFormatter(logging.Formatter(f"%(asctime)s fanfs[{tag}] %(levelname)s %(message)s"))
    warnings = WarningCount()
    root = logging.getLogger()
    root.handlers[:] = [handler, warnings]
    root.setLevel(logging.DEBUG if debug else logging.INFO)
    return warnings


def detach(logfile: str) -> None:
    """Stdin from /dev/null; stdout and stderr to a fresh log (the previous one kept as .1)."""
    if os.path.lexists(logfile):
        os.replace(logfile, logfile + ".1")
    devnull = os.open(os.devnull, os.O_RDWR)
    out = create_private(logfile)
    os.dup2(devnull, 0)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(devnull)
    os.close(out)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)


def log_tail(logfile: str) -> str:
    """The last lines of a log, for the error of a daemon that died without a word."""
    try:
        with open(logfile, errors="replace") as f:
            lines = [line.strip() for line in f.readlines()[-3:] if line.strip()]
    except OSError:
        return ""
    return f"log {logfile}: " + " | ".join(lines) if lines else ""
