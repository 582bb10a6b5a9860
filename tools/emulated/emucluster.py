#!/usr/bin/env python3
"""An emulated cluster on one machine: N node network namespaces and a storage namespace on a bridge,
every link shaped with ``tc tbf``, and the shared file system a real network file system (sshfs
against an sshd in the storage namespace), mounted on every node.

    with emulated_cluster(nodes=4, link="1gbit", storage_link="1gbit", export=src) as cluster:
        cluster.run_in(cluster.nodes[0], ["ls", str(cluster.nodes[0].shared)])
        subprocess.run([*cluster.mpiexec(), sys.executable, "-m", "fanfs", "stage",
                        cluster.rank_path("shared/store"), cluster.rank_path("local")])

What is emulated: separate network stacks (a node's daemon, its sshfs and its MPI rank talk only
through their namespace's link), link bandwidth in both directions (a node's link, and one storage
link shared by every node: the parallel file system's bandwidth), and a shared file system where
every open, stat and read is a request to another host.  What is not: CPU, memory, page cache and
local disks are the host's, shared by every "node"; there is no added latency (this kernel has no
``netem``; a round trip is the veth's plus sshd's).

Needs root (network namespaces, tc, a FUSE mount run from a namespace), iproute2, openssh-server,
openssh-client, sshfs and fuse3 (``tools/setup --test`` installs them).  Stdlib only.

Nothing is left behind: names carry the owner's pid (namespaces ``fanfs-PID-SEQ-*``, links
``fzPID-SEQ*``), teardown removes every mount, process, namespace, link and directory however the
block ends (an exception, Ctrl-C, SIGTERM), and bringing a cluster up first sweeps what owners that
are no longer alive left (``python tools/emulated/emucluster.py down`` does only that).  Traffic goes only to
the namespaces made here: nodes have no default route and the host does not forward.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import ipaddress
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from emuhost import (LOCK, NETNS_DIR, REGISTRY, EmulationError, delete_netns, end_owner, free_subnet, rate_bits, run,
                     shape, sigterm_raises, status, sweep_leftovers, unmount_under)

MPIEXEC = Path(sys.executable).parent / "mpiexec"
FIRST_NODE_HOST = 10  # nodes are .10, .11, ...; the bridge (the host) is .1, storage .2
_seq = itertools.count()



def missing_requirements() -> str | None:
    """Why a cluster cannot be emulated on this machine, or None."""
    if os.geteuid() != 0:
        return "needs root (network namespaces and tc)"
    for tool in ("ip", "tc", "nsenter", "sshfs", "ssh-keygen", "fusermount3"):
        if shutil.which(tool) is None:
            return f"needs {tool} (tools/setup --test installs iproute2, openssh-server/client, sshfs, fuse3)"
    if not Path("/usr/sbin/sshd").exists():
        return "needs /usr/sbin/sshd (openssh-server)"
    if subprocess.run(["ip", "netns", "list"], capture_output=True).returncode != 0:
        return "no network namespace support (ip netns list failed)"
    return None


def _die_with_parent() -> None:
    """In a child before exec: SIGTERM when the cluster's owner dies, even by SIGKILL (sshd, sshfs)."""
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@dataclass(frozen=True)
class Host:
    """A namespace of the cluster: a node (``n0``, ``n1`` ...) or the storage."""

    name: str
    netns: str
    ip: str
    link: str  # the host side of its veth, in the root namespace (where its byte counters are read)
    dir: Path  # its own directory: local/ (node-local storage), mnt/, shared/ (the sshfs mount)

    @property
    def local(self) -> Path:
        return self.dir / "local"

    @property
    def mnt(self) -> Path:
        return self.dir / "mnt"

    @property
    def shared(self) -> Path:
        return self.dir / "shared"


