"""Shared pieces of the fanfs benchmarks: temp dirs, mounts that always go away, sample data, tables.

Every mount made here is unmounted however the benchmark ends (``fanfs umount``, then a lazy unmount,
then SIGKILL of its daemon: tools/support/fanfs_command.py), and every temp dir is removed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

TOOLS = Path(__file__).resolve().parent.parent
for _folder in ("emulated", "support"):  # the emulated cluster; the fanfs command and sample data (the tests' too)
    if str(TOOLS / _folder) not in sys.path:
        sys.path.insert(1, str(TOOLS / _folder))

from fanfs_command import FANFS, REPO, fanfs, force_unmount, mounted  # noqa: E402, F401  (bl.FANFS, bl.fanfs)
from photo_samples import make_jpegs, photo_paths  # noqa: E402, F401  (bl.make_jpegs)

from fanfs.util.mounts import unmount


def common_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workdir", default="/dev/shm",
                        help="where the temp data, stores, images and mount points go (default /dev/shm, a tmpfs)")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON to FILE")


@contextlib.contextmanager
def temp_dir(workdir: str, prefix: str) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=workdir))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def run(cmd: Sequence[str | os.PathLike], **kwargs: Any) -> subprocess.CompletedProcess:
    """Run a command; on failure raise with its output (a benchmark must not go on with a half setup).  Its stdin
    is /dev/null unless given: mpiexec would forward the caller's input to rank 0 and fail (clusterjob.mpi_fanfs)."""
    kwargs.setdefault("stdin", subprocess.DEVNULL)
    done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kwargs)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} failed ({done.returncode}): {done.stderr.strip() or done.stdout.strip()}")
    return done


def daemon_pid(mnt: Path) -> int:
    """Pid of the fanfs daemon serving ``mnt`` (its control channel's status answer)."""
    from fanfs.serve import control
    return int(control.request(str(mnt), {"cmd": "status"}, timeout=10)["pid"])


@contextlib.contextmanager
def fanfs_mount(store: Path, mnt: Path, *options: str, env: dict[str, str] | None = None,
                cwd: str | None = None) -> Iterator[int]:
    """``fanfs mount`` (returns once serving); yields the daemon pid; always unmounted afterwards."""
    with mounted(store, mnt, *options, env=env, cwd=cwd):
        yield daemon_pid(mnt)


_AS_NOBODY = """import os, pwd, sys
import fanfs.cache.share, fanfs.cli.serve, fanfs.serve.daemon, fanfs.serve.fusefs, fanfs.store
from fanfs.cli.main import main
user = pwd.getpwnam("nobody")
os.setgroups([]); os.setgid(user.pw_gid); os.setuid(user.pw_uid)
sys.exit(main(sys.argv[1:]))
"""
"""``python -c _AS_NOBODY ARGS``: ``fanfs ARGS`` as nobody, its modules imported first as root (whose interpreter
nobody may not be able to read)."""


@contextlib.contextmanager
def unprivileged_mount(store: Path, mnt: Path, *options: str) -> Iterator[int]:
    """``fanfs mount`` by the user nobody (no capability: the readahead stays the kernel's 128 KiB), with allow_other so
    that this process's readers may read it.  For the time of the mount, /dev/fuse is opened to every user and
    /etc/fuse.conf allows allow_other, as a site that lets users mount does; the store is made readable to nobody."""
    fuse_conf, dev = Path("/etc/fuse.conf"), "/dev/fuse"
    conf = fuse_conf.read_text() if fuse_conf.exists() else ""
    mode = os.stat(dev).st_mode & 0o777
    for path in [*(p for p in store.parents if str(p) != "/" and p.stat().st_uid == os.getuid()), *store.rglob("*"), store]:
        os.chmod(path, path.stat().st_mode | (0o555 if path.is_dir() else 0o444))
    mnt.mkdir(parents=True, exist_ok=True)
    shutil.chown(mnt, "nobody", "nogroup")
    env = {k: v for k, v in os.environ.items() if k != "FANFS_RUNTIME_DIR"}
    try:
        os.chmod(dev, mode | 0o666)
        if "\nuser_allow_other" not in f"\n{conf}":
            fuse_conf.write_text(conf + "\nuser_allow_other\n")
        run([sys.executable, "-c", _AS_NOBODY, "mount", store, mnt, "-o", "allow_other", *options], env=env)
        yield int(run(["pgrep", "-u", "nobody", "-o", "-f", f"mount {store} {mnt}"]).stdout.split()[0])
    finally:
        unmount(mnt)
        force_unmount(mnt)
        os.chmod(dev, mode)
        fuse_conf.write_text(conf)


