"""Issue 27: pack straight from archives, as datasets ship: tar in every format and compression, zip, a tar on
standard input, archives of archives (ImageNet's tar of class tars), several archives merged into one tree.

Each pack of an archive must hold exactly what the pack of the same tree as a directory holds: ``verify
--against`` the directory compares every entry's type, mode, mtime, symlink target and bytes (pixels for JPEG
records), and the sources again as archives; a mount reads it back byte-exact.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest
from fanfs_command import FANFS, fanfs
from support.archives import COMPRESS, MTIME, gnu_tar, make_dataset, member, tar_bytes, zip_of

from fanfs.ingest.streams import ByteStream
from fanfs.ingest.tar import TarReader
from fanfs.store import Store
from fanfs.util.images import decode_pixels

pytestmark = pytest.mark.in_process_too  # issue 48: every read test of the mount, in-process too

RECORDS = ("--progressive-jpeg", "--scales", "2", "--float-records")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("archives") / "src")


def _check_against(store: Path, *sources: Path | str) -> None:
    done = fanfs("verify", store, "--against", *sources, "--quiet")
    assert done.stdout.startswith("ok:"), done.stdout + done.stderr


# --- the parser ---------------------------------------------------------------------------------------------

def _entries(data: bytes) -> list[tuple]:
    reader = TarReader(ByteStream(io.BytesIO(data)), "test")
    out = []
    for entry in reader:
        body = b"".join(reader.data(entry)) if entry.type == b"0" else b""
        if entry.regions is not None:
            full = bytearray(entry.realsize)
            pos = 0
            for offset, length in entry.regions:
                full[offset:offset + length] = body[pos:pos + length]
                pos += length
            body = bytes(full)
        out.append((entry.name.rstrip(b"/"), entry.type, entry.mode, entry.mtime // 10**9, entry.linkname,
                    hashlib.sha256(body).hexdigest()))
    return out


def _tarfile_entries(data: bytes) -> list[tuple]:
    kinds = {tarfile.GNUTYPE_SPARSE: b"0", tarfile.AREGTYPE: b"0", tarfile.CONTTYPE: b"0"}
    out = []
    with tarfile.open(fileobj=io.BytesIO(data), encoding="utf-8", errors="surrogateescape") as tar:
        for m in tar:
            body = tar.extractfile(m).read() if m.isreg() else b""
            out.append((os.fsencode(m.name).rstrip(b"/"), kinds.get(m.type, m.type), m.mode, int(m.mtime),
                        os.fsencode(m.linkname), hashlib.sha256(body).hexdigest()))
    return out


@pytest.mark.parametrize("fmt", ["gnu", "oldgnu", "posix", "sparse-0.0", "sparse-0.1", "ustar-python",
                                 "gnu-python", "pax-python"])
def test_the_tar_parser_reads_what_tarfile_reads(dataset, tmp_path, fmt):
    """Every header form (ustar prefix, GNU long names and base-256 numbers, pax records, sparse maps of GNU's
    three kinds) gives the entries Python's tarfile gives."""
    if fmt.endswith("-python"):
        kind = {"ustar": tarfile.USTAR_FORMAT, "gnu": tarfile.GNU_FORMAT, "pax": tarfile.PAX_FORMAT}[fmt[:-7]]
        big = member("big-mtime.bin", b"y" * 5000)
        big[0].mtime = 2**34  # base-256 in GNU format, a pax record in pax
        members = [member("d/" + "p" * 90 + "/" + "q" * 90 + ".txt", b"prefix"), member("x/", kind=tarfile.DIRTYPE),
                   member("s", kind=tarfile.SYMTYPE, link="x"), member("h", kind=tarfile.LNKTYPE, link="s"),
                   *([big] if kind != tarfile.USTAR_FORMAT else [])]
        data = tar_bytes(members, kind)
    else:
        args = ["--format=posix", f"--sparse-version={fmt[7:]}"] if fmt.startswith("sparse") else [f"--format={fmt}"]
        data = subprocess.run(["tar", *args, "-S", "-cf", "-", "-C", str(dataset), "."], check=True,
                              capture_output=True).stdout
    assert _entries(data) == _tarfile_entries(data)


# --- every kind of archive packs as its directory does ------------------------------------------------------

