"""Issue 9: stores written by earlier fanfs versions mount and read byte-exactly, forever.

``tests/fixtures/format1`` was written by fanfs 0.1.0 (format 1, commit 7027fd2): plain files, an empty
file, a three-chunk file, a sparse file, two JPEG records, a symlink and an empty directory, in four
shards.  ``format2`` and ``format2-elf`` (written by ``tests/fixtures/make_format2.py``) add float
records, lossless and ELF within 1e-4: real weights (silero-vad), every float dtype, NaN, inf,
denormals, a two-chunk array, a fallback.  ``format3`` (``tests/fixtures/make_format3.py``) holds JPEG records
with resolution tiers 1/2 and 1/4 (``sha256_tiers``: each record's bytes at each tier); ``format4`` hard links
(``make_format4.py``); ``format5`` extents, read through the mount by splicing (``make_format5.py``).  Each manifest holds every entry's type, mode, mtime, size
and sha256 (at every view for the records: fidelity K, or precision 8k).  A format change must keep this passing (a reader for the old format) or refuse the
store with one clear line; it must never read it differently.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

import numpy as np
import pytest
from fanfs_command import fanfs, set_presentation

from fanfs.records import Presentation, parse
from fanfs.util.images import decode_pixels
from fanfs.store import Store

pytestmark = pytest.mark.in_process_too  # issue 48: every read test of the mount, in-process too

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="module", params=["format1", "format2", "format2-elf", "format3", "format4", "format5"])
def fixture(request):
    base = FIXTURES / request.param
    return base / "store", json.loads((base / "manifest.json").read_text()), base / "originals"


def test_fixture_reads_in_process(fixture):
    store_path, manifest, originals = fixture
    s = Store(str(store_path))
    assert s.meta["store_id"] == manifest["store_id"]
    for path, want in manifest["entries"].items():
        entry = s.lookup(path.encode())
        assert (int(s.index.type[entry]), int(s.index.mode[entry]), int(s.index.mtime[entry])) == \
            (want["type"], want["mode"], want["mtime_ns"]), path
        if "sha256" in want:
            assert hashlib.sha256(s.read_file(path)).hexdigest() == want["sha256"], path
            for k, digest in want.get("sha256_at", {}).items():
                assert hashlib.sha256(s.read_file(path, int(k))).hexdigest() == digest, (path, k)
            for tier, digest in want.get("sha256_tiers", {}).items():
                view = s.view(entry, Presentation(fidelity=parse("fidelity", tier)))
                assert hashlib.sha256(s.read_file(path, view)).hexdigest() == digest, (path, tier)
        if "target" in want:
            assert s.readlink(entry).decode() == want["target"]
    for original in originals.iterdir():
        assert np.array_equal(decode_pixels(s.read_file(f"photos/{original.name}")), decode_pixels(original.read_bytes()))
    s.close()


@pytest.mark.slow
def test_fixture_verifies_and_mounts(fixture, mount):
    store_path, manifest, _ = fixture
    assert fanfs("verify", store_path, "--quiet").stdout.startswith("ok:")
    info = fanfs("info", store_path).stdout
    assert all(line in info for line in manifest.get("info", ["2 progressive records"]))
    entries = manifest["entries"]
    with mount(store_path) as mnt:
        for path, want in entries.items():
            full = mnt / path if path else mnt
            st = os.lstat(full)
            assert (stat.S_IMODE(st.st_mode), st.st_mtime_ns) == (stat.S_IMODE(want["mode"]), want["mtime_ns"]), path
            if want["type"] == 1:
                data = full.read_bytes()
                assert len(data) == want["size"] == st.st_size and hashlib.sha256(data).hexdigest() == want["sha256"], path
            if "target" in want:
                assert os.readlink(full) == want["target"]
        if "empty" in entries:
            assert os.listdir(mnt / "empty") == []
        records = {p: w for p, w in entries.items() if "sha256_at" in w}
        for setting in sorted({w.get("setting", "fidelity") for w in records.values()}):
            mine = {p: w for p, w in records.items() if w.get("setting", "fidelity") == setting}
            for k in range(1, max(int(k) for w in mine.values() for k in w["sha256_at"]) + 1):
                set_presentation(mnt, setting, str(k * max(w.get("unit", 1) for w in mine.values())))
                for path, want in mine.items():
                    expected = want["sha256_at"].get(str(k), want["sha256"])
                    assert hashlib.sha256((mnt / path).read_bytes()).hexdigest() == expected, (path, setting, k)
            fanfs("ctl", mnt, f"--{setting}", "full")  # once through the command; the switches above as it sends them
        tiers = {p: w["sha256_tiers"] for p, w in entries.items() if "sha256_tiers" in w}
        for tier in sorted({t for digests in tiers.values() for t in digests}):
            set_presentation(mnt, "fidelity", tier)
            for path, digests in tiers.items():
                assert hashlib.sha256((mnt / path).read_bytes()).hexdigest() == digests[tier], (path, tier)
