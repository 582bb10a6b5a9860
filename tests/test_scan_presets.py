"""Issue 13: scan-script presets at pack (every kind of JPEG, every K, the default, the refusals) and the
decode speed per K that ``fanfs fidelity`` reports (fields only: speed is measured, never asserted)."""

from __future__ import annotations

import io
import json
import math
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from fanfs_command import fanfs, set_presentation
from support.jpeg_samples import build_samples
from support.messages import messages
from photo_samples import make_photo_set
from PIL import Image, ImageFile

from fanfs.util.images import decode_pixels
from fanfs.records.jpeg.markers import present, split_layers
from fanfs.records.jpeg.scans import DEFAULT_SCANS, PRESETS, SCAN_CHOICES, ScanScript, scan_script
from fanfs.records.jpeg.transcode import to_progressive
from fanfs.store import Store

assert not ImageFile.LOAD_TRUNCATED_IMAGES  # a presented JPEG must be complete, not tolerated
FIXTURES = Path(__file__).parent / "fixtures"
KINDS = ("s420", "s444", "gray", "cmyk", "progressive", "exif_orient6", "restart", "photo_china")
# scans per image for each preset: colour, grayscale, CMYK
SCANS = {"compact": (6, 4, 7), "fast": (7, 3, 9), "libjpeg": (10, 6, 18)}


@pytest.fixture(scope="module")
def samples(tmp_path_factory):
    src = tmp_path_factory.mktemp("presets") / "src"
    made = build_samples(src)
    if "s444" not in made:
        pytest.skip("no sample photos installed (sklearn, skimage, matplotlib)")
    for name in set(made) - set(KINDS):
        made.pop(name).unlink()
    return src, made


@pytest.fixture(scope="module")
def stores(samples, tmp_path_factory):
    """The samples packed with each preset through the real CLI."""
    src, _ = samples
    base = tmp_path_factory.mktemp("preset-stores")
    out = {}
    for preset in SCAN_CHOICES:
        done = fanfs("pack", src, base / preset, "--scan-script", preset, "--quiet")
        assert "0 kept as plain files" in done.stdout, done.stdout  # every kind of JPEG becomes a record
        out[preset] = base / preset
    return out


def _mode(path: Path) -> str:
    with Image.open(path) as im:
        return im.mode


def _size(path: Path) -> tuple[int, int]:
    with Image.open(path) as im:
        return im.size


def test_presets_are_valid_lossless_scripts_for_every_component_count():
    assert set(SCAN_CHOICES) == {"compact", "fast", "libjpeg"} and DEFAULT_SCANS == "compact"
    for name in PRESETS:
        script = scan_script(name)
        assert script.name == name and script.components == 3
        for ncomp, want in zip((3, 1, 4), SCANS[name]):
            fitted = ScanScript(script.fitted(ncomp).text)  # parses: every bit of every coefficient sent
            assert (len(fitted), fitted.components) == (want, ncomp)
    assert scan_script("libjpeg") is None


@pytest.mark.parametrize("preset", SCAN_CHOICES)
def test_every_preset_keeps_pixels_and_every_k_decodes(preset, samples, stores):
    src, made = samples
    store = Store(str(stores[preset]))
    colour, gray, cmyk = SCANS[preset]
    for name, path in made.items():
        rel = os.fsencode(path.relative_to(src))
        entry = store.lookup(rel)
        layers = int(store.index.layers[entry])
        mode, size = _mode(path), _size(path)
        assert layers == {"L": gray, "CMYK": cmyk}.get(mode, colour), (preset, name)
        original = decode_pixels(path.read_bytes())
        assert np.array_equal(decode_pixels(store.read_file(rel)), original), (preset, name)
        for k in range(1, layers + 1):
            with Image.open(io.BytesIO(store.read_file(rel, k))) as im:
                im.load()  # complete and valid at every K
                assert im.size == size and im.mode == mode, (preset, name, k)
    store.close()


