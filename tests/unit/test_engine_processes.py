"""Finding the processes a launch started (engines/process.py), with real child processes."""

from __future__ import annotations

import subprocess
import sys

from airflow_kafka_backpressure.engines.process import child_ids, new_children, stop_processes


def _child(marker: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", marker])


def test_new_children_are_the_ones_started_after_the_snapshot_with_the_marker():
    older = _child("kbp-marker-x")
    try:
        before = child_ids()
        newer, other = _child("kbp-marker-x"), _child("kbp-unrelated")
        try:
            found = new_children(before, ["kbp-marker-x"])
            # by identity, not by wall-clock time: psutil's create times can be a second off time.time()
            assert [p.pid for p in found] == [newer.pid]
            assert stop_processes(found, grace_s=5) == []  # SIGTERM was enough
            assert newer.wait(5) is not None and other.poll() is None
        finally:
            for p in (newer, other):
                p.kill()
                p.wait()
    finally:
        older.kill()
        older.wait()
