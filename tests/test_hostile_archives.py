"""Issue 27: hostile archives get one line and leave nothing: not a store, not a partial one, not a byte outside.

Each case is an archive a real attack or a real accident makes: names that climb out or are absolute, names
that collide, links that point out, devices and FIFOs, a member that declares more bytes than follow, a
truncated or corrupt compressed stream, header checksums that do not add up, zip bombs of both kinds,
archives nested 100 deep, names no file system takes.  Links pointing out and special files are left out
with a warning (the pack goes on, as for a directory); everything else refuses the whole pack.
"""

from __future__ import annotations

import gzip
import io
import os
import signal
import subprocess
import sys
import tarfile
import time
import zipfile

import pytest
from fanfs_command import FANFS, fanfs
from support.archives import COMPRESS, member, packed, refused, tar_bytes

from fanfs.store import Store


CASES = {
    "dotdot": ([member("../escape.txt")], "'..'"),
    "dotdot-inside": ([member("a/../../escape.txt")], "'..'"),
    "absolute": ([member("/etc/cron.d/evil")], "absolute name"),
    "same-name": ([member("a.txt", b"one"), member("./a.txt", b"two")], "name clash: a.txt"),
    "file-then-dir": ([member("a", b"file"), member("a/b.txt")], "name clash: a is a file"),
    "dir-then-file": ([member("a/b.txt"), member("a", b"file")], "name clash: a is a directory"),
    "hardlink-missing": ([member("h", kind=tarfile.LNKTYPE, link="nowhere")], "not an earlier member"),
    "hardlink-to-later": ([member("b", kind=tarfile.LNKTYPE, link="a"), member("a")], "not an earlier member"),
    "hardlink-to-itself": ([member("h", kind=tarfile.LNKTYPE, link="h")], "not an earlier member"),
    "hardlink-to-dir": ([member("d/", kind=tarfile.DIRTYPE), member("h", kind=tarfile.LNKTYPE, link="d")],
                        "a directory"),
    "hardlink-out": ([member("h", kind=tarfile.LNKTYPE, link="../../etc/passwd")], "'..'"),
    "nul-in-name": ([member("a", pax={"path": "a\0b"})], "NUL"),  # a pax record may carry one
    "name-too-long": ([member("x" * 256)], "256 bytes"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_names_arerefused(tmp_path, case):
    members, expect = CASES[case]
    refused(tmp_path, tar_bytes(members), expect=expect)


def test_links_pointing_out_are_left_out_with_a_warning(tmp_path):
    s, err = packed(tmp_path, tar_bytes([
        member("data.txt", b"data"), member("dir/", kind=tarfile.DIRTYPE),
        member("dir/up", kind=tarfile.SYMTYPE, link="../data.txt"),  # inside: kept
        member("abs", kind=tarfile.SYMTYPE, link="/etc/passwd"),
        member("climb", kind=tarfile.SYMTYPE, link="../../etc/passwd"),
        member("dot", kind=tarfile.SYMTYPE, link="."),
        member("chain", kind=tarfile.SYMTYPE, link="dot/.."),  # through another link: out
        member("loop1", kind=tarfile.SYMTYPE, link="loop2"), member("loop2", kind=tarfile.SYMTYPE, link="loop1"),
    ]))
    names = {os.fsdecode(name) for name, *_ in s.listdir(0)}
    assert names == {"data.txt", "dir", "dot", "loop1", "loop2"}
    for left_out in ("abs", "climb", "chain"):
        assert f"skipped symbolic link {tmp_path / 'odd.tar'}:{left_out} -> " in err
    assert s.readlink(s.lookup(b"dir/up")) == b"../data.txt"


def test_hard_links_to_links_pointing_out_are_left_out_too(tmp_path):
    """A hard link to a symbolic link is that link again, at its own place: checked as a symbolic link is."""
    s, err = packed(tmp_path, tar_bytes([
        member("data.txt", b"data"), member("dir/", kind=tarfile.DIRTYPE),
        member("evil", kind=tarfile.SYMTYPE, link="/etc/passwd"),
        member("evil2", kind=tarfile.LNKTYPE, link="evil"),  # a copy of a link left out
        member("evil3", kind=tarfile.LNKTYPE, link="evil2"),  # and a copy of that copy
        member("dir/up", kind=tarfile.SYMTYPE, link="../data.txt"),  # inside: kept
        member("dir/up2", kind=tarfile.LNKTYPE, link="dir/up"),  # the same place: inside, kept
        member("up3", kind=tarfile.LNKTYPE, link="dir/up"),  # one level up, ../data.txt climbs out
    ]))
    assert {os.fsdecode(name) for name, *_ in s.listdir(0)} == {"data.txt", "dir"}
    for left_out in ("evil", "evil2", "evil3", "up3"):
        assert f"skipped symbolic link {tmp_path / 'odd.tar'}:{left_out} -> " in err
    assert s.readlink(s.lookup(b"dir/up2")) == b"../data.txt"


@pytest.mark.parametrize("source", ["tar", "directory"])
def test_hard_links_to_links_pointing_out_of_nested_archives(tmp_path, source):
    """With --expand-archives, a link out inside a nested tar or zip, and hard links to it from inside that
    archive or from the archive around it, are all left out; the source is a tar of archives or a directory."""
    zipped = io.BytesIO()
    with zipfile.ZipFile(zipped, "w") as z:
        info = zipfile.ZipInfo("zevil")
        info.create_system, info.external_attr = 3, (0o120777 << 16)
        z.writestr(info, "/etc/shadow")
    inner = tar_bytes([member("evil", kind=tarfile.SYMTYPE, link="../../etc/passwd"),
                       member("evil2", kind=tarfile.LNKTYPE, link="evil")])
    outer = [member("ok.txt"), member("inner.tar", inner), member("z.zip", zipped.getvalue())]
    if source == "tar":
        outer += [member("h1", kind=tarfile.LNKTYPE, link="inner/evil"),
                  member("h2", kind=tarfile.LNKTYPE, link="z/zevil")]
        archive = tmp_path / "outer.tar"
        archive.write_bytes(tar_bytes(outer))
    else:
        archive = tmp_path / "src"
        archive.mkdir()
        for info, data in outer:
            (archive / info.name).write_bytes(data)
    fanfs("pack", archive, tmp_path / "store", "--expand-archives", "--quiet")
    s = Store(str(tmp_path / "store"))
    kept = sorted(os.fsdecode(s.index.path(e)) for e in range(1, s.index.entries))
    assert kept == ["inner", "ok.txt", "z"]


def test_devices_and_fifos_are_skipped_with_a_warning(tmp_path):
    s, err = packed(tmp_path, tar_bytes([member("ok.txt"), member("null", kind=tarfile.CHRTYPE),
                                          member("disk", kind=tarfile.BLKTYPE), member("pipe", kind=tarfile.FIFOTYPE)]))
    assert [os.fsdecode(name) for name, *_ in s.listdir(0)] == ["ok.txt"]
    assert err.count("fanfs: warning: skipped ") == 3 and "skipped FIFO" in err


def _lying_member() -> bytes:
    """A member whose header declares 100,000 bytes, followed by 1,000 and the end of the file."""
    info = tarfile.TarInfo("big.bin")
    info.size = 100_000
    header = info.tobuf(tarfile.USTAR_FORMAT)
    return header + os.urandom(1000)


def test_a_member_declaring_more_bytes_than_follow(tmp_path):
    refused(tmp_path, _lying_member(), expect="declares 100,000 bytes but only")


def test_a_truncated_header(tmp_path):
    refused(tmp_path, tar_bytes([member("a.txt", b"a" * 600), member("b.txt")])[:1024 + 300],
             expect="truncated")


def test_a_bad_header_checksum(tmp_path):
    data = bytearray(tar_bytes([member("a.txt", b"data")]))
    data[0] ^= 1  # the first byte of the name
    refused(tmp_path, bytes(data), expect="bad checksum")


@pytest.mark.parametrize("compression", ["gz", "bz2", "xz", "zst"])
def test_a_truncated_compressed_stream(tmp_path, compression):
    data = COMPRESS[compression](tar_bytes([member(f"f{i}.bin", os.urandom(20_000)) for i in range(20)]))
    refused(tmp_path, data[:len(data) // 2], expect="", name=f"cut.tar.{compression}")


@pytest.mark.parametrize("compression", ["gz", "bz2", "xz", "zst"])
def test_a_corrupt_compressed_stream(tmp_path, compression):
    data = bytearray(COMPRESS[compression](tar_bytes([member(f"f{i}.bin", os.urandom(20_000)) for i in range(20)])))
    for at in range(len(data) // 3, len(data) // 3 + 64):
        data[at] ^= 0x5A
    refused(tmp_path, bytes(data), expect="", name=f"bad.tar.{compression}")


def test_not_an_archive_and_an_empty_file(tmp_path):
    refused(tmp_path, os.urandom(4096), expect="neither a directory nor an archive")
    refused(tmp_path, b"", expect="is empty")


def test_a_zip_whose_members_overlap(tmp_path):
    """The "quoted overlap" bomb: two directory entries naming the same compressed bytes."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("a.bin", bytes(100_000))
        z.writestr("b.bin", bytes(100_000))
    data = buf.getvalue()
    first = data.find(b"PK\x01\x02")
    second = data.find(b"PK\x01\x02", first + 4)
    offset_field = second + 42  # the second central entry's local header offset: point it at the first's
    data = data[:offset_field] + (0).to_bytes(4, "little") + data[offset_field + 4:]
    refused(tmp_path, data, expect="overlaps", name="bomb.zip")


def test_an_archive_that_expands_beyond_the_limit(tmp_path):
    """A gzip of zeros: ~1,000x, far more than the --max-expansion allowed here; stopped early, one line."""
    zeros = gzip.compress(tar_bytes([member("zeros.bin", bytes(80 << 20))]), compresslevel=9)
    line = refused(tmp_path, zeros, "--max-expansion", "50", expect="expand to more than 50 times",
                    name="bomb.tar.gz")
    assert "--max-expansion 0" in line


def test_archives_nested_100_deep(tmp_path):
    data = tar_bytes([member("core.txt", b"the bottom")])
    for level in range(100):
        data = tar_bytes([member(f"level{level}.tar", data)])
    refused(tmp_path, data, "--expand-archives", expect="nested more than 16 deep")
    s, _ = packed(tmp_path, data)  # without --expand-archives: one file, as it is
    assert s.read_file("level99.tar") == data[512:512 + len(s.read_file("level99.tar"))]


def test_an_archive_member_that_is_not_an_archive(tmp_path):
    refused(tmp_path, tar_bytes([member("fake.tar", os.urandom(2048))]), "--expand-archives",
             expect="fake.tar: not an archive")


def test_a_zip_on_a_pipe(tmp_path):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("a.txt", b"a")
    done = subprocess.run([*FANFS, "pack", "-", str(tmp_path / "store")], input=buf.getvalue(), capture_output=True,
                          timeout=60)
    assert done.returncode == 1 and b"a zip archive on a pipe" in done.stderr.strip().splitlines()[-1]
    assert not list(tmp_path.iterdir())


@pytest.mark.slow
def test_a_hundred_thousand_members_in_one_directory(tmp_path, mount):
    data = tar_bytes([member(f"all/{i:06d}.txt", b"%d" % i) for i in range(100_000)], tarfile.GNU_FORMAT)
    s, _ = packed(tmp_path, data)
    assert s.meta["totals"]["files"] == 100_000
    with mount(tmp_path / "store") as mnt:
        names = os.listdir(mnt / "all")
        assert len(names) == 100_000 and (mnt / "all" / "099999.txt").read_bytes() == b"99999"


def _tar_stream(members: int, member_size: int, big: int) -> str:
    """A script writing a tar to stdout: ``members`` files of ``member_size`` bytes, then one of ``big`` bytes."""
    return f"""
import sys, tarfile
out = sys.stdout.buffer
block = bytes(range(256)) * 4096
def add(name, size):
    info = tarfile.TarInfo(name); info.size = size
    out.write(info.tobuf(tarfile.GNU_FORMAT))
    left = size
    while left:
        n = min(left, len(block)); out.write(block[:n]); left -= n
    out.write(bytes(-size % 512))
for i in range({members}):
    add(f"small/{{i:05d}}.bin", {member_size})
add("huge.bin", {big})
out.write(bytes(1024))
"""


@pytest.mark.slow
def test_memory_stays_bounded_by_the_shard_size(tmp_path):
    """1.4 GiB through a pipe (a thousand 1 MiB members, one of 400 MiB): the pack's processes together stay within
    a few shards of 16 MiB of their size at rest, not the archive's (the large member is spooled beside the shards,
    then removed)."""
    from benchlib import tree_rss
    feeder = subprocess.Popen([sys.executable, "-c", _tar_stream(1000, 1 << 20, 400 << 20)], stdout=subprocess.PIPE)
    pack = subprocess.Popen([*FANFS, "pack", "-", str(tmp_path / "store"), "--shard-size", "16M", "--codec", "lz4",
                             "--jobs", "2", "--quiet"], stdin=feeder.stdout)
    feeder.stdout.close()
    peak = 0
    while pack.poll() is None:
        peak = max(peak, tree_rss(pack.pid))
        time.sleep(0.05)
    assert feeder.wait() == 0 and pack.returncode == 0
    assert peak < 500 << 20, f"peak {peak >> 20} MiB (the parent and two workers)"
    s = Store(str(tmp_path / "store"))
    assert s.meta["totals"]["files"] == 1001 and s.size_at(s.lookup(b"huge.bin")) == 400 << 20
    assert not (tmp_path / "store" / "spool").exists()


def test_ctrl_c_during_an_archive_pack_leaves_nothing(tmp_path):
    """A tar still arriving on a pipe when the user presses Ctrl-C: exit 130, one line, nothing left."""
    feeder = subprocess.Popen([sys.executable, "-c", _slow_tar()], stdout=subprocess.PIPE)
    pack = subprocess.Popen([*FANFS, "pack", "-", str(tmp_path / "store"), "--quiet"], stdin=feeder.stdout,
                            stderr=subprocess.PIPE, text=True)
    feeder.stdout.close()
    deadline = time.monotonic() + 60
    while not list(tmp_path.glob("store.partial-*/shards/*")) and time.monotonic() < deadline:
        time.sleep(0.05)
    pack.send_signal(signal.SIGINT)
    err = pack.communicate(timeout=60)[1]
    feeder.kill()
    feeder.wait()
    assert pack.returncode == 130 and err.strip().splitlines()[-1].startswith("fanfs: interrupted"), err
    assert not list(tmp_path.iterdir())


def _slow_tar() -> str:
    return """
import sys, tarfile, time
out = sys.stdout.buffer
for i in range(100000):
    info = tarfile.TarInfo(f"f{i:06d}.bin"); info.size = 1 << 20
    out.write(info.tobuf(tarfile.GNU_FORMAT) + bytes([i % 256]) * (1 << 20)); out.flush()
    time.sleep(0.01)
"""
