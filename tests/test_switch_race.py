"""Issue 8.1: no torn or undecodable read while the fidelity switches under load.

Eight reader processes list, open, fstat, read and decode JPEG records as fast as they can while the mount's
fidelity cycles through 1, 3, full, 5, 2, full, and every invalidation of a cached name is slowed down
on purpose (each is followed by a pause, injected: tests/support/inject), so a switch's window is long.  Switches are counted in reads, not
timed (the next one when 50 more reads have ended), so a busy machine changes how long a race takes, not what it
does.  Every read must be
exactly as long as its fstat says, and be byte for byte one of the file's presentations (first K
layers + EOI, or the whole record), which Pillow decodes.
"""

from __future__ import annotations

import io
import multiprocessing as mp
import os
import random
import time
from pathlib import Path

import numpy as np
import pytest
import xxhash
from support.inject import inject
from fanfs_command import fanfs
from photo_samples import make_photo_set
from support.processes import kernel_state
from PIL import Image

from fanfs.serve.control import request
from fanfs.records.floats import FloatRecords
from fanfs.records import Presentation
from fanfs.records.jpeg import FIDELITY, JpegRecords
from fanfs.store import FULL, Store

pytestmark = [pytest.mark.slow, pytest.mark.in_process_too]  # see docs/userguide.rst, 'Quick start'

SWITCHES = 24
"""Switches in each race: every setting of a cycle three times or more."""
READS_BETWEEN = 50
"""Reads that end between two switches: every switch lands among reads, however fast either goes."""
WAIT = 120.0
"""Seconds a race waits for reads (or for its readers to end) before it calls them hung."""
SLOW_INVALIDATIONS = "fanfs.serve.lowlevel:Session.invalidate_entry=faults.pausing(Session.invalidate_entry, 0.003)"
"""A slow kernel's invalidations: 3 ms after each (the daemon inherits it)."""

_reads = None  # per reader, the reads it has done (shared memory the forked readers inherit)
_stop = None  # set once the race's switches are done


def _share(reads, stop) -> None:
    global _reads, _stop
    _reads, _stop = reads, stop


def _decoded(data: bytes, how: str) -> None:
    """Raise unless ``data`` decodes as ``how`` says: "image" (Pillow) or "npy" (numpy)."""
    if how == "image":
        with Image.open(io.BytesIO(data)) as im:
            im.load()
    else:
        np.load(io.BytesIO(data))


def _reader(args: tuple[str, list[str], dict[str, set[int]], int, dict[str, str]]) -> list[str]:
    """Read random files until the switches are done; returns the problems.  Every read must be as long as
    fstat says and one presentation of the record; the names in ``decodes`` must also decode.  Now and then
    a reader lists the directory too, which gives the kernel every name with its attributes (READDIRPLUS)
    in the middle of switches."""
    mnt, names, valid, seed, decodes = args
    rng = random.Random(seed)
    problems = []
    while not _stop.is_set():
        name = rng.choice(names)
        if rng.random() < 0.02:
            folder = os.path.dirname(name)
            listed = {os.path.join(folder, entry.name) for entry in os.scandir(os.path.join(mnt, folder))}
            if missing := {n for n in names if os.path.dirname(n) == folder} - listed:
                problems.append(f"a listing of {folder or '.'} lacks {sorted(missing)[:3]}")
        with open(os.path.join(mnt, name), "rb") as f:
            size = os.fstat(f.fileno()).st_size
            data = f.read()
        _reads[seed] += 1
        if len(data) != size:
            problems.append(f"{name}: read {len(data)} bytes, fstat said {size}")
        elif xxhash.xxh3_64_intdigest(data) not in valid[name]:
            problems.append(f"{name}: {len(data)} bytes that are no presentation of the record")
        elif name in decodes:
            try:
                _decoded(data, decodes[name])
            except Exception as err:  # noqa: BLE001 - any decode failure is the finding
                problems.append(f"{name}: does not decode: {err}")
    return problems


