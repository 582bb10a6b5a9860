"""A slow disk for tests (issue 40): one image file served through a FUSE file system of its own, whose reads are
held while the test says so; a loop device over it and an ext4 mounted from that device make a real local disk
(RWF_NOWAIT, cachestat and the page cache behave as on an SSD) whose reads the test can stall.

    slow_disk.py IMAGE MOUNTPOINT CONTROL_DIR

Serves IMAGE as MOUNTPOINT/disk, read-only.  While CONTROL_DIR/slow exists, each read request is held, unanswered,
and counted in CONTROL_DIR/held (how many are held now); once the file is gone they are all answered.  While
CONTROL_DIR/bad exists, each read fails with EIO: a disk whose sectors cannot be read.  Prints
``ready`` once it serves.  Built on fanfs's own libfuse binding (fanfs.serve.lowlevel).
"""

import errno
import os
import stat
import sys
import threading
import time

from fanfs.serve import lowlevel as ll

image, mountpoint, control = sys.argv[1:4]
fd = os.open(image, os.O_RDONLY)
size = os.fstat(fd).st_size
ROOT, DISK = 1, 2
held: list[tuple[int, int, int]] = []
lock = threading.Lock()


class SlowDisk:
    def __init__(self) -> None:
        self.entry = ll.EntryParam(attr_timeout=3600.0, entry_timeout=3600.0)
        self.attr = ll.Stat()

    def _fill(self, target, offset: int, ino: int) -> None:
        mode = stat.S_IFDIR | 0o755 if ino == ROOT else stat.S_IFREG | 0o444
        ll.pack_stat(target, offset, ino, mode, 2 if ino == ROOT else 1, 0, 0, 0 if ino == ROOT else size, 0)

    def ready(self, session) -> None:
        print("ready", flush=True)

    def lookup(self, req: int, parent: int, name: bytes) -> None:
        if parent != ROOT or name != b"disk":
            ll.reply_err(req, errno.ENOENT)
            return
        self._fill(self.entry, ll.ATTR_OFFSET, DISK)
        ll.set_entry_ino(self.entry, DISK)
        ll.reply_entry(req, self.entry)

    def getattr(self, req: int, ino: int) -> None:
        self._fill(self.attr, 0, ino)
        ll.reply_attr(req, self.attr, 3600.0)

    def readlink(self, req: int, ino: int) -> None:
        ll.reply_err(req, errno.EINVAL)

    def read(self, req: int, ino: int, offset: int, length: int) -> None:
        if os.path.exists(os.path.join(control, "bad")):
            ll.reply_err(req, errno.EIO)
            return
        with lock:
            if os.path.exists(os.path.join(control, "slow")):
                held.append((req, offset, length))
                _count()
                return
        _answer(req, offset, length)

    def readdirplus(self, req: int, ino: int, offset: int, length: int) -> None:
        ll.reply_buf(req, b"", 0)

    def statfs(self, req: int, ino: int) -> None:
        ll.reply_statfs(req, ll.StatVfs(f_bsize=4096, f_frsize=4096))


def _answer(req: int, offset: int, length: int) -> None:
    data = os.pread(fd, length, offset)
    ll.reply_buf(req, data, len(data))


def _count() -> None:
    with open(os.path.join(control, "held.tmp"), "w") as f:
        f.write(str(len(held)))
    os.replace(os.path.join(control, "held.tmp"), os.path.join(control, "held"))


def _release() -> None:
    """Answer the held reads once the test lets the disk go (held replies go from this thread)."""
    while True:
        time.sleep(0.01)
        with lock:
            if held and not os.path.exists(os.path.join(control, "slow")):
                for req, offset, length in held:
                    _answer(req, offset, length)
                held.clear()
                _count()


threading.Thread(target=_release, daemon=True).start()
session = ll.Session(SlowDisk(), mountpoint, ["ro", "fsname=slowdisk", "subtype=slowdisk"])
sys.exit(session.loop())
