"""Issue 29: what a new user's first day ran into: help that explains every argument, a job script that lists
every setting, an unmount of a wrong path that fails, ``stats`` and ``info`` that say what their figures are."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from fanfs_command import fanfs
from photo_samples import make_photo_set

from fanfs import __version__
from fanfs.cli.main import build_parser
from fanfs.records import settings
from fanfs.util.processes import fanfs_command

REPO = Path(__file__).resolve().parent.parent


def _arguments(parser: argparse.ArgumentParser, name: str = "fanfs"):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub, subparser in action.choices.items():
                yield from _arguments(subparser, f"{name} {sub}")
        elif not isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
            yield name, action


def test_every_argument_of_every_command_has_help():
    missing = [f"{name} {action.option_strings or action.dest}" for name, action in _arguments(build_parser())
               if not action.help]
    assert not missing, missing


def test_a_folder_named_fanfs_in_the_working_directory_is_no_traceback(tmp_path):
    """Issue 50: ``python -m fanfs`` beside a folder named fanfs (a clone of the checkout) failed with a traceback about
    ``__version__``; it now says what is wrong in one line, and the way fanfs starts its own children (job steps, the
    demo) is not shadowed at all.  The installed package, as a user's venv has it: no PYTHONPATH naming the checkout."""
    (tmp_path / "fanfs" / "fanfs").mkdir(parents=True)
    env = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    plain = subprocess.run([sys.executable, "-m", "fanfs", "--version"], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=60)
    assert plain.returncode == 1 and plain.stderr == (
        f"fanfs: error: the directory {tmp_path / 'fanfs'} shadows the installed fanfs package ('import fanfs' finds "
        "a folder named fanfs there first: beside the script, or in the current directory): rename that folder, or run "
        "from another directory\n"), plain.stderr
    child = subprocess.run([*fanfs_command(), "--version"], cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=60)
    assert (child.returncode, child.stdout, child.stderr) == (0, f"fanfs {__version__}\n", "")


def test_mount_help_says_peers_talk_tcp():
    text = " ".join(fanfs("mount", "--help").stdout.split())
    assert "over TCP" in text and "over MPI" not in text


def test_the_job_script_lists_every_setting_of_job_help():
    """slurm/train.sbatch's header: every FANFS_ variable 'fanfs job --help' names, each setting with its syntax."""
    header = "".join(line for line in (REPO / "slurm" / "train.sbatch").read_text().splitlines(True)
                     if line.startswith("#"))
    helped = set(re.findall(r"^\s+(FANFS_[A-Z]+)\s", fanfs("job", "--help").stdout, re.MULTILINE))
    assert {"FANFS_WORKERS", "FANFS_FIDELITY", "FANFS_LOCAL"} <= helped
    assert not [v for v in helped if f"#   {v} " not in header], header
    for setting in settings():
        line = re.search(rf"#   {setting.variable}\s+(\S+)", header)
        assert line and line.group(1).rstrip(":") == setting.metavar, (setting.variable, setting.metavar)


def test_umount_of_a_directory_that_never_was_a_mount_fails_with_one_line(tmp_path):
    done = fanfs("umount", tmp_path, check=False)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        f"fanfs: error: {tmp_path} is not a fanfs mount, and none of yours was ever mounted there: check the path"]


@pytest.fixture(scope="module")
def tiered(tmp_path_factory):
    base = tmp_path_factory.mktemp("tiered")
    make_photo_set(base / "src" / "photos", 12)
    fanfs("pack", base / "src", base / "store", "--scales", "2", "--quiet")
    return base / "store"


def test_stats_labels_layers_and_tiers_and_gives_a_rate(tiered, mount):
    with mount(tiered, "--fidelity", "1/2") as mnt:
        photos = sorted((mnt / "photos").iterdir())
        for path in photos[:6]:
            path.read_bytes()
        fanfs("ctl", mnt, "--fidelity", "2")
        for path in photos[6:]:
            path.read_bytes()
        text = fanfs("stats", mnt).stdout
        data = json.loads(fanfs("stats", mnt, "--json").stdout)
    lines = {line[:10].strip(): line[11:] for line in text.splitlines()}
    assert re.fullmatch(r"12 in [\d.,]+ s since the mount \([\d,]+/s on average\)   errors 0", lines["reads"]), text
    assert re.search(r"/s\)   read from storage", lines["presented"]), text
    assert re.fullmatch(r"1: \S+ \S+  2: \S+ \S+", lines["per layer"]), text  # scans 1 and 2, counted from 1
    assert re.fullmatch(r"1/2: \S+ \S+", lines["per tier"]), text  # the tier's bytes, not a layer number
    assert "misses" not in text and "of them from fanfs's memory cache" in lines["blobs"]
    assert data["fidelity"] == "2" and data["precision"] == "full" and "65535" not in json.dumps(data)
    assert data["side_names"] == ["1/2"] and len(data["stored_by_side_layer"]) == 1
    assert sum(data["stored_by_layer"]) + sum(data["stored_by_side_layer"]) == data["bytes_stored_read"]


