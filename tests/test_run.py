"""Issue 48: ``fanfs run -- COMMAND``: the command's Python processes open the mount's files in their own process, and
get what the mount gives, always: the same bytes and sizes at every fidelity and precision, file objects that behave
as the mount's, and everything the fast path does not handle left to the mount, unchanged."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from fanfs_command import FANFS, fanfs, mount_stats, set_presentation
from photo_samples import make_photo_set
from support.jpeg_samples import build_samples
from support.trees import make_torture_tree

READER = Path(__file__).resolve().parent / "support" / "run_reader.py"


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("run")
    src = make_torture_tree(base / "src")
    build_samples(src / "samples")
    for c in range(2):
        make_photo_set(src / "photos" / f"class{c}", 5, seed=c)
    rng = np.random.default_rng(48)
    np.savez(src / "arrays.npz", a=rng.standard_normal((1000, 500)).astype(np.float32), b=np.arange(10))
    (src / "big.raw").write_bytes(rng.bytes(5 << 20))  # random: an extent
    fanfs("pack", src, base / "plain", "--shard-size", "256K", "--quiet")
    fanfs("pack", src, base / "progressive", "--progressive-jpeg", "--shard-size", "256K", "--quiet")
    return {"src": src, "plain": base / "plain", "progressive": base / "progressive"}


def under_run(mnt: Path, *command: str | os.PathLike, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    """``fanfs run --mount MNT -- COMMAND`` as a user runs it."""
    done = subprocess.run([*FANFS, "run", "--mount", str(mnt), "--", *map(str, command)], capture_output=True,
                          text=True, timeout=300, **kwargs)
    assert not check or done.returncode == 0, done.stderr
    return done


def read(mnt: Path, *args: str, run: bool = True) -> dict:
    """What tests/support/run_reader.py read of the mount, under fanfs run or through the mount alone."""
    if run:
        done = under_run(mnt, sys.executable, READER, mnt, *args)
    else:
        done = subprocess.run([sys.executable, READER, str(mnt), *args], capture_output=True, text=True, check=True,
                              timeout=300)
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("which", ["plain", pytest.param("progressive", marks=pytest.mark.slow)])
def test_every_file_reads_as_through_the_mount_at_every_fidelity(stores, mount, which):
    """Every regular file of a torture tree (odd names, empty, multi-chunk, sparse past 4 GiB, extents, real JPEGs)
    at full fidelity and, for progressive records, at K = 1, 3 and 5: the same size and bytes in-process as through
    the mount; and in-process indeed (the mount counts the files its readers read so)."""
    with mount(stores[which]) as mnt:
        for fidelity in (["full"] if which == "plain" else ["1", "3", "5", "full"]):
            set_presentation(mnt, "fidelity", fidelity)
            through = read(mnt, "tree", run=False)
            inside = read(mnt, "tree")
            assert inside.pop("in_process") and not through.pop("in_process")
            assert inside == through, fidelity
        counted = mount_stats(mnt)["in_process"]
        assert counted["processes"] >= 1 and counted["files"] >= len(inside) - 1, counted


@pytest.mark.slow
def test_float_records_at_every_precision_as_through_the_mount(tmp_path, mount):
    from float_samples import make_float_tree
    make_float_tree(tmp_path / "src")
    fanfs("pack", tmp_path / "src", tmp_path / "store", "--float-records", "--quiet")
    with mount(tmp_path / "store") as mnt:
        for precision in ("8", "16", "full"):
            set_presentation(mnt, "precision", precision)
            inside, through = read(mnt, "tree"), read(mnt, "tree", run=False)
            assert inside.pop("in_process") and not through.pop("in_process")
            assert inside == through, precision


FILE_OBJECT = r"""
import io, json, mmap, os, sys
from pathlib import Path
import numpy as np
root = Path(sys.argv[1])
path = root / "train" / "cat" / "1.txt"
out = {}
with open(path, "rb") as f:
    out["buffered"] = isinstance(f, io.BufferedReader) and isinstance(f, io.BufferedIOBase)
    out["name"] = [f.name == str(path), f.mode, f.closed, f.readable(), f.seekable(), f.writable()]
    out["parts"] = [f.read(4).decode(), f.tell(), f.seek(-5, os.SEEK_END), f.read().decode(), f.seek(2), f.peek(3)[:3].decode()]
    buffer = bytearray(6)
    out["readinto"] = [f.readinto(buffer), buffer.decode()]
    fd = f.fileno()
    out["fileno"] = [os.fstat(fd).st_size, os.lseek(fd, 0, os.SEEK_CUR) >= 0]
    with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as m:
        out["mmap"] = m[:4].decode()
