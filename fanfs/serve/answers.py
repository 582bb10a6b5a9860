"""What a mount's daemon says: its control socket's answers (status, stats, a switch of the presentation, the view an
in-process reader asks for) and what it does once it serves (the ready report, the caller's hooks)."""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING, Any

from ..records import Presentation, presentation_notes, side_names
from ..store import Store
from ..store.resident import ANSWERS
from .control import Handler
from .options import Counters, Hooks, MountOptions
from .publish import view_handler
from .readahead import current
from .workers import ServingProcesses, merge_counters

if TYPE_CHECKING:
    from .fusefs import FanfsFS

log = logging.getLogger("fanfs")
IN_PROCESS = ("processes", "files", "bytes", "to_mount")
"""What ``fanfs stats`` says of the reads made in readers' own processes: by how many processes, how many files and
bytes, and how many opens they left to the mount."""


class MountAnswers:
    """The answers of the mount of ``store`` at ``mountpoint``; :attr:`fs` is set once the file system is made (it
    calls :meth:`ready` when the kernel's INIT is answered)."""

    def __init__(self, store: Store, mountpoint: str, options: MountOptions, hooks: Hooks,
                 report_ready: Any = None) -> None:
        """``report_ready()``: tells the process that started the daemon that it serves (None: nobody waits)."""
        self.store, self.mountpoint, self.options, self.hooks = store, mountpoint, options, hooks
        self.fs: FanfsFS | None = None
        self._report_ready = report_ready
        self._started = time.monotonic()
        self._layered = bool(store.index.layers.size) and int(store.index.layers.max()) > 1  # stats: bytes per layer
        self._processes: ServingProcesses | None = None  # the serving processes, once forked
        self._in_process = dict.fromkeys(IN_PROCESS, 0)  # what readers read in their own processes (fanfs run)
        self._in_process_counters: Counters = {}  # and what they counted as the serving processes count (summed)

    def handlers(self) -> dict[str, Handler]:
        assert self.fs is not None
        fs = self.fs
        return {"status": self.status, "stats": self.stats, "present": self.present, "in_process": self.count_in_process,
                "view": view_handler(self.store, lambda: fs.shown, self.mountpoint, self.hooks.recipe),
                **self.hooks.commands}

    def ready(self) -> None:
        """The kernel's INIT is answered: the mount serves."""
        assert self.fs is not None
        log.info("serving %s at %s (pid %d, %s)", self.store.root, self.mountpoint, os.getpid(),
                 self.fs.presentation.describe())
        if self._report_ready is not None:
            self._report_ready()
        if self.hooks.on_ready is not None:
            self.hooks.on_ready()

    def serving(self, processes: ServingProcesses | None, start_server: Any) -> None:
        """The serving processes are there (None: one loop here): start this process's threads."""
        self._processes = processes
        start_server()
        if self.hooks.serving is not None:
            self.hooks.serving()

    def counters(self) -> Counters:
        """This serving process's counters (summed over them for ``fanfs stats``)."""
        fs = self.fs
        assert fs is not None
        return {**self.store.stats.as_dict(), "lookups": fs.lookups, "listed": fs.listed,
                "reads_in_memory": fs.in_memory, "reads_deferred": fs.deferred, "page_cache_answers": dict(ANSWERS),
                **(self.hooks.counters() if self.hooks.counters else {})}

    def status(self, message: dict[str, Any]) -> dict[str, Any]:
        fs = self.fs
        assert fs is not None
        return {"pid": os.getpid(), "store": self.store.root, "mountpoint": self.mountpoint,
                "workers": self.options.workers, "readahead": fs.readahead(), **fs.presentation}

    def stats(self, message: dict[str, Any]) -> dict[str, Any]:
        fs, store, hooks = self.fs, self.store, self.hooks
        assert fs is not None
        parts = self._processes.counters() if self._processes is not None else [self.counters()]
        summed = merge_counters([*parts, self._in_process_counters])  # the readers' reads count as the mount's
        window = current(self.mountpoint) or fs.readahead()  # now: an administrator may have raised it since
        return {"store": store.root, **fs.presentation, "workers": self.options.workers, "readahead": window,
                "reads_by_process": [part.get("reads", 0) for part in parts], **summed,
                "processes_silent": self._processes.silent if self._processes is not None else 0,
                "notes": presentation_notes(store.index, fs.presentation), "side_names": side_names(store.index),
                "layered": self._layered, "seconds": round(time.monotonic() - self._started, 3),
                "in_process": dict(self._in_process),
                **(hooks.extra_stats(summed) if hooks.extra_stats else {})}

    def count_in_process(self, message: dict[str, Any]) -> dict[str, Any]:
        """A reader process of ``fanfs run`` says, as it ends, what it read in-process and what it left to the mount,
        and its ``counters`` as the serving processes count (stored bytes by source, a job node's cache and peers):
        only numbers under names of the mount's own counters (and sources), which ``stats`` adds to theirs."""
        counts = {name: message.get(name) for name in IN_PROCESS[1:]}
        counters = message.get("counters", {})
        known = {**self.counters(), "by_source": dict.fromkeys((source.name for source in self.store.sources), 0)}
        if not (all(type(value) is int and value >= 0 for value in counts.values()) and _counts_of(counters, known)):
            raise ValueError(f"in-process counts are {', '.join(IN_PROCESS[1:])}: whole numbers; counters: numbers of "
                             "the mount's own")
        self._in_process["processes"] += 1
        for name, value in counts.items():
            self._in_process[name] += value
        self._in_process_counters = merge_counters([self._in_process_counters, counters])
        return {}

    def present(self, message: dict[str, Any]) -> dict[str, Any]:
        fs = self.fs
        assert fs is not None
        settings = {k: v for k, v in message.items() if k != "cmd"}
        unknown = set(settings) - set(Presentation.NAMES)
        if unknown or not settings:
            raise ValueError(f"a presentation sets {', '.join(Presentation.NAMES)}; got {sorted(settings)}")
        answer = fs.set_presentation(fs.presentation.replace(**settings))
        if self.hooks.on_present is not None:
            self.hooks.on_present(fs.presentation)
        return answer


def _counts_of(given: Any, known: Counters) -> bool:
    """Whether ``given`` holds only numbers (at least 0), under names ``known`` has, nested as there."""
    return isinstance(given, dict) and all(
        name in known and (_counts_of(value, known[name]) if isinstance(known[name], dict)
                           else type(value) in (int, float) and 0 <= value < float("inf"))
        for name, value in given.items())
