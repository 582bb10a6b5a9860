"""What a mount is, whoever asks for it, and what its caller adds to it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..records import Presentation
from .control import Handler
from .readahead import PREFETCH, READAHEAD

Counters = dict[str, Any]


@dataclass
class MountOptions:
    """What a mount is, whoever asks for it (``fanfs mount``, a cluster node, a Slurm job's node)."""

    cache_size: int = 1 << 30
    presentation: Presentation = field(default_factory=Presentation)
    foreground: bool = False
    allow_other: bool = False
    debug: bool = False
    workers: int = 1  # serving processes (fanfs.serve.workers); 1: one loop in the daemon itself
    readahead: int = READAHEAD  # the kernel's readahead window asked for (fanfs.serve.readahead); 0: its default
    prefetch: int = PREFETCH  # bytes read ahead of a known order (fanfs.cache.follow); 0: none


@dataclass
class Hooks:
    """What the caller of a mount adds to it (a cluster node: its peer server, client and their figures; a Slurm
    job: the line that says the node serves).  Every one is optional."""

    on_ready: Callable[[], None] | None = None
    """The mount serves (INIT answered)."""
    serving: Callable[[], None] | None = None
    """Its serving processes are there: start the caller's threads now (forking is over)."""
    counters: Callable[[], Counters] | None = None
    """Counters kept in each serving process (summed over them for ``fanfs stats``)."""
    extra_stats: Callable[[Counters], dict[str, Any]] | None = None
    """What to add to the "stats" answer, given the summed counters."""
    commands: dict[str, Handler] = field(default_factory=dict)
    """More requests the control socket answers (a lazily staged node: "order")."""
    on_present: Callable[[Presentation], None] | None = None
    """The presentation was switched (in the control thread, once the switch is done)."""
    recipe: Callable[[], dict[str, Any]] | None = None
    """How an in-process reader builds this node's store (:mod:`.publish`; default: the store's own shards)."""
    close: Callable[[], None] = lambda: None
    """The mount has ended: stop what reads the store (a read-ahead's threads), before it closes."""