@pytest.mark.slow
def test_fast_preset_through_a_mount_at_every_k(samples, stores, mount):
    src, made = samples
    with mount(stores["fast"], "--fidelity", "1") as mnt:
        for k in [*range(1, SCANS["fast"][2] + 1), "full"]:
            set_presentation(mnt, "fidelity", str(k))
            for name, path in made.items():
                data = (mnt / path.relative_to(src)).read_bytes()
                with Image.open(io.BytesIO(data)) as im:
                    im.load()
                    assert im.size == _size(path), (name, k)
                if k == "full":
                    assert np.array_equal(decode_pixels(data), decode_pixels(path.read_bytes())), name


def test_transcode_fits_presets_to_grayscale_and_cmyk(samples):
    _, made = samples
    for preset in PRESETS:
        script = scan_script(preset)
        for name in ("gray", "cmyk", "s444"):
            data = made[name].read_bytes()
            layers = split_layers(to_progressive(data, script))
            assert np.array_equal(decode_pixels(b"".join(layers)), decode_pixels(data)), (preset, name)
            assert decode_pixels(present(layers, 1)).shape == decode_pixels(data).shape


@pytest.mark.slow
def test_default_is_compact_and_info_says_which_script(samples, stores, tmp_path):
    src, made = samples
    default = tmp_path / "default"
    fanfs("pack", src, default, "--progressive-jpeg", "--quiet")
    a, b = Store(str(default)), Store(str(stores["compact"]))
    for path in made.values():
        rel = os.fsencode(path.relative_to(src))
        ea, eb = a.lookup(rel), b.lookup(rel)
        assert int(a.index.layers[ea]) == int(b.index.layers[eb])
        assert [a.read_file(rel, k) for k in range(1, int(a.index.layers[ea]) + 1)] == \
            [b.read_file(rel, k) for k in range(1, int(b.index.layers[eb]) + 1)]
    a.close()
    b.close()
    for store, name in ((default, "compact"), (stores["fast"], "fast"), (stores["libjpeg"], "libjpeg")):
        assert f"scan script: {name}\n" in fanfs("info", store).stdout + "\n"
        assert json.loads(fanfs("info", store, "--json").stdout)["records"]["jpeg"]["scan_script"] == name
    script = tmp_path / "mine.txt"
    script.write_text(PRESETS["fast"])  # a file, even with a preset's text, is a file
    fanfs("pack", src, tmp_path / "custom", "--scan-script", script, "--quiet")
    assert "scan script: custom (from a file)" in fanfs("info", tmp_path / "custom").stdout


def test_older_stores_say_what_is_known():
    assert "scan script: libjpeg" in fanfs("info", FIXTURES / "format2" / "store").stdout  # no script: libjpeg's
    assert "scan script" not in fanfs("info", FIXTURES / "format1" / "store").stdout  # fanfs 0.1.0 did not record it


@pytest.mark.parametrize("choice, why", [
    ("nonsense", "cannot read scan script nonsense: No such file or directory (name a file, or a preset: "
                 "compact, fast, libjpeg)"),
    ("", "cannot read scan script : No such file or directory"),
    ("COMPACT", "cannot read scan script COMPACT"),
    ("lossy", "incomplete"),
    ("five", "line 1"),
    ("dir", "dir is a directory"),
])
def test_bad_scan_script_is_one_line_and_leaves_nothing(choice, why, samples, tmp_path):
    src, _ = samples
    files = {"lossy": "0 1 2: 0 0 0 1;\n0: 1 63 0 0;\n1: 1 63 0 0;\n2: 1 63 0 0;\n",  # DC's last bit never sent
             "five": "0 1 2 3 4: 0 0 0 0;\n"}
    (tmp_path / "dir").mkdir()
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    store = tmp_path / "out" / "store"
    (tmp_path / "out").mkdir()
    done = fanfs("pack", src, store, "--scan-script", choice, check=False, cwd=tmp_path)
    assert done.returncode == 1 and done.stdout == "", done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fanfs: error: ") and why in lines[0], done.stderr
    assert os.listdir(tmp_path / "out") == []  # no store, no STORE.partial-*