KINDS = ["tar-posix", "tar-gnu", "tar.gz", "tar.bz2", "tar.xz", "tar.zst", "zip", "stdin"]


@pytest.mark.parametrize("kind", [pytest.param(k, marks=pytest.mark.slow) if k not in ("tar-posix", "stdin")
                                  else k for k in KINDS])
def test_an_archive_packs_as_its_directory(dataset, tmp_path, kind):
    store = tmp_path / "store"
    if kind == "zip":
        archive = zip_of(dataset, tmp_path / "data.zip")
    elif kind.startswith("tar-") or kind == "stdin":
        archive = gnu_tar(dataset, tmp_path / "data.tar", "gnu" if kind == "tar-gnu" else "posix")
    else:
        archive = gnu_tar(dataset, tmp_path / f"data.{kind}", "posix", kind.split(".")[1])
    if kind == "stdin":
        with open(archive, "rb") as f:
            fanfs("pack", "-", store, *RECORDS, "--quiet", stdin=f)
    else:
        fanfs("pack", archive, store, *RECORDS, "--quiet")
    _check_against(store, dataset)  # a zip has no hard links: the second name is a second file of the same bytes
    if kind != "zip":
        with open(archive, "rb") as f:
            done = fanfs("verify", store, "--against", "-" if kind == "stdin" else archive, "--quiet", stdin=f)
        assert done.stdout.startswith("ok:")
    info = json.loads(fanfs("info", store, "--json").stdout)
    s = Store(str(store))
    assert s.meta["sources"] == [{"path": "-" if kind == "stdin" else str(archive),
                                  "kind": "tar" if kind in ("tar-posix", "tar-gnu", "stdin") else kind}]
    assert info["records"]["jpeg"]["files"] == 6 and info["records"]["float"]["files"] == 1
    if kind != "zip":  # a zip has neither sparse files nor hard links
        sparse = s.lookup(b"sparse.img")
        first, count = int(s.index.first[sparse]), int(s.index.count[sparse])
        assert count == 4 and not s.index.blob_stored[first + 1:first + 3].any()  # a sparse member's holes stay holes
        assert s.meta["format"] == 4 and s.index.first[s.lookup(b"hard")] == s.index.first[s.lookup(b"notes.txt")]


@pytest.mark.slow
def test_a_mount_of_an_archive_pack_reads_every_byte(dataset, tmp_path, mount):
    store = tmp_path / "store"
    fanfs("pack", gnu_tar(dataset, tmp_path / "data.tar.zst", compression="zst"), store, "--progressive-jpeg",
          "--quiet")
    with mount(store) as mnt:
        for path in dataset.rglob("*"):
            got = mnt / path.relative_to(dataset)
            assert os.lstat(got).st_mtime_ns == MTIME * 10**9, path
            if path.is_symlink():
                assert os.readlink(got) == os.readlink(path)
            elif path.suffix.lower() in (".jpg", ".jpeg"):
                assert np.array_equal(decode_pixels(got.read_bytes()), decode_pixels(path.read_bytes()))
            elif path.is_file():
                assert got.read_bytes() == path.read_bytes(), path
        assert os.stat(mnt / "hard").st_size == os.stat(mnt / "notes.txt").st_size


# --- archives of archives, several archives, a pipe ----------------------------------------------------------

def _imagenet_like(tmp_path: Path, dataset: Path) -> tuple[Path, dict[str, bytes]]:
    """ILSVRC2012_img_train.tar's shape: a tar of class tars; plus a nested tar.gz, a zip and a .npz that stays."""
    photos = sorted((dataset / "train" / "n01440764").iterdir())
    want: dict[str, bytes] = {}
    classes = []
    for c, name in enumerate(("n01440764", "n01443537")):
        inner = tar_bytes([member(f"{name}_{i}.JPEG", p.read_bytes()) for i, p in enumerate(photos[c::2])])
        classes.append(member(f"{name}.tar", inner))
        want.update({f"{name}/{name}_{i}.JPEG": p.read_bytes() for i, p in enumerate(photos[c::2])})
    deep = tar_bytes([member("deep.txt", b"deep")])
    classes.append(member("extra.tar.gz", COMPRESS["gz"](tar_bytes([member("level2.tar", deep)]))))
    want["extra/level2/deep.txt"] = b"deep"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("inzip/a.txt", b"from a zip")
    classes.append(member("bundle.zip", buf.getvalue()))
    want["bundle/inzip/a.txt"] = b"from a zip"
    npz = io.BytesIO()
    np.savez(npz, x=np.arange(10))
    classes.append(member("volume.npz", npz.getvalue()))
    want["volume.npz"] = npz.getvalue()
    outer = tmp_path / "ILSVRC2012_img_train.tar"
    outer.write_bytes(tar_bytes(classes))
    return outer, want


