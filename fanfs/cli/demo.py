"""``fanfs demo``: the main job end to end on the built-in sample, with the commands a user would type."""

from __future__ import annotations

import hashlib
import json
import shlex
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from .sample import make_sample
from ..util.processes import fanfs_command
from ..util.units import human_size


def _fanfs(*args: object, show: bool = True) -> str:
    print("$ fanfs " + " ".join(shlex.quote(str(a)) for a in args), flush=True)
    done = subprocess.run([*fanfs_command(), *map(str, args)], capture_output=True, text=True)
    output = (done.stdout + done.stderr).rstrip()
    if output and (show or done.returncode):
        print("  " + output.replace("\n", "\n  "), flush=True)
    if done.returncode:
        raise SystemExit(done.returncode)
    return done.stdout


def _read_all(root: Path) -> tuple[int, int, float, dict[str, bytes]]:
    """Read every file under ``root`` like a training epoch: (files, bytes, seconds, contents)."""
    started = time.perf_counter()
    contents = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink()):
        contents[str(path.relative_to(root))] = path.read_bytes()
    return len(contents), sum(map(len, contents.values())), time.perf_counter() - started, contents


def _pixels(data: bytes) -> bytes:
    from ..util.images import decode_pixels
    return decode_pixels(data).tobytes()


def run_demo(workdir: str | None = None, keep: bool = False) -> int:
    """The demo in ``workdir`` (default: a new temporary directory, removed at the end, whatever happened, unless
    ``keep``).  FUSE is checked first: where this user may not mount, one line says what to ask for, nothing made."""
    from ..serve.daemon import check_fuse
    check_fuse()
    base = Path(workdir or tempfile.mkdtemp(prefix="fanfs-demo-"))
    try:
        return _demo(base)
    finally:
        if not keep and workdir is None:
            shutil.rmtree(base, ignore_errors=True)


def _demo(base: Path) -> int:
    base.mkdir(parents=True, exist_ok=True)
    src, store, mnt = base / "sample", base / "sample.fanfs", base / "mnt"
    if not src.exists():
        make_sample(src)
    mnt.mkdir(exist_ok=True)
    print(f"fanfs demo in {base}\n")
    _fanfs("pack", src, store, "--progressive-jpeg", "--force", "--quiet")
    _fanfs("info", store)
    _fanfs("mount", store, mnt)
    failures = 0
    try:
        files, nbytes, seconds, full = _read_all(mnt)
        for rel, data in full.items():
            original = (src / rel).read_bytes()
            same = data == original or (rel.endswith(".JPEG") and _pixels(data) == _pixels(original))
            if not same:
                failures += 1
                print(f"MISMATCH {rel}")
        print(f"\nread {files} files ({human_size(nbytes)}) through the mount in {seconds:.2f} s: "
              f"{'all exact' if not failures else f'{failures} MISMATCHES'} "
              "(bytes for plain files, pixels for JPEGs stored as progressive records)\n")
        _fanfs("ctl", mnt, "--fidelity", "3")
        low = _read_all(mnt)[3]
        jpegs = [rel for rel in low if rel.endswith(".JPEG")]
        at3 = sum(len(low[r]) for r in jpegs)
        at_full = sum(len(full[r]) for r in jpegs)
        print(f"\nat fidelity 3 the {len(jpegs)} JPEGs are {human_size(at3)} instead of {human_size(at_full)} "
              f"({100 * at3 / at_full:.0f}%), still valid images; other files unchanged\n")
        stats = json.loads(_fanfs("stats", mnt, "--json", show=False))
        print(f"  (read from storage: {human_size(stats['bytes_stored_read'])}, "
              f"presented: {human_size(stats['bytes_presented'])})\n")
    finally:
        _fanfs("umount", mnt)
    digest = hashlib.sha256(b"".join(full[k] for k in sorted(full))).hexdigest()[:16]
    print(f"\nsummary: {files} files, {human_size(nbytes)} read back, {failures} mismatches, "
          f"content digest {digest}")
    return 1 if failures else 0
