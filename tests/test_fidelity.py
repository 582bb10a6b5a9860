"""Issue 3: progressive JPEG records presented at every fidelity through a real mount."""

from __future__ import annotations

import io
import json
import mmap
import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
from fanfs_command import fanfs, mount_stats, set_presentation
from support.jpeg_samples import BROKEN, ORIENTATION, build_samples
from PIL import Image, ImageFile

from fanfs.records.jpeg import JpegRecords
from fanfs.tune.quality import decode
from fanfs.store import FULL, Store

pytestmark = pytest.mark.in_process_too  # issue 48: every read test of the mount, in-process too

assert ImageFile.LOAD_TRUNCATED_IMAGES is False  # a presented JPEG must be complete, not tolerated


@pytest.fixture(scope="module")
def jpeg_store(tmp_path_factory):
    base = tmp_path_factory.mktemp("jpeg")
    src = base / "src"
    samples = build_samples(src / "photos")
    (src / "notes").mkdir()
    (src / "notes" / "readme.txt").write_text("not a jpeg\n" * 50)
    (src / "notes" / "named.jpg").write_bytes(b"plain text with a .jpg name")
    store = base / "store"
    done = fanfs("pack", src, store, "--progressive-jpeg")
    assert "progressive records" in done.stdout and "kept as is" in done.stdout
    return src, store, samples


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def test_records_and_fallbacks(jpeg_store):
    src, store, samples = jpeg_store
    s = Store(str(store))
    records = {os.fsdecode(s.index.path(e)) for e in np.flatnonzero(s.index.record == JpegRecords.kind_id).tolist()}
    for name, path in samples.items():
        rel = str(path.relative_to(src))
        assert (rel in records) == (name not in BROKEN), name
    assert "notes/named.jpg" not in records  # JPEGs are found by content, not by name
    s.close()


def _by_layer(mnt: Path) -> list[int]:
    """Stored bytes the mount has read per layer (layer 1 first; a plain file's blobs are its layer 1)."""
    return mount_stats(mnt)["stored_by_layer"]


@pytest.mark.slow
def test_every_fidelity_decodes_and_matches_stat(jpeg_store, mount):
    """Each file is read once per K (decoded from the bytes read, not opened again); what is counted is which
    layers the mount read, not how often: a page the kernel drops under load and asks for again is a layer <= K
    read twice (a bound on the bytes failed at load 10-14), while a layer above K read at all is a defect."""
    src, store, samples = jpeg_store
    s = Store(str(store))
    top = int(s.index.layers.max())
    with mount(store, "--fidelity", "1") as mnt:
        for k in [*range(1, top + 1), FULL]:
            set_presentation(mnt, "fidelity", "full" if k == FULL else str(k))
            before = _by_layer(mnt)
            for path in _files(mnt):
                rel = path.relative_to(mnt)
                data = path.read_bytes()
                assert len(data) == path.stat().st_size == s.size_at(s.lookup(os.fsencode(rel)), k), (rel, k)
                entry = s.lookup(os.fsencode(rel))
                if s.index.record[entry] == JpegRecords.kind_id:
                    with Image.open(io.BytesIO(data)) as im:
                        im.load()  # a valid JPEG at every K: no LOAD_TRUNCATED_IMAGES
                    if k >= int(s.index.layers[entry]):
                        assert np.array_equal(decode(data), decode((src / rel).read_bytes())), rel
                else:
                    assert data == (src / rel).read_bytes(), (rel, k)  # odd files are byte-exact at every K
            after = _by_layer(mnt)
            above = [b - (before[i] if i < len(before) else 0) for i, b in enumerate(after)][min(k, top):]
            assert not any(above), (k, above)  # only layers <= K were read
    s.close()


