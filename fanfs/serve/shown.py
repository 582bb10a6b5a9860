"""What a mount shows now, in memory its serving processes share and its in-process readers map read-only.

A memfd (``MAP_SHARED``), made before the serving processes are forked and handed to in-process readers (``fanfs
run``) through the control socket: a word that says whether the mount serves, the presentation with a generation
(a seqlock: odd while a switch writes the values, so a reader never takes half of one switch with half of another),
and per name the view + 1 that the kernel was last told in a lookup (0: never looked up, or invalidated since).  A
switch is made by one process; the others, and every in-process reader, see the new generation at their next read
of it: no round trip per open.
"""

from __future__ import annotations

import mmap
import os
import time

import numpy as np

from ..records import FULL, Presentation

VIEW_SHIFT = 32
"""A mount's inode number is ``view << VIEW_SHIFT | entry + 1`` (view 0: the whole file): see :mod:`.fusefs`."""
_FIELDS = len(Presentation.NAMES)
HEADER = 8 * (2 + _FIELDS)
"""Bytes before the names: the serving word, the generation, a value per setting (int64 each)."""


def inode(entry: int, view: int) -> int:
    """The inode number the mount gives ``entry`` presented at ``view`` (FULL, or a kind's view)."""
    return (0 if view == FULL else view) << VIEW_SHIFT | (entry + 1)


class ShownView:
    """The presentation as the mount shows it now, read from the shown memory (a serving process's, or a reader's
    read-only mapping of it)."""

    def __init__(self, memory: mmap.mmap) -> None:
        self._words = memoryview(memory)[:HEADER].cast("q")  # serving, generation, the values
        self._seen, self._current = -1, Presentation()

    @property
    def serving(self) -> bool:
        """Whether the mount serves (set once it answers, cleared when its loop ends)."""
        return self._words[0] == 1

    @property
    def generation(self) -> int:
        return self._words[1]

    def current(self) -> Presentation:
        """The presentation now: the last switch's values, never half of one (retried while a switch writes)."""
        words = self._words
        while True:
            generation = words[1]
            if generation == self._seen:
                return self._current
            if generation & 1:  # a switch is writing the values
                time.sleep(0)
                continue
            values = words[2:].tolist()
            if words[1] == generation:
                self._current, self._seen = Presentation.from_values(values), generation
                return self._current


class Shown(ShownView):
    """The shown memory of a mount (the daemon's): made here, written by :meth:`set` and :meth:`serve`."""

    def __init__(self, entries: int, presentation: Presentation) -> None:
        self.fd = os.memfd_create("fanfs-shown", os.MFD_CLOEXEC)
        os.ftruncate(self.fd, HEADER + 2 * entries)
        self._memory = mmap.mmap(self.fd, HEADER + 2 * entries, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        super().__init__(self._memory)
        self.named = np.frombuffer(self._memory, np.uint16, entries, offset=HEADER)
        self.set(presentation)

    def set(self, presentation: Presentation) -> None:
        """The values between two moves of the generation: odd while they are written, even once they are."""
        words = self._words
        words[1] += 1
        for i, name in enumerate(Presentation.NAMES, 2):
            words[i] = presentation[name]
        words[1] += 1

    def serve(self, serving: bool) -> None:
        self._words[0] = 1 if serving else 0
