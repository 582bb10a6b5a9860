"""A fanfs job on ranks, for the cluster benchmarks (``bench_cluster``, ``bench_emulated``, ``bench_lazy``,
``bench_staging``, ``scale_model``): mpiexec command lines (this host's, or the emulated cluster's launcher),
a tree of JPEGs to pack, a mount job that always ends, and timed read passes.

The benchmarks import this and benchlib, never each other's harness: ``bench_cluster --emulate`` runs
``bench_emulated``, which uses ``bench_lazy``'s rows, and none of them imports back.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager, suppress
from pathlib import Path

import benchlib as bl
import numpy as np

MPIEXEC = str(Path(sys.executable).parent / "mpiexec")
READERS = 4


def read_size(path: str) -> int:
    """The bytes of the file at ``path`` read whole, -1 if it could not be read."""
    try:
        with open(path, "rb") as f:
            return len(f.read())
    except OSError:
        return -1


def mpi_fanfs(ranks: int, *args: str | os.PathLike, launcher: list[str] | None = None,
              logs: Path | None = None) -> list[str]:
    """``fanfs ARGS`` on ``ranks`` ranks (``launcher``: another mpiexec command line, the emulated cluster's);
    with ``logs``, each rank's stderr goes to ``logs/rank-N.err`` and mpiexec prints every rank's exit status.

    Run it with stdin from /dev/null: mpiexec forwards its stdin to rank 0, and when there is input (a shell
    reading its commands from a pipe: the commands after this one) that no rank reads, rank 0's proxy gives
    up ("process reading stdin too slowly") and mpiexec ends with "process manager error waiting for
    completion" (issue 35)."""
    per_rank = ["-print-all-exitcodes", "-errfile-pattern", str(logs / "rank-%r.err")] if logs else []
    return [*(launcher or [MPIEXEC, "-disable-auto-cleanup", "-n", str(ranks)]), *per_rank, *bl.FANFS, *map(str, args)]


class RankFailed(RuntimeError):
    """A job on ranks failed; the message is one line naming the rank (or the launcher) and why."""


_EXIT_CODES = re.compile(r"^\[mpiexec@[^]]*\] Exit codes: ((?:\[[^]]*\] [\d,]+\s*)+)", re.MULTILINE)


def exit_statuses(stdout: str) -> tuple[str, list[int] | None]:
    """``stdout`` without mpiexec's ``-print-all-exitcodes`` lines (``[host] STATUS,STATUS`` per host), and the
    wait statuses they gave in rank order (one rank per host, or all on one host); None if mpiexec ended
    before it could say them."""
    found = _EXIT_CODES.search(stdout)
    if found is None:
        return stdout, None
    statuses = [int(code) for code in re.findall(r"\d+", re.sub(r"\[[^]]*\]", " ", found.group(1)))]
    return stdout[:found.start()] + stdout[found.end():], statuses


def _last_line(path: Path) -> str:
    lines = path.read_text(errors="replace").strip().splitlines() if path.exists() else []
    return lines[-1].strip() if lines else "nothing on its stderr"


def _hydra_said(line: str, who: str) -> str:
    """``[proxy:0@vm] function (file.c:533): message`` as ``proxy 0: message``."""
    return f"{who}: {line.split('): ', 1)[-1]}"


def why_failed(statuses: list[int] | None, logs: Path, stderr: str) -> str:
    """One line: the first rank that failed, how, and the last line it wrote; or, when mpiexec ended without
    the ranks' statuses (a proxy lost or not started), what the launcher said."""
    for rank, status in enumerate(statuses or []):
        if status:
            how = f"was killed by {signal.Signals(status & 0x7F).name}" if status & 0x7F else f"exited with {status >> 8}"
            return f"rank {rank} {how}: {_last_line(logs / f'rank-{rank}.err')}"
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    node = [line for line in lines if line.startswith("emucluster:")]  # the emulated launcher names the node
    proxy = [_hydra_said(line, "proxy " + line[len("[proxy:"):].split("@")[0]) for line in lines
             if line.startswith("[proxy:")]  # proxy N runs on the N-th host, with its ranks
    hydra = [_hydra_said(line, "mpiexec") for line in lines if line.startswith("[mpiexec@")]
    said = [*node, *proxy[:1], *hydra[:1]] or lines[-1:] or ["no message"]
    return "mpiexec ended without the ranks' statuses: " + "; ".join(said)


def run_ranks(ranks: int, *args: str | os.PathLike, logs: Path, launcher: list[str] | None = None,
              timeout: float = 7200, retry: bool = True) -> str:
    """``fanfs ARGS`` on ``ranks`` ranks; returns its stdout.  Each rank's stderr is kept in ``logs``.  A failure
    of the launcher itself (mpiexec ended without the ranks' statuses: a proxy lost) is retried once, and said
    so; a failure then, or of a rank, raises :class:`RankFailed` naming the rank and its last line."""
    shutil.rmtree(logs, ignore_errors=True)
    logs.mkdir(parents=True)
    try:
        done = subprocess.run(mpi_fanfs(ranks, *args, launcher=launcher, logs=logs), stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        last = "; ".join(f"rank {rank}: {_last_line(logs / f'rank-{rank}.err')}" for rank in range(ranks))
        raise RankFailed(f"fanfs {args[0]} on {ranks} ranks did not end within {timeout:.0f} s ({last})") from None
    stdout, statuses = exit_statuses(done.stdout)
    if done.returncode == 0:
        return stdout
    why = f"fanfs {args[0]} on {ranks} ranks: {why_failed(statuses, logs, done.stderr)}"
    if statuses is not None or not retry:
        raise RankFailed(why + ("" if retry else " (on its retry)"))
    print(f"{why}; retrying once", flush=True)
    return run_ranks(ranks, *args, logs=logs, launcher=launcher, timeout=timeout, retry=False)


def make_tree(src: Path, files: int, size: int) -> list[str]:
    for i, data in enumerate(bl.make_jpegs(files, size)):
        (src / f"c{i % 20:02d}").mkdir(parents=True, exist_ok=True)
        (src / f"c{i % 20:02d}" / f"{i:05d}.jpg").write_bytes(data)
    rels = sorted(str(p.relative_to(src)) for p in src.rglob("*.jpg"))
    np.random.default_rng(0).shuffle(rels)
    return rels


@contextmanager
def job(store: Path | str, base: Path, ranks: int, replicas: int, *options: str, launcher: list[str] | None = None,
        mnt: str = "mnt{rank}", local: str = "local{rank}") -> Iterator[list[Path]]:
    """A mount job (staging first), unmounted and ended however the block ends; ``options`` go to ``mount``
    (default ``--stage``), ``mnt`` and ``local`` are paths under ``base`` with ``{rank}``.  With
    ``--no-mount`` in ``options`` the nodes mount nothing: ``mnt`` are their node directories."""
    from fanfs.cluster.nodeview import NODE_FILE, serving
    mounts = [base / mnt.format(rank=rank) for rank in range(ranks)]
    serve_only = "--no-mount" in options
    for mountpoint in mounts if not serve_only else ():  # a node directory is made private by its node
        mountpoint.mkdir(exist_ok=True)
    log, logs = open(base / "job.log", "w"), base / "job-ranks"
    shutil.rmtree(logs, ignore_errors=True)
    logs.mkdir()
    proc = subprocess.Popen(mpi_fanfs(ranks, "mount", store, base / mnt, "--local-dir", base / local, "--replicas",
                                      str(replicas), "--peer-timeout", "2", "--foreground", *(options or ["--stage"]),
                                      launcher=launcher, logs=logs),
                            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        for rank, mountpoint in enumerate(mounts):
            deadline = time.monotonic() + 120
            while not (serving(str(mountpoint)) if serve_only else os.path.ismount(mountpoint)):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RankFailed(f"fanfs mount on {ranks} ranks: rank {rank} did not "
                                     f"{'serve' if serve_only else 'mount'} within 120 s"
                                     f"{'' if proc.poll() is None else ' (the job ended)'}: "
                                     f"{_last_line(logs / f'rank-{rank}.err')}")
                time.sleep(0.1)
            if not serve_only:
                bl.run([*bl.FANFS, "wait", mountpoint, "--timeout", "120"], timeout=150)
        yield mounts
    finally:
        for mountpoint in mounts:
            if serve_only and serving(str(mountpoint)):  # one node's end ends the job (BYE)
                os.kill(json.loads((mountpoint / NODE_FILE).read_text())["pid"], signal.SIGTERM)
                break
            if os.path.ismount(mountpoint):
                subprocess.run([*bl.FANFS, "umount", mountpoint], capture_output=True, timeout=60)
                break
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            with suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for mountpoint in mounts:
            bl.force_unmount(mountpoint)
        log.close()
        if "--stage" in (options or ["--stage"]):  # what it staged itself
            for rank in range(ranks):
                shutil.rmtree(base / local.format(rank=rank), ignore_errors=True)


def read_pass(mnt: Path, rels: list[str], readers: int = READERS) -> float:
    """files/s of every file read once by ``readers`` processes."""
    return pool_pass(read_size, [str(mnt / rel) for rel in rels], readers)


def pool_pass(read: Callable[[str], int], items: list[str], readers: int, initializer: Callable[..., None] | None = None,
              initargs: tuple = ()) -> float:
    """files/s of ``read`` over every item by ``readers`` processes, timed once every process has started and
    run ``initializer`` (as a loader's workers have before its first batch)."""
    with ProcessPoolExecutor(readers, initializer=initializer, initargs=initargs) as pool:
        list(pool.map(time.sleep, [0.05] * readers))
        started = time.perf_counter()
        sizes = list(pool.map(read, items, chunksize=8))
        seconds = time.perf_counter() - started
    assert min(sizes) >= 0, "a read failed"
    return len(items) / seconds
