"""The batch script's side of a Slurm job (``fanfs job run``): the steps, their order, and the job's end.

1. A *serve* step, one task per node (``fanfs job serve``, :mod:`.job`), in the background for the
   whole job: every node stages its shards and mounts; each says on stdout when it serves.
2. As soon as every node serves, the *training* step with the job's own task layout: each task is
   ``fanfs job exec -- COMMAND``, which finds its node's mount and becomes the command.  If instead
   the serve step ends first (a node could not stage or mount: every node stops with the same
   one-line reason), the job fails right away.
3. When training ends, SIGUSR2 to the serve step (srun passes it to every task, where a SIGTERM would
   make srun kill them): each node unmounts and removes what the job put there.  The job's exit status
   is the training step's.

``scancel`` and a time limit end every step at once, with SIGTERM first: each node's serving task
cleans up by itself then, since no new step can start.  Output of both steps passes through here, so
the job's output holds each node's messages; the serving daemons log there too.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import IO, TextIO

from ..errors import FanfsError, UsageError
from ..records import setting
from ..util.processes import fanfs_command
from .job import MNT_VARIABLE
from .serving import READY_LINE

READY_MARK = READY_LINE.split("{")[0]  # "fanfs: ready: "
_TASK_EXIT = re.compile(r"srun: error: \S+: tasks? [0-9,-]+: Exited with exit code \d+$")
END_GRACE = 60.0  # seconds the nodes get to unmount and clean up once training is over
FAIL_GRACE = 10.0  # after a node's error, seconds the others get to fail alike before they are ended


@dataclass
class JobSettings:
    """What the serve step is asked to do (from ``fanfs job run``'s options and environment)."""

    nodes: int
    replicas: int
    presentation: dict[str, str] = field(default_factory=dict)  # setting -> value as written (a kind's syntax)
    cache_size: int = 1 << 30
    mpi: str = "pmi2"  # srun's PMI for the serve step's MPI start-up
    workers: int | None = None  # serving processes of each node's mount (None: the node's default)
    mount: bool = True  # False: the nodes serve without a mount (their tasks read in-process)
    stage: str = "full"  # "lazy": the nodes serve at once and fill their caches as they read
    capacity: int | None = None  # lazy: local disk each node's cache may take
    in_process: bool = True  # the training command runs under 'fanfs run': its Python reads its node's mount in-process

    def task_prefix(self, fanfs: Sequence[str]) -> list[str]:
        """What each task of the training command runs it under: 'fanfs run' on its node's mount (in_process)."""
        return [*fanfs, "run", "--mount", "$" + MNT_VARIABLE, "--"] if self.in_process and self.mount else []

    def serve_command(self, fanfs: Sequence[str], store: str) -> list[str]:
        return ["srun", f"--nodes={self.nodes}", f"--ntasks={self.nodes}", "--ntasks-per-node=1", "--overlap",
                f"--mpi={self.mpi}", "--kill-on-bad-exit=0",
                *fanfs, "job", "serve", store, "--replicas", str(self.replicas),
                *(argument for name, text in self.presentation.items() for argument in (setting(name).option, text)),
                "--cache-size", str(self.cache_size), *(["--workers", str(self.workers)] if self.workers else []),
                *([] if self.mount else ["--no-mount"]), "--stage", self.stage,
                *(["--capacity", str(self.capacity)] if self.capacity is not None else [])]


class _Relay:
    """Copies a step's output to ours line by line (never letting the step block on a full pipe),
    counting the nodes that say they serve and noticing errors.  Once a node has said why it failed,
    srun's own "task N: Exited with exit code 1" lines add nothing and are left out."""

    def __init__(self, stream: IO[bytes], out: TextIO) -> None:
        self.ready = 0
        self.errors = 0
        self.changed = threading.Condition()
        self._thread = threading.Thread(target=self._copy, args=(stream, out), daemon=True)
        self._thread.start()

    def _copy(self, stream: IO[bytes], out: TextIO) -> None:
        said_why = False
        for line in stream:
            text = line.decode(errors="replace")
            said_why = said_why or "fanfs: error:" in text
            if not (said_why and _TASK_EXIT.match(text)):
                out.write(text)
                out.flush()
            with self.changed:
                self.ready += READY_MARK in text
                self.errors += "fanfs: error:" in text or "srun: error:" in text
                self.changed.notify_all()
        with self.changed:
            self.changed.notify_all()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)


