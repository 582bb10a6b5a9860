"""Issue 22: a store read in-process through fsspec (``fsspec.filesystem("fanfs", ...)``), no FUSE.

Real stores packed with the real command (the torture tree, real photos, JPEGs the transcoder refuses,
real float weights), compared with the source tree and with a real mount of the same store at the
same fidelity or precision: the same bytes, sizes and listings.  A bad copy is EIO, never wrong
bytes; every write is refused; the URL forms and the entry point work.  (The DataLoader side is in
test_fsspec_loader.py.)
"""

from __future__ import annotations

import configparser
import errno
import io
import logging
import os
import random
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import fsspec
import numpy as np
import pytest
from fanfs_command import fanfs
from float_samples import make_float_tree, original_files
from photo_samples import make_photo_set
from support.jpeg_samples import build_samples
from support.trees import SPARSE_SIZE, damaged_copy, make_torture_tree, tree_listing

from fanfs.errors import StoreError, UsageError
from fanfs.fsspec import FanfsFileSystem, ReadOnlyError
from fanfs.store.format import SHARD_DIR, shard_name
from fanfs.util.images import decode_pixels

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("fsspec")
    src = make_torture_tree(base / "src")
    build_samples(src / "samples")  # real JPEGs, a truncated and a fake one among them
    for c in range(3):
        make_photo_set(src / "photos" / f"class{c}", 6, seed=c)
    fanfs("pack", src, base / "plain", "--shard-size", "256K", "--quiet")
    fanfs("pack", src, base / "progressive", "--progressive-jpeg", "--shard-size", "256K", "--quiet")
    return {"src": src, "plain": base / "plain", "progressive": base / "progressive"}


def listing(fs: FanfsFileSystem) -> dict[bytes, tuple]:
    """What ``tree_listing`` says of a directory tree, from the file system's walk (mtimes as float seconds)."""
    out = {}
    for _, dirs, files in fs.walk("", detail=True):
        for info in [*dirs.values(), *files.values()]:
            whole = info["type"] == "directory"
            target = os.fsencode(info["destination"]) if info["islink"] else None
            out[os.fsencode(info["name"])] = (stat.S_IFMT(info["mode"]), stat.S_IMODE(info["mode"]),
                                              None if whole else info["size"], None if whole else info["mtime"], target)
    return out


def expected_listing(root: Path) -> dict[bytes, tuple]:
    return {rel: (kind, mode, size, None if mtime is None else mtime / 1e9, target)
            for rel, (kind, mode, size, mtime, target) in tree_listing(root).items()}


def regular_files(root: Path) -> list[str]:
    return [os.fsdecode(rel) for rel, (kind, _, size, _, _) in tree_listing(root).items()
            if kind == stat.S_IFREG and size != SPARSE_SIZE]  # the 5 GiB sparse file is read in ranges


@pytest.mark.parametrize("which", ["plain", "progressive"])
def test_full_fidelity_reads_back_the_source(stores, which):
    src = stores["src"]
    fs = fsspec.filesystem("fanfs", store=str(stores[which]))
    assert isinstance(fs, FanfsFileSystem)
    found, expected = listing(fs), expected_listing(src)  # names, types, modes, sizes, mtimes, link targets
    if which == "progressive":  # a record's size is its progressive transcode's (compared with a mount below)
        found, expected = ({rel: (k, m, t, target) for rel, (k, m, _, t, target) in d.items()} for d in (found, expected))
    assert found == expected
    records = 0
    for name in regular_files(src):
        original = (src / name).read_bytes()
        data = fs.cat_file(name)
        with fs.open(name) as f:
            assert f.read() == data and f.size == len(data) == fs.info(name)["size"]
        if data != original:  # only a JPEG stored as a progressive record: the same pixels
            assert which == "progressive" and fs.store.kind(fs.store.lookup(os.fsencode(name))).name == "jpeg", name
            assert np.array_equal(decode_pixels(data), decode_pixels(original)), name
            records += 1
    assert (records > 20) if which == "progressive" else records == 0
    assert fs.cat_file("samples/truncated.jpg") == (src / "samples" / "truncated.jpg").read_bytes()


