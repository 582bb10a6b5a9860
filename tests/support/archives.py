"""Archives for the tests: a dataset tree, the same tree as every kind of archive, and hostile archives.

Real tools make them where a tool exists here (GNU tar for its formats and sparse files); Python's tarfile and
zipfile write what GNU tar would not (names with ``..``, members that lie about their size, zips that overlap).
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import os
import subprocess
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import zstandard
from fanfs_command import fanfs
from photo_samples import make_photo_set

from fanfs.store import Store

MTIME = 1_700_000_000  # whole, even seconds: every archive format (zip's 2-second DOS time too) keeps them
COMPRESS = {"gz": gzip.compress, "bz2": bz2.compress, "xz": lzma.compress,
            "zst": lambda data: zstandard.ZstdCompressor(write_checksum=True).compress(data)}  # as the zstd tool does


def make_dataset(root: Path, photos: int = 6) -> Path:
    """Photos (JPEG records), a float array, text, an empty file and directory, a sparse file, a symlink inside,
    a hard link, a 255-byte and a non-UTF-8 name, odd modes; every mtime the same whole second."""
    (root / "train" / "n01440764").mkdir(parents=True)
    make_photo_set(root / "train" / "n01440764", photos)
    (root / "empty_dir").mkdir()
    np.save(root / "weights.npy", np.random.default_rng(0).standard_normal(50_000).astype(np.float32))
    (root / "notes.txt").write_text("notes\n" * 500)
    (root / "empty.dat").write_bytes(b"")
    (root / ("n" * 255)).write_bytes(b"long name")
    os.close(os.open(os.path.join(os.fsencode(root), b"latin1-\xe9\xff"), os.O_CREAT | os.O_WRONLY, 0o600))
    with open(root / "sparse.img", "wb") as f:
        f.write(b"head")
        f.seek(3 << 20)
        f.write(b"tail")
    (root / "link").symlink_to("notes.txt")
    os.link(root / "notes.txt", root / "hard")
    os.chmod(root / "notes.txt", 0o640)
    for path in [*root.rglob("*"), root]:
        os.utime(path, (MTIME, MTIME), follow_symlinks=False)
    return root


def gnu_tar(src: Path, out: Path, fmt: str = "posix", compression: str | None = None) -> Path:
    """``tar --format=FMT -S`` of SRC's contents (``./`` names), compressed by Python if asked."""
    data = subprocess.run(["tar", f"--format={fmt}", "-S", "-cf", "-", "-C", str(src), "."], check=True,
                          capture_output=True).stdout
    out.write_bytes(COMPRESS[compression](data) if compression else data)
    return out


def zip_of(src: Path, out: Path) -> Path:
    """A zip of SRC with Unix modes, directories and symlinks, as Info-ZIP writes them (no hard links in zip)."""
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for path in sorted(src.rglob("*")):
            raw = os.fsencode(path.relative_to(src)) + (b"/" if path.is_dir() and not path.is_symlink() else b"")
            st = path.lstat()
            info = _RawName(raw, _local(st.st_mtime))
            info.create_system = 3
            info.external_attr = st.st_mode << 16
            if path.is_symlink():
                z.writestr(info, os.readlink(path))
            elif path.is_dir():
                z.writestr(info, b"")
            else:
                info.compress_type = zipfile.ZIP_DEFLATED
                z.writestr(info, path.read_bytes())
    return out


class _RawName(zipfile.ZipInfo):
    """A member named by its bytes, without zip's UTF-8 flag where they are not UTF-8 (as Info-ZIP on Linux)."""

    def __init__(self, raw: bytes, date_time: tuple[int, ...]) -> None:
        super().__init__(raw.decode("cp437"), date_time)
        self._raw = raw

    def _encodeFilenameFlags(self) -> tuple[bytes, int]:
        try:
            self._raw.decode("utf-8")
        except UnicodeDecodeError:
            return self._raw, self.flag_bits
        return self._raw, self.flag_bits | 0x800


