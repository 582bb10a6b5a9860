"""Issue 22, part 2: a cluster node without FUSE.  The nodes of a real ``mpiexec`` job stage their shards and
serve their peers without mounting anything (``fanfs mount --no-mount``); an in-process reader on a node
(``fsspec.filesystem("fanfs", node=DIR)``) reads its staged copy and fetches what it lacks from the peers
through the job's authenticated protocol, as the node's mount would.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import fsspec
import pytest
from fanfs_command import fanfs
from support.processes import mpi_segments, mpi_segments_left, stop
from test_cluster import MPIEXEC, dataset, finish, holders_of, mpiexec, stage  # noqa: F401  (dataset: a fixture)

from fanfs.cluster.nodeview import KEY_FILE, NODE_FILE
from fanfs.peers.placement import place
from fanfs.errors import FanfsError
from fanfs.fsspec import FanfsFileSystem  # noqa: F401  (registers the protocol where the entry point is not installed)
from fanfs.store.format import INDEX_NAME
from fanfs.store.index import Index

NODES = 3
pytestmark = [pytest.mark.slow,  # mpiexec jobs of 3 nodes
              pytest.mark.filterwarnings("ignore:This DataLoader will create 4 worker processes"),  # on 2 cores
              pytest.mark.skipif(not MPIEXEC.exists(), reason="needs the pip mpich's mpiexec (tools/setup --test)")]


class NodeJob:
    """``mpiexec -n 3 fanfs mount STORE node{rank} --local-dir local{rank} --no-mount``: nodes without a mount."""

    def __init__(self, store: Path, base: Path, replicas: int, *options: str) -> None:
        self.base = base
        self.dirs = [base / f"node{rank}" for rank in range(NODES)]
        self.log = base / "job.log"
        self.logfile = open(self.log, "w")
        self.segments = mpi_segments()
        self.proc = mpiexec("mount", store, base / "node{rank}", "--local-dir", base / "local{rank}", "--replicas",
                            replicas, "--peer-timeout", "1", "--no-mount", *options, nodes=NODES, stdout=self.logfile,
                            stderr=subprocess.STDOUT)

    def __enter__(self) -> "NodeJob":
        deadline = time.monotonic() + 90
        while not all((d / NODE_FILE).exists() for d in self.dirs):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.__exit__()
                raise AssertionError(f"the nodes did not serve: {self.text()}")
            time.sleep(0.1)
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if self.proc.poll() is None:
                for rank in range(NODES):
                    try:
                        os.kill(self.pid(rank), signal.SIGTERM)  # one node's end ends them all (BYE)
                        break
                    except (OSError, ValueError, KeyError):
                        continue
            finish(self.proc, 60)
        finally:
            self.logfile.close()

    def pid(self, rank: int) -> int:
        """The serving daemon of node ``rank``."""
        return json.loads((self.dirs[rank] / NODE_FILE).read_text())["pid"]

    def stats(self, rank: int) -> dict:
        return json.loads(fanfs("stats", self.dirs[rank], "--json").stdout)

    def leftovers(self) -> list[str]:
        found = subprocess.run(["pgrep", "-f", f"fanfs mount .*{self.base}"], capture_output=True, text=True).stdout
        processes = [p for p in found.split() if Path(f"/proc/{p}/cmdline").read_bytes().startswith(
            os.fsencode(sys.executable)) and "mpiexec" not in Path(f"/proc/{p}/cmdline").read_text()]
        published = [str(d / name) for d in self.dirs for name in (NODE_FILE, KEY_FILE) if (d / name).exists()]
        return processes + published + mpi_segments_left(self.segments, hosts=1)

    def text(self) -> str:
        return self.log.read_text(errors="replace")


def only_at_peers(store: Path, replicas: int, rank: int, files: list[str]) -> list[str]:
    """The files of which node ``rank`` holds no blob."""
    index = Index(str(store / INDEX_NAME))
    placement = place(index.blob_stored, NODES, replicas)
    return [f for f in files if rank not in holders_of(index, placement, f)]


def test_a_reader_on_a_node_without_a_mount_reads_every_file_from_its_copy_and_its_peers(dataset, tmp_path):
    src, store, files = dataset
    remote = only_at_peers(store, 1, 0, files)
    assert remote and len(remote) < len(files)
    stage(store, tmp_path, replicas=1)
    with NodeJob(store, tmp_path, 1) as job:
        assert not any(os.path.ismount(d) for d in job.dirs)
        assert all(oct((d / KEY_FILE).stat().st_mode & 0o777) == "0o600" and d.stat().st_mode & 0o077 == 0
                   for d in job.dirs)
        fs = fsspec.filesystem("fanfs", node=str(job.dirs[0]))
        assert sorted(fs.find("")) == files
        bad = [f for f in files if fs.cat_file(f) != (src / f).read_bytes()]
        assert not bad, bad[:3]
        with fs.open(remote[-1]) as f:  # a seekable file of a blob held by a peer only
            f.seek(-100, os.SEEK_END)
            assert f.read() == (src / remote[-1]).read_bytes()[-100:]
        mine = fs.stats()
        assert mine["by_source"][str(tmp_path / "local0")] > 0 and mine["by_source"]["peer#1"] > 0, mine
        assert mine["remote_requests"] > 0 and mine["remote_failures"] == mine["remote_timeouts"] == 0, mine
        served = [job.stats(rank)["cluster"]["served_requests"] for rank in (1, 2)]
        shown = fanfs("stats", job.dirs[1]).stdout
        assert f"node       {job.dirs[1]} -> {store}  (no mount" in shown and "served" in shown, shown
        assert min(served) > 0 and sum(served) >= mine["remote_requests"], served
        os.kill(job.pid(1), signal.SIGTERM)  # one node's end ends the job (BYE), as an unmount does
        assert finish(job.proc, 60) == 0, job.text()
    assert "job ending (rank 1 is done)" in job.text()
    assert not job.leftovers()
    with pytest.raises(FanfsError, match="no fanfs node serves in"):
        FanfsFileSystem(node=str(job.dirs[0]), skip_instance_cache=True)


class NodeFiles:
    """A Dataset of a node's files (the store's paths), read in-process by each DataLoader worker."""

    def __init__(self, fs, files: list[str]) -> None:
        self.fs, self.files = fs, files

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> bytes:
        return self.fs.cat_file(self.files[i])


@pytest.fixture(scope="module")
def node_job(dataset):
    """A job whose node directories another user can reach (not under pytest's private directories)."""
    base = Path(tempfile.mkdtemp(prefix="fanfs-nodejob-"))
    base.chmod(0o711)
    try:
        stage(dataset[1], base, replicas=1)
        with NodeJob(dataset[1], base, 1) as job:
            yield job
        assert not job.leftovers()
    finally:
        shutil.rmtree(base)


def test_dataloader_workers_forked_after_peer_reads_each_use_their_own_connections(dataset, node_job):
    """The file system is opened, and has read from peers, before the DataLoader forks its 4 workers: each
    worker opens its own channels (a channel's frames are numbered: two processes cannot share one)."""
    torch = pytest.importorskip("torch")
    src, store, files = dataset
    remote = only_at_peers(store, 1, 2, files)
    fs = fsspec.filesystem("fanfs", node=str(node_job.dirs[2]))
    assert fs.cat_file(remote[0]) == (src / remote[0]).read_bytes()  # the parent holds a channel to a peer now
    loader = torch.utils.data.DataLoader(NodeFiles(fs, remote), batch_size=None, num_workers=4, timeout=60,
                                         collate_fn=lambda data: data)
    got = list(loader)
    assert got == [(src / f).read_bytes() for f in remote]
    assert fs.cat_file(remote[1]) == (src / remote[1]).read_bytes()  # and the parent's channel still works


def test_job_true_reads_the_node_of_a_slurm_task(dataset, node_job, monkeypatch):
    src, _, files = dataset
    monkeypatch.delenv("FANFS_MNT", raising=False)
    with pytest.raises(ValueError, match=r"job=True reads the node of a Slurm job's task \(\$FANFS_MNT"):
        fsspec.filesystem("fanfs", job=True, skip_instance_cache=True)
    monkeypatch.setenv("FANFS_MNT", str(node_job.dirs[1]))
    fs = fsspec.filesystem("fanfs", job=True)
    assert fs.cat_file(files[0]) == (src / files[0]).read_bytes()
    with pytest.raises(ValueError, match="name the store once"):
        fsspec.filesystem("fanfs", store=str(node_job.dirs[1]), node=str(node_job.dirs[1]))


NOBODY_READER = """
import sys, fsspec, fanfs.fsspec, fanfs.cluster.nodeview, fanfs.peers.peer
import os, pwd
nobody = pwd.getpwnam("nobody")
os.setgroups([]); os.setgid(nobody.pw_gid); os.setuid(nobody.pw_uid)
try:
    open(sys.argv[1] + "/fanfs-node.key", "rb").read()
    print("read the key")
except OSError as err:
    print("key:", err.strerror)
try:
    fsspec.filesystem("fanfs", node=sys.argv[1]).cat_file(sys.argv[2])
    print("read a file")
except Exception as err:
    print("fanfs:", err)
"""


@pytest.mark.root("to act as another user")
def test_another_user_gets_a_clear_error_not_the_key(dataset, node_job):
    _, _, files = dataset
    done = subprocess.run([sys.executable, "-c", NOBODY_READER, str(node_job.dirs[0]), files[0]],
                          capture_output=True, text=True, timeout=60)
    lines = done.stdout.splitlines()
    assert lines[0] == "key: Permission denied", done
    assert lines[1] == (f"fanfs: node directory {node_job.dirs[0]} belongs to uid 0, not to you (uid "
                        f"{pwd.getpwnam('nobody').pw_uid}): refusing to use it, since another user could tamper with "
                        "fanfs's files there; use a directory of your own that only you can write (mkdir -m 700)"), done
    key = (node_job.dirs[0] / KEY_FILE).read_bytes()
    assert key.hex() not in done.stdout + done.stderr and "Traceback" not in done.stderr


def test_a_dead_peer_costs_a_replica_or_the_shared_store_never_a_hang(dataset, tmp_path):
    """3 nodes, 2 replicas: node 1 killed (-9) mid-job, every file still reads exact on node 0 from the replicas;
    node 2 then stopped too: a file whose blobs only nodes 1 and 2 hold is read from the shared store (after the
    client's 1 s deadline; issue 50: it was an EIO), the others still read."""
    src, store, files = dataset
    index = Index(str(store / INDEX_NAME))
    placement = place(index.blob_stored, NODES, 2)
    lost = [f for f in files if 0 not in holders_of(index, placement, f)]
    assert lost and len(lost) < len(files)
    stage(store, tmp_path, replicas=2)
    with NodeJob(store, tmp_path, 2) as job:
        fs = fsspec.filesystem("fanfs", node=str(job.dirs[0]))
        os.kill(job.pid(1), signal.SIGKILL)
        assert [fs.cat_file(f) for f in files] == [(src / f).read_bytes() for f in files]
        assert job.proc.poll() is None  # the others serve on
        stopped = job.pid(2)
        stop(stopped)
        try:
            assert fs.cat_file(lost[0]) == (src / lost[0]).read_bytes()
            kept = [f for f in files if f not in lost]
            assert [fs.cat_file(f) for f in kept] == [(src / f).read_bytes() for f in kept]
        finally:
            os.kill(stopped, signal.SIGCONT)
        assert fs.stats()["remote_timeouts"] >= 1
        with pytest.raises(FanfsError, match="no fanfs node serves in"):  # the dead node's rank withdrew its view
            FanfsFileSystem(node=str(job.dirs[1]), skip_instance_cache=True)
    assert not job.leftovers()


def test_no_mount_needs_a_local_dir(tmp_path):
    done = fanfs("mount", tmp_path, tmp_path / "node", "--no-mount", check=False)
    assert done.returncode != 0 and done.stderr.strip() == \
        "fanfs: error: --stage, --replicas and --no-mount need --local-dir", done.stderr


@pytest.mark.parametrize("mode", [0o755, 0o750, 0o701], ids=["755", "750", "701"])
def test_a_node_directory_others_can_enter_is_refused(tmp_path, mode):
    """Issue 29.4: a node directory holds the node's private key, and the README promises 0700; ``private_dir``
    refused only one that others could write, so a 0755 one was used.  Both the serving node and a reader refuse
    one that anyone else may list or enter, with one line that says how to mend it."""
    from fanfs.cluster.nodeview import node_dir, open_node
    from fanfs.util.runtime import UnsafeDirError
    node = tmp_path / "node"
    node.mkdir()
    node.chmod(mode)
    for check in (lambda: node_dir(str(node)), lambda: open_node(node, 1 << 20)):
        with pytest.raises(UnsafeDirError) as refused:
            check()
        assert str(refused.value) == (f"node directory {node} is open to other users (mode {mode:o}) and would hold a "
                                      "private key: chmod 700 it, or use a directory of your own that only you can "
                                      "write (mkdir -m 700)"), refused.value
    node.chmod(0o700)
    assert node_dir(str(node)) == str(node)