def test_expand_archives_makes_directories_of_archives_inside(dataset, tmp_path):
    outer, want = _imagenet_like(tmp_path, dataset)
    store = tmp_path / "store"
    fanfs("pack", outer, store, "--expand-archives", "--progressive-jpeg", "--quiet")
    s = Store(str(store))
    assert sorted(os.fsdecode(s.index.path(e)) for e in range(s.index.entries) if s.index.type[e] == 1) == sorted(want)
    for path, data in want.items():
        if path.endswith(".JPEG"):
            assert np.array_equal(decode_pixels(s.read_file(path)), decode_pixels(data))
        else:
            assert s.read_file(path) == data
    assert s.meta["expand_archives"] is True
    _check_against(store, outer)  # read again as the pack read it: archives inside expanded
    plain = tmp_path / "plain"
    fanfs("pack", outer, plain, "--quiet")  # without the option, the class tars stay files
    assert Store(str(plain)).lookup(b"n01440764.tar") > 0


def test_expanding_a_directory_of_class_tars(dataset, tmp_path):
    outer, want = _imagenet_like(tmp_path, dataset)
    classes = tmp_path / "classes"
    classes.mkdir()
    with tarfile.open(outer) as tar:
        tar.extractall(classes, filter="data")
    store = tmp_path / "store"
    fanfs("pack", classes, store, "--expand-archives", "--quiet")
    s = Store(str(store))
    assert all(s.read_file(path) == data for path, data in want.items())
    _check_against(store, classes)


def test_several_archives_merge_into_one_tree(tmp_path):
    """A WebDataset shard set: shard-000000.tar ... each holding some samples, one directory in the store."""
    shards = []
    for n in range(3):
        shard = tmp_path / f"shard-{n:06d}.tar"
        shard.write_bytes(tar_bytes([member(f"sample{n * 10 + i:06d}.{ext}", f"{n} {i} {ext}".encode())
                                     for i in range(10) for ext in ("jpg", "cls")]))
        shards.append(shard)
    store = tmp_path / "store"
    fanfs("pack", *shards, store, "--quiet")
    s = Store(str(store))
    assert [os.fsdecode(name) for name, *_ in s.listdir(0)] == [f"sample{k:06d}.{e}" for k in range(30) for e in ("cls", "jpg")]
    assert s.read_file("sample000021.cls") == b"2 1 cls"
    assert [x["path"] for x in s.meta["sources"]] == [str(p) for p in shards]
    _check_against(store, *shards)


def test_train_and_val_in_one_store_under_their_folders(dataset, tmp_path):
    """Issue 35: ``pack train=ILSVRC2012_img_train.tar val=ILSVRC2012_img_val.tar`` gives the README's
    ``train/n01440764/...``; a directory and a zip go under a folder too, and verify --against takes the same
    arguments."""
    outer, want = _imagenet_like(tmp_path, dataset)
    val = tmp_path / "ILSVRC2012_img_val.tar"
    val.write_bytes(tar_bytes([member("ILSVRC2012_val_00000001.JPEG", b"val one")]))
    bundle = zip_of(dataset / "train", tmp_path / "bundle.zip")
    store = tmp_path / "store"
    srcs = [f"train={outer}", f"val={val}", f"more/tree={dataset / 'train'}", f"more/zip={bundle}"]
    fanfs("pack", *srcs, store, "--expand-archives", "--quiet")
    s = Store(str(store))
    assert [os.fsdecode(name) for name, *_ in s.listdir(0)] == ["more", "train", "val"]
    assert all(s.read_file(f"train/{path}") == data for path, data in want.items() if not path.endswith(".JPEG"))
    assert s.lookup(b"train/n01440764/n01440764_0.JPEG") > 0
    assert s.read_file("val/ILSVRC2012_val_00000001.JPEG") == b"val one"
    some = next(p for p in (dataset / "train").rglob("*") if p.is_file()).relative_to(dataset / "train")
    assert s.read_file(f"more/tree/{some}") == s.read_file(f"more/zip/{some}") == (dataset / "train" / some).read_bytes()
    assert [x.get("prefix") for x in s.meta["sources"]] == ["train", "val", "more/tree", "more/zip"]
    info = fanfs("info", store).stdout
    assert f"{outer} (tar) under train/" in info and f"{val} (tar) under val/" in info
    _check_against(store, *srcs)


