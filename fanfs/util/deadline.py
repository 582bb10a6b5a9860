"""Reads of a store on a network file system, each waited on for a bounded time: a stalled server costs a read EIO.

A ``pread`` from a network file system whose server stops answering (NFS, sshfs, Lustre...) waits in the kernel,
often uninterruptibly: nothing ends it but an answer.  So such reads run on threads of their own (:class:`Deadline`);
the reader waits at most ``seconds`` (``--store-timeout``, ``FANFS_STORE_TIMEOUT``) and gets :class:`Stalled`, an
EIO (the store answers the read with EIO and a log line naming the file), while the thread stays in its ``pread``
until the file system answers.  Once a read was given up on, the store is *stalled*: reads fail at once (one every
``seconds`` is still asked, not waited for: a probe; none once :data:`STUCK` threads are stuck, so memory stays
bounded).  The first answer from it (a stuck read returning at last, or a probe) ends the stall: reads go to it
again, on the same mount.  Opening a store (its index, its shards' checks, a mount point's check) and staging it are
waited on alike, every call (:func:`within`), and so is asking which file system it is on (:func:`deadline_for`): a
command then fails with one line.  A process whose thread waits in the kernel cannot end until it is answered
(:func:`unanswered`): ``fanfs mount`` and ``stage`` leave such a process behind (:mod:`fanfs.cli.supervise`).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import mmap
import os
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from ..errors import UsageError
from .units import parse_seconds

log = logging.getLogger("fanfs")

VARIABLE = "FANFS_STORE_TIMEOUT"
DEFAULT_SECONDS = 30.0
STUCK = 16
"""Threads that may wait on a stalled file system at once (each keeps a stack and the buffer it reads into)."""
NETWORK_MAGICS = {
    0x6969: "NFS", 0x517B: "SMB", 0xFF534D42: "CIFS", 0xFE534D42: "SMB2", 0x65735546: "FUSE",
    0x0BD00BD0: "Lustre", 0x47504653: "GPFS", 0x00C36400: "CephFS", 0x01021997: "9P", 0x5346414F: "AFS",
    0x6B414653: "AFS", 0x19830326: "BeeGFS", 0xAAD7AAEA: "PanFS", 0x01161970: "GFS2", 0x7461636F: "OCFS2",
    0x20030528: "OrangeFS", 0x73757245: "Coda",
}
"""``statfs`` f_type of the file systems a read may wait on a server for (a FUSE one may be anything: counted in)."""

_libc = ctypes.CDLL(None, use_errno=True)


def store_timeout() -> float:
    """Seconds a read waits on a store on a network file system (``FANFS_STORE_TIMEOUT``; 0: for ever)."""
    text = os.environ.get(VARIABLE, "").strip()
    if not text:
        return DEFAULT_SECONDS
    try:
        return parse_seconds(text, zero=True)
    except ValueError as err:
        raise UsageError(f"{VARIABLE} (--store-timeout): {err}; 0 waits for ever") from None


def network_file_system(path: str) -> str | None:
    """The kind of network file system ``path`` is on (None: a local one, or none can be told)."""
    buffer = ctypes.create_string_buffer(256)  # struct statfs: f_type (a long) first
    if _libc.statfs(os.fsencode(path), buffer) != 0:
        return None
    return NETWORK_MAGICS.get(ctypes.c_long.from_buffer(buffer).value & 0xFFFFFFFF)


def deadline_for(directory: str) -> Deadline | None:
    """The deadline for reads of ``directory``'s files: None where they need none (a local disk; a timeout of 0).
    Asking which file system it is waits on its server too (a ``statfs``): that is waited on for the deadline's time,
    and Stalled if it does not answer."""
    seconds = store_timeout()
    if not seconds:
        return None
    deadline = Deadline(directory, seconds)
    kind = deadline.run(directory, network_file_system, directory)
    if kind is None:
        deadline.retire()
        return None
    deadline.name = f"{directory} (on {kind})"
    return deadline


def within(deadline: Deadline | None, what: str, function: Callable[..., Any], *args: Any) -> Any:
    """``function(*args)``, waited on for ``deadline``'s time at most (:meth:`Deadline.run`); None: called here."""
    return function(*args) if deadline is None else deadline.run(what, function, *args)


def close_within(deadline: Deadline | None, fds: list[int]) -> None:
    """Close descriptors of files that ``deadline`` bounds the reads of (:meth:`Deadline.close`); None: here."""
    if deadline is None:
        _close_all(fds)
    else:
        deadline.close(fds)


def unanswered() -> int:
    """Calls of this process given up on (or not waited for) whose threads still wait: the process cannot end until
    the file systems answer them (a FUSE request sshfs has taken is waited for beyond any signal)."""
    return len(_UNANSWERED)


_UNANSWERED: set[object] = set()
os.register_at_fork(after_in_child=_UNANSWERED.clear)  # a forked child has none of its parent's threads


class Stalled(OSError):
    """A read the store's file system did not answer in time, or not asked while it is stalled: EIO."""

    def __init__(self, message: str) -> None:
        super().__init__(errno.EIO, message)

    def __str__(self) -> str:
        return self.strerror


