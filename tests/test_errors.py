"""Issue 8.7: every failure says what happened in one line, and nothing a user does prints a traceback."""

from __future__ import annotations

import errno
import os
import random
import re
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from fanfs_command import fanfs, force_unmount
from support.messages import messages
from support.nobody import RUN_AS_NOBODY
from support.trees import damaged_copy


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    base = tmp_path_factory.mktemp("errors")
    (base / "src" / "d").mkdir(parents=True)
    for i in range(20):
        (base / "src" / "d" / f"f{i}.txt").write_text(f"file {i}\n" * 5000)
    fanfs("pack", base / "src", base / "store", "--quiet")
    return base


@pytest.mark.root("to mount a small tmpfs")
def test_full_disk_names_the_file_system_and_the_bytes_needed(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(6):
        (src / f"big{i}").write_bytes(os.urandom(1 << 20))
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(small)], check=True)
    try:
        done = fanfs("pack", src, small / "store", "--shard-size", "1M", check=False)
        assert done.returncode == 1 and len(messages(done.stderr)) == 1, done.stderr
        assert re.search(rf"no space left on {small} \(tmpfs\) for the store {small / 'store'}:", done.stderr), done.stderr
        assert re.search(r"needs (about|up to) \d+(\.\d)? [KMG]iB in all", done.stderr), done.stderr
        assert os.listdir(small) == []
    finally:
        subprocess.run(["umount", str(small)], check=True)