def _race(mnt: Path, names: list[str], valid: dict[str, set[int]], decodes: dict[str, str],
          settings: list[dict[str, int]], readers: int) -> tuple[int, list[str]]:
    """``readers`` processes read (``_reader``) while the mount cycles through ``settings``, SWITCHES times, each
    switch READS_BETWEEN reads after the last; returns (reads, problems)."""
    context = mp.get_context("fork")
    reads, stop = context.RawArray("q", readers), context.Event()
    pool = context.Pool(readers, initializer=_share, initargs=(reads, stop))
    workers = list(pool._pool)  # noqa: SLF001 - their pids, to report one that does not end
    try:
        pending = pool.map_async(_reader, [(str(mnt), names, valid, seed, decodes) for seed in range(readers)])
        for switch in range(SWITCHES):
            setting = settings[switch % len(settings)]
            answer = request(mnt, {"cmd": "present", **setting}, timeout=60)
            assert all(answer[k] == v for k, v in setting.items())
            due, deadline = sum(reads) + READS_BETWEEN, time.monotonic() + WAIT
            while sum(reads) < due and not pending.ready():  # ready this early: a reader failed (get() says why)
                assert time.monotonic() < deadline, f"no {READS_BETWEEN} reads within {WAIT:.0f} s: the readers hang"
                time.sleep(0.005)
        stop.set()
        results = pending.get(timeout=WAIT)
    finally:
        stop.set()
        pool.close()
        ends = time.monotonic() + 60
        for worker in workers:
            worker.join(timeout=max(0.0, ends - time.monotonic()))
        stuck = [kernel_state(worker.pid) for worker in workers if worker.is_alive()]  # a hang: say where
        pool.terminate()
        assert not stuck, "readers that did not end:\n" + "\n".join(stuck)
    return sum(reads), [p for ps in results for p in ps]


def _digests(s: Store, entry: int, views) -> set[int]:
    """The digests of every presentation of ``entry`` at ``views``: what a read may return."""
    return {xxhash.xxh3_64_intdigest(s.read(entry, 0, s.size_at(entry, k), k)) for k in views}


@pytest.fixture(scope="module")
def photo_store(tmp_path_factory):
    base = tmp_path_factory.mktemp("race")
    make_photo_set(base / "src", 60)
    store = base / "store"
    fanfs("pack", base / "src", store, "--progressive-jpeg", "--shard-size", "2M", "--quiet")
    return base / "src", store


@pytest.mark.parametrize("workers", [1, 2])
def test_no_torn_read_while_fidelity_switches(photo_store, mount, monkeypatch, workers):
    """With one serving loop, and with two serving processes that share the names' views through memory."""
    src, store = photo_store
    s = Store(str(store))
    names = sorted(p.name for p in src.iterdir())
    valid: dict[str, set[int]] = {}
    for name in names:
        entry = s.lookup(name.encode())
        assert s.index.record[entry] == JpegRecords.kind_id
        layers = int(s.index.layers[entry])
        valid[name] = _digests(s, entry, range(1, layers + 1))
    s.close()
    inject(monkeypatch, SLOW_INVALIDATIONS)
    with mount(store, "--fidelity", "2", "--workers", str(workers)) as mnt:
        reads, problems = _race(mnt, names, valid, dict.fromkeys(names, "image"),
                                [{"fidelity": k} for k in (1, 3, FULL, 5, 2, FULL)], 8)
        print(f"{reads} reads by 8 processes, {SWITCHES} switches: {len(problems)} torn or undecodable")
        assert not problems, f"{len(problems)} of {reads} reads were wrong, e.g. {problems[:5]}"
        # once a switch has returned, every name resolves to the new view
        request(mnt, {"cmd": "present", "fidelity": 3}, timeout=60)
        s = Store(str(store))
        for name in names:
            entry = s.lookup(name.encode())
            expected = s.read(entry, 0, s.size_at(entry, 3), 3)
            with open(mnt / name, "rb") as f:
                assert os.fstat(f.fileno()).st_size == len(expected) and f.read() == expected, name
        s.close()


