"""The fault suite's pause point is inert unless a test sets its directory and arms it, and fires once."""

from __future__ import annotations

from airflow_kafka_backpressure import _fault_points as fp


def test_the_pause_point_does_nothing_unless_set_and_armed(tmp_path, monkeypatch):
    monkeypatch.setattr(fp, "PAUSE_S", 0.0)
    monkeypatch.delenv(fp.PAUSE_AFTER_COMMIT_DIR_ENV, raising=False)
    fp.after_commit("p", 1)
    assert list(tmp_path.iterdir()) == []

    monkeypatch.setenv(fp.PAUSE_AFTER_COMMIT_DIR_ENV, str(tmp_path))
    fp.after_commit("p", 1)  # not armed
    assert list(tmp_path.iterdir()) == []


def test_an_armed_pause_point_fires_once_for_its_pipeline(tmp_path, monkeypatch):
    import os

    monkeypatch.setattr(fp, "PAUSE_S", 0.0)
    monkeypatch.setenv(fp.PAUSE_AFTER_COMMIT_DIR_ENV, str(tmp_path))
    (tmp_path / "p.arm").touch()
    fp.after_commit("other", 3)  # another pipeline's batch passes
    assert not (tmp_path / "other.paused").exists()
    fp.after_commit("p", 4)
    assert (tmp_path / "p.paused").read_text() == f"{os.getpid()} 4"
    (tmp_path / "p.paused").unlink()
    fp.after_commit("p", 5)  # disarmed by the first
    assert not (tmp_path / "p.paused").exists()