@pytest.mark.parametrize("make", [None, "file"])
def test_a_bad_mount_point_fails_before_auto_measures(jpeg_store, tmp_path, make):
    """Issue 35: ``--fidelity auto:`` measured for 22 s, then failed on the mount point: it is checked first."""
    mnt = tmp_path / "mnt"
    if make == "file":
        mnt.write_bytes(b"")
    done = fanfs("mount", jpeg_store[1], mnt, "--fidelity", "auto:0.95", check=False)
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert f"mount point {mnt}" in done.stderr and "mkdir -p" in done.stderr, done.stderr
    assert done.stdout == "", "nothing measured, no K chosen"


@pytest.mark.mount_only  # the daemon's own counters
@pytest.mark.slow
def test_low_fidelity_reads_fewer_bytes(jpeg_store, mount):
    src, store, samples = jpeg_store
    stored = {}
    for k in ("1", "full"):
        with mount(store, "--fidelity", k) as mnt:
            for path in _files(mnt):
                path.read_bytes()
            stats = mount_stats(mnt)
            stored[k] = stats["bytes_stored_read"]
            assert len(stats["stored_by_layer"]) <= (1 if k == "1" else 64)
    assert stored["1"] < 0.3 * stored["full"]  # the first scan of every preset is the DC: about a tenth of the bytes


def test_exif_orientation_and_icc_survive(jpeg_store, mount):
    src, store, samples = jpeg_store
    with mount(store) as mnt:
        for name in ("exif_orient6", "icc"):
            rel = samples[name].relative_to(src)
            with Image.open(src / rel) as a, Image.open(mnt / rel) as b:
                assert b.info.get("progressive") or b.info.get("progression")
                assert a.getexif().get(ORIENTATION) == b.getexif().get(ORIENTATION)
                assert a.info.get("icc_profile") == b.info.get("icc_profile")
                assert np.array_equal(np.asarray(a), np.asarray(b))


