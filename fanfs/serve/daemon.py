"""Mount lifecycle: start the FUSE daemon (in the background once it serves), unmount, wait.

``fanfs mount`` returns only when the kernel mount answers, so ``fanfs mount S M && ls M`` works.
The daemon reports readiness (or the reason it failed) through a pipe, holds the mount point's lock
for its lifetime (a second mount of the same point is refused), and logs to a file beside its control
socket, of at most 1 MiB (:mod:`.logfile`): the previous run's log is kept as ``.log.1``, and a run that ends
cleanly without a warning removes its log.  Stopping: ``fanfs umount`` (:func:`fanfs.util.mounts.unmount`), or
SIGTERM/SIGINT to the daemon.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import stat
import time
from collections.abc import Callable

from ..errors import FanfsError, StoreError
from ..records import check_presentation
from ..store import Store
from ..store.format import INDEX_NAME, SHARD_DIR
from ..util.deadline import Deadline, Stalled, deadline_for, within
from ..util.files import readable
from ..util.mounts import mount_owner, mounted, unmount
from ..util.processes import held_in_kernel, wait_ended
from ..util.runtime import runtime_dir
from ..util.server import configure_server, keep_large_buffers, release_free_memory
from . import control
from .listener import ControlServer, MountLock
from .logfile import detach, log_tail, setup_logging
from .options import Counters, Hooks, MountOptions  # noqa: F401  (re-exported: what a mount is, for its callers)

log = logging.getLogger("fanfs")

FUSE_DEVICE = "/dev/fuse"


def check_fuse() -> None:
    """Whether this user may mount with FUSE on this node, asked before anything is staged or measured: libfuse 3
    loads, and /dev/fuse opens for reading and writing (a node that keeps it 0600, root's alone, refuses a plain
    user: fusermount3 opens it as the user).  Else one line saying what to ask an administrator for, and what to do
    without a mount."""
    from .lowlevel import WITHOUT_MOUNT  # loads libfuse: one line (LibfuseError) unless a libfuse 3 it knows loads
    try:
        os.close(os.open(FUSE_DEVICE, os.O_RDWR | os.O_CLOEXEC))
    except FileNotFoundError:
        raise FanfsError(f"this node has no {FUSE_DEVICE} (the fuse kernel module): ask the administrator to load it "
                         f"(modprobe fuse); {WITHOUT_MOUNT}") from None
    except OSError as err:
        st = os.stat(FUSE_DEVICE)
        raise FanfsError(f"{FUSE_DEVICE} is not open to you ({err.strerror}: {stat.filemode(st.st_mode)}, "
                         f"{control.user_name(st.st_uid)}'s): ask the administrator to make it crw-rw-rw- as "
                         f"distributions ship it (a udev rule, or 'chmod 0666 {FUSE_DEVICE}' in a node prolog); "
                         f"{WITHOUT_MOUNT}") from None


def check_mountpoint(mountpoint: str, store_root: str, local_dir: str | None = None, shared: str | None = None) -> None:
    """Refuse a mount point that is not a directory, is mounted already, or is or holds a path the daemon of
    ``store_root`` (and ``local_dir``, and the node's ``shared`` copies) will open: through its own mount, the daemon
    would wait on itself.  On a network file system the store's paths are looked at for ``--store-timeout`` at most
    each (Stalled)."""
    if mounted(mountpoint):
        alive = os.path.ismount(mountpoint) and not control.daemon_ended(mountpoint)  # a dead root may stat from cache
        dead = "" if alive else " whose daemon has ended (it answers 'Transport endpoint is not connected')"
        raise StoreError(f"{mountpoint} is already a mount point{dead}: 'fanfs umount {mountpoint}' first")
    if not os.path.lexists(mountpoint):
        raise StoreError(f"mount point {mountpoint} does not exist: create it first (mkdir -p {mountpoint})")
    if not os.path.isdir(mountpoint):
        raise StoreError(f"mount point {mountpoint} is not a directory: give a directory (mkdir -p one)")
    st = os.stat(mountpoint)
    reads = deadline_for(store_root) or deadline_for(os.path.join(store_root, SHARD_DIR))  # its shards: a link away?
    for what, path in _opened_paths(store_root, local_dir, shared, reads).items():
        if within(reads, path, _at_or_under, path, (st.st_dev, st.st_ino)):
            raise StoreError(f"{what} {path} is the mount point {mountpoint} or lies under it: the daemon would "
                             "read it through its own mount and hang; mount somewhere else")


def _at_or_under(path: str, directory: tuple[int, int]) -> bool:
    """Whether ``path`` (or, if it does not exist yet, where it would be made) is ``directory`` (st_dev,
    st_ino) or lies under it: compared as inodes along the real path, so symlinks, ``..`` and bind
    mounts do not hide it."""
    current = os.path.realpath(path)
    while True:
        try:
            st = os.stat(current)
            if (st.st_dev, st.st_ino) == directory:
                return True
        except OSError:
            pass
        parent = os.path.dirname(current)
        if parent == current:
            return False
        current = parent


def _opened_paths(store_root: str, local_dir: str | None, shared: str | None, reads: Deadline | None) -> dict[str, str]:
    """What a daemon serving ``store_root`` opens while it serves: none may lie under its mount point.
    Its index and shards are named one by one, since any of them may be a symbolic link elsewhere."""
    shards = os.path.join(store_root, SHARD_DIR)
    paths = {"the store": store_root, "its index": os.path.join(store_root, INDEX_NAME), "its shards": shards}
    try:
        paths.update(within(reads, shards, _shard_paths, shards))
    except Stalled:
        raise
    except OSError:  # no store here: opening it says so
        pass
    paths["the runtime directory"] = runtime_dir()
    if local_dir is not None:
        paths["the local directory"] = local_dir
    if shared is not None:
        paths["the shared copies' directory"] = shared
    return paths


def _shard_paths(shards: str) -> dict[str, str]:
    with os.scandir(shards) as entries:
        return {f"its shard {entry.name}": entry.path for entry in entries}


def mount(store_path: str, mountpoint: str, options: MountOptions,
          hooks: Callable[[Store], Hooks] | None = None) -> int:
    """Open and check the store here (clear errors), then serve it; returns the daemon's pid.  ``hooks``: what the
    caller adds to the mount of the opened store (its read-ahead)."""
    mountpoint = os.path.abspath(mountpoint)
    if options.foreground:
        setup_logging(options.debug)
    lock = MountLock(mountpoint)
    keep_large_buffers()  # the index's validation reuses heap pages for its temporaries (0.1-0.2 s of page faults)
    try:
        check_mountpoint(mountpoint, store_path)
        store = Store(os.path.abspath(store_path), cache_size=options.cache_size)
        check_presentation(store.index, options.presentation)
        return start(store, mountpoint, options, lock=lock, hooks=hooks(store) if hooks is not None else None)
    finally:
        lock.remove()  # unless start() handed it to the daemon: the mount was refused before it


def start(store: Store, mountpoint: str, options: MountOptions, *, lock: MountLock,
          hooks: Hooks | None = None) -> int:
    """Serve an opened store here (foreground) or in a daemon process once it serves; returns its pid.

    ``lock`` is the mount point's lock, taken by the caller before it checked the mount point; the
    daemon holds it while it serves and removes it when it ends.
    """
    hooks = hooks or Hooks()
    if options.foreground:
        try:
            run_daemon(store, mountpoint, options, ready_fd=None, hooks=hooks)
        finally:
            lock.remove()
        return os.getpid()
    logfile = control.log_path(mountpoint)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the daemon
        os.close(read_end)
        release_free_memory()  # what the parent freed (the index's validation) is no memory of the daemon's
        code = 1
        try:
            os.setsid()
            os.chdir("/")
            detach(logfile)
            warnings = setup_logging(options.debug, own_file=True)
            run_daemon(store, mountpoint, options, ready_fd=write_end, hooks=hooks)
            if not warnings.count:
                os.unlink(logfile)  # a clean run leaves no log behind
            code = 0
        except FanfsError as err:  # a reason the user can act on: one line, here and in the log
            _report(write_end, f"error: {err}")
            log.error("%s", err)
        except BaseException as err:  # report to the waiting parent, then leave without cleanup handlers
            _report(write_end, f"error: {err}")
            log.exception("daemon failed")
        finally:
            lock.remove()
            os._exit(code)
    lock.release()  # the daemon holds the lock from here on, and removes it when it ends
    os.close(write_end)
    store.close()
    message = _await(read_end, timeout=120)
    if message != "ready":
        tail = "" if message.startswith("error: ") else log_tail(logfile)  # a daemon that died without a word
        raise StoreError(f"mount of {store.root} at {mountpoint} failed: {message.removeprefix('error: ')}"
                         + (f" ({tail})" if tail else ""))
    return pid


def run_daemon(store: Store, mountpoint: str, options: MountOptions, ready_fd: int | None,
               hooks: Hooks | None = None) -> None:
    """Serve ``store`` at ``mountpoint`` from this process (and its serving processes) until unmounted."""
    from .answers import MountAnswers
    from .fusefs import FanfsFS, serve

    configure_server()
    hooks = hooks or Hooks()
    answers = MountAnswers(store, mountpoint, options, hooks,
                           (lambda: _report(ready_fd, "ready")) if ready_fd is not None else None)
    fs = answers.fs = FanfsFS(store, options.presentation, answers.ready)
    # Before mounting: once mounted, resolving the mount point's path would ask this very daemon.
    server = ControlServer(mountpoint, answers.handlers())
    try:
        ended_by = serve(store, mountpoint, fs, allow_other=options.allow_other, debug=options.debug,
                         workers=options.workers, readahead=options.readahead,
                         serving=lambda processes: answers.serving(processes, server.start), counters=answers.counters)
        if ended_by > 0:
            log.info("stopped by signal %d (%s)", ended_by, signal.Signals(ended_by).name)
    finally:
        server.close()
        hooks.close()  # its read-ahead, before the store it reads
        store.close()
        log.info("unmounted %s", mountpoint)


def _report(fd: int, message: str) -> None:
    try:
        os.write(fd, message.encode()[:4000])
        os.close(fd)
    except OSError:
        pass


def _await(fd: int, timeout: float) -> str:
    """The daemon's first message; if it dies silently, say so."""
    deadline = time.monotonic() + timeout
    chunks = []
    with os.fdopen(fd, "rb") as pipe:
        while time.monotonic() < deadline:
            if readable(pipe.fileno(), 0.5):
                data = os.read(pipe.fileno(), 4096)
                if not data:
                    break
                chunks.append(data)
                if b"".join(chunks) == b"ready":
                    return "ready"
        else:
            return f"the daemon did not report within {timeout:.0f} s"
    text = b"".join(chunks).decode(errors="replace")
    return text or "the daemon exited before mounting"


def umount(mountpoint: str, lazy: bool = False, timeout: float = 20.0) -> bool:
    """Unmount and wait until the daemon has gone; False if nothing was mounted there (ended already:
    a job's mounts all end with its first unmount, so a cleanup on every node must not fail)."""
    mountpoint = os.path.abspath(mountpoint)
    if not mounted(mountpoint):  # first: a dead mount is no directory to stat (ENOTCONN), and is unmounted below
        if not os.path.isdir(mountpoint):
            raise StoreError(f"{mountpoint}: no such directory")
        return False
    if (owner := mount_owner(mountpoint)) is not None and os.getuid() not in (owner, 0):
        raise StoreError(f"{mountpoint} is mounted by {control.user_name(owner)}, not by you: only they or root can "
                         "unmount it")
    try:
        pid = control.request(mountpoint, {"cmd": "status"}, timeout=5)["pid"]
    except (control.ControlError, KeyError, TimeoutError):
        pid = None
    done = unmount(mountpoint, lazy)
    if done.returncode != 0:
        if not mounted(mountpoint):
            return False  # it ended meanwhile
        reason = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"{done.args[0]} failed"
        if "busy" in reason.lower():
            reason += "; close the files open under it, or use --lazy"
        raise StoreError(f"cannot unmount {mountpoint}: {reason}")
    # lazily, files still open keep it serving: it ends with the last
    if pid is not None and not wait_ended(pid, timeout) and not lazy:
        with contextlib.suppress(ProcessLookupError):  # stuck (on its store?): unmounted, it serves nobody
            os.kill(pid, signal.SIGKILL)  # (a lazy cache resumes after a kill)
        if not wait_ended(pid, 5):  # a killed process ends at once, unless it waits in the kernel
            raise StoreError(f"unmounted {mountpoint}, but its daemon (pid {pid}) did not end in {timeout:g} s nor "
                             "when killed: it waits in the kernel on a file system that does not answer (its "
                             f"store's?), and ends when that answers (see {control.log_path(mountpoint)})")
        log.warning("unmounted %s; its daemon (pid %d), not ended in %g s, was killed", mountpoint, pid, timeout)
    if pid is not None and held_in_kernel(pid):
        log.warning("unmounted %s; its daemon (pid %d) has exited, but threads of it wait in the kernel on a file "
                    "system that does not answer (its store's?): they go when it answers", mountpoint, pid)
    return True


def wait_ready(mountpoint: str, timeout: float) -> dict:
    """Block until the daemon of ``mountpoint`` serves (``fanfs wait``)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if os.path.ismount(mountpoint):
                return control.request(mountpoint, {"cmd": "status"}, timeout=5, needs=("store", "pid"))
        except control.DaemonEnded:
            raise
        except control.ControlError:
            pass
        if time.monotonic() > deadline:
            raise FanfsError(f"{mountpoint} did not become ready within {timeout:.0f} s")
        time.sleep(0.1)
