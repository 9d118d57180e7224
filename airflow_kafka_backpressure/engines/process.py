"""Processes a batch launch starts: make them die with their parent, find them, stop them.

Linux specifics are optional: elsewhere :func:`die_with_parent` is None and only the explicit stop
works. Uses psutil (an Airflow dependency). No Airflow or Spark imports.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import signal
import sys
from collections.abc import Callable, Iterable

import psutil

_PR_SET_PDEATHSIG = 1
_libc = None
if sys.platform.startswith("linux"):
    try:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:  # pragma: no cover - no libc to talk to
        _libc = None


def _pdeathsig_term() -> None:
    # Runs in the child between fork and exec: no imports, no locks, just the system call.
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)  # type: ignore[union-attr]


#: ``preexec_fn`` for ``subprocess.Popen``: the child gets SIGTERM when the thread that started it
#: dies (e.g. the Airflow task process is killed), so a JVM never outlives the task that launched it.
#: SIGTERM, not SIGKILL: the JVM's shutdown hooks then remove its temporary directories.
die_with_parent: Callable[[], None] | None = _pdeathsig_term if _libc is not None else None


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
