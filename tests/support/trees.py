"""Source trees for the tests: every kind of entry a real dataset may hold."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from pathlib import Path

from fanfs.store import Store
from fanfs.store.format import SHARD_DIR, shard_name

SPARSE_SIZE = (5 << 30) + 12345  # over 4 GiB, so offsets past 2**32 are exercised


def make_torture_tree(root: Path) -> Path:
    """Regular, empty, compressible, incompressible, multi-chunk and >4 GiB sparse files; unicode and
    255-byte names; nested and empty dirs; a directory of 1,500 names (a listing of many pages); relative and
    dangling symlinks; odd modes and mtimes; a FIFO."""
    root.mkdir(parents=True)
    (root / "train" / "cat").mkdir(parents=True)
    (root / "train" / "dog").mkdir(parents=True)
    (root / "empty_dir" / "deeper_empty").mkdir(parents=True)
    (root / "train" / "cat" / "1.txt").write_text("meow\n" * 2000)
    (root / "train" / "dog" / "1.bin").write_bytes(os.urandom(200_000))
    (root / "train" / "dog" / "multi_chunk.bin").write_bytes(os.urandom(1 << 20) + b"x" * (3 << 20) + os.urandom(777))
    (root / "empty.dat").write_bytes(b"")
    (root / "wide").mkdir()
    for i in range(1500):
        (root / "wide" / f"{i:05d}{'_' * (i % 97)}.txt").write_bytes(b"w" * (i % 300))
    (root / "ünïcødé ✓ 名前.txt").write_text("unicode name\n")
    (root / ("n" * 255)).write_bytes(b"long name")
    os.close(os.open(os.path.join(os.fsencode(root), b"latin1-\xe9\xff"), os.O_CREAT | os.O_WRONLY, 0o644))
    (root / "spaces and 'quotes' \"here\"").write_text("x")
    (root / "link_rel").symlink_to("train/cat/1.txt")
    (root / "link_dangling").symlink_to("/nonexistent/target")
    (root / "link_dir").symlink_to("train")
    with open(root / "sparse.img", "wb") as f:
        f.write(b"head")
        f.seek((1 << 32) + 100)
        f.write(b"past-4GiB")
        f.truncate(SPARSE_SIZE)
    (root / "exec.sh").write_text("#!/bin/sh\necho hi\n")
    os.chmod(root / "exec.sh", 0o755)
    os.chmod(root / "train" / "cat" / "1.txt", 0o600)
    os.utime(root / "train" / "dog" / "1.bin", ns=(1_000_000_000_123_456_789, 1_000_000_000_123_456_789))
    os.mkfifo(root / "a_fifo")
    return root


def make_spaced_tree(src: Path) -> Path:
    """120 files in 4 directories, names with spaces, sizes from 0 to ~200 KB (random bytes, then zeros): a job's
    dataset in the Slurm tests."""
    for i in range(120):
        path = src / f"dir {i % 4}" / f"file {i}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(i * 1700) + bytes(i * 300))
    return src


def tree_listing(root: Path) -> dict[bytes, tuple]:
    """Relative path -> (type, mode, size, mtime_ns, link target) for everything but special files."""
    out = {}
    base = os.fsencode(root)
    for dirpath, dirnames, filenames in os.walk(base):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode) or stat.S_ISLNK(st.st_mode)):
                continue
            target = os.readlink(path) if stat.S_ISLNK(st.st_mode) else None
            size = st.st_size if not stat.S_ISDIR(st.st_mode) else None
            out[os.path.relpath(path, base)] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), size,
                                                st.st_mtime_ns if not stat.S_ISDIR(st.st_mode) else None, target)
    return out


def sha256_file(path: Path | bytes, skip_sparse: bool = True) -> str:
    """sha256 of a file; the >4 GiB sparse test file is hashed by its known parts instead."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        if skip_sparse and os.fstat(f.fileno()).st_size == SPARSE_SIZE:
            for offset in (0, (1 << 32) + 100, SPARSE_SIZE - 10):
                f.seek(offset)
                digest.update(f.read(16))
            return digest.hexdigest()
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def damaged_copy(store: Path, bad: Path, victim: bytes, at: int = 0, flip: int = 0x01) -> int:
    """Copy ``store`` to ``bad`` and flip bits of byte ``at`` of ``victim``'s first blob; returns its shard."""
    shutil.copytree(store, bad)
    s = Store(str(bad))
    entry = s.lookup(victim)
    shard = int(s.index.shard[entry])
    offset = int(s.index.blob_offset[int(s.index.first[entry])]) + at
    s.close()
    with open(bad / SHARD_DIR / shard_name(shard), "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ flip]))
    return shard
