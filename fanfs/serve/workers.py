"""Several processes serving one mount (``fanfs mount --workers N``): a node's serving grows with its cores.

One Python loop serves a file in ~100 us of CPU, so it tops out near 10,000 files/s whatever the node's
cores, and more threads in one process only queue on the GIL.  The kernel lets any process holding a
mount's ``/dev/fuse`` descriptor read the next request and answer it, so the daemon mounts, answers INIT
itself, then forks N serving processes that inherit the session (the descriptor and libfuse's state)
and each run libfuse's loop.  What they need is shared for free or set up before the fork:

* the store: immutable, its index a sealed memory the daemon read and validated (mapped: the children and
  ``fanfs run``'s readers share its pages), its shard descriptors (``pread`` needs no file offset); decoded-blob
  caches are per process;
* per name the view the kernel was told, and the presentation (:class:`.fusefs.Shown`, in shared
  memory): a switch is made once, by the parent, and its invalidations go out once, from it;
* counters: each process keeps its own, and answers the parent's numbered "counters?" on a socket of its own, with
  that number; ``fanfs stats`` gets their sum (:func:`merge_counters`).  A process that does not answer within
  ``ASK_SECONDS`` (stopped, busy) counts with the last counters it gave, so totals never go down, and its late
  answer, when it comes, is told from the next one by its number and passed over.

The parent serves no request: it owns the session (only it unmounts), runs the control socket and a
cluster node's peer server, turns a stop signal into an unmount, and watches its children:

* a serving process that dies (killed, out of memory) takes the requests it held with it, and their
  readers would wait for ever; so the parent then ends the mount at once, and loudly, rather than serve
  half a mount: it kills the other serving processes and ends the kernel's connection, leaving the mount
  in place.  The requests held fail (ECONNABORTED) and every later access fails with ENOTCONN ("Transport
  endpoint is not connected": the file system's server is gone) until ``fanfs umount``; the log says which
  process died of what.  (Unmounting instead left an empty directory: readers got ENOENT, as if the files
  did not exist);
* once the mount has ended (unmounted, or its connection aborted), serving processes have
  ``END_GRACE_SECONDS`` to leave; one that has not (stopped with SIGSTOP, stuck) is killed and logged, so
  the daemon ends and the mount point can be mounted again (a stopped one used to hold the daemon, and the
  mount point's lock, for ever).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import signal
import socket
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

from ..errors import FanfsError
from ..util.sockets import recv_exactly
from ..util.processes import die_with_parent, exited
from . import lowlevel as ll

log = logging.getLogger("fanfs")

Counters = dict[str, Any]
_STOPS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_ASK = struct.Struct("<Q")  # the parent's question: its number
_ANSWER = struct.Struct("<QI")  # an answer's head: the number of the question it answers, and its length
ASK_SECONDS = 5.0  # a serving process that does not give its counters within this long is left out of a sum
END_GRACE_SECONDS = 5.0  # serving processes still there this long after the mount ended are killed


class WorkerDied(FanfsError):
    """A serving process died while the mount served: the mount was ended (its readers got an error)."""


class ServingProcesses:
    """The parent's side: N forked serving processes, their counters, their end."""

    def __init__(self, session: ll.Session, count: int, counters: Callable[[], Counters],
                 on_exit: Callable[[], None]) -> None:
        """``counters``: a process's own counters (called in each serving process); ``on_exit``: what a serving
        process does once its loop has ended (e.g. let its reader threads finish)."""
        self.session = session
        self.count = count
        self._counters = counters
        self._on_exit = on_exit
        self._pids: list[int] = []
        self._sockets: list[socket.socket] = []
        self._ask_lock = threading.Lock()
        self._asked = 0  # the number of the last question
        self._heard: list[bytearray] = []  # per process, what it sent and was not read yet (an answer in part)
        self._last: list[Counters] = []  # per process, the last counters it gave
        self.silent = 0  # processes that did not answer the last question in time
        self._exits: queue.SimpleQueue = queue.SimpleQueue()
        self._stopped_by = 0
        self._killed: set[int] = set()  # serving processes killed by the parent: their end is no death to report
        self._abandoned = False  # a serving process died: the mount is left in place, its connection ended

    def run(self, started: Callable[[], None]) -> int:
        """Mount, answer INIT, fork the serving processes, call ``started()``, and watch them until the mount
        ends: 0 after an unmount, the number of the stop signal that ended it (SIGTERM, SIGINT, SIGHUP: an
        unmount), or WorkerDied."""
        previous = {sig: signal.signal(sig, self._stop) for sig in _STOPS}
        try:
            self.session.mount()
            self.session.serve_until_ready()
            self.start()
            started()
            return self.supervise()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            if self._abandoned:
                self.session.abandon()
            else:
                self.session.unmount()
            for sock in self._sockets:
                sock.close()

    def start(self) -> None:
        """Fork the serving processes (the session's INIT answered; no thread of this process running yet)."""
        parent = os.getpid()
        for _ in range(self.count):
            ours, theirs = socket.socketpair()
            pid = os.fork()
            if pid == 0:
                ours.close()
                for sock in self._sockets:
                    sock.close()
                self._serve(theirs, parent)  # never returns
            theirs.close()
            self._pids.append(pid)
            self._sockets.append(ours)
            self._heard.append(bytearray())
            self._last.append({})
        for pid in self._pids:
            threading.Thread(target=self._wait, args=(pid,), name="fanfs-reap", daemon=True).start()

    def _serve(self, sock: socket.socket, parent: int) -> None:
        code = 1
        try:
            die_with_parent(signal.SIGKILL, parent)  # a parent gone is a mount gone: no serving on alone
            for sig in (*_STOPS, signal.SIGUSR1, signal.SIGUSR2):
                signal.signal(sig, signal.SIG_IGN)  # stopping is the parent's: it unmounts, and the loop ends
            threading.Thread(target=self._answer, args=(sock,), name="fanfs-counters", daemon=True).start()
            code = 0 if self.session.loop_here() == 0 else 1
            self._on_exit()
        except BaseException:
            log.exception("serving process %d failed", os.getpid())
        finally:
            os._exit(code)

    def _answer(self, sock: socket.socket) -> None:
        """In a serving process: give the parent this process's counters whenever it asks, with its question's number."""
        try:
            while True:
                (number,) = _ASK.unpack(recv_exactly(sock, _ASK.size))
                data = json.dumps(self._counters()).encode()
                sock.sendall(_ANSWER.pack(number, len(data)) + data)
        except OSError:  # the parent closed its end: the mount is over
            pass

    def _wait(self, pid: int) -> None:
        _, status = os.waitpid(pid, 0)
        self._exits.put((pid, os.waitstatus_to_exitcode(status)))

    def supervise(self) -> int:
        """Until every serving process has ended: 0 after an unmount, the number of the stop signal that
        ended the mount, or WorkerDied if a serving process died while it served."""
        died = None
        live = set(self._pids)
        ended = None  # when the mount was seen to have ended
        while live:
            try:
                pid, code = self._exits.get(timeout=0.5)  # a Python wait: stop signals are handled meanwhile
            except queue.Empty:
                ended = self._outlived(live, ended)
                continue
            live.discard(pid)
            if code != 0 and died is None and not self._stopped_by and pid not in self._killed:
                died = (pid, code)
                self._end(f"serving process {pid} " + (f"died of {signal.Signals(-code).name}" if code < 0
                                                       else f"exited with status {code}"))
        if died is not None:
            raise WorkerDied(f"a serving process of {self.session.mountpoint} died (pid {died[0]}, "
                             + (f"{signal.Signals(-died[1]).name}" if died[1] < 0 else f"status {died[1]}")
                             + f"): the mount was ended rather than leave its readers waiting; 'fanfs umount "
                             f"{self.session.mountpoint}' clears it")
        return self._stopped_by

    def _outlived(self, live: set[int], ended: float | None) -> float | None:
        """Kill the serving processes still there END_GRACE_SECONDS after the mount ended; when it ended (None: not
        yet).  The kernel's connection tells: unmounted or aborted, however it happened."""
        now = time.monotonic()
        if ended is None:
            return now if self.session.ended() else None
        live.difference_update([pid for pid in live if exited(pid, held=True)])  # but for threads stuck on the store
        if now - ended >= END_GRACE_SECONDS:
            for pid in sorted(live - self._killed):
                log.warning("serving process %d had not ended %g s after the mount did (stopped, or stuck): killed",
                            pid, END_GRACE_SECONDS)
                self._kill(pid)
        return ended

    def _stop(self, signum: int, frame: object) -> None:
        if not self._stopped_by:  # once: a second signal must not re-enter the unmount under way
            self._stopped_by = signum
            self.session.unmount()

    def _end(self, why: str) -> None:
        log.error("%s: ending the mount (the requests it held would never be answered); its readers get 'Transport "
                  "endpoint is not connected' until 'fanfs umount %s'", why, self.session.mountpoint)
        self._abandoned = True
        for pid in self._pids:
            self._kill(pid)

    def _kill(self, pid: int) -> None:
        self._killed.add(pid)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def counters(self) -> list[Counters]:
        """Every serving process's counters, asked of all at once and waited for ``ASK_SECONDS`` in all: one that has
        not answered by then counts with the last it gave (:attr:`silent` says how many)."""
        with self._ask_lock:
            self._asked += 1
            question = _ASK.pack(self._asked)
            for sock in self._sockets:
                with contextlib.suppress(OSError):  # a process gone: its last counters stay
                    sock.sendall(question)
            deadline = time.monotonic() + ASK_SECONDS
            self.silent = 0
            for i, sock in enumerate(self._sockets):
                answer = self._answer_to(i, sock, deadline)
                if answer is None:
                    self.silent += 1
                else:
                    self._last[i] = answer
            return list(self._last)

    def _answer_to(self, i: int, sock: socket.socket, deadline: float) -> Counters | None:
        """Process ``i``'s answer to the last question, read by ``deadline``; None if it has not come by then (what came
        of it is kept for the next question; answers to earlier ones are passed over)."""
        heard = self._heard[i]
        while True:
            while len(heard) >= _ANSWER.size:
                number, length = _ANSWER.unpack_from(heard)
                if len(heard) < _ANSWER.size + length:
                    break
                body = bytes(heard[_ANSWER.size:_ANSWER.size + length])
                del heard[:_ANSWER.size + length]
                if number == self._asked:
                    try:
                        return json.loads(body)
                    except ValueError:
                        return None
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                sock.settimeout(left)
                more = sock.recv(1 << 16)
            except OSError:  # its time is up, or it is gone
                return None
            if not more:
                return None
            heard += more


def merge_counters(parts: list[Counters]) -> Counters:
    """The sum of several processes' counters: numbers added (a key ending in ``_max`` or ``_max_ms`` takes
    the largest), lists added element by element, dictionaries merged key by key."""
    merged: Counters = {}
    for part in parts:
        for key, value in part.items():
            if key not in merged:
                merged[key] = value
            elif isinstance(value, dict):
                merged[key] = merge_counters([merged[key], value])
            elif isinstance(value, list):
                old = merged[key]
                merged[key] = [a + b for a, b in zip(old + [0] * (len(value) - len(old)),
                                                     value + [0] * (len(old) - len(value)))]
            elif key.endswith(("_max", "_max_ms")):
                merged[key] = max(merged[key], value)
            else:
                merged[key] = merged[key] + value
    return merged
