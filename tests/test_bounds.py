"""Issue 49: every input is bounded in memory and time, whatever its size or value: a duration given to any command
(an option or a variable), a control answer that never comes or is not fanfs's, an index of any size."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from fanfs_command import FANFS, fanfs

from fanfs.cli.args import seconds, seconds_or_zero
from fanfs.cli.main import build_parser
from fanfs.serve.control import socket_path
from fanfs.store.format import _INDEX_HEAD, INDEX_MAGIC
from fanfs.util.units import MAX_SECONDS

BAD_SECONDS = ("nan", "inf", "-1", "1e10", str(MAX_SECONDS + 1), "soon")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    base = tmp_path_factory.mktemp("bounds")
    (base / "src").mkdir()
    for i in range(20):
        (base / "src" / f"f{i:02d}.bin").write_bytes(os.urandom(1000))
    fanfs("pack", base / "src", base / "store", "--quiet")
    return base / "store"


DURATIONS = {
    ("mount", "S", "M", "--peer-timeout"): False, ("mount", "S", "M", "--store-timeout"): True,
    ("stage", "S", "L", "--store-timeout"): True, ("wait", "M", "--timeout"): False,
    ("select", "SRC", "--timing"): False,
}
"""Every option of the command line that takes a duration (its metavar SECONDS), and whether 0 is one (for ever)."""


def _seconds_options(parser: argparse.ArgumentParser, command: tuple[str, ...] = ()):
    """(command, option, type) of each option of ``parser`` and its subcommands whose value is seconds."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _seconds_options(sub, (*command, name))
        elif action.metavar == "SECONDS" or action.type in (seconds, seconds_or_zero):
            yield command, action.option_strings[0], action.type


def test_every_duration_option_takes_seconds_above_0_and_up_to_a_year(capsys):
    """Issue 49: ``--peer-timeout`` took nan, inf, -1 and 0 (every peer read then failed, with a traceback in the
    log); ``wait --timeout nan`` never returned; ``--store-timeout 1e10`` was an OverflowError.  One parser now: a bad
    value is argparse's one line and exit 2."""
    parser = build_parser()
    found = {(command, option): kind for command, option, kind in _seconds_options(parser)}
    assert found == {(tuple(args[:1]), option): seconds_or_zero if zero else seconds
                     for (*args, option), zero in DURATIONS.items()}
    for (*args, option), zero in DURATIONS.items():
        for value in (*BAD_SECONDS, *(() if zero else ("0",))):
            with pytest.raises(SystemExit) as exit:
                parser.parse_args([*args, option, value])
            said = capsys.readouterr().err.strip().splitlines()[-1]
            assert exit.value.code == 2 and f"argument {option}: expected a number of seconds" in said, said
        assert getattr(parser.parse_args([*args, option, "2.5"]), option[2:].replace("-", "_")) == 2.5
        if zero:
            assert parser.parse_args([*args, option, "0"]).store_timeout == 0


@pytest.mark.parametrize("variable, command", [("FANFS_STORE_TIMEOUT", "info"), ("FANFS_PROGRESS_SECONDS", "verify")])
def test_every_duration_variable_takes_seconds_or_says_so_in_one_line(store, variable, command):
    """Issue 49: ``FANFS_STORE_TIMEOUT=1e10`` was an OverflowError's traceback; a bad ``FANFS_PROGRESS_SECONDS`` was
    Python's "could not convert string to float"."""
    for value in ("1e10", "nan", "-1"):
        done = fanfs(command, store, check=False, env={**os.environ, variable: value})
        assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
        assert done.stderr.startswith(f"fanfs: error: {variable}") and "expected a number of seconds" in done.stderr


@contextlib.contextmanager
def a_daemon_answering(mountpoint: Path, answer: bytes | None):
    """A control socket at ``mountpoint``'s place, served by a process that reads each request and answers
    ``answer``, or (None) ends without a word, as a daemon killed while it worked on the request."""
    path = socket_path(str(mountpoint))
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(8)

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.recv(1 << 16)
                if answer is not None:
                    conn.sendall(answer)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown(socket.SHUT_RDWR)
        server.close()
        thread.join(5)
        os.unlink(path)


