"""The host's side of emulated clusters (``tools/emulated/emucluster.py``): commands, link rates and shaping, free
subnets, SIGTERM as Ctrl-C, and what clusters leave on this machine, found and removed.

Every name an emulated cluster makes carries its owner's pid (namespaces ``fanfs-PID-SEQ-*``, links
``fzPID-SEQ*``, a registry file ``/run/fanfs-emucluster/PID-SEQ`` naming its directory), so what an owner
no longer alive left is recognised by name and pid, never by name alone.  Stdlib only.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

NETNS_DIR = Path("/run/netns")
REGISTRY = Path("/run/fanfs-emucluster")  # one file per running cluster (named by its tag) holding its directory
LOCK = REGISTRY / "lock"
_NETNS_RE = re.compile(r"^fanfs-(\d+)-(\d+)-")
_LINK_RE = re.compile(r"^fz(\d+)-(\d+)")
_TAG_RE = re.compile(r"^(\d+)-(\d+)$")
_RATE_RE = re.compile(r"^(\d+(?:\.\d+)?)([kmg]?)bit$")
SUBNETS = ipaddress.ip_network("10.201.0.0/16")  # one /24 per cluster, the first one not on this host


class EmulationError(RuntimeError):
    """The emulated cluster cannot be brought up here (not root, a missing tool, a failed command)."""


def run(*argv: str | os.PathLike, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=60)
    if check and done.returncode != 0:
        raise EmulationError(f"{' '.join(map(str, argv))}: {done.stderr.strip() or done.returncode}")
    return done


def alive(pid: int) -> bool:
    """Whether a process runs (a zombie, killed but not yet reaped, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _kill_in_netns(netns: str) -> None:
    """SIGKILL every process still in a namespace of ours (a daemon a caller left, a session sshd)."""
    pids = run("ip", "netns", "pids", netns, check=False).stdout.split()
    for pid in map(int, pids):
        if pid != os.getpid():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def delete_netns(netns: str) -> None:
    _kill_in_netns(netns)
    run("ip", "netns", "del", netns, check=False)


def unmount_under(root: str) -> list[str]:
    """Lazily unmount whatever is still mounted under ``root`` (deepest first); returns the mount points."""
    with open("/proc/self/mounts") as f:
        points = [line.split()[1].encode().decode("unicode_escape") for line in f]
    under = sorted((p for p in points if p.startswith(root.rstrip("/") + "/")), key=len, reverse=True)
    for point in under:
        run("fusermount3", "-u", "-z", point, check=False)
        if os.path.ismount(point):
            run("umount", "-l", point, check=False)
    return under


def sweep_leftovers() -> list[str]:
    """Remove what emulated clusters of owners no longer alive left behind; returns what was removed."""
    removed = []
    for marker in sorted(REGISTRY.glob("*-*")) if REGISTRY.is_dir() else []:
        m = _TAG_RE.match(marker.name)
        if m and not alive(int(m.group(1))):
            root = marker.read_text().strip()
            removed += [f"mount {point}" for point in unmount_under(root)]
            if os.path.isdir(root):
                shutil.rmtree(root, ignore_errors=True)
                removed.append(f"dir {root}")
            marker.unlink()
    if NETNS_DIR.is_dir():
        for ns in sorted(NETNS_DIR.iterdir()):
            m = _NETNS_RE.match(ns.name)
            if m and not alive(int(m.group(1))):
                delete_netns(ns.name)
                removed.append(f"netns {ns.name}")
    for line in run("ip", "-o", "link", "show").stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        m = _LINK_RE.match(name)
        if m and not alive(int(m.group(1))):
            run("ip", "link", "del", name, check=False)
            removed.append(f"link {name}")
    return removed


def status() -> list[dict[str, object]]:
    owners: dict[str, list[str]] = {}
    if NETNS_DIR.is_dir():
        for ns in NETNS_DIR.iterdir():
            m = _NETNS_RE.match(ns.name)
            if m:
                owners.setdefault(f"{m.group(1)}-{m.group(2)}", []).append(ns.name)
    return [{"cluster": tag, "owner_pid": int(tag.split("-")[0]), "alive": alive(int(tag.split("-")[0])),
             "namespaces": sorted(names)} for tag, names in sorted(owners.items())]


def end_owner(pid: int) -> None:
    """SIGTERM an owner of a cluster and wait (bounded) until it has torn its cluster down."""
    if not any(c["owner_pid"] == pid and c["alive"] for c in status()):
        raise EmulationError(f"no running cluster is owned by pid {pid} (see 'status')")
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 60
    while alive(pid) and any(c["owner_pid"] == pid for c in status()) and time.monotonic() < deadline:
        time.sleep(0.1)
    print(f"asked {pid} to tear its cluster down")


def rate_bits(rate: str) -> int:
    """Bits per second of a tc rate ("1gbit", "250mbit", "800kbit", "1000000bit")."""
    m = _RATE_RE.match(rate.strip().lower())
    if not m:
        raise EmulationError(f"bad link rate {rate!r}: say e.g. 1gbit, 250mbit, 800kbit")
    return int(float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)])


def shape(link: str, netns: str, rate: str) -> None:
    """tbf at ``rate`` on both ends of a host's veth (``link`` on this side, eth0 in ``netns``): out of the
    namespace and into it."""
    bits = rate_bits(rate)
    burst = max(bits // 8 // 100, 256 * 1024)  # 10 ms of the rate, at least a few GSO super-packets
    tbf = ["tbf", "rate", f"{bits}bit", "burst", str(burst), "latency", "50ms"]
    run("tc", "qdisc", "replace", "dev", link, "root", *tbf)
    run("tc", "-n", netns, "qdisc", "replace", "dev", "eth0", "root", *tbf)


def free_subnet() -> ipaddress.IPv4Network:
    """The first /24 of SUBNETS that no address or route on this host overlaps (under LOCK)."""
    taken = []
    for line in run("ip", "-4", "-o", "addr", "show").stdout.splitlines():
        taken.append(ipaddress.ip_interface(line.split()[3]).network)
    for line in run("ip", "-4", "route", "show").stdout.splitlines():
        dst = line.split()[0]
        if dst != "default":
            taken.append(ipaddress.ip_network(dst, strict=False))
    for subnet in SUBNETS.subnets(new_prefix=24):
        if not any(subnet.overlaps(t) for t in taken):
            return subnet
    raise EmulationError(f"no free /24 left in {SUBNETS}")


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """SIGTERM ends the block like Ctrl-C, once (so teardown runs, and a second SIGTERM does not cut it
    short); only in the main thread, where handlers live."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    raised = []

    def handler(signum, frame):
        if not raised:
            raised.append(signum)
            raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
