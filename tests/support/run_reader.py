"""A reader of a mount, run by the tests under ``fanfs run`` (and without it, to compare): it opens files as a training
script does and prints what it got as JSON on its last line.

    run_reader.py MOUNTPOINT tree            every regular file: its size and sha256 (large sparse ones: head and tail)
    run_reader.py MOUNTPOINT files REL...    the same, of these files (an error's errno in place of a file's figures)
    run_reader.py MOUNTPOINT repeat N REL... read these files whole N times (a switch races them): each read's sha256

and says whether ``open`` was fanfs's in-process one (``"in_process"``).
"""

from __future__ import annotations

import builtins
import hashlib
import json
import os
import sys

LARGE = 64 << 20  # files larger than this are hashed by their first and last MiB (a sparse file of >4 GiB)


def figures(path: str) -> list | int:
    """[size, sha256] of the file's bytes as read with ``open()``, or the errno of the failure."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size if os.path.getsize(path) > LARGE else None
            if size is None:
                data = f.read()
                return [len(data), hashlib.sha256(data).hexdigest()]
            head = f.read(1 << 20)
            f.seek(size - (1 << 20))
            tail = f.read()
            return [size, hashlib.sha256(head + tail).hexdigest()]
    except OSError as err:
        return err.errno or -1


def main() -> None:
    root, what, *rest = sys.argv[1:]
    out: dict = {"in_process": getattr(builtins.open, "__module__", "") == "fanfs.inproc.hook"}
    if what == "tree":
        for directory, _, names in os.walk(root):
            for name in names:
                path = os.path.join(directory, name)
                if os.path.isfile(path) and not os.path.islink(path):
                    out[os.path.relpath(path, root)] = figures(path)
    elif what == "files":
        for rel in rest:
            out[rel] = figures(os.path.join(root, rel))
    elif what == "repeat":
        count, rels = int(rest[0]), rest[1:]
        out["reads"] = [[rel, figures(os.path.join(root, rel))] for _ in range(count) for rel in rels]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
