"""The fault suite's pause after the sink commit, registered on the product's seam
(:mod:`airflow_kafka_backpressure.batch.fault_points`) by ``inject/sitecustomize.py`` in the processes
the suite starts (``PYTHONPATH``), never by the product.

It does something only when ``$KBP_TEST_PAUSE_AFTER_COMMIT_DIR`` is set **and** a test armed it by
creating ``<dir>/<pipeline>.arm``: the first batch of that pipeline to reach the point takes the arm
file (an atomic rename, so it fires once), writes its task process's PID to
``<dir>/<pipeline>.paused`` and sleeps, so the test can SIGKILL the task at a known step — after the
batch's output was swapped into the sink, before the ledger marked it finished.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

PAUSE_DIR_ENV = "KBP_TEST_PAUSE_AFTER_COMMIT_DIR"
PAUSE_S = 600.0
#: The folder to put first on the PYTHONPATH of processes whose seam the suite arms.
INJECT_DIR = Path(__file__).resolve().parent / "inject"


def _pause(name: str, batch_id: int) -> None:
    directory = os.environ.get(PAUSE_DIR_ENV)
    if not directory:
        return
    d = Path(directory)
    try:
        os.rename(d / f"{name}.arm", d / f"{name}.fired")
    except FileNotFoundError:
        return
    tmp = d / f"{name}.paused.tmp"
    tmp.write_text(f"{os.getpid()} {batch_id}")
    os.replace(tmp, d / f"{name}.paused")
    time.sleep(PAUSE_S)


def pause_after_commit(pipeline: str, batch_id: int) -> None:
    """The pause after the sink commit (see the module doc): armed by ``<pipeline>.arm``."""
    _pause(pipeline, batch_id)


def pause_after_plan(pipeline: str, batch_id: int) -> None:
    """The same pause after the plan task recorded its plan: armed by ``<pipeline>.after_plan.arm``,
    reported in ``<pipeline>.after_plan.paused``."""
    _pause(f"{pipeline}.after_plan", batch_id)


def install() -> None:
    """Register the pauses on the product's seams (once per process)."""
    from airflow_kafka_backpressure.batch import fault_points as _fault_points

    if pause_after_commit not in _fault_points._AFTER_COMMIT:
        _fault_points.on_after_commit(pause_after_commit)
    if pause_after_plan not in _fault_points._AFTER_PLAN:
        _fault_points.on_after_plan(pause_after_plan)
