"""One task of a test job's training command (run by 'fanfs job exec' on every node).

    slurm_task.py OUT MNT [--source DIR] [--images DIR] [--in-process] [--sleep S] [--exit N] [ARG...]

Writes ``OUT/<node>-<task>.json``: the node, the mount point it was given (argument and $FANFS_MNT),
the extra arguments exactly as received, the mount's fidelity and serving processes ('fanfs stats'), and what it checked:
with ``--source``, that every file under the mount has the source's bytes; with ``--images``, that
every JPEG that Pillow can open in the source decodes through the mount, at the source's size.  With ``--in-process``
the source's files are read in-process instead (``fsspec.filesystem("fanfs", job=True)``: the job's nodes serve
without a mount) and the report has the reader's requests to peers; ``run`` says whether it runs under 'fanfs run' (the
job's default: ``open()`` is fanfs's in-process one); and, read after the checks, a lazily staged node's cache figures.  Then sleeps and exits as asked (a long
training step to cancel, a failing one).
"""

import argparse
import builtins
import json
import os
import subprocess
import sys
import time

from PIL import Image

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("mnt")
parser.add_argument("--source")
parser.add_argument("--images")
parser.add_argument("--in-process", action="store_true")
parser.add_argument("--sleep", type=float, default=0)
parser.add_argument("--exit", type=int, default=0)
parser.add_argument("extra", nargs="*")
args = parser.parse_intermixed_args()

node, task = os.environ["SLURMD_NODENAME"], os.environ["SLURM_PROCID"]
report = {"node": node, "task": task, "mnt": args.mnt, "env_mnt": os.environ.get("FANFS_MNT"),
          "extra": args.extra, "files": 0, "mismatches": [], "images": 0, "mounted": os.path.ismount(args.mnt),
          "run": getattr(builtins.open, "__module__", "") == "fanfs.inproc.hook"}  # under 'fanfs run' (FANFS_RUN)
stats = subprocess.run([sys.executable, "-m", "fanfs", "stats", args.mnt, "--json"], capture_output=True, text=True)
served = json.loads(stats.stdout) if stats.returncode == 0 else {}
report["fidelity"] = served.get("fidelity", stats.stderr)
report["workers"] = served.get("workers")
fs = None
if args.in_process:
    import fsspec

    import fanfs.fsspec  # noqa: F401  (registers the protocol where the entry point is not installed)
    fs = fsspec.filesystem("fanfs", job=True)
for top in filter(None, [args.source, args.images]):
    for root, _, files in os.walk(top):
        for name in files:
            original = os.path.join(root, name)
            served = os.path.join(args.mnt, os.path.relpath(original, top))
            if top == args.source:
                report["files"] += 1
                with open(original, "rb") as a:
                    if fs is not None:
                        same = a.read() == fs.cat_file(os.path.relpath(original, top))
                    else:
                        with open(served, "rb") as b:
                            same = a.read() == b.read()
                if not same:
                    report["mismatches"].append(served)
            elif name.endswith(".jpg"):
                try:
                    with Image.open(original) as a:
                        a.load()
                        size = a.size
                except OSError:
                    continue  # a broken original (the sample set has some): served as its bytes
                with Image.open(served) as b:
                    b.load()
                    if b.size != size:
                        report["mismatches"].append(served)
                report["images"] += 1
if fs is not None:
    report["remote_requests"] = fs.stats()["remote_requests"]
if report["run"]:  # what this process read in-process is told now, not at its end: the counts below have it
    from fanfs.inproc.hook import report as tell_the_mounts
    tell_the_mounts()
after = subprocess.run([sys.executable, "-m", "fanfs", "stats", args.mnt, "--json"], capture_output=True, text=True)
report["cache"] = json.loads(after.stdout).get("cache") if after.returncode == 0 else None  # a lazily staged node's
report["in_process_files"] = json.loads(after.stdout).get("in_process", {}).get("files") if after.returncode == 0 else None
with open(os.path.join(args.out, f"{node}-{task}.json"), "w") as f:
    json.dump(report, f)
time.sleep(args.sleep)
sys.exit(args.exit)
