"""Issue 27: progress a person can follow anywhere: a bar on a terminal, lines in a log (a batch job's), with done
and total files and bytes, rate, ETA and elapsed time; nothing extra from a command done within the period."""

from __future__ import annotations

import io
import time

from fanfs.util import progress
from fanfs.peers.world import local_ranks
from fanfs.util.progress import Progress, human_duration


def test_a_log_gets_lines_with_everything_a_person_asks(monkeypatch):
    monkeypatch.setattr(progress, "LOG_EVERY", 0.0)
    log = io.StringIO()
    with Progress(10 << 30, "pack", unit="B", count_total=1000, stream=log) as bar:
        time.sleep(0.01)
        bar.update_to(1 << 30, count=100)
    line = log.getvalue().strip()
    assert line.startswith("fanfs pack: 100/1,000 files, 1.0 GiB of 10.0 GiB (10%), ") and "/s, ETA " in line
    assert line.endswith(" elapsed") and "\r" not in log.getvalue()


def test_no_total_no_eta_and_nothing_within_the_period(monkeypatch):
    log = io.StringIO()
    with Progress(0, "pack", unit="B", stream=log) as bar:  # a pipe: its size is unknown
        bar.update_to(5 << 20, count=7)
        assert log.getvalue() == ""  # within LOG_EVERY (10 s): nothing
        assert "ETA" not in bar.line() and bar.line().startswith("7 files, 5.0 MiB, ")
    monkeypatch.setattr(progress, "LOG_EVERY", 0.0)
    with Progress(300, "fidelity", unit="records", stream=log) as bar:
        bar.update_to(30)
    assert "fanfs fidelity: 30 of 300 (10%), " in log.getvalue() and " records/s" in log.getvalue()


def test_durations_read_as_a_person_says_them():
    assert [human_duration(s) for s in (5, 75, 3725, 90061)] == ["5s", "1m15s", "1h02m", "25h01m"]


def test_ranks_on_this_node_from_every_launcher(monkeypatch):
    for name in ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_STEP_TASKS_PER_NODE", "SLURM_NODEID"):
        monkeypatch.delenv(name, raising=False)
    assert local_ranks() == 1
    monkeypatch.setenv("SLURM_STEP_TASKS_PER_NODE", "2(x3),1")
    monkeypatch.setenv("SLURM_NODEID", "2")
    assert local_ranks() == 2
    monkeypatch.setenv("SLURM_NODEID", "3")
    assert local_ranks() == 1
    monkeypatch.setenv("MPI_LOCALNRANKS", "4")  # Hydra's own count wins
    assert local_ranks() == 4
