"""Issue 17.4-17.6: JPEGs that are hostile to pack and to the fidelity measurement.

A flat 10000x10000 JPEG is 1.1 MB on disk and took the measurement to 10.4 GB; a crafted one whose frame
header says 65535x65535 is a few hundred bytes; a 7x3 JPEG made the measurement fail for the whole store;
bytes after a JPEG's EOI (an MPO's second image, a motion photo's video) were dropped by the transcode.
The commands run as a user runs them, some under an address-space limit (``RLIMIT_AS``) so that a
regression fails here instead of taking the machine's memory.
"""

from __future__ import annotations

import io
import json
import os
import resource
from pathlib import Path

import numpy as np
import pytest
from fanfs_command import fanfs
from photo_samples import make_photo_set
from PIL import Image

from fanfs.records.jpeg import JpegRecords
from fanfs.records.jpeg.markers import frame
from fanfs.store import Store

pytestmark = pytest.mark.in_process_too  # issue 48: every read test of the mount, in-process too

LIMIT = 3 << 30  # bytes of address space for a command that must not decode a huge image


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT))


def _jpeg(size: tuple[int, int], mode: str = "RGB", colour=(90, 140, 200), **options) -> bytes:
    out = io.BytesIO()
    Image.new(mode, size, colour if mode == "RGB" else 128).save(out, "JPEG", **options)
    return out.getvalue()


def _claims(data: bytes, width: int, height: int) -> bytes:
    """``data`` with its frame header rewritten to say width x height (the scans stay those of the small image)."""
    at = data.index(b"\xff\xc0") + 5  # Pillow writes no fill bytes and no thumbnail: the first SOF0 is the frame
    patched = data[:at] + height.to_bytes(2, "big") + width.to_bytes(2, "big") + data[at + 4:]
    assert frame(patched)[2:] == (width, height)
    return patched


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    """A tree of real photos and the hostile JPEGs, and its store packed with the defaults."""
    base = tmp_path_factory.mktemp("hostile")
    src = base / "src"
    make_photo_set(src / "photos", 6)
    big = src / "big"
    big.mkdir()
    (big / "flat-10000.jpg").write_bytes(_jpeg((10000, 10000), "L", quality=10))  # 1.1 MB
    (big / "claims-65535.jpg").write_bytes(_claims(_jpeg((16, 16)), 65535, 65535))
    small = src / "small"
    small.mkdir()
    (small / "seven-by-three.jpg").write_bytes(_jpeg((7, 3)))
    (small / "ten-by-ten.jpg").write_bytes(_jpeg((10, 10), "L"))
    return src, base


def _kept(stdout: str, src: Path) -> dict[str, str]:
    """pack's summary: path (relative to src) -> why it was kept as is."""
    lines = [line.strip()[len("kept as is: "):] for line in stdout.splitlines() if "kept as is: " in line]
    return {os.path.relpath(path, src): why for path, why in (line.split(": ", 1) for line in lines)}


def _records(store: Path) -> set[str]:
    s = Store(str(store))
    names = {os.fsdecode(s.index.path(e)) for e in np.flatnonzero(s.index.record == JpegRecords.kind_id).tolist()}
    s.close()
    return names


def test_pack_caps_pixels_from_the_frame_header(hostile):
    """Issue 17.4: over --max-pixels (default 64M) a JPEG is kept byte-exact and listed, never transcoded;
    the count comes from the header, so a tiny file claiming 65535x65535 costs nothing (the pack runs in
    3 GiB of address space; transcoding it would need ~26 GB)."""
    src, base = hostile
    done = fanfs("pack", src, base / "default", "--progressive-jpeg", preexec_fn=_limited)  # not -q: the list
    kept = _kept(done.stdout, src)
    assert kept["big/flat-10000.jpg"] == "10000x10000 = 100,000,000 pixels, more than --max-pixels 67,108,864"
    assert kept["big/claims-65535.jpg"] == "65535x65535 = 4,294,836,225 pixels, more than --max-pixels 67,108,864"
    assert _records(base / "default") >= {f"photos/img_0000{i}.jpg" for i in range(6)}
    s = Store(str(base / "default"))
    for name in kept:
        assert s.read_file(name) == (src / name).read_bytes()
    s.close()
    fanfs("verify", base / "default", "--against", src, "--quiet")

    done = fanfs("pack", src, base / "lower", "--max-pixels", "0.1M")  # implies --progressive-jpeg
    kept = _kept(done.stdout, src)
    assert "more than --max-pixels 104,857" in kept["big/flat-10000.jpg"]
    photos = {f"photos/img_0000{i}.jpg": Image.open(src / f"photos/img_0000{i}.jpg").size for i in range(6)}
    assert {name for name, (w, h) in photos.items() if w * h > 104857} <= set(kept)
    assert {name for name, (w, h) in photos.items() if w * h <= 104857} <= _records(base / "lower")
    for bad in ("0", "-5", "lots"):
        done = fanfs("pack", src, base / "never", "--max-pixels", bad, check=False)
        assert done.returncode == 2 and "--max-pixels" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.slow
