"""Issue 4: compressor selection per content class under a rate constraint, plans, and pack --plan."""

from __future__ import annotations

import glob
import io
import json
import re
import os
import shutil
import struct
import sysconfig
from pathlib import Path

import numpy as np
import pytest
from fanfs_command import fanfs
from support.trees import sha256_file

from fanfs.pack.classify import CLASSES, classify, float_width
from fanfs.codecs import BytePlanes, CodecError, codec_from_config
from fanfs.pack.plan import Plan, PlanError
from fanfs.pack.select import Demand, SelectError, make_plan, parse_rate, select
from fanfs.pack.select.decide import TIE, decide
from fanfs.store import Store

STDLIB = Path(sysconfig.get_paths()["stdlib"])


def _photos() -> list[Path]:
    import sklearn
    return sorted((Path(sklearn.__file__).parent / "datasets" / "images").glob("*.jpg"))


def _npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


def _weights(rng: np.random.Generator, n: int) -> np.ndarray:
    """Weight-like float32: a real trained layer is near-Gaussian with a small spread."""
    return (rng.standard_normal(n) * 0.02).astype(np.float32)


def make_mixed_tree(root: Path, n_text: int = 120) -> Path:
    """Real Python sources, real photos, float arrays and a little already-compressed data."""
    (root / "text").mkdir(parents=True)
    (root / "photos").mkdir()
    (root / "arrays").mkdir()
    sources = sorted(p for p in STDLIB.glob("**/*.py") if 2_000 < p.stat().st_size < 60_000)[:n_text]
    for i, p in enumerate(sources):
        shutil.copyfile(p, root / "text" / f"{i:04d}_{p.name}")
    for p in _photos():
        shutil.copyfile(p, root / "photos" / p.name)
    rng = np.random.default_rng(7)
    for i in range(3):
        (root / "arrays" / f"layer{i}.npy").write_bytes(_npy(_weights(rng, 150_000 + 7 * i)))
    (root / "arrays" / "big.npy").write_bytes(_npy(_weights(rng, 700_000)))  # > 1 MiB: chunked
    import gzip
    (root / "text.tar.gz").write_bytes(gzip.compress(b"".join(p.read_bytes() for p in sources[:5])))
    return root


@pytest.fixture(scope="module")
def mixed(tmp_path_factory) -> Path:
    return make_mixed_tree(tmp_path_factory.mktemp("mixed") / "src")


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> Path:
    """Text and one photo: enough for the command-line runs, quick to measure."""
    root = tmp_path_factory.mktemp("small") / "src"
    (root / "text").mkdir(parents=True)
    sources = sorted(p for p in STDLIB.glob("**/*.py") if 2_000 < p.stat().st_size < 60_000)[:48]
    for i, p in enumerate(sources):
        shutil.copyfile(p, root / "text" / f"{i:04d}_{p.name}")
    shutil.copyfile(_photos()[0], root / "photo.jpg")
    return root


@pytest.fixture(scope="module")
def measured(mixed):
    """One measurement of the mixed tree (the slow part), re-decided under different demands."""
    sel = select(str(mixed), Demand(), fraction=0.02, cap=1 << 20, timing=0.04)  # quicker, noisier timings
    return sel


# ---------------------------------------------------------------------------------------------------
# classes and the byte-planes codec


def test_classify_by_content(tmp_path):
    assert classify(_photos()[0].read_bytes()) == "jpeg"
    import skimage
    assert classify((Path(skimage.__file__).parent / "data" / "astronaut.png").read_bytes()) == "png"
    assert classify(_npy(np.zeros(10, np.float32))) == "float"
    assert float_width(_npy(np.zeros(10, np.float16))) == 2
    assert float_width(_npy(np.zeros(10, ">f8"))) == 8
    assert classify(_npy(np.zeros(10, np.int64))) == "binary"
    header = json.dumps({"w": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 8]}}).encode()
    assert classify(struct.pack("<Q", len(header)) + header + bytes(8)) == "float"
    import gzip
    import zstandard
    assert classify(gzip.compress(b"abc")) == "compressed"
    assert classify(zstandard.ZstdCompressor().compress(b"abc")) == "compressed"
    assert classify((STDLIB / "os.py").read_bytes()) == "text"
    assert classify("naïve café ".encode() * 400) == "text"  # cut in the middle of a character at SNIFF
    assert classify(b"ELF\x00\x01\x02" + os.urandom(100)) == "binary"
    assert classify(b"") == "binary"