out["closed"] = f.closed
with open(str(path)) as t:
    out["text"] = [t.mode, t.readline(), len(t.readlines()), isinstance(t, io.TextIOWrapper)]
with open(os.fsencode(path), "rb", buffering=0) as raw:
    out["unbuffered"] = [raw.read(4).decode(), raw.name == os.fsencode(path)]
out["pathlib"] = [len(path.read_bytes()), path.read_text()[:4]]
arrays = np.load(root / "arrays.npz")
out["npz"] = [float(arrays["a"].sum()), int(arrays["b"].sum())]
with open(root / "big.raw", "rb") as big:
    whole = big.read()
    big.seek(3 << 20)
    view = bytearray(1 << 20)
    out["extent"] = [len(whole), big.readinto(view), view == whole[3 << 20:4 << 20]]
    big.seek(0)
    out["fromfile"] = int(np.fromfile(big, dtype=np.uint8, count=100).sum()) == sum(whole[:100])
print(json.dumps(out))
"""


def test_a_file_opened_in_process_behaves_as_the_mount_s(stores, mount):
    """``isinstance`` checks, ``name`` (a ``Path``'s as ``open`` gives it: a str), ``mode``, seek/tell/peek/readinto, ``with``; a real
    descriptor of the same file on the mount for ``fileno()`` (fstat, mmap, numpy.fromfile); text mode, unbuffered,
    pathlib, ``np.load`` of an .npz and an extent's parts: all as through the mount."""
    with mount(stores["plain"]) as mnt:
        inside = json.loads(under_run(mnt, sys.executable, "-c", FILE_OBJECT, mnt).stdout)
        through = json.loads(subprocess.run([sys.executable, "-c", FILE_OBJECT, str(mnt)], capture_output=True,
                                            text=True, check=True).stdout)
        assert mount_stats(mnt)["in_process"]["files"] >= 7
    assert inside == through
    assert inside["buffered"] and inside["name"] == [True, "rb", False, True, True, False] and inside["closed"]


READ_WHOLE = "import sys\nfor name in sys.argv[2:]:\n    open(sys.argv[1] + '/' + name, 'rb').read()\n"


def test_what_readers_read_in_process_counts_by_source_as_through_the_mount(stores, mount):
    """``fanfs stats`` counts what happened: the stored bytes a reader read in its own process count in the mount's
    bytes read from each source (what a lazily staged node read through, a job node's peers), as the same reads
    through a fresh mount count; from the reader's report at its end."""
    names = sorted(str(p.relative_to(stores["src"])) for p in (stores["src"] / "photos").rglob("*.jpg"))
    counted = {}
    for way in ("in-process", "through"):
        with mount(stores["plain"]) as mnt:
            before = mount_stats(mnt)["by_source"]
            if way == "in-process":
                assert ": 10 files (" in under_run(mnt, sys.executable, "-c", READ_WHOLE, mnt, *names).stderr
            else:
                subprocess.run([sys.executable, "-c", READ_WHOLE, mnt, *names], check=True)
            after = mount_stats(mnt)["by_source"]
            counted[way] = {name: after[name] - before.get(name, 0) for name in after}
    assert counted["in-process"] == counted["through"] and sum(counted["through"].values()) > 0, counted


HOLDING_DESCRIPTORS = r"""
import hashlib, json, os, resource, sys
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4096)), hard))
held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]  # before the first open under the mount
print(json.dumps({name: hashlib.sha256(open(os.path.join(sys.argv[1], name), "rb").read()).hexdigest()
                  for name in sys.argv[2:]}))
"""


def test_a_reader_holding_over_a_thousand_descriptors_reads_in_process(stores, mount):
    """A training process may hold more than 1,023 descriptors (its files, its workers' pipes, its sockets) before its
    first open under the mount: the descriptors fanfs then opens get numbers ``select`` refuses (ValueError), so what
    asks whether the daemon lives polls instead.  Every file reads in process, exact."""
    if resource.getrlimit(resource.RLIMIT_NOFILE)[1] < 1200:
        pytest.skip("this machine's hard limit of descriptors is under 1,200")
    src = stores["src"]
    names = sorted(str(p.relative_to(src)) for p in (src / "photos").rglob("*.jpg"))
    with mount(stores["plain"]) as mnt:
        done = under_run(mnt, sys.executable, "-c", HOLDING_DESCRIPTORS, mnt, *names)
        assert mount_stats(mnt)["in_process"]["files"] == len(names), done.stderr
    assert json.loads(done.stdout) == {name: hashlib.sha256((src / name).read_bytes()).hexdigest() for name in names}


LEFT_TO_THE_MOUNT = r"""
import errno, json, os, sys
root = sys.argv[1]
def answer(*args, **kwargs):
    try:
        with open(*args, **kwargs) as f:
            return ["ok", len(f.read())]
    except OSError as err:
        return [type(err).__name__, err.errno]
out = {
    "write": answer(os.path.join(root, "empty.dat"), "wb"),
    "append": answer(os.path.join(root, "empty.dat"), "a"),
    "plus": answer(os.path.join(root, "empty.dat"), "r+b"),
    "directory": answer(os.path.join(root, "train"), "rb"),
    "missing": answer(os.path.join(root, "train", "nope"), "rb"),
    "dotdot": answer(os.path.join(root, "train", "..", "empty.dat"), "rb"),
    "dot": answer(os.path.join(root, ".", "train", "cat", "1.txt"), "rb"),
    "doubled": answer(root + "//train/cat/1.txt", "rb"),
    "link": answer(os.path.join(root, "link_rel"), "rb"),
    "link_dir": answer(os.path.join(root, "link_dir", "cat", "1.txt"), "rb"),
    "dangling": answer(os.path.join(root, "link_dangling"), "rb"),
    "out_of_the_mount": answer(os.path.join(root, "train", "..", "..", "outside"), "rb"),
    "fd": answer(os.open(os.path.join(root, "empty.dat"), os.O_RDONLY), "rb"),
    "opener": answer(os.path.join(root, "empty.dat"), "rb", opener=lambda p, f: os.open(p, f)),
}
os.chdir(os.path.join(root, "train"))
out["relative"] = answer("cat/1.txt", "rb")
os.chdir("/")
out["after_chdir"] = answer(os.path.relpath(os.path.join(root, "train", "cat", "1.txt")), "rb")
print(json.dumps(out))
"""


def test_what_the_fast_path_does_not_handle_is_the_mount_s_unchanged(stores, mount, tmp_path):
    """Writes (EROFS), a directory, a missing name, ``..`` and ``.`` and ``//`` in a name, symbolic links (in the
    store, to a directory, dangling, out of the mount), a descriptor, an opener, relative names after a ``chdir``:
    every answer is the mount's."""
    (tmp_path / "outside").write_text("not the store's")
    with mount(stores["plain"]) as mnt:
        inside = json.loads(under_run(mnt, sys.executable, "-c", LEFT_TO_THE_MOUNT, mnt).stdout)
        through = json.loads(subprocess.run([sys.executable, "-c", LEFT_TO_THE_MOUNT, str(mnt)], capture_output=True,
                                            text=True, check=True).stdout)
    assert inside == through
    assert inside["write"] == ["OSError", errno.EROFS] and inside["directory"][0] == "IsADirectoryError"
    assert inside["missing"][0] == "FileNotFoundError" and inside["relative"][0] == "ok"


def test_the_command_s_status_and_signals_are_its_own_and_it_starts_and_ends_with_a_line(stores, mount):
    with mount(stores["plain"]) as mnt:
        done = under_run(mnt, sys.executable, "-c", "import sys; open(sys.argv[1] + '/empty.dat').read(); sys.exit(3)",
                         mnt, check=False)
        assert done.returncode == 3, done.stderr
        lines = done.stderr.splitlines()
        assert len(lines) == 2 and lines[0].startswith("fanfs run: ") and "in-process" in lines[0], lines
        assert "1 file " in lines[1] and "by 1 process;" in lines[1], lines
        killed = under_run(mnt, sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)",
                           check=False)
        assert killed.returncode == 128 + 15
        missing = subprocess.run([*FANFS, "run", "--mount", str(mnt), "--", "/no/such/command"], capture_output=True,
                                 text=True)
        assert missing.returncode == 1 and missing.stderr.splitlines()[-1].startswith("fanfs: error: cannot run"), \
            missing.stderr


