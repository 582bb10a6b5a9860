"""The training command of the shared-copy jobs (tests/test_slurm_shared.py), one task per job:

    shared_task.py OUT MNT SOURCE GO END

Says it serves (``OUT/ready-TAG``; TAG: the job's id, an array's task ``ARRAYID_TASK``), waits for the file GO, reads
every file of SOURCE through MNT (under 'fanfs run', the job's default: in-process from the node's store) and writes
``OUT/TAG.json`` (the job, its node and user,
the files read and those that differ from the source, and the shared copy the node reads, from 'fanfs stats'); then
waits for the file END.  Each wait lasts 3 minutes at most."""

import json
import os
import subprocess
import sys
import time

out, mnt, source, go, end = sys.argv[1:]
array = os.environ.get("SLURM_ARRAY_JOB_ID")
job = f"{array}_{os.environ['SLURM_ARRAY_TASK_ID']}" if array else os.environ["SLURM_JOB_ID"]


def wait_for(path: str) -> None:
    deadline = time.monotonic() + 180
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.1)


with open(os.path.join(out, f"ready-{job}"), "w"):
    pass
wait_for(go)
report = {"job": job, "node": os.environ["SLURMD_NODENAME"], "uid": os.getuid(), "files": 0, "mismatches": []}
for root, _, names in os.walk(source):
    for name in names:
        original = os.path.join(root, name)
        with open(original, "rb") as a, open(os.path.join(mnt, os.path.relpath(original, source)), "rb") as b:
            report["files"] += 1
            if a.read() != b.read():
                report["mismatches"].append(name)
stats = subprocess.run([sys.executable, "-m", "fanfs", "stats", mnt, "--json"], capture_output=True, text=True)
report["shared_copy"] = json.loads(stats.stdout).get("shared_copy") if stats.returncode == 0 else stats.stderr
with open(os.path.join(out, f"{job}.json.tmp"), "w") as f:
    json.dump(report, f)
os.rename(os.path.join(out, f"{job}.json.tmp"), os.path.join(out, f"{job}.json"))
wait_for(end)