@pytest.mark.root("to mount a small tmpfs")
def test_a_full_disk_estimates_the_whole_store_within_2x(tmp_path):
    """Issue 35: the estimate was off by 100x either way (it divided what the temporary directory held, shards in part,
    spill and spool files, by what the workers said they had packed).  Now: the source at the ratio of the shards
    packed whole, against the size the same pack reaches where it fits."""
    src = tmp_path / "src"
    src.mkdir()
    for i in range(24):  # half random, half zeros: a ratio of about 2
        (src / f"half{i:02d}").write_bytes(os.urandom(1 << 19) + bytes(1 << 19))
    fanfs("pack", src, tmp_path / "fits", "--shard-size", "1M", "--quiet")
    real = sum(f.stat().st_size for f in (tmp_path / "fits").rglob("*") if f.is_file())
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=5m", "tmpfs", str(small)], check=True)
    try:
        done = fanfs("pack", src, small / "store", "--shard-size", "1M", "--jobs", "1", check=False)
    finally:
        subprocess.run(["umount", str(small)], check=True)
    assert done.returncode == 1 and len(messages(done.stderr)) == 1, done.stderr
    found = re.search(r"needs about (\d+(?:\.\d)?) ([KMG])iB in all", done.stderr)
    assert found, done.stderr
    estimate = float(found[1]) * {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[found[2]]
    assert real / 2 <= estimate <= real * 2, (estimate, real, done.stderr)


@pytest.mark.root("to mount a small tmpfs")
@pytest.mark.parametrize("ranks", [1, 2])
def test_a_stage_that_fills_the_disk_says_so_once(store, tmp_path, ranks):
    """A tmpfs with inodes for two shard copies: the third shard's copy fails with ENOSPC (the free-space
    check, in bytes, passes), and every later one would too."""
    from test_cluster import MPIEXEC, finish, mpiexec
    fanfs("pack", store / "src", tmp_path / "store", "--shard-size", "16K", "--quiet")
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size=20m,nr_inodes={2 + 3 * ranks}", "tmpfs", str(small)], check=True)
    try:
        if ranks == 1:
            done = fanfs("stage", tmp_path / "store", small / "local", "--quiet", check=False)
            code, err = done.returncode, done.stderr
        else:
            if not MPIEXEC.exists():
                pytest.skip("needs the pip mpich's mpiexec")
            proc = mpiexec("stage", tmp_path / "store", small / "local{rank}", "--quiet", nodes=ranks,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            code, err = finish(proc, 60), proc.stderr.read()
        assert code == 1 and len(err.strip().splitlines()) == 1, err
        assert err.count("No space left on device") == ranks and "free space" in err, err
        assert not [p for p in small.rglob("*.tmp")]
    finally:
        subprocess.run(["umount", str(small)], check=True)


@pytest.mark.root("to mount a small tmpfs")
def test_a_disk_too_small_to_stage_on_suggests_a_lazy_cache_with_a_capacity(tmp_path):
    """Issue 41: staging onto too small a disk suggested more nodes, fewer replicas or a bigger disk, not the cache that
    keeps what fits: --stage lazy --capacity SIZE."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "noise").write_bytes(os.urandom(3 << 20))
    fanfs("pack", tmp_path / "src", tmp_path / "store", "--quiet")
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(small)], check=True)
    try:
        done = fanfs("stage", tmp_path / "store", small / "local", "--quiet", check=False)
    finally:
        subprocess.run(["umount", str(small)], check=True)
    assert done.returncode == 1 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "use more nodes, fewer replicas or a bigger disk, or mount with --stage lazy --capacity SIZE: a cache that " \
           "keeps what fits the disk and reads the rest through (FANFS_STAGE=lazy FANFS_CAPACITY=SIZE in a job)" \
           in done.stderr, done.stderr


def test_an_empty_tree_packs_without_a_meaningless_ratio(tmp_path):
    (tmp_path / "empty").mkdir()
    done = fanfs("pack", tmp_path / "empty", tmp_path / "store")
    assert "packed 0 files" in done.stdout and "nan" not in done.stdout and "0 B/s" not in done.stdout, done.stdout
    assert "nan" not in fanfs("info", tmp_path / "store").stdout


def catches_alarms(pid: int) -> bool:
    """Whether fanfs's ``main`` has put its Ctrl-C handlers in place: from then on the process catches SIGALRM (a
    Ctrl-C deferred out of the import machinery), which the interpreter alone never does."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), 16)
    return bool(caught >> (signal.SIGALRM - 1) & 1)


def start_fanfs(*args: str) -> subprocess.Popen:
    """``python -m fanfs ARGS``, returned once fanfs handles Ctrl-C (or the command ended first).

    What a user is promised: a Ctrl-C from the moment fanfs's own code runs is one line and exit 130.  One that
    lands while the Python interpreter is still starting (its ``site`` import, fanfs's package being imported:
    tens of milliseconds) is the interpreter's, as for any Python program: its KeyboardInterrupt, before fanfs
    has done anything (a fresh clone's first run once took one there at delay 0)."""
    proc = subprocess.Popen([sys.executable, "-m", "fanfs", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + 60
    while not catches_alarms(proc.pid) and proc.poll() is None:
        assert time.monotonic() < deadline, "fanfs never put its Ctrl-C handler in place"
        time.sleep(0.001)
    return proc


@pytest.mark.slow
def test_ctrl_c_at_any_moment_of_a_pack_is_one_line(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(24):
        (src / f"f{i}").write_bytes(os.urandom(1 << 20) + bytes(1 << 20))
    rng = random.Random(7)
    for attempt in range(12):
        store = tmp_path / f"store{attempt}"
        proc = start_fanfs("pack", str(src), str(store), "--codec", "zstd:12")
        time.sleep(rng.uniform(0.0, 1.2))
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
        assert "Traceback" not in err and "Exception ignored" not in err, err
        if proc.returncode == 130:
            assert err.strip() == "fanfs: interrupted; nothing was left half-done", err
            assert not store.exists()
        else:
            assert proc.returncode == 0 and store.exists(), err  # it finished before the signal
        assert not list(tmp_path.glob(f"store{attempt}.*"))


def test_ctrl_c_while_starting_is_quiet(store):
    for delay in (0.0, 0.005, 0.01, 0.02, 0.04, 0.08, 0.15):
        proc = start_fanfs("verify", str(store / "store"), "--quiet")
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        assert "Traceback" not in err and proc.returncode in (0, 130), (delay, proc.returncode, err)
        assert err.strip() in ("", "fanfs: interrupted; nothing was left half-done"), err


CTRL_C_AT = """\
import os, signal, sys


def ctrl_c(frame, event, arg):  # one Ctrl-C, as the first function where {where} starts
    code = frame.f_code
    if {where}:
        sys.settrace(None)
        os.kill(os.getpid(), signal.SIGINT)


sys.settrace(ctrl_c)
"""
"""A ``sitecustomize`` for ``python -m fanfs`` (Python imports it before anything else): one Ctrl-C sent
where the pack reaches a chosen point, not after a guessed delay."""

CTRL_C_POINTS = {
    # dataclasses (the pack's modules, as they are imported) make methods by exec() of a string: CPython marks a
    # KeyboardInterrupt that leaves such code "unhandled" however it is handled later, and python -m then killed
    # itself with SIGINT at exit (returncode -2), after the clean-up and the message (multiprocessing's shared
    # values did too, once the store's directory existed: the pack makes none since its full-disk estimate counts
    # whole shards)
    "importing": 'code.co_filename == "<string>" and "fanfs.pack.shards" in sys.modules',
    # the store's directory made but not yet claimed by its marker: it was left, and no later pack removes it
    "claiming": 'code.co_name == "_mark"',
    # after the last shard, as the pool shuts down: the Ctrl-C was lost and the pack went on to exit 0
    "pool-ending": 'code.co_name == "shutdown" and code.co_filename.endswith("futures/process.py")',
}


@pytest.mark.parametrize("where", CTRL_C_POINTS.values(), ids=CTRL_C_POINTS.keys())
def test_ctrl_c_at_each_point_of_a_pack_exits_130_leaving_nothing(tmp_path, where):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        (src / f"f{i}").write_bytes(os.urandom(1 << 20))
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(CTRL_C_AT.format(where=where))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(hook), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-m", "fanfs", "pack", str(src), str(tmp_path / "store"), "-q",
                           "--shard-size", "1M", "--jobs", "2"], env=env, capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stderr.strip()) == (130, "fanfs: interrupted; nothing was left half-done")
    assert not list(tmp_path.glob("store*"))


def test_a_failed_read_is_logged_once(store, tmp_path, mount):
    bad = tmp_path / "bad"
    damaged_copy(store / "store", bad, b"d/f3.txt", at=10)
    from fanfs.serve.control import log_path
    with mount(bad) as mnt:
        for _ in range(3):
            with pytest.raises(OSError):
                (mnt / "d" / "f3.txt").read_bytes()
        log = Path(log_path(mnt)).read_text()
    assert log.count("EIO d/f3.txt") == 1, log


def test_missing_scan_script_and_plan_are_one_clear_line(store, tmp_path):
    for option, what in (("--scan-script", "scan script"), ("--plan", "plan")):
        done = fanfs("pack", store / "src", tmp_path / "x", option, tmp_path / "nosuch", check=False)
        assert done.returncode == 1 and len(done.stderr.strip().splitlines()) == 1
        assert f"cannot read {what} {tmp_path / 'nosuch'}: No such file or directory" in done.stderr, done.stderr
        assert "[Errno" not in done.stderr
    os.mkfifo(tmp_path / "fifo")
    done = fanfs("pack", store / "src", tmp_path / "x", "--scan-script", tmp_path / "fifo", check=False, timeout=30)
    assert done.returncode == 1 and "FIFO" in done.stderr


def test_a_closed_pipe_ends_the_command_quietly(store):
    proc = subprocess.Popen([sys.executable, "-m", "fanfs", "info", "--json", str(store / "store")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # as `| head -0` would
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == 141 and err == b"", err


def _fake_libfuse(directory: Path, source: str | None) -> dict[str, str]:
    """An environment whose ``libfuse3.so.3`` is ``directory``'s: libz (no libfuse at all), or compiled C."""
    directory.mkdir()
    if source is None:
        os.symlink("/lib/x86_64-linux-gnu/libz.so.1", directory / "libfuse3.so.3")
    else:
        (directory / "fake.c").write_text(source)
        subprocess.run([shutil.which("cc"), "-shared", "-fPIC", "-o", directory / "libfuse3.so.3", directory / "fake.c"],
                       check=True)
    return {**os.environ, "LD_LIBRARY_PATH": str(directory)}


@pytest.mark.parametrize("source, said", [
    (None, "is not libfuse 3 (it has no fuse_version)"),
    ("int fuse_version(void) { return 317; }", "is libfuse 3.17"),
    ("int fuse_version(void) { return 314; }", "lacks fuse_session_new"),
])
def test_an_unknown_libfuse_is_one_line_naming_what_is_supported(store, tmp_path, source, said):
    if source is None and not os.path.exists("/lib/x86_64-linux-gnu/libz.so.1") or source and not shutil.which("cc"):
        pytest.skip("needs libz (and a C compiler) to make a library that is not libfuse 3")
    env = _fake_libfuse(tmp_path / "lib", source)
    (tmp_path / "mnt").mkdir()
    for foreground in ((), ("--foreground",)):
        done = fanfs("mount", store / "store", tmp_path / "mnt", *foreground, check=False, env=env, timeout=60)
        assert done.returncode == 1 and len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert said in done.stderr and "fanfs needs libfuse 3.0-3.16 (libfuse3.so.3)" in done.stderr, done.stderr
        assert not os.path.ismount(tmp_path / "mnt")


_WITH_DEV_FUSE = """
set -e
mount --bind "$1" /dev/fuse
shift
exec "$@"
"""
"""In a mount namespace of its own (nothing outside sees it): /dev/fuse replaced by ``$1`` (the same device, of the
mode the test chose, whatever another test makes the host's meanwhile), then the command."""


@pytest.fixture
def nobody_s_place(store):
    """A directory of nobody's in /tmp: the store readable by all, an empty mount point, a runtime directory and a
    temporary directory; ``run(fuse_mode, *args)`` runs ``fanfs ARGS`` as nobody there, /dev/fuse of that mode."""
    base = Path(tempfile.mkdtemp(prefix="fanfs-test-nobody-", dir="/tmp"))
    shutil.copytree(store / "store", base / "store")
    for path in [base / "store", *(base / "store").rglob("*")]:  # packed in pytest's 0700 directory: private
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
    for name in ("mnt", "run", "tmp"):
        (base / name).mkdir()
    os.chmod(base, 0o755)
    for path in (base / "mnt", base / "run", base / "tmp", base):
        os.chown(path, pwd.getpwnam("nobody").pw_uid, -1)
    env = {**os.environ, "FANFS_RUNTIME_DIR": str(base / "run"), "TMPDIR": str(base / "tmp")}

    def run(fuse_mode: int, *args: object) -> subprocess.CompletedProcess:
        device = base / f"fuse-{fuse_mode:o}"
        if not device.exists():
            os.mknod(device, fuse_mode | stat.S_IFCHR, os.stat("/dev/fuse").st_rdev)
            os.chmod(device, fuse_mode)  # whatever the umask
        return subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", _WITH_DEV_FUSE, "sh",
                               device, sys.executable, RUN_AS_NOBODY, *map(str, args)], capture_output=True, text=True,
                              timeout=120, env=env)

    try:
        yield base, run
    finally:
        force_unmount(base / "mnt")
        shutil.rmtree(base)


@pytest.mark.root("to act as another user")
@pytest.mark.skipif(not shutil.which("unshare"), reason="needs unshare")
def test_a_failed_mount_says_libfuse_s_reason_in_one_line(nobody_s_place):
    """As nobody, with allow_other (which /etc/fuse.conf does not allow users): the reason libfuse or fusermount3 gives
    is the error, not a traceback's last lines."""
    base, run = nobody_s_place
    done = run(0o666, "mount", base / "store", base / "mnt", "-o", "allow_other")
    assert done.returncode == 1 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert re.search(r"cannot mount at \S+: (fuse: |fusermount3: ).*allow_other", done.stderr), done.stderr
    assert "Traceback" not in done.stderr and "File " not in done.stderr and "[Errno" not in done.stderr
    assert not os.path.ismount(base / "mnt")


@pytest.mark.root("to act as another user")
@pytest.mark.skipif(not shutil.which("unshare"), reason="needs unshare")
def test_fuse_closed_to_the_user_is_one_line_before_anything_is_staged_or_made(nobody_s_place):
    """Issue 50: a node whose /dev/fuse is 0600 refused a plain user's mount only after the job staged its shards (and
    said nothing of FANFS_MOUNT=0), and ``tools/demo`` failed at its mount leaving its /tmp/fanfs-demo-* behind.  Now
    FUSE is checked first: one line that says what to ask the administrator for and what to do without a mount;
    nothing staged, no directory made, no demo directory left."""
    base, run = nobody_s_place
    for args in (("mount", base / "store", base / "mnt", "--local-dir", base / "local", "--stage"),
                 ("mount", base / "store", base / "mnt"), ("demo",)):
        done = run(0o600, *args)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 1 and len(lines) == 1, done.stderr
        assert lines[0].startswith("fanfs: error: /dev/fuse is not open to you (Permission denied: crw-------, "
                                   "root (uid 0)'s): ask the administrator to make it crw-rw-rw-"), lines
        assert "--no-mount (FANFS_MOUNT=0 in a job)" in lines[0], lines
        assert not os.path.ismount(base / "mnt")
    assert not (base / "local").exists() and os.listdir(base / "tmp") == []  # nothing staged, no demo left


@pytest.mark.slow
def test_a_blob_that_decodes_to_the_wrong_size_is_eio_and_logged_once(store, tmp_path, mount):
    """A crafted store (valid checksums) whose blob is a zstd frame of fewer bytes than the index says."""
    import numpy as np
    import zstandard

    from fanfs.serve.control import log_path
    from fanfs.store.format import INDEX_NAME, SHARD_DIR, checksum, read_index, shard_name, write_index
    bad = tmp_path / "bad"
    shutil.copytree(store / "store", bad)
    meta, columns, *_ = read_index(str(bad / INDEX_NAME))
    columns = {name: np.array(column) for name, column in columns.items()}
    from fanfs.store import Store
    opened = Store(str(bad))
    entry = opened.lookup(b"d/f3.txt")
    opened.close()
    blob = int(columns["first"][entry])
    offset, length = int(columns["blob_offset"][blob]), int(columns["blob_stored"][blob])
    frame = zstandard.ZstdCompressor().compress(b"short")
    padding = length - len(frame) - 8  # a zstd skippable frame fills the blob to its stored size
    crafted = frame + (0x184D2A50).to_bytes(4, "little") + padding.to_bytes(4, "little") + bytes(padding)
    shard = bad / SHARD_DIR / shard_name(int(columns["shard"][entry]))
    data = bytearray(shard.read_bytes())
    data[offset:offset + length] = crafted
    shard.write_bytes(data)
    columns["blob_checksum"][blob] = checksum(crafted)
    columns["shard_checksum"][int(columns["shard"][entry])] = checksum(bytes(data))
    write_index(str(bad / INDEX_NAME), meta, columns)
    with mount(bad) as mnt:
        for _ in range(3):
            with pytest.raises(OSError) as info:
                (mnt / "d" / "f3.txt").read_bytes()
            assert info.value.errno == errno.EIO
        log = Path(log_path(mnt)).read_text()
    assert log.count("EIO d/f3.txt (shard") == 1 and "decoded 5 bytes, expected 35000" in log, log


def test_a_codec_misspelled_is_a_bad_option_naming_the_codecs_to_choose(tmp_path):
    """Issue 41: '--codec zsdt' printed a Python dict and the internal codec 'planes', exit 1.  Now argparse's line
    (exit 2, as for any bad option) lists the codecs a user may name."""
    (tmp_path / "src").mkdir()
    done = fanfs("pack", tmp_path / "src", tmp_path / "store", "--codec", "zsdt", check=False)
    assert done.returncode == 2 and done.stderr.startswith("usage: fanfs pack "), done.stderr
    assert done.stderr.splitlines()[-1] == ("fanfs pack: error: argument --codec: no codec 'zsdt' to choose: use zstd, "
                                            "zstd:LEVEL (1-22), lz4, lz4:LEVEL (1-12) or raw")
    assert "planes" not in done.stderr and not (tmp_path / "store").exists()
    assert "zstd, zstd:LEVEL (1-22), lz4, lz4:LEVEL (1-12) or raw (default zstd:3)" in " ".join(
        fanfs("pack", "--help").stdout.split())


@pytest.mark.parametrize("args, usage, said", [
    (["mount", "STORE", "MNT", "--fidelty", "3"], "fanfs mount", "unrecognized arguments: --fidelty 3 (did you mean "
                                                                 "--fidelity?)"),
    (["mount", "STORE", "MNT", "--fidelty=3"], "fanfs mount", "unrecognized arguments: --fidelty=3 (did you mean "
                                                              "--fidelity?)"),
    (["pack", "SRC", "STORE", "--quite"], "fanfs pack", "unrecognized arguments: --quite (did you mean --quiet?)"),
    (["job", "serve", "STORE", "--replika", "2"], "fanfs job serve", "unrecognized arguments: --replika 2 (did you mean "
                                                                     "--replicas?)"),
])
def test_a_misspelled_option_gets_its_commands_usage_and_the_closest_option(args, usage, said):
    """Issue 41: '--fidelty' printed the top level's usage and suggested nothing (argparse 3.11 does not)."""
    done = fanfs(*args, check=False)
    assert done.returncode == 2 and done.stderr.startswith(f"usage: {usage} "), done.stderr
    assert done.stderr.splitlines()[-1] == f"{usage}: error: {said}", done.stderr


def test_a_source_whose_prefix_begins_with_a_dash_is_told_to_follow_dashes(tmp_path):
    """Issue 39.11d: '-=SRC' (the folder '-') was taken for an option, and the error said only that STORE was missing.
    argparse takes it after '--' (or as an option's value, --against=-=SRC): the error says so, and that works."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "f").write_bytes(b"f")
    source, store = f"-={tmp_path / 'src'}", tmp_path / "store"
    done = fanfs("pack", source, store, check=False)
    assert done.returncode == 2 and done.stderr.splitlines()[-1] == (
        f"fanfs pack: error: the following arguments are required: STORE ({source} was taken for an option: write the "
        f"sources after '--': fanfs pack [OPTIONS] -- {source} ...)"), done.stderr
    fanfs("pack", "--quiet", "--", source, store)
    done = fanfs("verify", store, "--against", tmp_path, source, check=False)
    assert done.returncode == 2 and done.stderr.splitlines()[-1].endswith(
        f"({source} was taken for an option: write --against={source})"), done.stderr
    assert fanfs("verify", store, f"--against={source}", "--quiet").stdout.startswith("ok: 1 shards, 1 files")
