"""Processes a batch launch starts: find them, stop them.

Uses psutil (an Airflow dependency). No Airflow or Spark imports. (A launched JVM ending with the
task process that started it is the driver's business: :mod:`..spark.launcher_watch`.)
"""

from __future__ import annotations

import signal
from collections.abc import Iterable

import psutil


def children_since(started_at: float, markers: Iterable[str]) -> list[psutil.Process]:
    """This process's direct children created at or after ``started_at`` (epoch seconds) whose
    command line contains one of ``markers``."""
    wanted = tuple(markers)
    found = []
    for child in psutil.Process().children(recursive=False):
        try:
            if child.create_time() + 0.5 < started_at:  # create_time has ~10 ms resolution
                continue
            cmdline = " ".join(child.cmdline())
        except psutil.Error:
            continue
        if any(m in cmdline for m in wanted):
            found.append(child)
    return found


def with_descendants(roots: Iterable[psutil.Process]) -> list[psutil.Process]:
    """``roots`` and every process under them, collected now (a process whose parent dies is
    re-parented and would no longer be found under it)."""
    procs: list[psutil.Process] = []
    for root in roots:
        try:
            procs.extend([*root.children(recursive=True), root])
        except psutil.Error:
            continue
    return procs


def stop_processes(procs: Iterable[psutil.Process], grace_s: float = 4.0) -> list[int]:
    """SIGTERM ``procs``, wait up to ``grace_s``, then SIGKILL what is left; returns the PIDs that had
    to be killed."""
    procs = list(procs)
    for p in procs:
        try:
            p.send_signal(signal.SIGTERM)
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=grace_s)
    return [p.pid for p in alive]