def test_verify_against_sources_without_their_folders_says_so_once(tmp_path):
    """Issue 41: a store packed as train=A val=B, verified --against A B, gave a line per file (or stopped at the first,
    'no such file in the store').  Now one line says the store has PREFIX folders and how pack had them, exit 1; a file
    truly missing from the store is one difference among the others, not the end of the comparison."""
    for split in ("train", "val"):
        for i in range(3):
            (tmp_path / split / f"d{i}").mkdir(parents=True)
            (tmp_path / split / f"d{i}" / f"{split}{i}.txt").write_text(f"{split} {i}\n")
    store = tmp_path / "store"
    fanfs("pack", f"train={tmp_path / 'train'}", f"val={tmp_path / 'val'}", store, "--quiet")
    for against in ([tmp_path / "train"], [tmp_path / "train", tmp_path / "val"]):
        done = fanfs("verify", store, "--against", *against, "--quiet", check=False)
        assert done.returncode == 1 and done.stderr.splitlines() == [
            "fanfs: error: the store puts its sources under PREFIX folders (train/, val/) and the sources given do not: "
            f"give --against PREFIX=SRC as pack had them (--against train={tmp_path / 'train'} val={tmp_path / 'val'})"]
    (tmp_path / "train" / "d1" / "new.txt").write_text("new\n")
    done = fanfs("verify", store, "--against", f"train={tmp_path / 'train'}", f"val={tmp_path / 'val'}", "--quiet",
                 check=False)
    assert done.returncode == 1 and "fanfs: train/d1/new.txt: in the source, missing from the store" in done.stderr
    assert done.stdout.startswith("FAILED: ") and "error" not in done.stderr, done.stderr


def test_a_hard_link_in_an_archive_under_a_prefix_links_under_it(tmp_path):
    """Issue 39: a hard link of ``p=ARCHIVE`` names a member of that archive, so it lands under ``p/`` too, never on a
    file of the same path at the tree's root (another source's)."""
    archive = tmp_path / "a.tar"
    archive.write_bytes(tar_bytes([member("d/f", b"in the archive"), member("d/h", kind=tarfile.LNKTYPE, link="d/f")]))
    root = tmp_path / "root"
    (root / "d").mkdir(parents=True)
    (root / "d" / "f").write_bytes(b"at the root")
    store = tmp_path / "store"
    fanfs("pack", root, f"p={archive}", store, "--quiet")
    s = Store(str(store))
    assert s.read_file("p/d/h") == s.read_file("p/d/f") == b"in the archive"
    assert s.read_file("d/f") == b"at the root"
    link, target = s.lookup(b"p/d/h"), s.lookup(b"p/d/f")
    assert s.index.first[link] == s.index.first[target]  # one file under two names: the same blobs
    s.close()
    _check_against(store, root, f"p={archive}")


def test_an_argument_naming_a_path_is_that_path(tmp_path):
    """A directory literally named ``a=b`` packs as itself, not as ``b`` under ``a/``."""
    src = tmp_path / "a=b"
    src.mkdir()
    (src / "f").write_bytes(b"f")
    store = tmp_path / "store"
    fanfs("pack", "a=b", store, "--quiet", cwd=tmp_path)
    assert Store(str(store)).read_file("f") == b"f"