@pytest.mark.slow
@pytest.mark.parametrize("fidelity", ["2", "auto:0.95"])
def test_fidelity_presents_what_the_mount_presents(stores, mount, fidelity):
    store = stores["progressive"]
    fs = fsspec.filesystem("fanfs", store=str(store), fidelity=fidelity)
    full = fsspec.filesystem("fanfs", store=str(store))
    with mount(store, "--fidelity", fidelity) as mnt:
        assert listing(fs) == expected_listing(mnt)  # sizes honest: those the mount's stat gives
        smaller = 0
        for name in regular_files(mnt):
            data = fs.cat_file(name)
            assert data == (mnt / name).read_bytes(), name
            assert fs.info(name)["size"] == len(data)
            smaller += len(data) < full.info(name)["size"]
        assert smaller > 20  # records really are presented at a K below full
    assert len(fs.stats()["stored_by_layer"]) <= fs.presentation.fidelity  # no layer above K was read


def test_float_records_at_a_precision_as_the_mount(tmp_path, mount):
    src = tmp_path / "src"
    make_float_tree(src)
    fanfs("pack", src, tmp_path / "store", "--float-records", "--quiet")
    exact = fsspec.filesystem("fanfs", store=str(tmp_path / "store"))
    fs = fsspec.filesystem("fanfs", store=str(tmp_path / "store"), precision=16)
    assert fsspec.filesystem("fanfs", store=str(tmp_path / "store"), precision="16") is not None
    files = original_files(src)
    with mount(tmp_path / "store", "--precision", "16") as mnt:
        changed = 0
        for path in files:
            data = fs.cat_file(path)
            assert data == (mnt / path).read_bytes(), path
            assert fs.info(path)["size"] == (mnt / path).stat().st_size == len(data)
            assert exact.cat_file(path) == (src / path).read_bytes(), path
            changed += data != exact.cat_file(path)
        assert changed > 5


def test_listing_paths_and_links(stores):
    src = stores["src"]
    fs = fsspec.filesystem("fanfs", store=str(stores["plain"]))
    names = {os.fsdecode(rel): kind for rel, (kind, *_) in tree_listing(src).items()}
    assert fs.find("") == sorted(n for n, kind in names.items() if kind != stat.S_IFDIR)
    assert fs.find("", withdirs=True) == sorted(names)
    assert fs.ls("train", detail=False) == ["train/cat", "train/dog"]
    assert fs.ls("/train/cat/1.txt", detail=False) == ["train/cat/1.txt"]
    assert [top for top, _, _ in fs.walk("", maxdepth=1)] == [""]
    assert fs.isdir("empty_dir/deeper_empty") and fs.ls("empty_dir/deeper_empty") == []
    text = (src / "train" / "cat" / "1.txt").read_bytes()
    for path in ("/train/cat/1.txt", "fanfs://train/cat/1.txt", "train//cat/./1.txt", "train/dog/../cat/1.txt",
                 "link_rel", "link_dir/cat/1.txt", "link_dir/../train/cat/1.txt"):
        assert fs.cat_file(path) == text, path
    link = fs.info("link_rel")  # a link is followed, as os.stat and fsspec's local info do
    assert (link["type"], link["size"], link["islink"], link["destination"]) == ("file", len(text), True, "train/cat/1.txt")
    assert fs.info("link_dir")["type"] == "directory" and fs.ls("link_dir", detail=False) == ["link_dir/cat", "link_dir/dog"]
    assert {i["name"]: i["type"] for i in fs.ls("")}["link_dir"] == "other"  # listed as it is: walk stays out
    for path, error in (("link_dangling", FileNotFoundError), ("nothing/here", FileNotFoundError),
                        ("../train", FileNotFoundError), ("train/cat/1.txt/x", NotADirectoryError),
                        ("train", IsADirectoryError)):
        with pytest.raises(error):
            fs.cat_file(path)
    assert not fs.exists("link_dangling") and fs.exists("link_rel") and fs.isfile("link_rel")
    assert fs.modified("train/dog/1.bin").timestamp() == pytest.approx(1_000_000_000.123_457, abs=1e-6)
    with pytest.raises(FileNotFoundError):
        fs.open("nothing")