def _local(mtime: float) -> tuple[int, ...]:
    import time
    return time.localtime(mtime)[:6]


def tar_bytes(members: list[tuple[tarfile.TarInfo, bytes | None]], fmt: int = tarfile.PAX_FORMAT) -> bytes:
    """A tar of hand-made members (tarfile writes names GNU tar would refuse to)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def member(name: str, data: bytes = b"x", kind: bytes = tarfile.REGTYPE, link: str = "",
           pax: dict[str, str] | None = None) -> tuple[tarfile.TarInfo, bytes | None]:
    """A member for :func:`tar_bytes`; ``pax``: records of its own pax header (written as given)."""
    info = tarfile.TarInfo(name)
    info.pax_headers = dict(pax or {})
    info.type, info.linkname, info.mtime, info.mode = kind, link, MTIME, 0o644
    if kind == tarfile.REGTYPE:
        info.size = len(data)
        return info, data
    return info, None


def raw_header(name: bytes, size: int, kind: bytes = b"0", fields: dict[int, bytes] | None = None) -> bytes:
    """One GNU tar header block as written by hand: ``fields`` puts bytes at offsets (a sparse map, a base-256
    number) that no tool writes as asked; the checksum is made to add up."""
    block = bytearray(512)
    block[0:len(name)] = name
    block[100:124] = b"0000644\0" + b"0000000\0" * 2
    block[124:136] = b"%011o\0" % size
    block[136:148] = b"%011o\0" % MTIME
    block[156:157] = kind
    block[257:265] = b"ustar  \0"
    for at, value in (fields or {}).items():
        block[at:at + len(value)] = value
    block[148:156] = b"        "
    block[148:156] = b"%06o\0 " % sum(block)
    return bytes(block)


def padded(data: bytes) -> bytes:
    return data + bytes(-len(data) % 512)


def old_gnu_sparse(extension_blocks: int) -> bytes:
    """An old-GNU sparse member (type S) whose map goes on for ``extension_blocks`` blocks of 21 empty regions."""
    slot = b"%011o\0%011o\0" % (0, 0)
    head = raw_header(b"sparse", 0, b"S", {386: slot, 482: b"\1", 483: b"%011o\0" % 0})
    more = bytearray(512)
    more[0:24 * 21] = slot * 21
    more[504] = 1
    return head + bytes(more) * extension_blocks + bytes(1024)


def pax_sparse(name: str, realsize: int, map_text: bytes, data: bytes = b"") -> bytes:
    """A GNU sparse 1.0 member (as ``tar --format=posix -S`` writes it): its map ``map_text`` opens its data."""
    body = padded(map_text) + data
    records = {"GNU.sparse.major": "1", "GNU.sparse.minor": "0", "GNU.sparse.name": name,
               "GNU.sparse.realsize": str(realsize)}
    return tar_bytes([member(f"GNUSparseFile.0/{name}", body, pax=records)])


def refused(tmp_path: Path, archive: bytes, *options: str, expect: str, name: str = "bad.tar") -> str:
    """Pack ``archive``; the one line it gets, after checking that nothing was left anywhere in tmp_path."""
    source = tmp_path / name
    source.write_bytes(archive)
    before = sorted(p.name for p in tmp_path.iterdir())
    done = fanfs("pack", source, tmp_path / "store", *options, check=False)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and lines[-1].startswith("fanfs: error: "), done.stderr
    assert "Traceback" not in done.stderr and expect in lines[-1], lines[-1]
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no store, no partial store, nothing else
    return lines[-1]


def packed(tmp_path: Path, archive: bytes, *options: str) -> tuple[Store, str]:
    source = tmp_path / "odd.tar"
    source.write_bytes(archive)
    done = fanfs("pack", source, tmp_path / "store", *options)
    return Store(str(tmp_path / "store")), done.stderr
