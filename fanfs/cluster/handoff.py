"""A job node's two processes: the rank the launcher started, and the daemon that serves.

The launcher (mpiexec, srun) tracks, signals and may kill the rank's process group: MPICH's Hydra kills
every survivor's group when one rank dies abnormally, whatever ``-disable-auto-cleanup`` says (measured:
docs/clusters.rst, "Many nodes").  So the daemon that serves the mount runs in a child forked *before* MPI is
initialised, in a session of its own: the launcher's kill of the rank does not reach it, and it never
holds MPI state (forking an MPI process is unsafe).  The rank does the job's collective start over MPI,
hands the daemon what it needs through a socket pair, then only waits for it, passing SIGTERM, SIGINT
and SIGHUP on (so ``scancel`` and Ctrl-C still end it) and exiting with its status (so the launcher
still sees a node whose daemon died).  SIGUSR2 is passed on as SIGTERM: it is how ``fanfs job run``
ends a Slurm job's serve step, since srun turns a SIGTERM of its own into killing the step's tasks.
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import socket
import struct
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import FanfsError
from ..util.sockets import recv_exactly
from ..util.processes import die_with_parent

log = logging.getLogger("fanfs")

_LENGTH = struct.Struct("<Q")
_FORWARDED = {signal.SIGTERM: signal.SIGTERM, signal.SIGINT: signal.SIGINT, signal.SIGHUP: signal.SIGHUP,
              signal.SIGUSR2: signal.SIGTERM}


def send(sock: socket.socket, message: Any) -> None:
    data = pickle.dumps(message, protocol=5)
    sock.sendall(_LENGTH.pack(len(data)) + data)


def recv(sock: socket.socket) -> Any:
    """The next message, or None if the other process went away."""
    try:
        head = recv_exactly(sock, _LENGTH.size)
        return pickle.loads(recv_exactly(sock, _LENGTH.unpack(head)[0]))
    except ConnectionResetError:
        return None


def _close_all_but(keep: set[int]) -> None:
    for fd in [int(name) for name in os.listdir("/proc/self/fd")]:
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:  # the directory listing's own descriptor
                pass


class Handoff:
    """The rank's side: the forked daemon's pid and the socket to it."""

    def __init__(self, pid: int, sock: socket.socket) -> None:
        self.pid = pid
        self.sock = sock

    @classmethod
    def spawn(cls, daemon_main: Callable[[socket.socket], int], end_with_rank: bool = False,
              keep: Sequence[int] = ()) -> "Handoff":
        """Fork the daemon (call this before MPI is initialised); it runs ``daemon_main(sock)`` and exits.

        ``end_with_rank``: the daemon gets SIGTERM (and unmounts) if the rank dies, e.g. SIGKILLed, rather
        than serving on (a Slurm job's serve step: the step is the mount's lifetime).  The daemon keeps its
        stdio, the socket to the rank and the descriptors in ``keep``; the launcher's (its listening
        socket, its PMI and stdio pipes) are closed, so the launcher's end is not held up by a daemon.
        """
        ours, theirs = socket.socketpair()
        rank = os.getpid()
        pid = os.fork()
        if pid == 0:
            ours.close()
            code = 1
            try:
                _close_all_but({0, 1, 2, theirs.fileno(), *keep})
                os.setsid()  # out of the launcher's process group
                if end_with_rank:
                    die_with_parent(signal.SIGTERM, rank)
                code = daemon_main(theirs)
            except BaseException as err:  # said in the log (the job's output), not lost with the process
                if isinstance(err, FanfsError):
                    log.error("this node's daemon: %s", err)
                else:
                    log.exception("this node's daemon failed")
            finally:
                os._exit(code)
        theirs.close()
        return cls(pid, ours)

    def send(self, message: Any) -> None:
        send(self.sock, message)

    def recv(self) -> Any:
        return recv(self.sock)

    def wait(self) -> int:
        """Wait for the daemon to end, passing stop signals on; its exit code (negative: the signal it died of)."""
        for sig in _FORWARDED:
            signal.signal(sig, lambda signum, frame: self._forward(_FORWARDED[signal.Signals(signum)]))
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # Hydra's notice of a peer's death: not ours to act on
        _, status = os.waitpid(self.pid, 0)
        self.sock.close()
        return os.waitstatus_to_exitcode(status)

    def _forward(self, signum: int) -> None:
        try:
            os.kill(self.pid, signum)
        except ProcessLookupError:
            pass