def test_ranges_seeks_and_text(stores):
    src = stores["src"]
    fs = fsspec.filesystem("fanfs", store=str(stores["plain"]))
    name = "train/dog/multi_chunk.bin"  # 4 MiB + 777 bytes: five independently compressed chunks
    data = (src / name).read_bytes()
    n, chunk = len(data), 1 << 20
    rng = random.Random(0)
    cases = [(None, None), (0, 0), (5, 3), (-10, None), (None, -10), (-(1 << 40), 10), (n - 5, n + 100), (n + 5, None),
             (chunk - 3, chunk + 3), (chunk, 2 * chunk), (3, -(1 << 40)), (-5, -2)]
    cases += [tuple(sorted(rng.randrange(-n, n + 10) for _ in range(2))) for _ in range(40)]
    for start, end in cases:
        assert fs.cat_file(name, start, end) == data[start:end], (start, end)
    assert fs.cat_ranges([name] * 3, [0, chunk - 1, -4], [4, chunk + 1, None]) == [data[:4], data[chunk - 1:chunk + 1], data[-4:]]
    assert fs.cat_file("sparse.img", (1 << 32) + 100, (1 << 32) + 109) == b"past-4GiB"
    assert fs.cat_file("sparse.img", 0, 4) == b"head" and fs.cat_file("sparse.img", -3) == bytes(3)
    with fs.open(name) as f, io.BytesIO(data) as reference:  # the same random operations on both
        for _ in range(300):
            op = rng.randrange(5)
            if op == 0:
                whence = rng.randrange(3)
                offset = rng.randrange(n + 10) - (0, reference.tell(), n)[whence]
                assert f.seek(offset, whence) == reference.seek(offset, whence)
            elif op == 1:
                size = rng.choice([0, 1, 7, 4096, chunk + 5, -1])
                assert f.read(size) == reference.read(size)
            elif op == 2:
                assert f.readline() == reference.readline()
            elif op == 3:
                want = bytearray(rng.randrange(1, 70_000))
                got = bytearray(len(want))
                assert f.readinto(got) == reference.readinto(want) and got == want
            assert f.tell() == reference.tell()
    assert f.closed and f.path == name and f.info()["size"] == n and isinstance(f, io.BufferedIOBase)
    with pytest.raises(io.UnsupportedOperation):
        f.write(b"x")
    with fs.open("sparse.img") as f:
        f.seek(-3, os.SEEK_END)
        assert f.read() == bytes(3) and f.read() == b""
    lines = (src / "exec.sh").read_text().splitlines(keepends=True)
    with fs.open("exec.sh", "r") as f:
        assert f.readlines() == lines
    with fsspec.open("fanfs://exec.sh", "rt", store=str(stores["plain"])) as f:
        assert list(f) == lines


def test_a_bad_copy_is_eio_never_wrong_bytes(stores, tmp_path, caplog):
    src = stores["src"]
    victim = "train/dog/1.bin"
    bad = tmp_path / "bad"
    shard = damaged_copy(stores["plain"], bad, victim.encode(), at=100)
    fs = fsspec.filesystem("fanfs", store=str(bad))
    caplog.set_level(logging.WARNING, logger="fanfs")

    def read_open() -> bytes:
        with fs.open(victim) as f:
            return f.read()

    for read in (lambda: fs.cat_file(victim), read_open, lambda: fs.cat_file(victim, 0, 10), lambda: fs.cat(victim)):
        with pytest.raises(OSError) as info:
            read()
        message = str(info.value)
        assert info.value.errno == errno.EIO and "\n" not in message
        assert victim in message and f"shard {shard_name(shard)}" in message and "checksum mismatch" in message
    logged = [r for r in caplog.records if victim in r.getMessage()]
    assert len(logged) == 1 and logged[0].getMessage().startswith("EIO ")  # once, not once per retry
    for name in regular_files(src):
        if name != victim:
            assert fs.cat_file(name) == (src / name).read_bytes()
    assert fs.stats()["errors"] == 4

    cut = tmp_path / "cut"  # a shard cut short after the store was opened: EIO for its files
    shutil.copytree(stores["plain"], cut)
    fs = fsspec.filesystem("fanfs", store=str(cut))
    shard = int(fs.store.index.shard[fs.store.lookup(victim.encode())])
    os.truncate(cut / SHARD_DIR / shard_name(shard), 100)
    with pytest.raises(OSError) as info:
        fs.cat_file(victim)
    assert info.value.errno == errno.EIO and "short read" in str(info.value)