@contextlib.contextmanager
def squashfuse_mount(binary: str, image: Path, mnt: Path) -> Iterator[int]:
    """squashfuse(_ll) in the foreground as our child (so we own its pid), default options as users run it."""
    with foreground_mount([binary, "-f", str(image), str(mnt)], mnt) as pid:
        yield pid


@contextlib.contextmanager
def foreground_mount(cmd: Sequence[str], mnt: Path) -> Iterator[int]:
    """A FUSE daemon that stays in the foreground (``cmd``) as our child, mounted at ``mnt``; yields its pid once it
    serves; always unmounted afterwards."""
    mnt.mkdir(parents=True, exist_ok=True)
    err = tempfile.TemporaryFile()  # not a pipe: a daemon that says much would block on a full one
    proc = subprocess.Popen(list(cmd), stdout=subprocess.DEVNULL, stderr=err)
    try:
        deadline = time.monotonic() + 120
        while not os.path.ismount(mnt):
            if proc.poll() is not None or time.monotonic() > deadline:
                err.seek(0)
                raise RuntimeError(f"{cmd[0]} did not mount: {err.read().decode(errors='replace')[-2000:]}")
            time.sleep(0.005)
        yield proc.pid
    finally:
        err.close()
        unmount(mnt)
        force_unmount(mnt)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def proc_memory(pid: int) -> dict[str, int]:
    """VmRSS / VmHWM / RssFile / RssShmem of a process, in bytes."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem"):
                out[key] = int(value.split()[0]) * 1024
    return out


def tree_rss(root: int) -> int:
    """Resident bytes of ``root`` and every process below it, from /proc."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
        rss[int(entry)] = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += rss.get(pid, 0)
        todo += children.get(pid, [])
    return total


def timed(cmd: Sequence[str | os.PathLike], every: float = 0.05, **kwargs: Any) -> tuple[float, int, float]:
    """Run ``cmd`` to its end: (seconds, peak resident bytes of its whole process tree, sampled every ``every`` s,
    CPU seconds of the tree: user + system of every process it waited for, which a loaded box does not inflate).
    Raises on failure, as :func:`run`."""
    with tempfile.TemporaryFile() as err:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        proc = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.DEVNULL, stderr=err, **kwargs)
        peak = 0
        while proc.poll() is None:
            peak = max(peak, tree_rss(proc.pid))
            time.sleep(every)
        seconds = time.perf_counter() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
        if proc.returncode != 0:
            err.seek(0)
            raise RuntimeError(f"{' '.join(map(str, cmd))} failed ({proc.returncode}): "
                               f"{err.read().decode(errors='replace').strip()[-2000:]}")
    return seconds, peak, cpu


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def wait_for_quiet(limit: float = 1.0, timeout: float = 60.0) -> None:
    """Wait (bounded) until the 1-minute load average is low, so other jobs on the box skew less."""
    deadline = time.monotonic() + timeout
    if os.getloadavg()[0] > limit:
        print(f"waiting up to {timeout:.0f} s for load average < {limit} (now {load_average()})", flush=True)
    while os.getloadavg()[0] > limit and time.monotonic() < deadline:
        time.sleep(5)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain aligned text table; numbers right-aligned, everything else left-aligned."""
    cells = [[str(h) for h in headers]] + [[_fmt(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    numeric = [all(isinstance(row[i], (int, float)) or row[i] in ("", "-") for row in rows) for i in range(len(headers))]
    lines = []
    for n, row in enumerate(cells):
        lines.append("  ".join(c.rjust(w) if numeric[i] else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))))
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(line.rstrip() for line in lines)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        return f"{value:,.2f}" if abs(value) < 100 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def write_json(path: str | None, data: Any) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(data, f, indent=2)
        print(f"\nresults written to {path}")
