"""A long-lived reader of a mount for the tests, run under ``fanfs run``: it reads commands on stdin, one a line, and
answers each with one JSON line on stdout, so that a test can change the mount (unmount it, kill its daemon, cut a
shard) between two opens of the same process.

    read REL      the file's [size, sha256], or the failure [exception name, errno]
    hold N REL    open REL N times and keep them open; answer how many descriptors this process then has
    keep REL      open REL and keep it open (held); answer its [size, sha256] as read
    fileno        the last held file's fileno(): [its fstat size, [size, sha256] of its bytes read by pread]
    release       close every file held; answer how many descriptors this process then has
    fds           how many descriptors this process has
    bug           from now on the fast path fails as a bug of fanfs's would (any exception): opens must go to the mount
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

root = sys.argv[1]
held: list = []


def answer(line: str) -> object:
    words = line.split(" ")
    if words[0] == "read":
        try:
            with open(os.path.join(root, words[1]), "rb") as f:
                data = f.read()
            return [len(data), hashlib.sha256(data).hexdigest()]
        except OSError as err:
            return [type(err).__name__, err.errno]
    if words[0] == "hold":
        for _ in range(int(words[1])):
            held.append(open(os.path.join(root, words[2]), "rb"))
        return [len(os.listdir("/proc/self/fd")), sum(len(f.read()) for f in held)]
    if words[0] == "keep":
        held.append(open(os.path.join(root, words[1]), "rb"))
        data = held[-1].read()
        return [len(data), hashlib.sha256(data).hexdigest()]
    if words[0] == "fileno":
        fd = held[-1].fileno()
        data = os.pread(fd, 1 << 24, 0)
        return [os.fstat(fd).st_size, [len(data), hashlib.sha256(data).hexdigest()]]
    if words[0] == "bug":
        import fanfs.inproc.hook

        def broken(*args: object) -> None:
            raise RuntimeError("a bug of fanfs's")
        fanfs.inproc.hook._opened = broken
    if words[0] == "release":
        for f in held:
            f.close()
        held.clear()
    return len(os.listdir("/proc/self/fd"))


for command in sys.stdin:
    print(json.dumps(answer(command.strip())), flush=True)