def test_the_shards_checked_at_open_are_the_ones_read_also_by_forked_workers(stores, tmp_path):
    """The descriptors the open check made are kept (a DataLoader worker forked from the process that opened the
    store inherits them instead of opening every shard again): what the open checked is what is read, even
    once the files are gone, and a store missing a shard is still refused at open."""
    src, gone = stores["src"], tmp_path / "gone"
    shutil.copytree(stores["plain"], gone)
    fs = fsspec.filesystem("fanfs", store=str(gone), skip_instance_cache=True)
    shutil.rmtree(gone / SHARD_DIR)
    names = regular_files(src)
    pid = os.fork()
    if pid == 0:  # a worker: exits 0 only if it read every file right
        ok = False
        try:
            ok = all(fs.cat_file(name) == (src / name).read_bytes() for name in names)
        finally:
            os._exit(0 if ok else 1)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    assert all(fs.cat_file(name) == (src / name).read_bytes() for name in names)
    with pytest.raises(StoreError, match=f"incomplete store: shard {shard_name(0)} is missing"):
        fsspec.filesystem("fanfs", store=str(gone), skip_instance_cache=True)


def test_every_write_is_refused(stores, tmp_path):
    store = stores["plain"]
    fs = fsspec.filesystem("fanfs", store=str(store))
    before = sorted((p, p.stat().st_size, p.stat().st_mtime_ns) for p in store.rglob("*"))
    local = tmp_path / "local.txt"
    local.write_text("x")
    name = "train/cat/1.txt"
    attempts = {
        "open wb": lambda: fs.open("new.bin", "wb"), "open ab": lambda: fs.open(name, "ab"),
        "open r+b": lambda: fs.open(name, "r+b"), "open w": lambda: fs.open(name, "w"),
        "pipe_file": lambda: fs.pipe_file(name, b"x"), "pipe": lambda: fs.pipe({name: b"x"}),
        "write_bytes": lambda: fs.write_bytes(name, b"x"), "write_text": lambda: fs.write_text(name, "x"),
        "touch": lambda: fs.touch(name), "mkdir": lambda: fs.mkdir("d"), "makedirs": lambda: fs.makedirs("d/e"),
        "mkdirs": lambda: fs.mkdirs("d"), "rm": lambda: fs.rm(name), "rm_file": lambda: fs.rm_file(name),
        "rm recursive": lambda: fs.rm("train", recursive=True), "rmdir": lambda: fs.rmdir("empty_dir/deeper_empty"),
        "mv": lambda: fs.mv(name, "moved"), "copy": lambda: fs.copy(name, "copied"), "cp_file": lambda: fs.cp_file(name, "c"),
        "put": lambda: fs.put(str(local), "up"), "put_file": lambda: fs.put_file(str(local), "up"),
        "upload": lambda: fs.upload(str(local), "up"), "delete": lambda: fs.delete(name),
        "url": lambda: fsspec.open("fanfs://new.bin", "wb", store=str(store)).open(),
    }
    for what, attempt in attempts.items():
        with pytest.raises(ReadOnlyError) as info:
            attempt()
        assert info.value.errno == errno.EROFS and isinstance(info.value, NotImplementedError), what
        assert "read-only" in str(info.value), what
    assert sorted((p, p.stat().st_size, p.stat().st_mtime_ns) for p in store.rglob("*")) == before
    assert fs.cat_file(name) == (stores["src"] / name).read_bytes()


def test_url_forms(stores):
    src, store = stores["src"], stores["plain"]
    text = (src / "train" / "cat" / "1.txt").read_bytes()
    with fsspec.open("fanfs://train/cat/1.txt", store=str(store)) as f:
        assert f.read() == text
    with fsspec.open(f"fanfs://train/cat/1.txt::{store}") as f:  # the store in the URL, as zip:// takes its archive
        assert f.read() == text
    fs, path = fsspec.core.url_to_fs(f"fanfs://photos::{store}")
    assert isinstance(fs, FanfsFileSystem) and path == "photos" and len(fs.ls(path)) == 3
    files = fsspec.open_files("fanfs://photos/*/*.jpg", store=str(store))
    assert len(files) == 18
    for of in files:
        with of as f:
            assert f.read() == (src / of.path).read_bytes()
    with pytest.raises(UsageError, match="local directory"):
        fsspec.open(f"fanfs://train/cat/1.txt::memory://{store}").open()