def test_no_torn_read_while_precision_and_fidelity_switch(tmp_path, mount, monkeypatch):
    """Issue 12: float --precision and JPEG --fidelity switch independently, with the same guarantee."""
    from float_samples import make_float_tree
    src = tmp_path / "src"
    make_float_tree(src, photos=12)
    store = tmp_path / "store"
    fanfs("pack", src, store, "--progressive-jpeg", "--float-records", "--shard-size", "2M", "--quiet")
    s = Store(str(store))
    names, valid, loadable = [], {}, set()
    for entry in np.flatnonzero(s.index.type == 1).tolist():
        name = os.fsdecode(s.index.path(entry))
        views = range(1, int(s.index.layers[entry]) + 1) if s.index.record[entry] else [FULL]
        valid[name] = _digests(s, entry, [*views, FULL])
        names.append(name)
        if s.index.record[entry] == FloatRecords.kind_id and name.endswith(".npy"):
            loadable.add(name)
    s.close()
    inject(monkeypatch, SLOW_INVALIDATIONS)
    settings = [{"precision": 8}, {"fidelity": 1}, {"precision": FULL}, {"fidelity": 3}, {"precision": 16},
                {"fidelity": FULL}, {"precision": 24}, {"fidelity": 2}]
    with mount(store, "--precision", "16", "--fidelity", "2", "--workers", "2") as mnt:
        reads, problems = _race(mnt, names, valid, dict.fromkeys(loadable, "npy"), settings, 6)
    print(f"{reads} reads by 6 processes, {SWITCHES} switches: {len(problems)} torn or unloadable")
    assert not problems, f"{len(problems)} of {reads} reads were wrong, e.g. {problems[:5]}"


def test_no_torn_read_while_fidelity_switches_among_tiers_and_scans(tmp_path, mount, monkeypatch):
    """Issue 20: the same promises with resolution tiers in the cycle (1/4, K, full, 1/2: views that are not nested)."""
    src = tmp_path / "src"
    make_photo_set(src, 40)
    store = tmp_path / "store"
    fanfs("pack", src, store, "--scales", "2,4", "--shard-size", "1M", "--quiet")
    half, quarter = (FIDELITY.parse(text) for text in ("1/2", "1/4"))
    s = Store(str(store))
    names = sorted(p.name for p in src.iterdir())
    valid: dict[str, set[int]] = {}
    for name in names:
        entry = s.lookup(name.encode())
        views = [s.view(entry, Presentation(fidelity=value)) for value in (half, quarter)]
        assert views == [half, quarter]  # every photo has its tiers
        valid[name] = _digests(s, entry, [*range(1, int(s.index.layers[entry]) + 1), *views])
    s.close()
    inject(monkeypatch, SLOW_INVALIDATIONS)
    cycle = [{"fidelity": value} for value in (quarter, 3, FULL, half, 1, quarter, half, FULL)]
    with mount(store, "--fidelity", "1/2", "--workers", "2") as mnt:
        reads, problems = _race(mnt, names, valid, dict.fromkeys(names, "image"), cycle, 8)
        print(f"{reads} reads by 8 processes, {SWITCHES} switches among tiers and scans: {len(problems)} wrong")
        assert not problems, f"{len(problems)} of {reads} reads were wrong, e.g. {problems[:5]}"
        request(mnt, {"cmd": "present", "fidelity": quarter}, timeout=60)
        s = Store(str(store))
        for name in names:
            expected = s.read_file(name, quarter)
            with open(mnt / name, "rb") as f:
                assert os.fstat(f.fileno()).st_size == len(expected) and f.read() == expected, name
        s.close()
