"""The keeper of a store being built: removes it if the pack dies before it is done, even by SIGKILL.

A pack removes its partial store itself on any error or Ctrl-C.  It cannot when it is killed outright: an OOM
kill, a time limit's SIGKILL, or ``mpiexec`` killing every rank of a job because one of them died.  So a pack
starts this small process (its own session, so a terminal's Ctrl-C or a rank's group kill does not reach it),
tells it the partial directory on its standard input, and says ``done`` when nothing is left to clean.  If its
input ends without ``done``, the pack is gone: it removes the directory, but only if the directory still holds
the marker naming that pack's process, and says so on its standard error.

A pack on ranks also tells each rank's keeper the MPI library's shared-memory segments (``segment PATH``): MPI
removes them when it ends, and a rank killed outright would leave them in /dev/shm.

Where the keeper itself is killed with the job (a batch system that kills the job's whole process tree), the
next pack of the same store removes the leftover by its marker (:mod:`.destination`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from typing import IO

PARTIAL_MARKER = ".fanfs-partial"


class Janitor:
    """Started by a pack; ``watch(path)`` once the partial directory exists, ``done()`` when the pack ends."""

    def __init__(self) -> None:
        # this very file, isolated (-I): it imports nothing of fanfs, whichever fanfs the interpreter would find
        self._process = subprocess.Popen([sys.executable, "-I", os.path.abspath(__file__), str(os.getpid())],
                                         stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, start_new_session=True,
                                         close_fds=True)
        self._input: IO[bytes] | None = self._process.stdin

    def watch(self, path: str) -> None:
        self._say(os.fsencode(os.path.abspath(path)) + b"\n")

    def watch_segment(self, path: str) -> None:
        """Remove ``path``, a file in /dev/shm, if the pack dies without saying done."""
        self._say(b"segment " + os.fsencode(path) + b"\n")

    def done(self) -> None:
        """Nothing to clean any more (the store is in place, or the pack removed its leftovers itself)."""
        self._say(b"done\n")
        if self._input is not None:
            self._input.close()
            self._input = None
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()

    def _say(self, line: bytes) -> None:
        if self._input is not None:
            try:
                self._input.write(line)
                self._input.flush()
            except OSError:  # it died: the pack goes on, with the stale-leftover rule as the fallback
                self._input = None


def _owned_by(path: bytes, pid: int) -> bool:
    try:
        with open(os.path.join(path, PARTIAL_MARKER.encode()), "rb") as f:
            return int(json.load(f)["pid"]) == pid
    except (OSError, ValueError, KeyError, TypeError):
        return False


def main(pid: int) -> int:
    watched: list[bytes] = []
    segments: list[bytes] = []
    for line in sys.stdin.buffer:
        line = line.rstrip(b"\n")
        if line == b"done":
            return 0
        if line.startswith(b"segment /dev/shm/"):
            segments.append(line[len(b"segment "):])
        else:
            watched.append(line)
    for segment in segments:  # the job is over: the other ranks on this host keep their mappings meanwhile
        try:
            os.unlink(segment)
        except OSError:
            pass
    for path in watched:  # the pack ended without saying done: it was killed
        if _owned_by(path, pid):
            shutil.rmtree(path, ignore_errors=True)
            try:
                print(f"fanfs: error: the pack (process {pid}) was killed; its partial store "
                      f"{os.fsdecode(path)} was removed", file=sys.stderr, flush=True)
            except OSError:
                pass
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1])))