def test_bad_options_are_one_line(stores, tmp_path):
    plain, progressive = str(stores["plain"]), str(stores["progressive"])
    for kwargs, message in (({}, "say which store"), ({"store": str(tmp_path / "none")}, "no such store directory"),
                            ({"store": plain, "fidelity": 3}, "holds no files whose fidelity can be chosen"),
                            ({"store": progressive, "fidelity": 99}, "fidelity 99 is out of range"),
                            ({"store": progressive, "fidelity": "auto:2"}, "bad fidelity"),
                            ({"store": progressive, "fidelity": 2.5}, "fidelity must be a whole number"),
                            ({"store": progressive, "precision": "sixteen"}, "bad precision"),
                            ({"store": progressive, "precision": 16}, "holds no files whose precision"),
                            ({"store": plain, "cache_size": "lots"}, "bad cache_size"),
                            ({"store": plain, "fidelty": 2}, "unknown option 'fidelty'"),
                            ({"store": plain, "fo": plain}, "name the store once")):
        with pytest.raises((StoreError, UsageError), match=message) as info:
            FanfsFileSystem(**kwargs, skip_instance_cache=True)
        assert "\n" not in str(info.value)


def test_the_entry_point_registers_the_protocol(stores, tmp_path):
    """setup.cfg's ``fsspec.specs`` entry point, installed as pip installs it, lets fsspec find the file system
    in a fresh interpreter that never imports fanfs itself."""
    config = configparser.ConfigParser()
    config.read(REPO / "setup.cfg")
    specs = config["options.entry_points"]["fsspec.specs"].strip()
    assert specs == "fanfs = fanfs.fsspec:FanfsFileSystem"
    dist = tmp_path / "fanfs_specs-0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: fanfs-specs\nVersion: 0\n")
    (dist / "entry_points.txt").write_text(f"[fsspec.specs]\n{specs}\n")
    code = ("import sys, fsspec; fs = fsspec.filesystem('fanfs', store=sys.argv[1]); "
            "print(type(fs).__module__, fs.cat_file('train/cat/1.txt')[:4])")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", code, str(stores["plain"])], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["fanfs.fsspec.filesystem", "b'meow'"]


EDITABLE_INSTALL = """\
import sys
from importlib.machinery import PathFinder

class Editable:  # as setuptools' editable install finds the package's modules: in its checkout, whatever sys.path says
    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        return PathFinder.find_spec(fullname, [sys.argv[1]]) if fullname.rpartition(".")[0] == "fanfs" else None

sys.meta_path.insert(0, Editable)
"""


def test_a_folder_named_fanfs_beside_a_script_is_named_by_the_error(stores, tmp_path):
    """Issue 41: a script beside a directory named fanfs (a checkout) imports that folder as ``fanfs``, and fsspec's
    entry point then failed with "cannot import name '__version__' from 'fanfs' (unknown location)".  Now the error
    under fsspec's says what is wrong and where, in one line; fanfs.train too."""
    dist = tmp_path / "entry" / "fanfs_specs-0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: fanfs-specs\nVersion: 0\n")
    (dist / "entry_points.txt").write_text("[fsspec.specs]\nfanfs = fanfs.fsspec:FanfsFileSystem\n")
    (tmp_path / "work" / "fanfs" / "notes").mkdir(parents=True)
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "entry")}  # not the checkout: there, fanfs/ would win
    for name, code in (("reads.py", "import fsspec\nfsspec.filesystem('fanfs', store=sys.argv[2])\n"),
                       ("trains.py", "import fanfs.train\n")):
        (tmp_path / "work" / name).write_text(EDITABLE_INSTALL + code)
        done = subprocess.run([sys.executable, tmp_path / "work" / name, REPO / "fanfs", stores["plain"]],
                              capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
        said = [line for line in done.stderr.splitlines() if line.startswith("ImportError: fanfs:")]
        assert done.returncode == 1 and said == [
            f"ImportError: fanfs: the directory {tmp_path / 'work' / 'fanfs'} shadows the installed fanfs package "
            "('import fanfs' finds a folder named fanfs there first: beside the script, or in the current directory): "
            "rename that folder, or run from another directory"], done.stderr
        assert "__version__" not in done.stderr


def test_fanfs_and_its_command_line_never_import_fsspec():
    code = ("import sys, fanfs, fanfs.store, fanfs.serve.fusefs, fanfs.cli.main, fanfs.cli.serve; "
            "assert 'fsspec' not in sys.modules, 'fsspec imported'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