def test_a_mount_that_is_not_one_is_one_line(tmp_path):
    done = subprocess.run([*FANFS, "run", "--mount", str(tmp_path), "--", "true"], capture_output=True, text=True)
    assert done.returncode == 1 and done.stderr == (f"fanfs: error: {tmp_path} is not a mount point: give a fanfs "
                                                    f"mount (fanfs mount STORE {tmp_path})\n")
    nothing = subprocess.run([*FANFS, "run"], capture_output=True, text=True)
    assert nothing.returncode == 1 and "no command to run" in nothing.stderr


def test_a_python_without_fanfs_reads_through_the_mount_and_says_so_once(stores, mount, tmp_path):
    """A command whose Python cannot import fanfs (another environment) still runs, reads the mount's bytes through the
    mount, and one line says so (once for the command, not once per process)."""
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    code = ("import subprocess, sys; print(open(sys.argv[1] + '/train/cat/1.txt').read()[:4]); "
            "subprocess.run([sys.executable, '-c', 'pass'], check=True)")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    with mount(stores["plain"]) as mnt:
        done = under_run(mnt, bare / "bin" / "python", "-c", code, mnt, env=env)
    assert done.stdout == "meow\n"
    off = [line for line in done.stderr.splitlines() if "in-process reads are off" in line]
    assert len(off) == 1 and "ModuleNotFoundError" in off[0], done.stderr