class _Call:
    __slots__ = ("function", "args", "result", "error", "done", "late", "asked")

    def __init__(self, function: Callable[..., Any], args: tuple) -> None:
        self.function, self.args, self.result, self.error = function, args, None, None
        self.done, self.late, self.asked = threading.Event(), False, time.monotonic()


class Deadline:
    """Runs calls that may wait on one file system, each waited on for ``seconds`` at most (see the module)."""

    def __init__(self, name: str, seconds: float) -> None:
        self.name, self.seconds = name, seconds
        # when the first read still unanswered was asked (0: none) and the last probe or give-up, in memory that the
        # serving processes forked after this share: a stall one of them met, the others know at once
        self._clock = memoryview(mmap.mmap(-1, 16)).cast("d")
        self._start()

    def _start(self) -> None:
        self._lock = threading.Lock()
        self._calls: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()  # None: a thread ends
        self._idle = self._stuck = 0
        self._waiting: set[_Call] = set()
        self._stopped = False

    def run(self, what: str, function: Callable[..., Any], *args: Any) -> Any:
        """``function(*args)``'s result, or its error; :class:`Stalled` if it has not answered in time (``what``: the
        file it reads, for the message)."""
        call = _Call(function, args)
        with self._lock:
            probe = self._admit(what)
            if probe:  # asked, but not waited for
                call.late, stalled = True, self._stalled(what)
                _UNANSWERED.add(call)
                self._stuck += 1
            else:
                self._waiting.add(call)
            if self._idle:
                self._idle -= 1
            else:
                threading.Thread(target=self._work, name="fanfs-store-read", daemon=True).start()
        self._calls.put(call)
        if probe:
            raise stalled
        try:
            call.done.wait(self.seconds)
        finally:  # also when the wait is interrupted (a Ctrl-C): the call is left to its thread
            with self._lock:
                self._waiting.discard(call)
                answered = call.done.is_set()
                if not answered:
                    call.late = True
                    _UNANSWERED.add(call)
                    self._stuck += 1
                    self._clock[1] = time.monotonic()
                    if not self._clock[0]:
                        self._clock[0] = call.asked
        if not answered:
            raise Stalled(f"{what}: no answer within {self.seconds:g} s (--store-timeout): its file system is stalled; "
                          "try again once its server answers")
        if call.error is not None:
            raise call.error
        return call.result

    def _admit(self, what: str) -> bool:
        """Whether a call is to be waited for (False) or only asked (True: a probe, every ``seconds`` while stalled
        and fewer than STUCK threads are stuck); a Stalled error at once otherwise, while stalled."""
        if self._stopped:
            raise Stalled(f"{what}: not read: the mount is ending")
        if not self._clock[0] and self._stuck < STUCK:
            return False
        now = time.monotonic()
        if self._stuck >= STUCK or now - self._clock[1] < self.seconds:
            raise self._stalled(what)
        self._clock[1] = now
        return True

    def _stalled(self, what: str) -> Stalled:
        since = time.monotonic() - (self._clock[0] or time.monotonic())
        return Stalled(f"{what}: not read: its file system is stalled ({self._stuck} reads of this process "
                       f"unanswered, the first asked {since:.0f} s ago)")

    def _work(self) -> None:
        while (call := self._calls.get()) is not None:
            try:
                call.result = call.function(*call.args)
            except BaseException as err:  # the caller's to see (or nobody's, if it gave up)
                call.error = err
            call.args = ()  # nothing of the caller's is held once it is answered (a buffer it read into, to be closed)
            with self._lock:
                call.done.set()
                self._idle += 1
                if call.late:
                    self._stuck -= 1
                    _UNANSWERED.discard(call)
                if self._clock[0]:
                    log.info("%s answers again after %.0f s", self.name, time.monotonic() - self._clock[0])
                    self._clock[0] = 0.0

    def stop(self) -> None:
        """The mount is ending: calls waiting give up now, later ones fail at once (its daemon ends, stalled or not)."""
        with self._lock:
            self._stopped = True
            for call in self._waiting:
                call.error = Stalled("not read: the mount is ending")
                call.done.set()

    def close(self, fds: list[int]) -> None:
        """Close descriptors of files on this file system.  On a FUSE one (sshfs) a close asks its server too (a
        flush), which a stalled server leaves waiting, as a read: so a thread of its own closes them, waited on for
        ``seconds`` at most, and not at all while the file system is stalled or once the mount ends (they are closed
        when it answers, or by the process's exit, which then waits in the kernel, not in fanfs)."""
        if not fds:
            return
        token = object()
        _UNANSWERED.add(token)

        def close() -> None:
            try:
                _close_all(fds)
            finally:
                _UNANSWERED.discard(token)

        closing = threading.Thread(target=close, name="fanfs-store-close", daemon=True)
        closing.start()
        with self._lock:
            wait = not self._stopped and not self._clock[0]
        if wait:
            closing.join(self.seconds)

    def retire(self) -> None:
        """No more calls: its idle threads end (a deadline found needless, a local disk's)."""
        with self._lock:
            self._stopped = True
            for _ in range(self._idle):
                self._calls.put(None)
            self._idle = 0

    def after_fork(self) -> None:
        """In a forked child: no thread of the parent's is here (nor stuck); the stall, if any, is shared."""
        self._start()


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):  # a file only read: an error at its close (NFS's EIO) changes nothing
            os.close(fd)
