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
from photo_samples import make_photo_set

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
