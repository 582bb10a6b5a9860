"""Child processes: pools of workers that never outlive their parent and never see a Ctrl-C meant for it, whether a
process is alive, and how this installation's ``fanfs`` command is started in a child.

Every process pool of fanfs (pack, fidelity measurement, compressor selection) comes from here:

* workers ask the kernel to kill them when the process that forked them dies (``PR_SET_PDEATHSIG``):
  an OOM kill or a Slurm time limit of the parent leaves nothing running;
* SIGINT is blocked while workers are forked and ignored in them, so a Ctrl-C reaches only the parent
  (which stops the pool and reports once), never a worker in the middle of starting up (whose
  traceback would otherwise be printed).
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import ctypes
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

_PR_SET_PDEATHSIG = 1
_MAIN = ("import sys\n"
         "if not getattr(sys.flags, 'safe_path', False):\n"  # -P (3.11) leaves the directory out already
         "    del sys.path[0]\n"
         "from fanfs.cli import entry\n"
         "entry()\n")


def fanfs_command() -> list[str]:
    """The argv prefix that runs this interpreter's fanfs command line in a child (a job step, the demo's commands),
    whatever its working directory holds: ``python -m fanfs`` puts that directory first on ``sys.path``, and a folder
    named fanfs there (a clone of the checkout: git's default name, where a user submits a job from) would be
    imported instead of the installed package."""
    return [sys.executable, "-c", _MAIN]


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (someone else's counts: signalling it is only refused)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def wait_ended(pid: int, seconds: float) -> bool:
    """Whether process ``pid`` has ended, waited for up to ``seconds``: gone, a zombie (reaped if it is a child of
    ours), or exited but for threads the kernel holds (:func:`exited`: waiting on a file system that does not answer,
    they serve nothing and go when it answers)."""
    deadline = time.monotonic() + seconds
    while pid_alive(pid):
        with contextlib.suppress(ChildProcessError):
            if os.waitpid(pid, os.WNOHANG)[0]:
                return True
        if exited(pid):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


PF_EXITING = 0x4
"""A task flag (``/proc/PID/task/TID/stat``'s ninth field): the thread is in its exit and runs no more user code."""


def exited(pid: int, held: bool = False) -> bool:
    """Whether process ``pid`` has exited: its first thread is a zombie, and so is every other one but those the kernel
    holds: in state D (a read waiting on a file system that does not answer, its kill pending), or in their exit,
    whatever their state (closing the process's files: a close on a FUSE file system asks its server, sshfs's, and
    waits, interruptibly: state S, for an answer that a stalled server never gives); ``held``: and there is one such."""
    threads = thread_states(pid)
    if threads.get(pid, (b"Z", 0))[0] != b"Z":
        return False
    waiting = [(state, flags) for state, flags in threads.values() if state != b"Z"]
    return all(state == b"D" or flags & PF_EXITING for state, flags in waiting) and (bool(waiting) or not held)


EXIT_SECONDS = 2.0
"""How long a thread of an exited process may be in its exit before :func:`held_in_kernel` takes it for one the kernel
holds: the last thread of a process tears down its memory (here ~0.07 s per GB; longer on a loaded node)."""


def held_in_kernel(pid: int, seconds: float = EXIT_SECONDS) -> bool:
    """Whether process ``pid`` has exited but threads of it stay in the kernel (:func:`exited` with ``held``) for
    ``seconds`` on end, waiting on a file system that does not answer.  A process that exits normally has threads in
    their exit for a moment too (the last tearing down its memory, a second for a dozen GB): that is no such wait,
    and ``exited(pid, held=True)`` asked once, in that moment, says yes."""
    deadline = time.monotonic() + seconds
    while exited(pid, held=True):
        if time.monotonic() >= deadline:
            return True
        time.sleep(0.02)
    return False


def thread_states(pid: int) -> dict[int, tuple[bytes, int]]:
    """The kernel's state letter (R, S, D, Z...) and flags of each thread of process ``pid`` (empty if it is gone)."""
    states = {}
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{task}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
                states[int(task)] = (fields[0], int(fields[6]))
    return states


def die_with_parent(sig: int, parent: int) -> None:
    """Have the kernel send ``sig`` to this (forked) process when ``parent``, which forked it, dies."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before the request took effect
        os.kill(os.getpid(), sig)


def _start_worker(parent: int, initializer: Callable[..., None] | None, initargs: tuple) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    die_with_parent(signal.SIGKILL, parent)
    if initializer is not None:
        initializer(*initargs)


@contextlib.contextmanager
def process_pool(jobs: int, initializer: Callable[..., None] | None = None,
                 initargs: tuple = ()) -> Iterator[cf.ProcessPoolExecutor]:
    """A forked ``ProcessPoolExecutor`` of ``jobs`` workers, all started before this yields.

    Leaving the block on an exception (Ctrl-C included) terminates the workers instead of waiting
    for their queued work.
    """
    pool = cf.ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("fork"), initializer=_start_worker,
                                  initargs=(os.getpid(), initializer, initargs))
    main = threading.current_thread() is threading.main_thread()
    if main:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:  # fork every worker now, SIGINT blocked (fork pools start all at the first submit on 3.11+)
        for future in [pool.submit(int) for _ in range(jobs)]:
            future.result()
    finally:
        if main:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    try:
        yield pool
    except BaseException:
        terminate(pool)
        raise
    pool.shutdown(wait=True)


def terminate(pool: cf.ProcessPoolExecutor) -> None:
    """Stop a pool now: cancel what is queued, kill the workers, reap them, and wait for the pool's manager thread
    to end (left running, it closes its wake-up pipe while the interpreter's exit writes to it: CPython 3.11 then
    prints an ``OSError: Bad file descriptor`` traceback after the command's own error line)."""
    processes: dict[Any, Any] = dict(getattr(pool, "_processes", None) or {})
    manager = getattr(pool, "_executor_manager_thread", None)
    pool.shutdown(wait=False, cancel_futures=True)
    for proc in processes.values():
        with contextlib.suppress(Exception):
            proc.kill()
    for proc in processes.values():
        with contextlib.suppress(Exception):
            proc.join(5)
    if manager is not None:
        manager.join(5)