@pytest.mark.parametrize("width", [2, 4, 8])
def test_byte_planes_round_trip_any_length(width):
    rng = np.random.default_rng(width)
    codec = codec_from_config({"id": "planes", "width": width, "level": 3})
    assert isinstance(codec, BytePlanes) and codec.get_config() == {"id": "planes", "width": width, "level": 3}
    for n in [0, 1, width - 1, width, width + 1, 2 * width + 1, 1000, 4093, (1 << 20) + 3]:
        data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        assert codec.decode(codec.encode(data), n) == data, n
    floats = _weights(rng, 100_000).tobytes() + b"xyz"
    packed = codec.encode(floats)
    assert codec.decode(packed, len(floats)) == floats
    with pytest.raises(CodecError):
        codec_from_config({"id": "planes", "width": 3, "level": 3})


def test_byte_planes_beat_plain_zstd_on_weights():
    data = _weights(np.random.default_rng(0), 500_000).tobytes()
    planes = len(BytePlanes(4, 3).encode(data))
    plain = len(codec_from_config({"id": "zstd", "level": 3}).encode(data))
    assert planes < plain


# ---------------------------------------------------------------------------------------------------
# the choice


def _text(sel):
    return next(cr for cr in sel.classes if cr.name == "text")


@pytest.mark.slow
def test_every_class_measured_with_every_candidate(measured):
    names = {cr.name for cr in measured.classes}
    assert {"text", "jpeg", "float", "compressed"} <= names
    text = _text(measured)
    specs = {c.spec for c in text.candidates}
    assert {"raw", "lz4", "lz4:12"} <= specs
    assert {f"zstd:{level}" for level in range(1, 20)} <= specs
    assert any(c.family == "zstd+dict" for c in text.candidates)  # small files: a dictionary is tried
    floats = next(cr for cr in measured.classes if cr.name == "float")
    assert any(c.family == "planes" and c.codec.width == 4 for c in floats.candidates)
    assert not any(c.family == "planes" for c in text.candidates)
    for c in text.candidates:
        assert c.ratio > 0 and (c.family == "raw" or c.encode_Bps > 0)
        assert c.decode_Bps is None or c.decode_Bps > 0


@pytest.mark.slow
def test_demanding_rate_picks_faster_codec_relaxed_picks_best_ratio(measured):
    relaxed = decide(measured.sample, Demand(mode="async", rate=1e3), measured.classes)
    picks = {cr.name: (cr.chosen, max(c.ratio for c in cr.candidates)) for cr in relaxed.classes}
    for name, (pick, best) in picks.items():
        assert pick.ratio >= best * (1 - TIE), name  # relaxed: the best ratio
    relaxed_text = picks["text"][0]
    assert relaxed_text.ratio > 2.5 and relaxed_text.family != "raw"
    # a rate the relaxed choice cannot keep up with, derived from the measurement itself
    rate = Demand(mode="async").rate_for(relaxed_text.decode_Bps) * 1.5
    demanding = decide(measured.sample, Demand(mode="async", rate=rate), measured.classes)
    pick = _text(demanding).chosen
    assert pick.decode_speed() > relaxed_text.decode_Bps
    assert pick.decode_speed() >= demanding.required_Bps and pick.feasible
    assert not next(c for c in _text(demanding).candidates if c.spec == relaxed_text.spec).feasible
    assert pick.ratio <= relaxed_text.ratio
    assert demanding.feasible  # raw always keeps up: a speed demand alone never makes it infeasible


@pytest.mark.slow
def test_sync_is_stricter_than_async(measured):
    rate = 50e6
    sync = decide(measured.sample, Demand(mode="sync", rate=rate, overhead=0.05, threads=2), measured.classes)
    assert sync.required_Bps == pytest.approx(rate / (2 * 0.05))
    asyn = decide(measured.sample, Demand(mode="async", rate=rate, headroom=0.2, threads=2), measured.classes)
    assert asyn.required_Bps == pytest.approx(rate * 1.2 / 2)
    assert sync.required_Bps > asyn.required_Bps


