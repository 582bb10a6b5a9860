"""``fanfs mount`` and ``fanfs stage`` run in a child process, which a stalled shared store may leave behind.

A read of a network file system whose server has stopped answering waits in the kernel, and a FUSE request its
server has taken (sshfs: an open, a lookup, a read) is waited for beyond any signal, SIGKILL included.  Every
access to the store is waited on for ``--store-timeout`` at most (:mod:`fanfs.util.deadline`), on a thread that is
then left where it is, and the command fails with one line.  But a process with such a thread cannot end: its exit
waits for the answer too, and so would whoever waits for it (a shell, a batch script, ``$(...)``).  So these
commands run in a child of the process that was started, which only waits for it, passes stop signals on (not a
terminal's Ctrl-C: the child has it already), and exits with its status.  A child that leaves a thread in the
kernel lets go of the caller's terminal or pipes, says its status (through memory they share, and SIGUSR1) and
exits: the started process ends at once, and the child when the store answers.  Not under a launcher (mpiexec,
srun track their ranks themselves) nor for a mount in the foreground (it is the daemon its caller watches).
"""

from __future__ import annotations

import argparse
import contextlib
import mmap
import os
import signal
import sys

_PASSED_ON = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
_LEFT = signal.SIGUSR1  # the child's word that it has left, its status in the memory they share
_SI_KERNEL = 0x80  # si_code of a signal the kernel sent (a terminal's Ctrl-C), not a process (kill: SI_USER)
_WATCHED = {*_PASSED_ON, _LEFT, signal.SIGCHLD}

_status: mmap.mmap | None = None  # in the child: where it says its status
_parent = 0


def alone(args: argparse.Namespace) -> bool:
    """Whether a command runs supervised: not under a launcher (its ranks are its own), nor a mount in the foreground
    (it is the daemon its caller watches)."""
    from ..peers.world import launched_ranks
    return launched_ranks()[1] == 1 and not getattr(args, "foreground", False) and not getattr(args, "no_mount", False)


def supervise() -> int | None:
    """Fork.  In the parent: the command's exit status, once the child has ended or left (one killed by a signal
    kills this process with it); in the child: None, and the command runs there."""
    from ..util.processes import die_with_parent
    global _status, _parent
    status = mmap.mmap(-1, 8)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # an inherited SIG_IGN would reap the child unseen
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, _WATCHED)  # from before the fork: none is missed
    parent = os.getpid()
    child = os.fork()
    if child == 0:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        die_with_parent(signal.SIGTERM, parent)  # the started process killed (-9): the command is over
        _status, _parent = status, parent
        return None
    while True:
        info = signal.sigwaitinfo(_WATCHED)
        if info.si_signo == _LEFT and info.si_pid == child:
            return int.from_bytes(status[:8], "little", signed=True)
        if info.si_signo == signal.SIGCHLD:
            pid, wait_status = os.waitpid(child, os.WNOHANG)
            if pid:
                return _exit_code(os.waitstatus_to_exitcode(wait_status))
        elif info.si_signo in _PASSED_ON and info.si_code != _SI_KERNEL:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, info.si_signo)


def _exit_code(code: int) -> int:
    """The child's exit status as this process's: a signal that killed it kills this one too."""
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {-code})
        os.kill(os.getpid(), -code)
        return 128 - code
    return code


def leave(code: int) -> None:
    """At the command's end in a supervised child: if threads of it still wait in the kernel on a stalled store
    (:func:`fanfs.util.deadline.unanswered`), let go of the caller's terminal or pipes, tell the parent ``code``, and
    exit now."""
    if _status is None:
        return
    from ..util.deadline import unanswered
    if not unanswered():
        return
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    _status[:8] = code.to_bytes(8, "little", signed=True)
    os.kill(_parent, _LEFT)
    os._exit(code)
