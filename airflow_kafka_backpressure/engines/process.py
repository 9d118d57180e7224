"""Processes a batch launch starts: find them, stop them.

Uses psutil (an Airflow dependency). No Airflow or Spark imports. (A launched JVM ending with the
task process that started it is the driver's business: :mod:`..spark.launcher_watch`.)
"""

from __future__ import annotations

import signal
from collections.abc import Iterable

import psutil


def child_ids() -> frozenset[tuple[int, float]]:
    """This process's direct children now, as (PID, create time): a process's identity (a PID can be
    reused). Taken before a launch, for :func:`new_children`."""
    out = set()
    for child in psutil.Process().children(recursive=False):
        try:
            out.add((child.pid, child.create_time()))
        except psutil.Error:
            continue
    return frozenset(out)


def new_children(before: frozenset[tuple[int, float]], markers: Iterable[str]) -> list[psutil.Process]:
    """This process's direct children that are not in ``before`` (:func:`child_ids`) and whose
    command line contains one of ``markers``.

    Not "created after the launch's wall-clock time": psutil derives a process's create time from
    the boot time, which the kernel gives in whole seconds and which drifts from the wall clock, so
    create times can be a second or more off ``time.time()`` (measured on a CI machine: 0.9 s
    early, and a spark-submit started after the launch looked older than it, so a stop missed it).
    Both sides of this comparison come from psutil."""
    wanted = tuple(markers)
    found = []
    for child in psutil.Process().children(recursive=False):
        try:
            if (child.pid, child.create_time()) in before:
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
