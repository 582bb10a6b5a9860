"""Issue 8.1: no torn or undecodable read while the fidelity switches under load.

Eight reader processes open, fstat, read and decode JPEG records as fast as they can while the mount's
fidelity cycles through 1, 3, full, 5, 2, full, and every invalidation of a cached name is slowed down
on purpose (``FANFS_DEBUG_INVALIDATE_DELAY``), so a switch's window is long.  Every read must be
exactly as long as its fstat says, and be byte for byte one of the file's presentations (first K
layers + EOI, or the whole record), which Pillow decodes.
"""

from __future__ import annotations

import io
import multiprocessing as mp
import os
import random
import time

import numpy as np
import pytest
import xxhash
from conftest import fanfs
from jpeg_samples import make_photo_set
from PIL import Image

from fanfs.serve.control import request
from fanfs.records.floats import FloatRecords
from fanfs.records.jpeg import JpegRecords
from fanfs.store import FULL, Store

SWITCHES = (1, 3, FULL, 5, 2, FULL)
SECONDS = 12.0


def _decoded(data: bytes, how: str) -> None:
    """Raise unless ``data`` decodes as ``how`` says: "image" (Pillow) or "npy" (numpy)."""
    if how == "image":
        with Image.open(io.BytesIO(data)) as im:
            im.load()
    else:
        np.load(io.BytesIO(data))


def _reader(args: tuple[str, list[str], dict[str, set[int]], float, int, dict[str, str]]) -> tuple[int, list[str]]:
    """Read random files until the deadline; returns (reads, problems).  Every read must be as long as
    fstat says and one presentation of the record; the names in ``decodes`` must also decode."""
    mnt, names, valid, deadline, seed, decodes = args
    rng = random.Random(seed)
    reads, problems = 0, []
    while time.monotonic() < deadline:
        name = rng.choice(names)
        with open(os.path.join(mnt, name), "rb") as f:
            size = os.fstat(f.fileno()).st_size
            data = f.read()
        reads += 1
        if len(data) != size:
            problems.append(f"{name}: read {len(data)} bytes, fstat said {size}")
        elif xxhash.xxh3_64_intdigest(data) not in valid[name]:
            problems.append(f"{name}: {len(data)} bytes that are no presentation of the record")
        elif name in decodes:
            try:
                _decoded(data, decodes[name])
            except Exception as err:  # noqa: BLE001 - any decode failure is the finding
                problems.append(f"{name}: does not decode: {err}")
    return reads, problems


@pytest.fixture(scope="module")
def photo_store(tmp_path_factory):
    base = tmp_path_factory.mktemp("race")
    make_photo_set(base / "src", 60)
    store = base / "store"
    fanfs("pack", base / "src", store, "--progressive-jpeg", "--shard-size", "2M", "--quiet")
    return base / "src", store


def test_no_torn_read_while_fidelity_switches(photo_store, mount, monkeypatch):
    src, store = photo_store
    s = Store(str(store))
    names = sorted(p.name for p in src.iterdir())
    valid: dict[str, set[int]] = {}
    for name in names:
        entry = s.lookup(name.encode())
        assert s.index.record[entry] == JpegRecords.kind_id
        layers = int(s.index.layers[entry])
        valid[name] = {xxhash.xxh3_64_intdigest(s.read(entry, 0, s.size_at(entry, k), k))
                       for k in range(1, layers + 1)}
    s.close()
    monkeypatch.setenv("FANFS_DEBUG_INVALIDATE_DELAY", "0.003")  # the daemon inherits it
    with mount(store, "--fidelity", "2") as mnt:
        deadline = time.monotonic() + SECONDS
        with mp.get_context("fork").Pool(8) as pool:
            decodes = dict.fromkeys(names, "image")
            pending = pool.map_async(_reader, [(str(mnt), names, valid, deadline, seed, decodes) for seed in range(8)])
            switches = 0
            while time.monotonic() < deadline:
                k = SWITCHES[switches % len(SWITCHES)]
                answer = request(mnt, {"cmd": "present", "fidelity": k}, timeout=60)
                assert answer["fidelity"] == k
                switches += 1
                time.sleep(0.2)
            results = pending.get(timeout=120)
        reads = sum(r for r, _ in results)
        problems = [p for _, ps in results for p in ps]
        print(f"{reads} reads by 8 processes, {switches} switches: {len(problems)} torn or undecodable")
        assert switches >= 10 and reads >= 1000
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
        valid[name] = {xxhash.xxh3_64_intdigest(s.read(entry, 0, s.size_at(entry, k), k)) for k in [*views, FULL]}
        names.append(name)
        if s.index.record[entry] == FloatRecords.kind_id and name.endswith(".npy"):
            loadable.add(name)
    s.close()
    monkeypatch.setenv("FANFS_DEBUG_INVALIDATE_DELAY", "0.003")
    settings = [{"precision": 8}, {"fidelity": 1}, {"precision": FULL}, {"fidelity": 3}, {"precision": 16},
                {"fidelity": FULL}, {"precision": 24}, {"fidelity": 2}]
    with mount(store, "--precision", "16", "--fidelity", "2") as mnt:
        deadline = time.monotonic() + SECONDS * 0.75
        with mp.get_context("fork").Pool(6) as pool:
            decodes = dict.fromkeys(loadable, "npy")
            pending = pool.map_async(_reader, [(str(mnt), names, valid, deadline, seed, decodes) for seed in range(6)])
            switches = 0
            while time.monotonic() < deadline:
                setting = settings[switches % len(settings)]
                answer = request(mnt, {"cmd": "present", **setting}, timeout=60)
                assert all(answer[k] == v for k, v in setting.items())
                switches += 1
                time.sleep(0.15)
            results = pending.get(timeout=120)
    reads = sum(r for r, _ in results)
    problems = [p for _, ps in results for p in ps]
    print(f"{reads} reads by 6 processes, {switches} switches: {len(problems)} torn or unloadable")
    assert switches >= 10 and reads >= 500
    assert not problems, f"{len(problems)} of {reads} reads were wrong, e.g. {problems[:5]}"