LOADER = r"""
import json, os, sys, threading
from concurrent.futures import ThreadPoolExecutor
import numpy as np
import torch
from PIL import Image
root, context = sys.argv[1], sys.argv[2]
names = sorted(os.path.relpath(os.path.join(d, n), root) for d, _, ns in os.walk(os.path.join(root, "photos")) for n in ns)


def pixels(name):
    with Image.open(os.path.join(root, name)) as im:
        return int(np.asarray(im.convert("RGB"), dtype=np.uint64).sum())


class Photos(torch.utils.data.Dataset):
    def __len__(self):
        return len(names)

    def __getitem__(self, i):
        return pixels(names[i])


if __name__ == "__main__":
    loader = torch.utils.data.DataLoader(Photos(), batch_size=2, num_workers=2, multiprocessing_context=context)
    by_workers = [int(x) for batch in loader for x in batch]
    with ThreadPoolExecutor(4) as pool:  # threads of one process, at once
        by_threads = list(pool.map(pixels, names * 3))
    pid = os.fork()  # a process that forks after it has read: the child reads too
    if pid == 0:
        os._exit(0 if [pixels(n) for n in names] == by_workers else 1)
    forked = os.waitpid(pid, 0)[1] == 0
    print(json.dumps({"workers": by_workers, "threads": by_threads == by_workers * 3, "forked": forked}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_dataloader_workers_threads_and_forked_children_read_in_process(stores, mount, tmp_path, context):
    """A PyTorch DataLoader's workers (forked or spawned) decode the mount's JPEGs with PIL in their own processes, as
    do threads and a child the reader forks; every pixel as through the mount, and each worker counted by the mount
    when it ends (multiprocessing ends a forked worker without atexit)."""
    script = tmp_path / "loader.py"  # spawned workers import the dataset's class from its module
    script.write_text(LOADER)
    with mount(stores["progressive"]) as mnt:
        set_presentation(mnt, "fidelity", "3")
        before = mount_stats(mnt)["in_process"]
        inside = json.loads(under_run(mnt, sys.executable, script, mnt, context).stdout)
        counted = mount_stats(mnt)["in_process"]
        through = json.loads(subprocess.run([sys.executable, str(script), str(mnt), context], capture_output=True,
                                            text=True, check=True).stdout)
    assert inside == through and inside["threads"] and inside["forked"]
    # two workers and the reader (its own forked child ends with os._exit: it says nothing), their files
    assert counted["processes"] - before["processes"] == 3, counted
    assert counted["files"] - before["files"] == 4 * len(inside["workers"]), counted