# --- decode speed in fanfs fidelity ---------------------------------------------------------------


@pytest.fixture(scope="module")
def photo_store(tmp_path_factory):
    base = tmp_path_factory.mktemp("fidelity-speed")
    make_photo_set(base / "src" / "photos", 10)
    fanfs("pack", base / "src", base / "store", "--progressive-jpeg", "--quiet")
    return base / "src", base / "store"


def _positive(values: list[float]) -> bool:
    return bool(values) and all(math.isfinite(v) and v > 0 for v in values)


@pytest.mark.slow
def test_fidelity_reports_decode_speed_per_k(photo_store, tmp_path):
    src, store = photo_store
    plot = tmp_path / "curve.png"
    report = json.loads(fanfs("fidelity", store, "--sample", "8", "--timed", "5", "--source", src, "--json",
                              "--plot", plot).stdout)
    assert report["timed"] == 5 and report["with_source"] == 5
    assert len(report["decode_vs_full"]) == len(report["decode_vs_source"]) == len(report["ks"])
    assert _positive(report["decode_vs_full"]) and _positive(report["decode_vs_source"])
    assert report["decode_vs_full"][-1] == 1.0  # the last K is every image whole: the full presentation
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = fanfs("fidelity", store, "--sample", "8", "--timed", "3", "--source", src).stdout
    assert "decode vs orig" in text and "3 with their original" in text
    rows = [line.split() for line in text.splitlines() if line[:4].strip().isdigit()]
    assert rows and all(len(row) >= 6 and row[4].endswith("x") and row[5].endswith("x") for row in rows)


@pytest.mark.slow
def test_fidelity_without_timing_or_source(photo_store):
    src, store = photo_store
    report = json.loads(fanfs("fidelity", store, "--sample", "4", "--timed", "0", "--json").stdout)
    assert report["timed"] == 0 and report["decode_vs_full"] == [] == report["decode_vs_source"]
    assert "decode:" not in fanfs("fidelity", store, "--sample", "4", "--timed", "0").stdout
    report = json.loads(fanfs("fidelity", store, "--sample", "4", "--timed", "2", "--json").stdout)
    assert _positive(report["decode_vs_full"]) and report["decode_vs_source"] == [] and report["with_source"] == 0


@pytest.mark.slow
def test_fidelity_source_takes_only_the_real_originals(photo_store, tmp_path):
    src, store = photo_store
    partial = tmp_path / "partial" / "photos"
    partial.mkdir(parents=True)
    originals = sorted((src / "photos").iterdir())
    for path in originals[:5]:
        shutil.copy(path, partial / path.name)
    os.mkfifo(partial / originals[5].name)  # must be skipped, not waited on
    (partial / originals[6].name).write_bytes(originals[0].read_bytes())  # another image at that path
    report = json.loads(fanfs("fidelity", store, "--sample", "10", "--timed", "10", "--source", partial.parent,
                              "--json", timeout=120).stdout)
    assert report["timed"] == 10 and report["with_source"] == 5 and _positive(report["decode_vs_source"])
    wrong = tmp_path / "wrong" / "photos"
    wrong.mkdir(parents=True)
    for path in originals:
        (wrong / path.name).write_bytes(originals[0].read_bytes())
    (wrong / originals[0].name).write_bytes(originals[1].read_bytes())
    for source, why in ((wrong.parent, "no timed record has its original under"),
                        (tmp_path / "nosuch", "is not a directory"),
                        (originals[0], "is not a directory")):
        done = fanfs("fidelity", store, "--sample", "10", "--source", source, check=False)
        assert done.returncode == 1 and len(messages(done.stderr)) == 1 and why in done.stderr, done.stderr
    done = fanfs("fidelity", store, "--timed", "0", "--source", src, check=False)
    assert done.returncode == 1 and "needs --timed" in done.stderr
    done = fanfs("fidelity", store, "--timed", "-1", check=False)
    assert done.returncode == 2 and "0 or more" in done.stderr
