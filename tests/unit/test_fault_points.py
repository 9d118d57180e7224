"""The product's seam after the sink commit is inert: no environment variable arms it (issue 21,
item 8). The fault suite's pause, registered from its own processes' start-up, fires once when armed."""

from __future__ import annotations

import os
import threading

import pytest

from airflow_kafka_backpressure.batch import fault_points as fp
from tests.faults import pause_point


@pytest.fixture
def no_hooks(monkeypatch):
    monkeypatch.setattr(fp, "_AFTER_COMMIT", [])
    monkeypatch.setattr(fp, "_AFTER_PLAN", [])


def test_the_seam_cannot_be_armed_from_the_environment(tmp_path, monkeypatch, no_hooks):
    """What a deployed Airflow has: the seam, the old variable set and an arm file — and nothing
    happens (the previous product renamed the arm file and slept for 600 s)."""
    monkeypatch.setenv(pause_point.PAUSE_DIR_ENV, str(tmp_path))
    (tmp_path / "p.arm").touch()
    (tmp_path / "p.after_plan.arm").touch()
    for seam in (fp.after_commit, fp.after_plan):
        call = threading.Thread(target=seam, args=("p", 1), daemon=True)
        call.start()
        call.join(30)
        assert not call.is_alive(), f"the product's seam {seam.__name__} paused"
    assert sorted(x.name for x in tmp_path.iterdir()) == ["p.after_plan.arm", "p.arm"]


def test_the_suites_pause_is_inert_unless_set_and_armed(tmp_path, monkeypatch, no_hooks):
    monkeypatch.setattr(pause_point, "PAUSE_S", 0.0)
    pause_point.install()
    monkeypatch.delenv(pause_point.PAUSE_DIR_ENV, raising=False)
    fp.after_commit("p", 1)
    assert list(tmp_path.iterdir()) == []

    monkeypatch.setenv(pause_point.PAUSE_DIR_ENV, str(tmp_path))
    fp.after_commit("p", 1)  # not armed
    assert list(tmp_path.iterdir()) == []


def test_an_armed_pause_fires_once_for_its_pipeline(tmp_path, monkeypatch, no_hooks):
    monkeypatch.setattr(pause_point, "PAUSE_S", 0.0)
    pause_point.install()
    pause_point.install()  # once per process, however often start-up code runs
    assert fp._AFTER_COMMIT == [pause_point.pause_after_commit]
    assert fp._AFTER_PLAN == [pause_point.pause_after_plan]
    monkeypatch.setenv(pause_point.PAUSE_DIR_ENV, str(tmp_path))
    (tmp_path / "p.arm").touch()
    fp.after_commit("other", 3)  # another pipeline's batch passes
    assert not (tmp_path / "other.paused").exists()
    fp.after_commit("p", 4)
    assert (tmp_path / "p.paused").read_text() == f"{os.getpid()} 4"
    (tmp_path / "p.paused").unlink()
    fp.after_commit("p", 5)  # disarmed by the first
    assert not (tmp_path / "p.paused").exists()
    fp.after_plan("p", 6)  # the plan seam has its own arm file
    assert not (tmp_path / "p.after_plan.paused").exists()
    (tmp_path / "p.after_plan.arm").touch()
    fp.after_plan("p", 7)
    assert (tmp_path / "p.after_plan.paused").read_text() == f"{os.getpid()} 7"


def test_the_suites_processes_load_the_pause_at_start_up(tmp_path):
    """A process started as the suite starts Airflow (its PYTHONPATH) has the pause registered."""
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    env = {
        **os.environ,
        pause_point.PAUSE_DIR_ENV: str(tmp_path),
        "PYTHONPATH": os.pathsep.join([str(pause_point.INJECT_DIR), str(repo)]),
    }
    code = "from airflow_kafka_backpressure.batch import fault_points as f; print([h.__name__ for h in f._AFTER_COMMIT + f._AFTER_PLAN])"
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "['pause_after_commit', 'pause_after_plan']"
    env.pop(pause_point.PAUSE_DIR_ENV)
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"