@pytest.mark.slow  # the quick subset's time (its promise keeps a quicker test)
def test_a_single_file_packs_as_a_tree_of_that_file(dataset, tmp_path):
    """Issue 41: a labels file as a source was refused ('neither a directory nor an archive').  A regular file that is
    no archive is a tree of that one file: at the root as its name, or under PREFIX (through a symlink too, named as
    given); verify --against takes it the same way.  One named as an archive is no file to pack but a damaged archive."""
    labels = tmp_path / "val_labels.txt"
    labels.write_bytes(b"n01440764\nn01443537\n")
    os.utime(labels, ns=(MTIME * 10**9, MTIME * 10**9))
    (tmp_path / "labels-link.txt").symlink_to(labels.name)
    fanfs("pack", labels, tmp_path / "alone", "--quiet")
    alone = Store(str(tmp_path / "alone"))
    assert [name for name, *_ in alone.listdir(0)] == [b"val_labels.txt"]
    assert alone.read_file("val_labels.txt") == labels.read_bytes()
    assert alone.meta["sources"] == [{"path": str(labels), "kind": "file"}]
    _check_against(tmp_path / "alone", labels)
    srcs = [f"train={dataset / 'train'}", f"labels={tmp_path / 'labels-link.txt'}"]
    fanfs("pack", *srcs, tmp_path / "both", "--quiet")
    both = Store(str(tmp_path / "both"))
    assert [name for name, *_ in both.listdir(0)] == [b"labels", b"train"]
    assert both.read_file("labels/labels-link.txt") == labels.read_bytes()
    assert both.index.mtime[both.lookup(b"labels/labels-link.txt")] == MTIME * 10**9
    _check_against(tmp_path / "both", *srcs)
    assert "(file) under labels/" in fanfs("info", tmp_path / "both").stdout
    (tmp_path / "cut.tar.gz").write_bytes(b"half a download")  # named as an archive: refused, never packed as a file
    done = fanfs("pack", tmp_path / "cut.tar.gz", tmp_path / "cut", check=False)
    assert done.returncode == 1 and "its name says archive" in done.stderr and not (tmp_path / "cut").exists()


@pytest.mark.parametrize("arg", ["../x={src}", "/abs={src}", "={src}", "a//b={src}", "a/./b={src}", "train=",
                                 "a/../../b={src}"])
def test_a_hostile_prefix_is_refused_in_one_line(tmp_path, arg):
    src = tmp_path / "src"
    src.mkdir()
    (src / "f").write_bytes(b"f")
    store = tmp_path / "store"
    done = fanfs("pack", arg.format(src=src), store, "--quiet", check=False)
    assert done.returncode == 1 and done.stderr.count("\n") == 1 and "fanfs: error:" in done.stderr, done.stderr
    assert not store.exists() and os.listdir(tmp_path) == ["src"]


def test_a_tar_stream_from_a_pipe(dataset, tmp_path):
    """No seeking: GNU tar writes to the pack's standard input through a pipe, compressed on the way."""
    store = tmp_path / "store"
    tar = subprocess.Popen(["tar", "-czf", "-", "-C", str(dataset), "."], stdout=subprocess.PIPE)
    done = subprocess.run([*FANFS, "pack", "-", str(store), "--quiet"], stdin=tar.stdout, capture_output=True,
                          text=True, timeout=120)
    tar.stdout.close()
    assert tar.wait() == 0 and done.returncode == 0, done.stderr
    _check_against(store, dataset)
    assert Store(str(store)).meta["sources"] == [{"path": "-", "kind": "tar.gz"}]


def test_info_names_the_archives(dataset, tmp_path):
    store = tmp_path / "store"
    archive = gnu_tar(dataset, tmp_path / "data.tar.gz", compression="gz")
    fanfs("pack", archive, dataset / "train", store, "--quiet")  # the archive's train/ and the directory's contents
    out = fanfs("info", store).stdout
    assert f"{archive} (tar.gz)" in out and f"{dataset / 'train'} (directory)" in out


