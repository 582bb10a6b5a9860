"""A long-lived reader of a mount for the tests, run under ``fanfs run``: it reads commands on stdin, one a line, and
answers each with one JSON line on stdout, so that a test can change the mount (unmount it, kill its daemon, cut a
shard) between two opens of the same process.

    read REL      the file's [size, sha256], or the failure [exception name, errno]
    hold N REL    open REL N times and keep them open; answer how many descriptors this process then has
    release       close every file held; answer how many descriptors this process then has
    fds           how many descriptors this process has
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
    if words[0] == "release":
        for f in held:
            f.close()
        held.clear()
    return len(os.listdir("/proc/self/fd"))


for command in sys.stdin:
    print(json.dumps(answer(command.strip())), flush=True)