def test_open_file_keeps_its_fidelity_across_a_switch(jpeg_store, mount):
    src, store, samples = jpeg_store
    rel = samples["photo_china"].relative_to(src)
    s = Store(str(store))
    entry = s.lookup(os.fsencode(rel))
    at2, full = s.read(entry, 0, 1 << 30, 2), s.read_file(os.fsencode(rel))
    with mount(store, "--fidelity", "2") as mnt:
        with open(mnt / rel, "rb") as f:
            head = f.read(1000)
            fanfs("ctl", mnt, "--fidelity", "full")
            assert os.fstat(f.fileno()).st_size == len(at2)
            assert head + f.read() == at2  # no torn read
            with open(mnt / rel, "rb") as g:  # opened after the switch, the old one still open: the new view
                assert os.fstat(g.fileno()).st_size == len(full) and g.read() == full
            assert f.read() == b"" and os.fstat(f.fileno()).st_size == len(at2)  # the old handle is unchanged
        assert (mnt / rel).stat().st_size == len(full)
        assert (mnt / rel).read_bytes() == full
        with open(mnt / rel, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
            assert m[:] == full  # mmap, read and stat agree
        copy = mnt.parent / "copy.jpg"
        subprocess.run(["cp", str(mnt / rel), str(copy)], check=True)
        assert copy.read_bytes() == full
    s.close()


def test_names_a_listing_gave_follow_a_switch(jpeg_store, mount):
    """A listing answers every name with its attributes (READDIRPLUS), and the kernel keeps them as names: a
    reader that lists and then opens asks no lookup of its own.  Those names must follow a switch like
    looked-up ones: listed at K=2, switched to 5 without a single open, every stat and read shows K=5."""
    src, store, samples = jpeg_store
    s = Store(str(store))
    names = sorted(os.listdir(src / "photos"))
    entries = {name: s.lookup(os.fsencode(f"photos/{name}")) for name in names}
    with mount(store, "--fidelity", "2") as mnt:
        listed = {e.name: e.stat().st_size for e in os.scandir(mnt / "photos")}  # stat from the listing's attributes
        assert listed == {name: s.size_at(entry, 2) for name, entry in entries.items()}
        counted = json.loads(fanfs("stats", mnt, "--json").stdout)
        assert counted["lookups"] <= 2 and counted["listed"] >= len(names), counted  # "photos" (maybe) and the root
        fanfs("ctl", mnt, "--fidelity", "5")
        for name, entry in entries.items():
            expected = s.read(entry, 0, s.size_at(entry, 5), 5)
            assert (mnt / "photos" / name).stat().st_size == len(expected), name
            assert (mnt / "photos" / name).read_bytes() == expected, name
    s.close()


def test_control_never_shows_in_listings(jpeg_store, mount):
    src, store, samples = jpeg_store
    with mount(store, "--fidelity", "3") as mnt:
        assert sorted(os.listdir(mnt)) == sorted(os.listdir(src))
        fanfs("ctl", mnt, "--fidelity", "5")
        assert sorted(os.listdir(mnt)) == sorted(os.listdir(src))


@pytest.mark.slow
def test_fidelity_report_json_and_plot(jpeg_store, tmp_path):
    src, store, samples = jpeg_store
    plot = tmp_path / "fidelity.png"
    done = fanfs("fidelity", store, "--sample", "6", "--min-ssim", "0.9", "--json", "--plot", plot)
    report = json.loads(done.stdout)
    assert report["images"] == 6 and report["ks"][0] == 1
    assert report["ssim"] == sorted(report["ssim"]) and report["ssim"][-1] == 1.0
    assert report["bytes_fraction"][-1] == 1.0 and report["bytes_fraction"][0] < 0.3
    k = report["recommended"]
    assert report["ssim"][k - 1] >= 0.9 and (k == 1 or report["ssim"][k - 2] < 0.9)
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = fanfs("fidelity", store, "--sample", "6", "--min-ssim", "0.9").stdout
    assert "<- smallest K" in text


def test_custom_scan_script(jpeg_store, tmp_path):
    src, store, samples = jpeg_store
    script = tmp_path / "scans.txt"
    script.write_text("0,1,2: 0-0, 0, 1;\n0: 1-5, 0, 2;\n2: 1-63, 0, 0;\n1: 1-63, 0, 0;\n0: 6-63, 0, 2;\n"
                      "0: 1-63, 2, 1;\n0,1,2: 0-0, 1, 0;\n0: 1-63, 1, 0;\n")
    out = tmp_path / "custom"
    fanfs("pack", src / "photos", out, "--scan-script", script, "--quiet")
    s = Store(str(out))
    entry = s.lookup(os.fsencode(samples["photo_flower"].name))
    assert int(s.index.layers[entry]) == 8
    assert np.array_equal(decode(s.read_file(samples["photo_flower"].name)), decode(samples["photo_flower"].read_bytes()))
    s.close()
    script.write_text("0,1,2: 0-0, 0, 1;\n0: 1-99, 0, 2;\n")
    done = fanfs("pack", src / "photos", tmp_path / "bad", "--scan-script", script, check=False)
    assert done.returncode == 1 and "line 2" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "bad").exists()


@pytest.mark.slow  # the quick subset's time (its promise keeps a quicker test)
def test_fidelity_says_what_it_measures_how_to_go_faster_and_when_it_ends(jpeg_store):
    """Issue 41: 'fanfs fidelity STORE --save' (500 sampled records by default) took 4 minutes without saying how to
    make it shorter.  It says at once how many it measures and that --sample N measures fewer, then where it is with
    an ETA (a line per update here: FANFS_PROGRESS_SECONDS=0, as a log gets one every 10 s)."""
    _, store, _ = jpeg_store
    done = fanfs("fidelity", store, "--timed", "2", env={**os.environ, "FANFS_PROGRESS_SECONDS": "0"})
    lines = done.stderr.splitlines()
    measured = int(re.search(r"fidelity over (\d+) sampled JPEG records", done.stdout)[1])
    assert lines[0] == (f"fanfs fidelity: measuring {measured} sampled JPEG records, then their decode timed on 2 (the "
                        "progress line gives an ETA; --sample N measures fewer, sooner, and --timed 0 times none)")
    assert any(re.fullmatch(rf"fanfs fidelity: \d+ of {measured} \(\d+%\), .*, ETA \w+, \w+ elapsed", line) for line in lines), lines