def test_measurement_skips_what_it_cannot_measure(hostile, mount, tmp_path):
    """Issues 17.4 and 17.5: the 10000x10000 record (packed with --max-pixels 100M) is over the measurement's
    limit and the 7x3 and 10x10 ones are smaller than SSIM's window: each is skipped with a note, read from
    its header without decoding (3 GiB of address space; measuring the big one took 10.4 GB), and the curve
    is measured on the photos."""
    src, _ = hostile
    store = tmp_path / "roomy"  # the test's own (it runs again with its reads in-process)
    done = fanfs("pack", src, store, "--max-pixels", "100M")
    assert set(_kept(done.stdout, src)) == {"big/claims-65535.jpg"}
    done = fanfs("fidelity", store, "--timed", "2", "--json", preexec_fn=_limited)
    curve = json.loads(done.stdout)
    assert curve["images"] == 6 and curve["timed"] == 2
    assert curve["skipped"] == {"over 67,108,864 pixels (--max-pixels)": 1,
                                "smaller than 11x11 pixels (SSIM's window)": 2}
    assert all(0 < s <= 1 for s in curve["ssim"]) and curve["ssim"][-1] == 1
    done = fanfs("fidelity", store, "--timed", "0", preexec_fn=_limited)
    assert "skipped 3 of 9 sampled records: 1 over 67,108,864 pixels (--max-pixels), 2 smaller than 11x11" \
        in done.stdout
    done = fanfs("fidelity", store, "--timed", "0", "--json", "--max-pixels", "0.1M", preexec_fn=_limited)
    curve = json.loads(done.stdout)
    over = sum(w * h > 104857 for w, h in (Image.open(p).size for p in (src / "photos").iterdir()))
    assert curve["skipped"]["over 104,857 pixels (--max-pixels)"] == over + 1 and curve["images"] == 6 - over

    done = fanfs("info", store, "--fidelity", "auto:0.95", preexec_fn=_limited)  # measures and caches the curve
    assert "over 6 sampled images; skipped 3 of 9 sampled records" in done.stderr + done.stdout
    with mount(store, "--fidelity", "auto:0.95") as mnt:  # the curve cached above: no measurement
        with Image.open(mnt / "small" / "seven-by-three.jpg") as tiny:
            tiny.load()
            assert tiny.size == (7, 3)


@pytest.mark.slow
def test_a_store_with_nothing_measurable_is_one_line(tmp_path, mount):
    """Issue 17.5: a store whose sampled records are all too small for SSIM says so in one line (a Slurm job with
    FANFS_FIDELITY=auto:... got a traceback on every node); a mount of it at auto is refused the same way."""
    src = tmp_path / "src"
    src.mkdir()
    for i, size in enumerate([(7, 3), (10, 40), (3, 3)]):
        (src / f"tiny{i}.jpg").write_bytes(_jpeg(size))
    fanfs("pack", src, tmp_path / "store", "--progressive-jpeg", "--quiet")
    assert len(_records(tmp_path / "store")) == 3
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    for args in (["fidelity", tmp_path / "store"], ["mount", tmp_path / "store", mnt, "--fidelity", "auto:0.95"]):
        done = fanfs(*args, check=False)
        assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
        assert done.stderr.startswith("fanfs: error: ") and len(done.stderr.splitlines()) == 1, done.stderr
        assert "none of the 3 sampled JPEG records can be measured (3 smaller than 11x11 pixels" in done.stderr
    assert not os.path.ismount(mnt)
    with mount(tmp_path / "store", "--fidelity", "2") as shown:  # a K needs no measurement
        assert Image.open(shown / "tiny1.jpg").size == (10, 40)


def _mpo() -> bytes:
    out = io.BytesIO()
    first, second = Image.new("RGB", (64, 48), (200, 10, 10)), Image.new("RGB", (64, 48), (10, 200, 10))
    first.save(out, "MPO", save_all=True, append_images=[second], quality=90)
    return out.getvalue()


@pytest.mark.slow
def test_bytes_after_eoi_are_kept_byte_exact(tmp_path, mount):
    """Issue 17.6: an MPO (Pillow's MPO writer), a JPEG with an MP4-like trailer and one with trailing zeros are
    kept as plain files and listed ("bytes after EOI"); every fidelity and verify --against give their bytes."""
    src = tmp_path / "src"
    src.mkdir()
    photo = make_photo_set(tmp_path / "photos", 1)[0].read_bytes()
    trailers = {
        "stereo.mpo": _mpo(),
        "motion.jpg": photo + b"\x00\x00\x00\x18ftypmp42\x00\x00\x00\x00mp42isom" + os.urandom(3000),
        "zeros.jpg": photo + bytes(4096),
    }
    assert Image.open(io.BytesIO(trailers["stereo.mpo"])).n_frames == 2
    for name, data in trailers.items():
        (src / name).write_bytes(data)
    (src / "photo.jpg").write_bytes(photo)
    done = fanfs("pack", src, tmp_path / "store", "--progressive-jpeg")
    kept = _kept(done.stdout, src)
    assert set(kept) == set(trailers), done.stdout
    assert all(why.startswith("bytes after EOI (") for why in kept.values()), kept
    assert kept["zeros.jpg"] == "bytes after EOI (4,096)"
    assert _records(tmp_path / "store") == {"photo.jpg"}
    fanfs("verify", tmp_path / "store", "--against", src, "--quiet")
    shown = {}
    for fidelity in ("1", "full"):
        with mount(tmp_path / "store", "--fidelity", fidelity) as mnt:
            for name, data in trailers.items():
                assert (mnt / name).read_bytes() == data, (name, fidelity)
            shown[fidelity] = (mnt / "photo.jpg").stat().st_size
    assert shown["1"] < shown["full"]  # the record beside them is presented at each fidelity