@pytest.mark.slow
def test_only_raw_is_said_so(measured):
    sel = decide(measured.sample, Demand(mode="sync", rate=1e12), measured.classes)
    text = _text(sel)
    assert text.chosen.spec == "raw"
    assert any("only raw keeps up" in note for note in text.notes)


@pytest.mark.slow
def test_capacity_headroom_and_infeasible(measured):
    total = measured.sample.bytes
    fits = decide(measured.sample, Demand(rate=1e3, capacity=total, nodes=2, replicas=2), measured.classes)
    assert fits.feasible and fits.capacity["fits"] and fits.capacity["headroom_bytes"] > 0
    short = decide(measured.sample, Demand(rate=1e3, capacity=total // 20, nodes=2, replicas=2), measured.classes)
    assert not short.feasible and not short.capacity["fits"]
    assert "infeasible" in short.problems[0] and "would fit with" in short.problems[0]
    assert any(fix.startswith("nodes >=") for fix in short.capacity["would_fit_with"])
    with pytest.raises(SelectError):
        Demand(capacity=1 << 30, nodes=1, replicas=2)


def test_rate_units():
    assert parse_rate("800MB/s") == 800e6
    assert parse_rate("1.5GB/s") == 1.5e9
    assert parse_rate("200MiB/s") == 200 * 2**20
    assert parse_rate("3000") == 3000
    with pytest.raises(SelectError):
        parse_rate("fast")


# ---------------------------------------------------------------------------------------------------
# the command


@pytest.mark.parametrize("timing", ["0", "-1", "nan", "inf", "soon"])
def test_bad_timing_is_one_line(small, timing):
    done = fanfs("select", small, "--timing", timing, check=False)
    assert done.returncode == 2 and "--timing: expected a number of seconds, above 0" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.slow
def test_select_cli_json_plan_and_plot(small, tmp_path):
    plan_file, png = tmp_path / "plan.json", tmp_path / "pareto.png"
    done = fanfs("select", small, "--timing", "0.04", "--rate", "1MB/s", "--sample-cap", "512K", "--json", "-o", plan_file,
                 "--plot", png, "--jobs", "2")
    report = json.loads(done.stdout)
    assert report["feasible"] and report["demand"]["mode"] == "sync"  # a mount's, as README advises (issue 29)
    for cls in report["classes"]:
        assert cls["class"] in CLASSES and set(cls["chosen"]) >= {"id"}
        assert sum(c["chosen"] for c in cls["candidates"]) == 1
        for c in cls["candidates"]:
            assert {"codec", "ratio", "encode_MBps", "decode_MBps", "feasible"} <= set(c)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    plan = Plan.load(str(plan_file))
    text = next(c for c in report["classes"] if c["class"] == "text")
    assert plan.table["text"]["codec"] == text["chosen"]
    table = fanfs("select", small / "text", "--timing", "0.04", "--rate", "1MB/s", "--sample-cap", "256K", "--mode", "sync").stdout
    assert "candidate" in table and "<== chosen" in table and "decode >=" in table
    assert re.search(r" \d[\d.]* [MGk]B/s ", table) and not re.search(r"\d,\d{3}\.\d", table)  # 3 digits and a unit
    every = fanfs("select", small / "text", "--timing", "0.04", "--rate", "1MB/s", "--sample-cap", "256K", "--all").stdout
    assert "(--all shows them)" in table and len(every.splitlines()) > len(table.splitlines()) + 5


@pytest.mark.slow
def test_infeasible_is_reported_and_writes_no_plan(small, tmp_path):
    plan_file = tmp_path / "plan.json"
    done = fanfs("select", small / "text", "--timing", "0.04", "--rate", "1MB/s", "--sample-cap", "1M", "--capacity", "100K", "--nodes", "2",
                 "--replicas", "2", "-o", plan_file, check=False)
    assert done.returncode == 1
    assert "DOES NOT FIT" in done.stdout and "INFEASIBLE" in done.stdout
    assert "fanfs: error: infeasible" in done.stderr and "would fit with" in done.stderr
    assert "no plan written" in done.stderr
    assert not plan_file.exists()


# ---------------------------------------------------------------------------------------------------
# plans through pack and mount


def _dictionary_plan(src: Path) -> Plan:
    import zstandard
    samples = [p.read_bytes() for p in sorted((src / "text").iterdir())]
    dictionary = zstandard.train_dictionary(16 << 10, samples).as_bytes()
    return Plan({"text": {"codec": {"id": "zstd", "level": 9, "dict": "text"}, "ratio": 4.0},
                 "float": {"codec": {"id": "planes", "width": 4, "level": 3}, "ratio": 1.2},
                 "jpeg": {"codec": {"id": "raw"}, "ratio": 1.0}},
                {"text": dictionary}, {"constraint": {"mode": "async"}})


def test_plan_file_round_trip(mixed, tmp_path):
    plan = _dictionary_plan(mixed)
    path = tmp_path / "plan.json"
    plan.save(str(path))
    data = json.loads(path.read_text())
    assert data["fanfs_plan"] == 1 and isinstance(data["dictionaries"]["text"], str)
    again = Plan.load(str(path))
    assert again.codecs() == plan.codecs() and again.dictionaries() == plan.dictionaries()
    assert len(again.codecs()) == len(CLASSES)
    text = (STDLIB / "os.py").read_bytes()
    assert again.codecs()[again.codec_index(text)].get_config() == {"id": "zstd", "level": 9, "dict": "text"}
    assert again.classes()[again.codec_index(_photos()[0].read_bytes())] == "jpeg"
    assert again.table["binary"]["measured"] is False  # unseen class: the conservative default


@pytest.mark.slow
def test_dictionary_round_trips_through_pack_and_mount(mixed, tmp_path, mount):
    plan = _dictionary_plan(mixed)
    plan_file, store = tmp_path / "plan.json", tmp_path / "store"
    plan.save(str(plan_file))
    fanfs("pack", mixed, store, "--plan", plan_file, "--quiet", "--shard-size", "1M", "--jobs", "2")
    opened = Store(str(store), check_shards=False)
    assert opened.index.dictionaries == {"text": plan.dictionaries()["text"]}
    info = json.loads(fanfs("info", store, "--json").stdout)
    classes = {c["class"]: c for c in info["classes"]}
    assert classes["text"]["codec"] == "zstd:9+dict:text" and classes["text"]["files"] == 120
    assert classes["text"]["ratio"] > 2.5
    assert classes["float"]["codec"] == "planes:3" and classes["float"]["files"] == 4
    assert classes["jpeg"]["codec"] == "raw"
    text_info = fanfs("info", store).stdout
    assert "class (plan)" in text_info and "zstd:9+dict:text" in text_info
    assert fanfs("verify", store, "--against", mixed, "--quiet").stdout.startswith("ok:")
    with mount(store) as mnt:
        for path in sorted(glob.glob(str(mixed / "**" / "*"), recursive=True)):
            if os.path.isfile(path):
                rel = os.path.relpath(path, mixed)
                assert sha256_file(os.path.join(mnt, rel)) == sha256_file(path), rel


def _pack_with_plan(tmp_path, mixed, content):
    plan_file = tmp_path / "bad.json"
    plan_file.write_text(content if isinstance(content, str) else json.dumps(content))
    return fanfs("pack", mixed, tmp_path / "store", "--plan", plan_file, "--quiet", check=False)


@pytest.mark.parametrize("content, message", [
    ({"fanfs_plan": 2, "classes": {}}, "version 2 plan"),
    ({"fanfs_plan": 1, "classes": {"text": {"codec": {"id": "brotli", "level": 5}}}}, "unknown codec"),
    ({"fanfs_plan": 1, "classes": {"text": {"codec": {"id": "zstd", "level": 99}}}}, "out of range"),
    ({"fanfs_plan": 1, "classes": {"text": {"codec": {"id": "zstd", "level": 3, "dict": "t"}}}}, "dictionary 't'"),
    ({"fanfs_plan": 1, "classes": {"audio": {"codec": {"id": "raw"}}}}, "unknown content class"),
    ({"fanfs_plan": 1, "classes": {}, "dictionaries": {"t": "***"}}, "not valid base64"),
    ({"codecs": []}, "not a fanfs plan"),
    ("{broken", "not a fanfs plan"),
])
def test_bad_plans_are_refused_clearly(mixed, tmp_path, content, message):
    done = _pack_with_plan(tmp_path, mixed, content)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fanfs: error: ") and message in lines[0], done.stderr
    assert not (tmp_path / "store").exists()
    with pytest.raises(PlanError):
        Plan.load(str(tmp_path / "bad.json"))


@pytest.mark.slow
def test_selected_plan_packs_and_reads_back(mixed, measured, tmp_path, mount):
    sel = decide(measured.sample, Demand(rate=1e3), measured.classes)
    plan_file, store = tmp_path / "plan.json", tmp_path / "store"
    make_plan(sel).save(str(plan_file))
    fanfs("pack", mixed, store, "--plan", plan_file, "--quiet")
    info = json.loads(fanfs("info", store, "--json").stdout)
    chosen = {cr.name: cr.chosen for cr in sel.classes}
    for c in info["classes"]:
        if c["class"] in chosen and c["files"]:
            assert c["codec"] == chosen[c["class"]].spec
            assert c["predicted_ratio"] == pytest.approx(chosen[c["class"]].ratio, rel=1e-3)
    with mount(store) as mnt:
        for p in sorted((mixed / "text").iterdir())[:20] + sorted((mixed / "arrays").iterdir()):
            assert (mnt / p.relative_to(mixed)).read_bytes() == p.read_bytes()


@pytest.mark.slow
def test_float_class_measures_float_records_and_elf_and_a_plan_can_choose_them(tmp_path):
    """Issue 12.4: real weights; ELF only when select is given --float-error; pack --plan makes the records."""
    from float_samples import silero
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(silero(), src / "silero.safetensors")
    plain = json.loads(fanfs("select", src, "--timing", "0.04", "--json", "--sample-cap", "1M").stdout)
    floats = next(c for c in plain["classes"] if c["class"] == "float")
    families = {c["spec"].split("+")[0] for c in floats["candidates"]}
    assert "float" in families and not any(f.startswith("elf") for f in families)
    lossless = [c for c in floats["candidates"] if c["spec"].startswith("float+")]
    assert all(c["record"] == {"kind": "float", "elf": False, "error": None} and c["decode_MBps"] > 0 for c in lossless)
    assert max(c["ratio"] for c in lossless) > 1.2  # silero: ~1.28 as float records
    plan_file = tmp_path / "plan.json"
    report = json.loads(fanfs("select", src, "--timing", "0.04", "--json", "--sample-cap", "1M", "--float-error", "1e-4",
                              "-o", plan_file).stdout)
    floats = next(c for c in report["classes"] if c["class"] == "float")
    chosen = next(c for c in floats["candidates"] if c["chosen"])
    assert chosen["spec"].startswith("elf:0.0001+") and chosen["ratio"] > 2  # ELF 1e-4 beats every lossless form
    assert Plan.load(str(plan_file)).record("float") == {"kind": "float", "elf": True, "error": 1e-4}
    store = tmp_path / "store"
    done = fanfs("pack", src, store, "--plan", plan_file, "--quiet")
    assert "1 float records" in done.stdout and "LOSSY" in done.stderr
    info = fanfs("info", store).stdout
    assert "LOSSY" in info and "elf:0.0001+zstd" in info
    assert fanfs("verify", store, "--against", src, "--quiet").stdout.startswith("ok:")


def test_a_blob_compression_barely_shrinks_is_stored_raw(tmp_path):
    """Compression that saves under 1/16 of a blob is not kept: every read would pay a decode for next to nothing
    (as zstd does on a JPEG: ~3%).  A blob it shrinks by more is stored compressed, and both read back exact."""
    src = tmp_path / "src"
    src.mkdir()
    rng = np.random.default_rng(7)
    barely = rng.integers(0, 256, 96_000, dtype=np.uint8).tobytes() + bytes(3_000)  # zstd saves ~3%
    (src / "barely.bin").write_bytes(barely)
    (src / "text.txt").write_bytes(b"compressible line\n" * 5_000)
    fanfs("pack", src, tmp_path / "store", "--codec", "zstd:3", "--quiet")
    s = Store(str(tmp_path / "store"))
    for name, stored_raw in (("barely.bin", True), ("text.txt", False)):
        entry = s.lookup(name.encode())
        blob = int(s.index.first[entry])
        assert (s.index.blob_stored[blob] == s.index.blob_raw[blob]) == stored_raw, name
        assert s.read_file(name) == (src / name).read_bytes()
    s.close()