@pytest.mark.parametrize("answer, says", [(None, "ended before it answered"),
                                          (b'{"pid": 1}\n', "sent an answer this fanfs cannot read")])
def test_a_daemon_that_ends_before_it_answers_or_answers_otherwise_is_one_line(tmp_path, answer, says):
    """Issue 49: ``fanfs ctl --order`` whose daemon died before answering took the empty answer for ``{}``: a
    KeyError's traceback; ``ctl --fidelity`` and ``stats`` read their answers the same way.  A daemon of another fanfs
    (an answer without what this one reads) is one line too."""
    (tmp_path / "mnt").mkdir()
    (tmp_path / "order").write_text("a\n")
    with a_daemon_answering(tmp_path / "mnt", answer):
        for args in (("ctl", "--order", tmp_path / "order"), ("ctl", "--fidelity", "2"), ("stats",),
                     ("stats", "--json"), ("wait", "--timeout", "0.5")):
            done = fanfs(args[0], tmp_path / "mnt", *args[1:], check=False)
            assert done.returncode == 1 and done.stderr.count("\n") == 1, (args, done.stderr)
            assert done.stderr.startswith("fanfs: error: "), (args, done.stderr)
            assert says in done.stderr or args[0] == "wait", (args, done.stderr)


PEAK = ("import resource, subprocess, sys; done = subprocess.run(sys.argv[1:]); "
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(done.returncode)")
"""Runs a command and prints the most memory it held (KiB): started from this small process, not from the test's,
whose memory a child's peak would count from before its ``exec``."""


def _info(store: Path) -> tuple[int, str, int]:
    """``fanfs info STORE``: its exit status, what it said on stderr and the most memory it held (bytes)."""
    done = subprocess.run([sys.executable, "-c", PEAK, *FANFS, "info", str(store)], capture_output=True, text=True,
                          timeout=300)
    return done.returncode, done.stderr, int(done.stdout.split()[-1]) << 10


def _index_laying_out(store: Path, nbytes: int) -> None:
    """Replace ``store``'s index with a sparse file whose header lays out one column of ``nbytes``: every byte of
    the file accounted for, as in an index fanfs writes."""
    header = json.dumps({"columns": {"paths": ["|u1", 0, nbytes]}}).encode()
    head = _INDEX_HEAD.pack(INDEX_MAGIC, 1, 0, len(header)) + header
    with open(store / "index", "wb") as f:
        f.write(head)
    os.truncate(store / "index", -(-len(head) // 64) * 64 + nbytes + 8)


def test_an_index_is_refused_by_its_head_before_the_rest_is_read(store, tmp_path):
    """Issue 49: the index was read whole into memory before its magic was checked: a sparse 6 GiB ``index`` cost
    ``fanfs info`` 85 s and 6.2 GB before "not a fanfs index", 64 GiB gave "Cannot allocate memory" naming no file.
    Its head is checked first (magic, and the size its header lays out), and an index larger than the node's memory
    is refused by its size: each a line naming the file, in a few MB."""
    memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    copy = tmp_path / "store"
    shutil.copytree(store, copy)
    with open(copy / "index", "r+b") as f:
        f.truncate(2 << 30)  # a real head, then 2 GiB of nothing: its header lays out a few KB
    cases = {"laid out": "whose header lays out", "magic": "not a fanfs index", "huge": "more than this node's memory"}
    for case, says in cases.items():
        if case == "magic":
            with open(copy / "index", "r+b") as f:
                f.write(struct.pack("<8s", b"NOTFANFS"))
        elif case == "huge":
            _index_laying_out(copy, 2 * memory)
        code, said, held = _info(copy)
        assert code == 1 and said.count("\n") == 1, (case, said)
        assert said.startswith(f"fanfs: error: {copy / 'index'}: ") and says in said, (case, said)
        assert held < 512 << 20, (case, held)