def test_info_says_what_its_columns_are_on_a_tiered_store(tiered):
    text = fanfs("info", tiered).stdout
    assert "codec   files  full size     stored   ratio" in text
    assert "stored: their bytes in the shards, resolution tiers included" in text
    assert "; raw: stored as they are (compression would not pay; JPEG scans are compressed already)" in text
    assert re.search(r"resolution tiers 1/2: 12 records, \S+ \S+ stored \(\+\d+% over their scans\)", text), text


@pytest.mark.timeout(120)
def test_the_cluster_bench_counts_what_a_loader_skips_and_stops_at_a_dead_reader(tmp_path):
    """bench_cluster --emulate on a photo folder holding a file that is no image hung for an hour: a reader died
    on it and the bench waited on its queue.  Now such a file is counted as a loader's error handling would, and
    a reader that dies (here: a file gone) ends the epoch at once."""
    from bench_emulated import epoch, is_image
    root = tmp_path / "images"
    make_photo_set(root, 4)
    (root / "notes.jpg").write_text("a text file with an image's name\n")
    rels = sorted(p.name for p in root.iterdir())
    assert [is_image(root / rel) for rel in rels].count(False) == 1
    done = epoch([root], rels, readers=2, decode=True)
    assert done["undecodable"] == 1 and done["total"] > 0
    with pytest.raises(RuntimeError, match="a reader died"):  # the old code waited an hour: the timeout fails it
        epoch([root], [*rels, "gone.jpg"], readers=2, decode=True)


def test_the_install_lines_name_what_an_index_has():
    """fanfs is installed from its checkout: no message or page may say 'pip install fanfs[...]' (no index has it),
    and the environment tools/setup makes (tools/demo's) has fsspec, which the README's reading without FUSE needs."""
    setup = (REPO / "tools" / "setup").read_text()
    assert re.search(r'^extras="mpi,fsspec"', setup, re.MULTILINE), setup
    texts = {path: path.read_text() for path in [REPO / "README.rst", *(REPO / "docs").glob("*.rst"),
                                                 *(REPO / "fanfs").rglob("*.py")]}
    assert not [path for path, text in texts.items() if re.search(r"pip install '?fanfs\[", text)]


def test_setup_help_prints_its_usage_and_installs_nothing(tmp_path):
    """Issue 41: 'tools/setup --help' printed nothing and ran the install.  Now: its usage, exit 0; an unknown option
    is one line, exit 2; neither calls apt-get, dpkg-query or python3 (stand-ins here, which note a call and fail)."""
    stubs = tmp_path / "bin"
    stubs.mkdir()
    for name in ("apt-get", "sudo", "dpkg-query", "python3"):
        (stubs / name).write_text(f"#!/bin/sh\necho {name} >> {tmp_path / 'called'}\nexit 1\n")
        (stubs / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{stubs}:/usr/bin:/bin"}
    shown = subprocess.run([REPO / "tools" / "setup", "--help"], capture_output=True, text=True, env=env, timeout=60)
    assert shown.returncode == 0 and shown.stdout.startswith("usage: tools/setup [--test | --bench | --help]"), shown
    assert "--test" in shown.stdout and "--bench" in shown.stdout and not shown.stderr
    wrong = subprocess.run([REPO / "tools" / "setup", "--tset"], capture_output=True, text=True, env=env, timeout=60)
    assert wrong.returncode == 2 and not wrong.stdout, wrong
    assert wrong.stderr.splitlines() == ["tools/setup: error: unknown option '--tset': use --test, --bench or --help"]
    assert not (tmp_path / "called").exists()


@pytest.mark.slow  # the quick subset's time (its promise keeps a quicker test)
def test_a_store_without_jpegs_gets_no_line_about_them(tmp_path, mount):
    """Issue 41: a store of plain files showed 'raw: ... (JPEG scans are compressed already)' in info and 'per layer
    1: ...' in stats.  Such lines only where they apply."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "noise.bin").write_bytes(os.urandom(300_000))  # stored raw (an extent)
    (tmp_path / "src" / "text.txt").write_text("words " * 20_000)
    fanfs("pack", tmp_path / "src", tmp_path / "store", "--quiet")
    info = fanfs("info", tmp_path / "store").stdout
    assert "raw: stored as they are (compression would not pay)" in info and "JPEG" not in info, info
    with mount(tmp_path / "store") as mnt:
        assert (mnt / "noise.bin").read_bytes() and (mnt / "text.txt").read_bytes()
        text = fanfs("stats", mnt).stdout
        data = json.loads(fanfs("stats", mnt, "--json").stdout)
    assert data["stored_by_layer"] and not data["layered"] and "per layer" not in text, text
