"""Shared pieces of the fanfs benchmarks: temp dirs, mounts that always go away, sample data, tables.

Every mount made here is unmounted however the benchmark ends (``fanfs umount``, then a lazy
``fusermount3 -u -z``, then SIGKILL of the daemon we started, by its pid), and every temp dir is removed.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import multiprocessing as mp
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
FANFS = [sys.executable, "-m", "fanfs"]

# Real photos shipped by installed packages (package, path inside it): the seed of all JPEG samples.
PHOTO_SOURCES = (("sklearn", "datasets/images/china.jpg"), ("sklearn", "datasets/images/flower.jpg"),
                 ("skimage", "data/rocket.jpg"), ("skimage", "data/retina.jpg"),
                 ("skimage", "data/hubble_deep_field.jpg"), ("matplotlib", "mpl-data/sample_data/grace_hopper.jpg"))


def common_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workdir", default="/dev/shm",
                        help="where the temp data, stores, images and mount points go (default /dev/shm, a tmpfs)")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON to FILE")


@contextlib.contextmanager
def temp_dir(workdir: str, prefix: str) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=workdir))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def run(cmd: Sequence[str | os.PathLike], **kwargs: Any) -> subprocess.CompletedProcess:
    """Run a command; on failure raise with its output (a benchmark must not go on with a half setup)."""
    done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kwargs)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} failed ({done.returncode}): {done.stderr.strip() or done.stdout.strip()}")
    return done


def fanfs(*args: str | os.PathLike, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``python -m fanfs ARGS``; ``env``: its environment (e.g. PYTHONPATH to another checkout's fanfs)."""
    return run([*FANFS, *args], cwd=REPO, env=env)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(ChildProcessError):
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    return True


def _unmount(mnt: Path, pid: int | None, graceful: Sequence[str] | None) -> None:
    if graceful and os.path.ismount(mnt):
        subprocess.run([str(c) for c in graceful], capture_output=True, timeout=60)
    if os.path.ismount(mnt):
        subprocess.run(["fusermount3", "-u", "-z", str(mnt)], capture_output=True)
    deadline = time.monotonic() + 10
    while pid is not None and _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    if pid is not None and _alive(pid):
        os.kill(pid, signal.SIGKILL)


def daemon_pid(mnt: Path) -> int:
    """Pid of the fanfs daemon serving ``mnt`` (its control channel's status answer)."""
    from fanfs.serve import control
    return int(control.request(str(mnt), {"cmd": "status"}, timeout=10)["pid"])


@contextlib.contextmanager
def fanfs_mount(store: Path, mnt: Path, *options: str, env: dict[str, str] | None = None) -> Iterator[int]:
    """``fanfs mount`` (returns once serving); yields the daemon pid; always unmounted afterwards."""
    mnt.mkdir(parents=True, exist_ok=True)
    pid = None
    try:
        fanfs("mount", store, mnt, *options, env=env)
        pid = daemon_pid(mnt)
        yield pid
    finally:
        _unmount(mnt, pid, [*FANFS, "umount", mnt])


@contextlib.contextmanager
def squashfuse_mount(binary: str, image: Path, mnt: Path) -> Iterator[int]:
    """squashfuse(_ll) in the foreground as our child (so we own its pid), default options as users run it."""
    mnt.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([binary, "-f", str(image), str(mnt)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while not os.path.ismount(mnt):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{binary} did not mount: {proc.stderr.read().decode() if proc.stderr else ''}")
            time.sleep(0.005)
        yield proc.pid
    finally:
        _unmount(mnt, None, ["fusermount3", "-u", mnt])
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def proc_memory(pid: int) -> dict[str, int]:
    """VmRSS / VmHWM / RssFile / RssShmem of a process, in bytes."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem"):
                out[key] = int(value.split()[0]) * 1024
    return out


def photo_paths() -> list[Path]:
    found = []
    for package, rel in PHOTO_SOURCES:
        with contextlib.suppress(ImportError):
            path = Path(__import__(package).__file__).parent / rel
            if path.is_file():
                found.append(path)
    if not found:
        raise RuntimeError("no sample photos: install scikit-learn, scikit-image or matplotlib")
    return found


_photos: list[Any] = []
_bytes_per_pixel: dict[tuple[int, int], float] = {}  # (photo, quality) -> last seen, so most files need one encode


def _jpeg_variant(args: tuple[int, int]) -> bytes:
    """One distinct JPEG of about ``target`` bytes: a random crop of a real photo, resized, flipped, re-encoded.

    The pixel count comes from the last encode of that photo at that quality, corrected if the size is
    off by more than 15%.
    """
    from PIL import Image
    seed, target = args
    rng = np.random.default_rng(seed)
    if not _photos:
        _photos.extend(Image.open(p).convert("RGB") for p in photo_paths())
    pick = int(rng.integers(len(_photos)))
    im = _photos[pick]
    w, h = im.size
    scale = rng.uniform(0.5, 1.0)
    cw, ch = int(w * scale), int(h * scale)
    x, y = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
    crop = im.crop((x, y, x + cw, y + ch))
    if rng.random() < 0.5:
        crop = crop.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    quality = int(rng.integers(85, 96))
    for _ in range(3):
        bpp = _bytes_per_pixel.get((pick, quality), 0.25)
        side = (target / bpp / (cw * ch)) ** 0.5
        size = (max(16, int(cw * side)), max(16, int(ch * side)))
        out = io.BytesIO()
        crop.resize(size, Image.Resampling.BILINEAR).save(out, "JPEG", quality=quality)
        data = out.getvalue()
        _bytes_per_pixel[(pick, quality)] = len(data) / (size[0] * size[1])
        if abs(len(data) - target) < 0.15 * target:
            break
    return data


def make_jpegs(count: int, target: int, seed: int = 0) -> list[bytes]:
    """``count`` distinct real-photo JPEGs of about ``target`` bytes (all cores; squashfs would dedupe copies)."""
    with mp.get_context("fork").Pool(os.cpu_count() or 1) as pool:
        return pool.map(_jpeg_variant, [(seed * 1_000_003 + i, target) for i in range(count)], chunksize=16)


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def wait_for_quiet(limit: float = 1.0, timeout: float = 60.0) -> None:
    """Wait (bounded) until the 1-minute load average is low, so other jobs on the box skew less."""
    deadline = time.monotonic() + timeout
    if os.getloadavg()[0] > limit:
        print(f"waiting up to {timeout:.0f} s for load average < {limit} (now {load_average()})", flush=True)
    while os.getloadavg()[0] > limit and time.monotonic() < deadline:
        time.sleep(5)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain aligned text table; numbers right-aligned, everything else left-aligned."""
    cells = [[str(h) for h in headers]] + [[_fmt(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    numeric = [all(isinstance(row[i], (int, float)) or row[i] in ("", "-") for row in rows) for i in range(len(headers))]
    lines = []
    for n, row in enumerate(cells):
        lines.append("  ".join(c.rjust(w) if numeric[i] else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))))
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(line.rstrip() for line in lines)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        if value != value:
            return "-"
        return f"{value:,.2f}" if abs(value) < 100 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def write_json(path: str | None, data: Any) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(data, f, indent=2)
        print(f"\nresults written to {path}")