def test_progress_is_logged_when_not_on_a_terminal(dataset, tmp_path):
    """A pack in a batch job: lines on stderr (files, bytes, rate, elapsed), not a bar, every FANFS_PROGRESS_SECONDS."""
    store = tmp_path / "store"
    done = subprocess.run([*FANFS, "pack", str(dataset), str(store), "--progressive-jpeg"], capture_output=True,
                          text=True, env={**os.environ, "FANFS_PROGRESS_SECONDS": "0"}, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("fanfs pack: ")]
    assert lines and all(" elapsed" in line and "/s" in line for line in lines), done.stderr
    assert "\r" not in done.stderr and "files" in lines[-1]
    done = subprocess.run([*FANFS, "verify", str(store), "--against", str(dataset)], capture_output=True, text=True,
                          env={**os.environ, "FANFS_PROGRESS_SECONDS": "0"}, timeout=120)
    for step in ("verify shards", "verify files", "verify against"):
        assert f"fanfs {step}: " in done.stderr, done.stderr


# --- hard links share blobs (format 4); a crafted index cannot abuse that -------------------------------------

@pytest.mark.parametrize("edit, expect", [
    (lambda meta, cols, a, b: meta.update(format=3), "two files share blobs"),
    (lambda meta, cols, a, b: cols["checksum"].__setitem__(a, cols["checksum"][a] ^ 1), "share blobs but differ"),
    (lambda meta, cols, a, b: cols["first"].__setitem__(a, cols["first"][b] + 1), "two files share blobs"),
])
def test_shared_blobs_only_as_whole_hard_links(dataset, tmp_path, edit, expect):
    from test_crafted_store import rewrite

    from fanfs.errors import StoreError
    store = tmp_path / "store"
    fanfs("pack", dataset, store, "--quiet")
    s = Store(str(store))
    a, b = s.lookup(b"hard"), s.lookup(b"notes.txt")
    assert s.meta["format"] == 4 and s.index.first[a] == s.index.first[b]
    s.close()
    rewrite(store, lambda meta, cols: edit(meta, cols, a, b))
    with pytest.raises(StoreError, match=expect):
        Store(str(store))


def test_hard_link_chains_are_the_file_they_end_at(tmp_path, mount):
    """b -> a, c -> b, d -> c (and the same to a symbolic link): GNU tar extracts each as another name of the
    first; so does a pack, into a store that opens, verifies, and reads as GNU tar's extraction does."""
    body = b"the one file\n" * 1000
    archive = tmp_path / "chains.tar"
    archive.write_bytes(tar_bytes([
        member("a", body), member("b", kind=tarfile.LNKTYPE, link="a"), member("c", kind=tarfile.LNKTYPE, link="b"),
        member("sub/d", kind=tarfile.LNKTYPE, link="c"), member("s", kind=tarfile.SYMTYPE, link="a"),
        member("s2", kind=tarfile.LNKTYPE, link="s"), member("s3", kind=tarfile.LNKTYPE, link="s2")]))
    extracted = tmp_path / "gnu"
    extracted.mkdir()
    subprocess.run(["tar", "-xf", str(archive), "-C", str(extracted)], check=True)
    store = tmp_path / "store"
    fanfs("pack", archive, store, "--quiet")
    s = Store(str(store))
    assert s.meta["format"] == 4 and len({int(s.index.first[s.lookup(n)]) for n in (b"a", b"b", b"c", b"sub/d")}) == 1
    assert fanfs("verify", store, "--quiet").stdout.startswith("ok:")
    _check_against(store, extracted)
    with mount(store) as mnt:
        for name in ("a", "b", "c", "sub/d", "s", "s2", "s3"):
            assert (mnt / name).read_bytes() == (extracted / name).read_bytes() == body
        for name in ("s", "s2", "s3"):
            assert os.readlink(mnt / name) == os.readlink(extracted / name) == "a"


def test_a_prefix_part_longer_than_a_name_says_so(tmp_path):
    """Issue 39.11c: a 256-byte PREFIX got the generic 'needs a relative folder' line.  It says the part is too long."""
    (tmp_path / "src").mkdir()
    for prefix in ("a" * 256, "x/" + "b" * 300 + "/y"):
        done = fanfs("pack", f"{prefix}={tmp_path / 'src'}", tmp_path / "store", check=False)
        assert done.returncode == 1 and len(done.stderr.splitlines()) == 1, done.stderr
        assert f"its PREFIX has a part of {max(map(len, prefix.split('/'))):,} bytes, longer than the 255 a file name " \
               "may have: give a shorter folder" in done.stderr, done.stderr
    fanfs("pack", f"{'a' * 255}={tmp_path / 'src'}", tmp_path / "store", "--quiet")  # 255 is a name