class Cluster:
    """A running emulated cluster (made by :func:`emulated_cluster`)."""

    def __init__(self, workdir: Path, subnet: ipaddress.IPv4Network, nodes: int, link: str, storage_link: str,
                 export: Path, tag: str) -> None:
        self.workdir, self.export, self.tag = workdir, export, tag
        self.link, self.storage_link = link, storage_link
        hosts = list(subnet.hosts())
        self.bridge, self.bridge_ip = f"fz{tag}b", str(hosts[0])
        self.storage = Host("storage", f"fanfs-{tag}-storage", str(hosts[1]), f"fz{tag}s", workdir / "storage")
        self.nodes = [Host(f"n{i}", f"fanfs-{tag}-n{i}", str(hosts[FIRST_NODE_HOST - 1 + i]), f"fz{tag}n{i}",
                           workdir / f"n{i}") for i in range(nodes)]
        self.ssh = workdir / "ssh"
        self.launcher = workdir / "hydra-launcher"
        self._sshd: subprocess.Popen | None = None
        self._sshfs: dict[str, subprocess.Popen] = {}

    # --- running things on a node -----------------------------------------------------------------

    def env_in(self, node: Host) -> dict[str, str]:
        """What a process on ``node`` gets on top of the caller's environment."""
        return {"FANFS_PEER_HOST": node.ip}

    def argv_in(self, node: Host, argv: Sequence[str | os.PathLike]) -> list[str]:
        """``argv`` run in ``node``'s network namespace only (the mount namespace stays the host's,
        so a FUSE mount made there is seen by everyone; ``ip netns exec`` would hide it)."""
        env = [f"{k}={v}" for k, v in self.env_in(node).items()]
        return ["nsenter", f"--net={NETNS_DIR / node.netns}", "env", *env, *map(str, argv)]

    def run_in(self, node: Host, argv: Sequence[str | os.PathLike], **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(self.argv_in(node, argv), **kwargs)

    def popen_in(self, node: Host, argv: Sequence[str | os.PathLike], **kwargs) -> subprocess.Popen:
        return subprocess.Popen(self.argv_in(node, argv), **kwargs)

    def mpiexec(self, nodes: int | None = None) -> list[str]:
        """mpiexec (the pip MPICH's Hydra) with rank i in node i's namespace, one rank per node.

        Hydra's ssh launcher runs our launcher script, which enters the node's namespace (with
        ``FANFS_PEER_HOST`` set) instead of ssh-ing; the proxies reach mpiexec on the bridge's
        address.  UCX is held to TCP on the node's link, so MPI's traffic (the index broadcast) crosses
        the shaped network rather than shared memory.  ``-disable-auto-cleanup``: a dead node must not
        make Hydra kill the others (docs/clusters.rst, "Many nodes")."""
        count = len(self.nodes) if nodes is None else nodes
        return [str(MPIEXEC), "-launcher", "ssh", "-launcher-exec", str(self.launcher), "-localhost", self.bridge_ip,
                "-hosts", ",".join(n.name for n in self.nodes[:count]), "-n", str(count), "-ppn", "1",
                "-disable-auto-cleanup", "-genv", "UCX_TLS", "tcp,self", "-genv", "UCX_NET_DEVICES", "eth0"]

    def rank_path(self, rel: str) -> str:
        """A path in every node's directory with fanfs's ``{rank}`` in it (node i is rank i)."""
        return str(self.workdir / "n{rank}" / rel)

    # --- links and the shared file system -------------------------------------------------------

    def shape(self, link: str | None = None, storage_link: str | None = None) -> None:
        """Set the nodes' and/or the storage's link rate (both directions), also while in use."""
        if link is not None:
            for node in self.nodes:
                shape(node.link, node.netns, link)
            self.link = link
        if storage_link is not None:
            shape(self.storage.link, self.storage.netns, storage_link)
            self.storage_link = storage_link

    def counters(self) -> dict[str, dict[str, int]]:
        """Bytes each namespace has sent ("out") and received ("in") over its link so far."""
        out = {}
        for host in [self.storage, *self.nodes]:
            stats = Path("/sys/class/net") / host.link / "statistics"
            out[host.name] = {"in": int((stats / "tx_bytes").read_text()), "out": int((stats / "rx_bytes").read_text())}
        return out

    def remount_shared(self, node: Host | None = None) -> None:
        """A fresh sshfs mount of the shared store on ``node`` (every node by default): nothing cached."""
        for n in [node] if node else self.nodes:
            self._unmount_shared(n)
            self._mount_shared(n)

    def settings(self) -> dict[str, object]:
        return {"nodes": len(self.nodes), "link": self.link, "link_bits": rate_bits(self.link),
                "storage_link": self.storage_link, "storage_link_bits": rate_bits(self.storage_link),
                "shared_fs": "sshfs (SFTP) from the storage namespace", "added_latency": None}

    def describe(self) -> str:
        lines = [f"emulated cluster {self.tag}: {len(self.nodes)} node(s) on {self.link} links, storage behind one "
                 f"{self.storage_link} link; work dir {self.workdir}",
                 f"  host (bridge {self.bridge}) {self.bridge_ip}; storage {self.storage.ip} (netns {self.storage.netns}, "
                 f"serves {self.export})"]
        lines += [f"  {n.name} {n.ip}  netns {n.netns}  shared store at {n.shared}" for n in self.nodes]
        lines.append(f"  run on a node:   nsenter --net={NETNS_DIR}/{self.nodes[0].netns} env "
                     f"FANFS_PEER_HOST={self.nodes[0].ip} CMD")
        lines.append(f"  MPI, rank i on node i:   {' '.join(self.mpiexec())} CMD")
        return "\n".join(lines)

    # --- bring-up, used by emulated_cluster -------------------------------------------------------

    def _up(self, undo: contextlib.ExitStack) -> None:
        run("ip", "link", "add", self.bridge, "type", "bridge")
        undo.callback(run, "ip", "link", "del", self.bridge, check=False)
        run("ip", "addr", "add", f"{self.bridge_ip}/24", "dev", self.bridge)
        run("ip", "link", "set", self.bridge, "up")
        for host, rate in [(self.storage, self.storage_link), *((n, self.link) for n in self.nodes)]:
            run("ip", "netns", "add", host.netns)
            undo.callback(delete_netns, host.netns)
            run("ip", "link", "add", host.link, "type", "veth", "peer", "name", "eth0", "netns", host.netns)
            undo.callback(run, "ip", "link", "del", host.link, check=False)
            run("ip", "link", "set", host.link, "master", self.bridge, "up")
            run("ip", "-n", host.netns, "addr", "add", f"{host.ip}/24", "dev", "eth0")
            run("ip", "-n", host.netns, "link", "set", "eth0", "up")
            run("ip", "-n", host.netns, "link", "set", "lo", "up")
            shape(host.link, host.netns, rate)
            for sub in ("local", "mnt", "shared"):
                (host.dir / sub).mkdir(parents=True, exist_ok=True)
        self._write_launcher()
        self._start_sshd(undo)
        undo.callback(self._unmount_all_shared)
        for node in self.nodes:
            self._mount_shared(node)

    def _write_launcher(self) -> None:
        cases = "\n".join(f"  {n.name}) ns={n.netns}; ip={n.ip};;" for n in self.nodes)
        self.launcher.write_text(f"""#!/bin/sh
# Hydra's ssh launcher calls this as: LAUNCHER [-x] HOST COMMAND...; run COMMAND in HOST's network namespace.
# A proxy that ends badly is named here: mpiexec itself only says it lost one.
while [ "${{1#-}}" != "$1" ]; do shift; done
host=$1; shift
case "$host" in
{cases}
  *) echo "emucluster: no node named $host" >&2; exit 255;;
esac
nsenter --net={NETNS_DIR}/$ns env FANFS_PEER_HOST=$ip sh -c "$*"
code=$?
if [ $code -gt 128 ]; then
  echo "emucluster: node $host: its MPI proxy was killed by signal $((code - 128))" >&2
elif [ $code -ne 0 ]; then
  echo "emucluster: node $host: its MPI proxy exited with $code" >&2
fi
exit $code
""")
        self.launcher.chmod(0o755)

    def _start_sshd(self, undo: contextlib.ExitStack) -> None:
        """sshd in the storage namespace, bound to its address only, with its own keys and config."""
        self.ssh.mkdir(mode=0o700)
        for key in ("host_key", "client_key"):
            run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", self.ssh / key)
        shutil.copy(self.ssh / "client_key.pub", self.ssh / "authorized_keys")
        host_key = (self.ssh / "host_key.pub").read_text().split()
        (self.ssh / "known_hosts").write_text(f"{self.storage.ip} {host_key[0]} {host_key[1]}\n")
        (self.ssh / "sshd_config").write_text(f"""ListenAddress {self.storage.ip}
Port 22
HostKey {self.ssh / 'host_key'}
AuthorizedKeysFile {self.ssh / 'authorized_keys'}
PidFile none
StrictModes no
UsePAM no
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
AllowUsers {_user()}
X11Forwarding no
AllowTcpForwarding no
Subsystem sftp internal-sftp
""")
        if os.geteuid() == 0:
            Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation dir (Debian's path)
        log = open(self.workdir / "sshd.log", "w")
        self._sshd = subprocess.Popen(["nsenter", f"--net={NETNS_DIR / self.storage.netns}", "/usr/sbin/sshd", "-D",
                                       "-e", "-f", str(self.ssh / "sshd_config")], stdout=log, stderr=log,
                                      preexec_fn=_die_with_parent)
        log.close()
        undo.callback(_stop, self._sshd)
        deadline = time.monotonic() + 10
        while True:
            with contextlib.suppress(OSError), socket.create_connection((self.storage.ip, 22), timeout=1):
                return
            if self._sshd.poll() is not None or time.monotonic() > deadline:
                raise EmulationError(f"sshd did not start: {(self.workdir / 'sshd.log').read_text().strip()}")
            time.sleep(0.05)

    def _mount_shared(self, node: Host) -> None:
        """sshfs of the storage's export at ``node.shared``, run in the node's namespace, in the
        foreground as our child (so its pid is ours to stop)."""
        opts = (f"ro,IdentityFile={self.ssh / 'client_key'},UserKnownHostsFile={self.ssh / 'known_hosts'},"
                "StrictHostKeyChecking=yes,BatchMode=yes,LogLevel=ERROR")
        log = open(node.dir / "sshfs.log", "a")
        proc = subprocess.Popen(self.argv_in(node, ["sshfs", "-f", f"{_user()}@{self.storage.ip}:{self.export}",
                                                    node.shared, "-o", opts]),
                                stdout=log, stderr=log, stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)
        log.close()
        self._sshfs[node.name] = proc
        deadline = time.monotonic() + 20
        while not os.path.ismount(node.shared):
            if proc.poll() is not None or time.monotonic() > deadline:
                self._unmount_shared(node)
                raise EmulationError(f"sshfs on {node.name} did not mount: {(node.dir / 'sshfs.log').read_text().strip()}")
            time.sleep(0.02)

    def _unmount_shared(self, node: Host) -> None:
        if os.path.ismount(node.shared):
            run("fusermount3", "-u", "-z", node.shared, check=False)
        proc = self._sshfs.pop(node.name, None)
        if proc is not None:
            _stop(proc)

    def _unmount_all_shared(self) -> None:
        for node in self.nodes:
            self._unmount_shared(node)


def _user() -> str:
    import pwd
    return pwd.getpwuid(os.geteuid()).pw_name


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def emulated_cluster(nodes: int = 4, link: str = "1gbit", storage_link: str = "1gbit", export: str | os.PathLike | None = None,
                     workdir: str | os.PathLike | None = None) -> Iterator[Cluster]:
    """Bring up an emulated cluster; yields a :class:`Cluster`; tears it all down when the block ends.

    ``export``: the directory the storage serves (the shared file system's contents; default an empty
    ``export/`` in the work dir).  ``workdir``: where the cluster's own directory goes (default
    /dev/shm: node-local storage is memory, like a burst buffer).
    """
    why = missing_requirements()
    if why:
        raise EmulationError(why)
    if not 1 <= nodes <= 200:
        raise EmulationError(f"nodes must be 1..200, not {nodes}")
    for rate in (link, storage_link):
        rate_bits(rate)  # a bad rate is refused before anything is made
    sweep_leftovers()
    tag = f"{os.getpid()}-{next(_seq) % 10}"  # one digit: a link name (fzPID-Sn199) fits the kernel's 15 characters
    base = workdir or ("/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir())
    with sigterm_raises(), contextlib.ExitStack() as undo:
        REGISTRY.mkdir(mode=0o755, exist_ok=True)
        root = Path(tempfile.mkdtemp(prefix=f"fanfs-emu-{tag}-", dir=base))
        marker = REGISTRY / tag
        marker.write_text(str(root))
        undo.callback(marker.unlink)
        undo.callback(shutil.rmtree, root, ignore_errors=True)
        undo.callback(unmount_under, str(root))  # after everything else: whatever a caller left mounted
        if export is None:
            (root / "export").mkdir()
        LOCK.touch(exist_ok=True)
        with open(LOCK) as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            cluster = Cluster(root, free_subnet(), nodes, link, storage_link,
                              Path(export).resolve() if export is not None else root / "export", tag)
            cluster._up(undo)
        yield cluster


# --- the command line --------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="bring a cluster up and keep it until Ctrl-C or SIGTERM (then tear it down)")
    up.add_argument("--nodes", type=int, default=4)
    up.add_argument("--link", default="1gbit", help="each node's link rate, both directions (default 1gbit)")
    up.add_argument("--storage-link", default="1gbit", help="the storage's one link, shared by all nodes (default 1gbit)")
    up.add_argument("--export", help="the directory the shared file system serves (default: an empty one)")
    up.add_argument("--workdir", help="where the cluster's directory goes (default /dev/shm)")
    down = sub.add_parser("down", help="remove what clusters of dead owners left; with PID, first end that owner's")
    down.add_argument("pid", nargs="?", type=int, help="SIGTERM this owner (an 'up' or a test), which tears its cluster down")
    sub.add_parser("status", help="list emulated clusters on this machine (JSON)")
    args = parser.parse_args(argv)
    try:
        if args.command == "up":
            with emulated_cluster(args.nodes, args.link, args.storage_link, args.export, args.workdir) as cluster:
                print(cluster.describe(), "\n(Ctrl-C or SIGTERM to tear it down)", flush=True)
                signal.pause() if hasattr(signal, "pause") else time.sleep(1e9)
        elif args.command == "status":
            print(json.dumps(status(), indent=2))
        else:
            if args.pid is not None:
                end_owner(args.pid)
            for thing in sweep_leftovers():
                print(f"removed {thing}")
    except EmulationError as err:
        print(f"emucluster: error: {err}", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, SystemExit):
        print("emucluster: torn down", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