class BatchJob:
    """The steps of one job, and the signals that end them."""

    def __init__(self, store: str, command: Sequence[str], settings: JobSettings) -> None:
        self.store = store
        self.command = list(command)
        self.settings = settings
        self.fanfs = fanfs_command()  # the same installation on every node, whatever the submit directory holds
        self.serve: subprocess.Popen | None = None
        self.train: subprocess.Popen | None = None
        self.stopped_by: int | None = None

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):
            signal.signal(sig, self._stop)  # scancel, a time limit's warning (--signal=B:USR1@...)
        started = time.monotonic()
        self.serve = subprocess.Popen(self.settings.serve_command(self.fanfs, self.store),
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
        out, err = _Relay(self.serve.stdout, sys.stdout), _Relay(self.serve.stderr, sys.stderr)
        try:
            if not self._await_nodes(out, err):
                return 143 if self.stopped_by else 1
            print(f"fanfs: {self.settings.nodes} node(s) serve {self.store} "
                  f"({time.monotonic() - started:.1f} s to stage and mount)", flush=True)
            self.train = subprocess.Popen(["srun", "--overlap", *self.fanfs, "job", "exec", "--",
                                           *self.settings.task_prefix(self.fanfs), *self.command])
            code = self.train.wait()
            return 128 + self.stopped_by if self.stopped_by and code == 0 else code
        finally:
            self._end_serving()
            out.join(5)
            err.join(5)

    def _await_nodes(self, out: _Relay, err: _Relay) -> bool:
        """Until every node serves (True), or the serve step ends, a node fails or the job is stopped (False).

        A node's failure before the job's collective start is agreed on ends every node by itself; one
        that cannot be (a node that died, or never joined) would leave the others waiting: they are
        ended ``FAIL_GRACE`` seconds after the first error line.
        """
        assert self.serve is not None
        failed_at = None
        while True:
            with out.changed:
                if out.ready >= self.settings.nodes:
                    return True
                out.changed.wait(0.2)
            if self.stopped_by is not None:
                return False
            code = self.serve.poll()
            if code is not None:
                err.join(5)
                if not err.errors:
                    print(f"fanfs: error: the nodes stopped before serving (serve step exit {code})",
                          file=sys.stderr, flush=True)
                return False
            if err.errors and failed_at is None:
                failed_at = time.monotonic()
            if failed_at is not None and time.monotonic() - failed_at > FAIL_GRACE:
                print("fanfs: error: a node failed and the others did not stop by themselves: ending them",
                      file=sys.stderr, flush=True)
                self._end_serving(FAIL_GRACE)
                return False

    def _end_serving(self, grace: float = END_GRACE) -> None:
        """Tell each node to end (SIGUSR2 through srun), then wait ``grace`` seconds for the nodes' cleanup."""
        serve = self.serve
        if serve is None or serve.poll() is not None:
            return
        serve.send_signal(signal.SIGUSR2)
        try:
            code = serve.wait(grace)
        except subprocess.TimeoutExpired:
            print(f"fanfs: warning: the nodes did not end within {grace:.0f} s of being told to",
                  file=sys.stderr, flush=True)
            serve.kill()
            code = serve.wait()
        if code != 0 and not self.stopped_by:
            print(f"fanfs: warning: the serve step ended with status {code} (see the node lines above)",
                  file=sys.stderr, flush=True)

    def _stop(self, signum: int, frame: object) -> None:
        """The job is being ended: end the training step, then the nodes (Slurm may have signalled them already)."""
        self.stopped_by = self.stopped_by or signum
        if self.train is not None and self.train.poll() is None:
            self.train.send_signal(signal.SIGTERM)
        if self.serve is not None and self.serve.poll() is None:
            self.serve.send_signal(signal.SIGUSR2)


def run_job(store: str, command: Sequence[str], settings: JobSettings) -> int:
    """``fanfs job run``: check what can be checked here, then run the job's steps; the training step's status."""
    if not os.environ.get("SLURM_JOB_ID"):
        raise UsageError("'fanfs job run' runs inside a Slurm job: sbatch slurm/train.sbatch STORE COMMAND...")
    if not command:
        raise UsageError("no training command: sbatch slurm/train.sbatch STORE COMMAND...")
    if shutil.which("srun") is None:
        raise FanfsError("srun is not on PATH of the batch script")
    store = os.path.abspath(store)
    if not os.path.isdir(store):
        raise FanfsError(f"{store}: no such store directory (it must be on a file system every node sees)")
    return BatchJob(store, command, settings).run()
